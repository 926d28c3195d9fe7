"""Staying safe in an outage: throttle schedule, Retry-After and the shared retry budget."""

from __future__ import annotations

import email.utils
import logging
import pickle
import threading
import time
import weakref
from typing import Any

import fsspec
import pyarrow.fs as pafs
import pytest
from _helpers import FAST

import retryfs
from retryfs import RateLimit, RetryBudget, RetryPolicy
from retryfs.core.budget import TokenBucket, bucket_for, endpoint_of, reset_budgets
from retryfs.core.engine import retry_after_of
from retryfs.testing import FaultyFileSystem, errors


@pytest.fixture
def target(tmp_path):
    path = tmp_path / "f"
    path.write_bytes(b"x" * 10)
    return str(path)


# -- the budget bounds an outage -------------------------------------------------------------

OUTAGE_POLICY = RetryPolicy(max_attempts=6, initial_delay=0.02, multiplier=2, max_delay=0.05,
                            jitter=False)  # 0.02 + 0.04 + 0.05 * 3 = 0.21 s of sleep per call
THREADS, CALLS = 8, 3


def _outage(fs: retryfs.RetryingFileSystem, path: str) -> tuple[float, int]:
    """THREADS threads, CALLS calls each, every request failing: (wall seconds, failures)."""
    failures = [0] * THREADS
    barrier = threading.Barrier(THREADS + 1)

    def work(index: int) -> None:
        barrier.wait()
        for _ in range(CALLS):
            with pytest.raises(OSError, match="SERVICE_UNAVAILABLE"):
                fs.get_file_info(path)
            failures[index] += 1

    workers = [threading.Thread(target=work, args=(i,)) for i in range(THREADS)]
    for worker in workers:
        worker.start()
    barrier.wait()
    started = time.monotonic()
    for worker in workers:
        worker.join(timeout=60)
    return time.monotonic() - started, sum(failures)


def test_budget_bounds_total_time_in_a_hard_outage(target, caplog):
    caplog.set_level(logging.CRITICAL, logger="retryfs")  # 100+ lines otherwise
    down = lambda: OSError("AWS Error SERVICE_UNAVAILABLE during HeadObject operation")  # noqa: E731

    unbudgeted_store = FaultyFileSystem(pafs.LocalFileSystem())
    unbudgeted_store.inject("get_file_info", down, times=None)
    unbudgeted = retryfs.RetryingFileSystem(unbudgeted_store, OUTAGE_POLICY, budget=False)
    _, failed = _outage(unbudgeted, target)
    assert failed == THREADS * CALLS
    assert unbudgeted.stats.snapshot()["retries"] == THREADS * CALLS * 5
    # each call slept through its whole schedule (counted by the engine, not by a wall clock)
    without = unbudgeted.stats.snapshot()["sleep_seconds"]
    assert without == pytest.approx(THREADS * CALLS * 0.21)

    budget = RetryBudget(capacity=20, retry_cost=5)  # 4 retries, process-wide, then fail fast
    budgeted_store = FaultyFileSystem(pafs.LocalFileSystem())
    budgeted_store.inject("get_file_info", down, times=None)
    budgeted = retryfs.RetryingFileSystem(budgeted_store, OUTAGE_POLICY, budget=budget)
    _, failed = _outage(budgeted, target)
    assert failed == THREADS * CALLS

    snap = budgeted.stats.snapshot()
    assert snap["retries"] == budget.max_retries == 4
    assert snap["giveups"] == THREADS * CALLS
    assert snap["budget_exhausted"] == THREADS * CALLS  # each ended on an empty budget
    assert budgeted.retry_budget.available == 0
    # The bound: at most max_retries sleeps of at most max_delay across all threads.
    with_budget = snap["sleep_seconds"]
    assert with_budget <= budget.max_retries * OUTAGE_POLICY.max_delay, (with_budget, without)
    assert with_budget < without / 10, (with_budget, without)


def test_an_empty_budget_fails_after_one_attempt_with_a_note(target, caplog):
    store = FaultyFileSystem(pafs.LocalFileSystem())
    fs = retryfs.RetryingFileSystem(store, FAST, budget=RetryBudget(capacity=5, retry_cost=5))
    store.inject("get_file_info", errors.network(), times=None)
    caplog.set_level(logging.ERROR, logger="retryfs")
    with pytest.raises(OSError) as first:
        fs.get_file_info(target)
    assert store.calls["get_file_info"] == 2  # one retry: the budget's only one
    assert "retry budget" in first.value.__notes__[-1]
    assert "exhausted" in first.value.__notes__[-1]
    store.calls.clear()
    with pytest.raises(OSError):
        fs.get_file_info(target)
    assert store.calls["get_file_info"] == 1  # empty: no retry at all
    assert caplog.records[-1].getMessage().startswith(
        f"retryfs: get_file_info {target!r} gave up after 1 attempt(s) (retry budget exhausted)")
    assert fs.stats.snapshot()["budget_exhausted"] == 2
    assert fs.retry_budget.denied == 2


def test_successes_refill_the_budget(target):
    store = FaultyFileSystem(pafs.LocalFileSystem())
    budget = RetryBudget(capacity=50, retry_cost=5, success_refund=1)
    fs = retryfs.RetryingFileSystem(store, FAST, budget=budget)
    bucket = fs.retry_budget
    store.inject("get_file_info", errors.network(), times=3)
    fs.get_file_info(target)  # 3 retries (15 tokens), recovered: gives back its last retry's 5
    assert bucket.available == 50 - 15 + 5
    for _ in range(3):
        fs.get_file_info(target)  # first-attempt successes: 1 token each
    assert bucket.available == 43
    for _ in range(20):
        fs.get_file_info(target)
    assert bucket.available == 50  # never beyond capacity


def test_throttles_and_timeouts_cost_what_the_budget_says():
    budget = RetryBudget(capacity=100, retry_cost=5, throttle_cost=3, timeout_cost=10)
    assert budget.cost() == 5
    assert budget.cost(throttled=True) == 3
    assert budget.cost(timed_out=True) == 10
    assert budget.max_retries == 33
    with pytest.raises(ValueError, match="capacity"):
        RetryBudget(capacity=0)
    with pytest.raises(ValueError, match="success_refund"):
        RetryBudget(success_refund=-1)


def test_test_mode_sets_the_budget_aside(target):
    store = FaultyFileSystem(pafs.LocalFileSystem())
    fs = retryfs.RetryingFileSystem(store, FAST, budget=RetryBudget(capacity=1, retry_cost=1))
    store.inject("get_file_info", errors.network(), times=3)
    with retryfs.no_sleep():
        fs.get_file_info(target)  # 3 retries with a one-retry budget
    assert fs.stats.snapshot()["recovered"] == 1
    assert fs.retry_budget.available == 1


# -- one budget per endpoint per process -------------------------------------------------------

def _s3(endpoint: str = "http://127.0.0.1:9", region: str = "us-east-1", **kw):
    return pafs.S3FileSystem(endpoint_override=endpoint, region=region, access_key="AKIAKEY",
                             secret_key="topsecret", scheme="http", **kw)


def test_wrappers_of_one_endpoint_share_a_bucket():
    a = retryfs.RetryingFileSystem(_s3())
    b = retryfs.RetryingFileSystem(_s3(), RetryPolicy(max_attempts=3))  # another policy
    c = retryfs.RetryingFileSystem(_s3(endpoint="http://127.0.0.1:10"))
    d = retryfs.RetryingFileSystem(_s3(region="eu-west-1"))
    assert a.retry_budget is b.retry_budget
    assert a.retry_budget is not c.retry_budget
    assert a.retry_budget is not d.retry_budget
    assert a.retry_budget.endpoint == (
        "s3(scheme=http,endpoint_override=http://127.0.0.1:9,region=us-east-1)")
    assert "topsecret" not in repr(a.retry_budget) and "AKIAKEY" not in repr(a.retry_budget)
    # another configuration of the budget is another bucket (never a silent mix of two)
    e = retryfs.RetryingFileSystem(_s3(), budget=RetryBudget(capacity=10))
    assert e.retry_budget is not a.retry_budget and e.retry_budget.capacity == 10


def test_fault_injectors_and_fsspec_filesystems_have_their_own_buckets(tmp_path):
    one, two = FaultyFileSystem(), FaultyFileSystem()
    assert retryfs.RetryingFileSystem(one).retry_budget is not (
        retryfs.RetryingFileSystem(two).retry_budget)
    assert retryfs.RetryingFileSystem(one).retry_budget is (
        retryfs.RetryingFileSystem(one).retry_budget)
    memory = fsspec.filesystem("memory")
    key, label = endpoint_of(memory)
    assert label == "memory"
    assert retryfs.RetryingFileSystem(memory).retry_budget is (
        retryfs.RetryingFileSystem(fsspec.filesystem("memory")).retry_budget)
    local = retryfs.RetryingFileSystem(pafs.LocalFileSystem())
    nested = retryfs.RetryingFileSystem(local)  # a wrapper of a wrapper: the same endpoint
    assert nested.retry_budget is local.retry_budget


def test_the_budget_is_state_and_never_pickled():
    fs = retryfs.RetryingFileSystem(_s3(), budget=RetryBudget(capacity=40))
    fs.retry_budget.acquire(15)
    clone = pickle.loads(pickle.dumps(fs))
    assert clone == fs
    assert clone.retry_handler.budget == RetryBudget(capacity=40)  # configuration travels
    assert clone.retry_budget is fs.retry_budget  # same process, same endpoint: same bucket
    assert retryfs.RetryingFileSystem(_s3(), budget=True) == retryfs.RetryingFileSystem(
        _s3(), budget=RetryBudget())
    assert retryfs.RetryingFileSystem(_s3(), budget=False) != retryfs.RetryingFileSystem(_s3())
    off = pickle.loads(pickle.dumps(retryfs.RetryingFileSystem(_s3(), budget=False)))
    assert off.retry_budget is None


def test_bucket_is_freed_with_its_last_wrapper():
    import gc

    config = RetryBudget(capacity=123)
    bucket = bucket_for(_s3(endpoint="http://127.0.0.1:11"), config)
    bucket.acquire(100)
    assert bucket_for(_s3(endpoint="http://127.0.0.1:11"), config) is bucket  # alive: shared
    freed = weakref.ref(bucket)
    del bucket
    gc.collect()
    assert freed() is None  # the registry did not keep it alive
    fresh = bucket_for(_s3(endpoint="http://127.0.0.1:11"), config)
    assert isinstance(fresh, TokenBucket) and fresh.available == 123  # a new, full bucket


def test_reset_budgets_refills_every_bucket():
    fs = retryfs.RetryingFileSystem(_s3(endpoint="http://127.0.0.1:12"))
    fs.retry_budget.acquire(100)
    reset_budgets()
    assert fs.retry_budget.available == fs.retry_budget.capacity


def test_bucket_is_thread_safe():
    bucket = TokenBucket(RetryBudget(capacity=10_000), "x")
    taken = [0] * 8

    def work(i: int) -> None:
        while bucket.acquire(3):
            taken[i] += 3

    workers = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    assert sum(taken) == 9999 and bucket.available == 1


# -- throttling: the longer schedule and Retry-After --------------------------------------------

def _delays_recorded(policy: RetryPolicy, **options: Any
                     ) -> tuple[FaultyFileSystem, Any, list[tuple[bool, float]]]:
    """A wrapper of a faulty local filesystem, and the (throttled, delay) of each retry it makes."""
    store = FaultyFileSystem(pafs.LocalFileSystem())
    fs = retryfs.RetryingFileSystem(store, policy, **options)
    delays: list[tuple[bool, float]] = []
    fs.stats.on_retry(lambda e: delays.append((e.throttled, e.delay)))
    return store, fs, delays


def test_throttles_wait_on_the_longer_schedule(target):
    store, fs, delays = _delays_recorded(RetryPolicy(
        max_attempts=4, initial_delay=0.001, max_delay=1, jitter=False, throttle_delay=0.003))
    store.inject("get_file_info", errors.network(), times=2)
    fs.get_file_info(target)
    store.inject("get_file_info", errors.throttle(), times=3)
    fs.get_file_info(target)
    # a request's first two throttles are isolated: the transient schedule's 0.001 and 0.002;
    # the third waits the throttle schedule at its third retry (0.003 * 2 ** 2)
    assert delays == [(False, 0.001), (False, 0.002), (True, 0.001), (True, 0.002), (True, 0.012)]
    assert fs.stats.snapshot()["throttled"] == 3
    assert store.calls["get_file_info"] == 7  # each failed call made again once


def test_every_throttle_waits_the_throttle_schedule_without_fast_retries(target):
    store, fs, delays = _delays_recorded(RetryPolicy(
        max_attempts=4, initial_delay=0.001, max_delay=1, jitter=False, throttle_delay=0.003,
        fast_throttle_retries=0))
    store.inject("get_file_info", errors.throttle(), times=3)
    fs.get_file_info(target)
    assert delays == [(True, 0.003), (True, 0.006), (True, 0.012)]
    assert store.calls["get_file_info"] == 4


def test_fast_throttle_retries_counts_a_request_s_retries(target):
    store, fs, delays = _delays_recorded(RetryPolicy(
        max_attempts=5, initial_delay=0.001, max_delay=1, jitter=False, throttle_delay=0.01,
        fast_throttle_retries=2), rate_limit="off")
    store.inject("get_file_info", errors.throttle(), times=4)
    fs.get_file_info(target)
    assert delays == [(True, 0.001), (True, 0.002), (True, 0.04), (True, 0.08)]
    # and a transient failure first uses up the request's fast retry
    delays.clear()
    store.inject("get_file_info", errors.network(), times=2)
    store.inject("get_file_info", errors.throttle(), times=1)
    fs.get_file_info(target)
    assert delays == [(False, 0.001), (False, 0.002), (True, 0.04)]
    assert store.calls["get_file_info"] == 5 + 4


def test_during_a_storm_even_a_first_throttle_waits_the_throttle_schedule(target):
    """Once the endpoint's rate limiter is engaged (under "auto": `throttles` throttles within
    `window` seconds, at least `share` of the requests sent), no throttle is isolated."""
    store, fs, delays = _delays_recorded(
        RetryPolicy(max_attempts=3, initial_delay=0.001, max_delay=1, jitter=False,
                    throttle_delay=0.003),
        rate_limit=RateLimit(mode="auto", throttles=3, window=7.25, min_rate=1e5))
    for _ in range(4):
        store.inject("get_file_info", errors.throttle(), times=1)
        fs.get_file_info(target)
    # the first two throttles were isolated; the third engaged the limiter, as did the fourth
    assert [delay for _, delay in delays] == [0.001, 0.001, 0.003, 0.003]
    assert store.calls["get_file_info"] == 8


class _ClientError(Exception):
    """The shape of botocore's ClientError (the real one is exercised over HTTP below)."""

    def __init__(self, status: int, code: str, headers: dict[str, str]):
        super().__init__(f"An error occurred ({code}) when calling the HeadObject operation")
        self.response = {"Error": {"Code": code, "Message": code},
                         "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": headers}}


class _Response:
    def __init__(self, status: int, headers):
        self.status_code = status
        self.headers = headers


def test_retry_after_is_read_from_every_client():
    import requests
    from aiohttp import ClientResponseError
    from requests.structures import CaseInsensitiveDict

    assert retry_after_of(_ClientError(503, "SlowDown", {"retry-after": "7"})) == 7
    http_error = requests.HTTPError("429", response=_Response(
        429, CaseInsensitiveDict({"Retry-After": "3"})))
    assert retry_after_of(http_error) == 3
    aio = ClientResponseError(None, (), status=503, headers={"Retry-After": "2.5"})  # type: ignore[arg-type]
    assert retry_after_of(aio) == 2.5
    azure_like = type("HttpResponseError", (Exception,), {})("busy")
    azure_like.response = _Response(503, {"x-ms-retry-after-ms": "1500", "Retry-After": "9"})
    assert retry_after_of(azure_like) == 1.5
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 28 <= retry_after_of(_ClientError(503, "SlowDown", {"retry-after": when})) <= 30
    wrapped = OSError("[Errno 16] Please reduce your request rate")
    wrapped.__cause__ = _ClientError(503, "SlowDown", {"retry-after": "4"})
    assert retry_after_of(wrapped) == 4  # found through the cause chain (s3fs's translation)
    assert retry_after_of(_ClientError(503, "SlowDown", {"retry-after": "soon"})) is None
    assert retry_after_of(OSError("AWS Error SLOW_DOWN")) is None


def test_retry_after_sets_the_delay_within_max_delay(target, caplog):
    policy = RetryPolicy(max_attempts=3, initial_delay=0.001, throttle_delay=0.001,
                         max_delay=0.05, jitter=False)
    store = FaultyFileSystem(pafs.LocalFileSystem())
    fs = retryfs.RetryingFileSystem(store, policy)
    events = []
    fs.stats.on_retry(events.append)
    store.inject("get_file_info", lambda: _ClientError(503, "SlowDown", {"retry-after": "0.03"}))
    store.inject("get_file_info", lambda: _ClientError(503, "SlowDown", {"retry-after": "3600"}))
    caplog.set_level(logging.WARNING, logger="retryfs")
    started = time.monotonic()
    fs.get_file_info(target)
    elapsed = time.monotonic() - started
    assert [(e.retry_after, e.delay) for e in events] == [(0.03, 0.03), (3600, 0.05)]
    assert 0.08 <= elapsed < 1
    assert "(throttled, Retry-After 0.03s)" in caplog.records[0].getMessage()


def test_retry_after_past_the_deadline_gives_up_at_once(target):
    policy = RetryPolicy(max_attempts=5, initial_delay=0.001, max_delay=60, deadline=1)
    store = FaultyFileSystem(pafs.LocalFileSystem())
    fs = retryfs.RetryingFileSystem(store, policy)
    store.inject("get_file_info", lambda: _ClientError(503, "SlowDown", {"retry-after": "30"}))
    started = time.monotonic()
    with pytest.raises(_ClientError) as raised:
        fs.get_file_info(target)
    assert time.monotonic() - started < 0.5
    assert "deadline reached" in raised.value.__notes__[-1]


def test_retry_after_from_a_real_s3_endpoint(s3_fault_endpoint, s3_fault_bucket):
    """botocore's ClientError (under s3fs's OSError) carries the endpoint's Retry-After."""
    from retryfs.testing.s3 import S3Fault

    s3_fault_endpoint.put_object(s3_fault_bucket, "k", b"data")
    s3_fault_endpoint.add_fault(S3Fault.slow_down(op="HeadObject", retry_after=0.2, times=1))
    fs = retryfs.RetryingFileSystem(
        s3_fault_endpoint.s3fs(),
        RetryPolicy(max_attempts=3, initial_delay=0.001, max_delay=1, jitter=False))
    events = []
    fs.stats.on_retry(events.append)
    started = time.monotonic()
    info = fs.get_file_info(f"{s3_fault_bucket}/k")
    assert info.size == 4
    [event] = events
    assert event.retry_after == pytest.approx(0.2) and event.delay == pytest.approx(0.2)
    # (a HEAD response has no body, so no SlowDown code: s3fs says EBUSY; still retried)
    assert time.monotonic() - started >= 0.2

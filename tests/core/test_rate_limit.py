"""The per-endpoint rate limiter under throttling: when it engages (`auto`, `on`, `off`), how
it paces, how it lets go, that it never holds an operation past its deadline; and, at the S3
fault endpoint, that a SlowDown storm is asked at a bounded rate by many threads and that every
operation completes.
"""

from __future__ import annotations

import threading
import time

import pyarrow.fs as pafs
import pytest
from _helpers import Clock

import retryfs
from retryfs import RateLimit, RetryPolicy
from retryfs.core.classify import ErrorClassifier
from retryfs.core.engine import Retrier
from retryfs.core.ratelimit import RateLimiter, limiter_for, normalize_rate_limit
from retryfs.core.stats import RetryStats
from retryfs.testing import S3Fault, errors


def _limiter(mode: str = "auto", clock: Clock | None = None, **fields) -> RateLimiter:
    return RateLimiter(RateLimit(mode=mode, **fields), "test", clock=clock or Clock())


def _send(limiter: RateLimiter, clock: Clock, times: int, every: float) -> None:
    for _ in range(times):
        assert limiter.before_send(clock()) == 0
        clock.sleep(every)


# -- engagement ------------------------------------------------------------------------------

def test_auto_engages_at_the_tenth_throttle_within_the_window():
    clock = Clock()
    limiter = _limiter("auto", clock)
    for _ in range(10):  # 10 requests a second, two throttles every second: a fifth
        _send(limiter, clock, 5, 0.1)
        assert not limiter.engaged  # a few throttles: the lanes' backoff is enough
        limiter.throttled(clock())
    assert limiter.engaged and limiter.engagements == 1
    assert limiter.fill_rate == pytest.approx(0.7 * 10, rel=0.25)  # beta x the measured rate


def test_auto_does_not_engage_on_a_small_share_of_throttles():
    """50 requests a second, two throttles every second (4 %, a 5 % fault rate's): each is
    retried on its own; pacing every request would slow the 96 % that succeed."""
    clock = Clock()
    limiter = _limiter("auto", clock)
    for _ in range(30):
        _send(limiter, clock, 25, 0.02)
        limiter.throttled(clock())
    assert not limiter.engaged
    strict = _limiter("auto", clock, share=0.03)  # a share below 4 %: the same is a storm
    for _ in range(10):
        _send(strict, clock, 25, 0.02)
        strict.throttled(clock())
    assert strict.engaged


def test_auto_does_not_engage_on_throttles_spread_over_more_than_the_window():
    clock = Clock()
    limiter = _limiter("auto", clock)
    for _ in range(30):
        limiter.throttled(clock())
        clock.sleep(0.6)  # nine within any 5 s
    assert not limiter.engaged


def test_on_engages_at_the_first_throttle_and_off_never_exists():
    clock = Clock()
    limiter = _limiter("on", clock)
    limiter.throttled(clock())
    assert limiter.engaged
    assert limiter_for(pafs.LocalFileSystem(), RateLimit(mode="off")) is None
    assert normalize_rate_limit(False).mode == "off" and normalize_rate_limit(True).mode == "on"
    assert normalize_rate_limit("AUTO").mode == "auto"


@pytest.mark.parametrize("bad, named", [
    ({"mode": "sometimes"}, "mode"), ({"throttles": 0}, "throttles"),
    ({"window": 0}, "window"), ({"beta": 1.5}, "beta"), ({"min_rate": -1}, "min_rate")])
def test_a_bad_setting_is_a_value_error_naming_it(bad, named):
    with pytest.raises(ValueError, match=f"RateLimit.{named}"):
        RateLimit(**bad)


def test_a_bad_url_value_names_the_parameter(tmp_path):
    with pytest.raises(ValueError, match="retry_rate_limit"):
        retryfs.from_uri(f"{tmp_path.as_uri()}?retry_rate_limit=sometimes")


# -- pacing ----------------------------------------------------------------------------------

def test_an_engaged_limiter_spaces_requests_at_its_rate():
    clock = Clock()
    limiter = _limiter("on", clock, min_rate=2.0)
    limiter.throttled(clock())  # nothing measured yet: the floor, 2 requests a second
    sent = []
    started = clock()
    while len(sent) < 11:
        wait = limiter.before_send(clock())
        if wait:
            clock.sleep(wait)
        else:
            sent.append(clock() - started)
    # the first at once, then one every 0.5 s: 10 intervals, 5 s
    assert sent[0] == 0 and sent[-1] == pytest.approx(5.0)


def test_the_rate_comes_back_after_the_storm_and_auto_lets_go():
    """After the last throttle the rate doubles about every second while requests succeed,
    and `auto` disengages once `window` seconds passed without a throttle."""
    clock = Clock()
    limiter = _limiter("auto", clock, throttles=1)
    limiter.throttled(clock())  # nothing measured: the floor, 0.5 requests a second
    assert limiter.fill_rate == 0.5
    started = clock()
    reached = None
    while limiter.engaged:
        wait = limiter.before_send(clock())
        if wait:
            clock.sleep(wait)
            continue
        limiter.succeeded(clock())
        if reached is None and limiter.fill_rate >= 100:
            reached = clock() - started
    assert reached is not None and reached < 5.0  # (4.57 s: 0.5/s to 100/s)
    assert clock() - started == pytest.approx(5.0, abs=0.5)  # the window, then let go


def test_pacing_never_holds_an_operation_past_its_deadline():
    clock = Clock()
    limiter = _limiter("on", clock)
    limiter.throttled(clock())
    retrier = Retrier(lambda _op: RetryPolicy(deadline=1.5), ErrorClassifier(), RetryStats(),
                      sleep=clock.sleep, clock=clock, limiter=limiter)
    assert limiter.before_send(clock()) == 0  # the one token: the next waits 2 s at 0.5/s
    started = clock()
    assert retrier.call("read", "p", lambda: "done") == "done"
    assert clock() - started == pytest.approx(1.5)  # sent at the deadline, not after it
    assert limiter.paced == 1 and limiter.waited == pytest.approx(1.5)


def test_test_mode_never_paces():
    clock = Clock()
    limiter = _limiter("on", clock)
    limiter.throttled(clock())
    retrier = Retrier(lambda _op: RetryPolicy(), ErrorClassifier(), RetryStats(),
                      sleep=clock.sleep, clock=clock, limiter=limiter)
    with retryfs.no_sleep():
        for _ in range(5):
            retrier.call("read", "p", lambda: None)
    assert clock.slept == []


def test_throttles_seen_by_the_retrier_engage_the_wrappers_limiter(tmp_path):
    """Throttles reach the limiter through the retry engine, on the pyarrow face."""
    from retryfs.testing import FaultyFileSystem

    store = FaultyFileSystem(pafs.LocalFileSystem())
    fs = retryfs.RetryingFileSystem(store, RetryPolicy(max_attempts=5, initial_delay=0,
                                                       throttle_delay=0, max_delay=0),
                                    rate_limit="on", budget=False)
    store.inject("get_file_info", errors.throttle(), times=1)
    fs.get_file_info(str(tmp_path))
    assert fs.rate_limiter is not None and fs.rate_limiter.engaged
    off = retryfs.RetryingFileSystem(FaultyFileSystem(pafs.LocalFileSystem()),
                                     rate_limit="off")
    assert off.rate_limiter is None


# -- a storm at the S3 fault endpoint ----------------------------------------------------------

THREADS = 8
STORM = 1.5  # seconds of SlowDown for every listing


def _storm(endpoint, bucket: str, rate_limit: str) -> tuple[int, int, float]:
    """THREADS threads list the bucket 3 times each while every listing is answered SlowDown
    for STORM seconds: (requests during the storm, requests in all, seconds to finish)."""
    endpoint.put_object(bucket, "d/k", b"v")
    policy = RetryPolicy(max_attempts=1000, initial_delay=0.01, throttle_delay=0.01,
                         max_delay=0.05, deadline=60)
    fs, _ = retryfs.from_uri(endpoint.uri(bucket, retry_rate_limit=rate_limit,
                                          retry_budget="false"))
    fs = retryfs.RetryingFileSystem(fs.unwrap(), policy, config=fs.retry_config.replace(
        policy=policy))
    start = time.monotonic()
    endpoint.add_fault(S3Fault.slow_down(op="ListObjectsV2",
                                         when=lambda _r: time.monotonic() < start + STORM))
    errors_seen: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(3):
                assert [i.path for i in fs.get_file_info(pafs.FileSelector(f"{bucket}/d"))] == [
                    f"{bucket}/d/k"]
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors_seen.append(exc)

    threads = [threading.Thread(target=work) for _ in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    took = time.monotonic() - start
    assert errors_seen == []
    listed = endpoint.requests("ListObjectsV2")
    return len([r for r in listed if r.fault is not None]), len(listed), took


@pytest.mark.slow
def test_a_storm_is_asked_at_a_bounded_rate_and_every_listing_completes(s3_fault_endpoint,
                                                                         s3_fault_bucket):
    unpaced, unpaced_all, _ = _storm(s3_fault_endpoint, s3_fault_bucket, "off")
    s3_fault_endpoint.clear_faults()
    s3_fault_endpoint.reset_record()
    paced, paced_all, took = _storm(s3_fault_endpoint, s3_fault_bucket, "auto")
    assert paced_all - paced == unpaced_all - unpaced == 3 * THREADS  # each listing once done
    # without the limiter 8 lanes ask every ~30 ms (464-478 requests in 3 runs); with it, the
    # lanes' first throttles engage it and the storm is asked at about its floor (9-10)
    assert unpaced >= 100
    assert paced <= unpaced / 10
    assert took < 30

"""Two backoff schedules, chosen by the kind of failure, through the real clients: a
transient fault (500 InternalError, 503 ServiceUnavailable) is retried on the fast schedule
(from `initial_delay`, 0.1 s), a throttle (503 SlowDown, 429) on the slow one (from
`throttle_delay`, 1 s), on both faces, except a request's first two retries after an isolated
throttle (`fast_throttle_retries`), which go on the fast one; a URL parameter or a
per-operation override wins. The delays are those recorded on the retry events (test mode:
nothing is slept), drawn under a fixed seed.
"""

from __future__ import annotations

import random

import pyarrow.fs as pafs

import retryfs
from retryfs import RetryFileSystem, RetryPolicy
from retryfs.testing import S3Fault

# A listing: its error answers carry a body, so the client sees the code (a HEAD's 503 has no
# body: it cannot be told from a 503 ServiceUnavailable, and is transient, as in botocore).
OP = "ListObjectsV2"
KINDS = [False, True, False, True]  # 500 InternalError, 503 SlowDown, 503 ServiceUnavailable, 429


def _transient_then_throttle(endpoint, bucket: str) -> None:
    endpoint.put_object(bucket, "d/k", b"value")
    endpoint.add_fault(S3Fault.internal_error(op=OP, times=1))
    endpoint.add_fault(S3Fault.slow_down(op=OP, times=1))
    endpoint.add_fault(S3Fault.service_unavailable(op=OP, times=1))
    endpoint.add_fault(S3Fault.too_many_requests(op=OP, times=1))


def _delays(fs, call) -> list[tuple[bool, float]]:
    events: list[tuple[bool, float]] = []
    fs.stats.on_retry(lambda e: events.append((e.throttled, round(e.delay, 9))))
    random.seed(20261204)
    with retryfs.no_sleep():
        call()
    return events


def _under_the_seed(policy: RetryPolicy) -> list[tuple[bool, float]]:
    """Full jitter: a uniform draw under each retry's cap, from the same seed."""
    draw = random.Random(20261204)
    fixed = policy.replace(jitter=False)
    return [(throttled, round(draw.uniform(0.0, fixed.delay(
        n, throttled=throttled and policy.throttle_schedule(n))), 9))
        for n, throttled in enumerate(KINDS, 1)]


def _list(fs, bucket: str):
    return lambda: fs.get_file_info(pafs.FileSelector(f"{bucket}/d"))


def test_the_pyarrow_face_as_from_uri_builds_it(s3_fault_endpoint, s3_fault_bucket):
    _transient_then_throttle(s3_fault_endpoint, s3_fault_bucket)
    fs, _ = retryfs.from_uri(s3_fault_endpoint.uri(s3_fault_bucket, retry_budget="false"))
    events = _delays(fs, _list(fs, s3_fault_bucket))
    assert events == _under_the_seed(RetryPolicy())
    # the caps of the two schedules at retries 1-4: 0.1, 2 (throttle), 0.4, 8 (throttle) s
    assert [throttled for throttled, _ in events] == KINDS
    assert events[0][1] <= 0.1 and events[2][1] <= 0.4


def test_the_fsspec_face_as_a_retry_url_builds_it(s3_fault_endpoint, s3_fault_bucket):
    _transient_then_throttle(s3_fault_endpoint, s3_fault_bucket)
    fs = RetryFileSystem(fs=s3_fault_endpoint.s3fs(), budget=False)
    events = _delays(fs, lambda: fs.ls(f"retry::s3://{s3_fault_bucket}/d"))
    assert events == _under_the_seed(RetryPolicy())


def test_url_parameters_set_both_schedules(s3_fault_endpoint, s3_fault_bucket):
    _transient_then_throttle(s3_fault_endpoint, s3_fault_bucket)
    fs, _ = retryfs.from_uri(s3_fault_endpoint.uri(
        s3_fault_bucket, retry_budget="false", retry_jitter="false",
        retry_initial_delay="0.02", retry_throttle_delay="3"))
    assert _delays(fs, _list(fs, s3_fault_bucket)) == [
        (False, 0.02), (True, 0.04), (False, 0.08), (True, 24.0)]


def test_a_per_operation_override_wins(s3_fault_endpoint, s3_fault_bucket):
    _transient_then_throttle(s3_fault_endpoint, s3_fault_bucket)
    fs, _ = retryfs.from_uri(s3_fault_endpoint.uri(
        s3_fault_bucket, retry_budget="false", retry_jitter="false",
        retry_throttle_delay="3", retry_metadata_throttle_delay="0.5",
        retry_metadata_initial_delay="0.001"))
    assert _delays(fs, _list(fs, s3_fault_bucket)) == [
        (False, 0.001), (True, 0.002), (False, 0.004), (True, 4.0)]


def test_retry_after_lengthens_a_throttle_never_a_transient_schedule(s3_fault_endpoint,
                                                                       s3_fault_bucket):
    """s3fs (botocore) shows the server's Retry-After; pyarrow's S3 does not."""
    s3_fault_endpoint.put_object(s3_fault_bucket, "d/k", b"value")
    s3_fault_endpoint.add_fault(S3Fault.slow_down(op=OP, times=1, retry_after=5))
    s3_fault_endpoint.add_fault(S3Fault.internal_error(op=OP, times=1))
    fs = RetryFileSystem(fs=s3_fault_endpoint.s3fs(), budget=False, jitter=False)
    assert _delays(fs, lambda: fs.ls(f"s3://{s3_fault_bucket}/d")) == [(True, 5.0), (False, 0.2)]


def _lone_slow_down(endpoint, bucket: str, times: int = 2) -> S3Fault:
    endpoint.put_object(bucket, "d/k", b"value")
    return endpoint.add_fault(S3Fault.slow_down(op=OP, times=times))


def _cost(endpoint, fault: S3Fault) -> tuple[int, int]:
    """The throttles fired, and the listings sent (each throttled one sent again, once)."""
    return endpoint.fired(fault), len(endpoint.requests(OP))


def test_an_isolated_throttle_is_retried_on_the_fast_schedule_its_third_on_the_slow(
        s3_fault_endpoint, s3_fault_bucket):
    fault = _lone_slow_down(s3_fault_endpoint, s3_fault_bucket, times=3)
    fs, _ = retryfs.from_uri(s3_fault_endpoint.uri(
        s3_fault_bucket, retry_budget="false", retry_jitter="false"))
    # the first two retries: the transient schedule's 0.1 and 0.2 s; the third: the throttle
    # schedule's at a third retry, 4 s
    assert _delays(fs, _list(fs, s3_fault_bucket)) == [(True, 0.1), (True, 0.2), (True, 4.0)]
    assert _cost(s3_fault_endpoint, fault) == (3, 4)


def test_fast_throttle_retries_zero_from_a_url_waits_the_throttle_schedule_at_once(
        s3_fault_endpoint, s3_fault_bucket):
    fault = _lone_slow_down(s3_fault_endpoint, s3_fault_bucket)
    fs = RetryFileSystem(fs=s3_fault_endpoint.s3fs(), budget=False, jitter=False,
                         fast_throttle_retries=0)
    assert _delays(fs, lambda: fs.ls(f"s3://{s3_fault_bucket}/d")) == [(True, 1.0), (True, 2.0)]
    assert _cost(s3_fault_endpoint, fault) == (2, 3)
    s3_fault_endpoint.reset_record()
    fs, _ = retryfs.from_uri(s3_fault_endpoint.uri(
        s3_fault_bucket, retry_budget="false", retry_jitter="false",
        retry_fast_throttle_retries="0"))
    fault = s3_fault_endpoint.add_fault(S3Fault.slow_down(op=OP, times=2))
    assert _delays(fs, _list(fs, s3_fault_bucket)) == [(True, 1.0), (True, 2.0)]
    assert _cost(s3_fault_endpoint, fault) == (2, 3)

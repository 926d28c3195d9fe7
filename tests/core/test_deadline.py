"""The deadline bounds the whole user-visible operation: the first attempt counts, and the
reopens and replays nested inside a stream's retry end by the same deadline.

Time is an injected clock: each failing attempt "takes" its seconds by advancing it, and the
retrier's sleeps advance it too, so the bounds are exact and nothing waits.
"""

from __future__ import annotations

import asyncio

import pyarrow.fs as pafs
import pytest

from retryfs import RetryingFileSystem, RetryPolicy
from retryfs.core.classify import ErrorClassifier
from retryfs.core.engine import Retrier, operation_end
from retryfs.core.stats import RetryStats
from retryfs.datapath.streams import GATHERED
from retryfs.testing.faulty import FaultyFileSystem, errors

DELAY = 0.1
ATTEMPT = 1.5  # what one failing attempt takes on the injected clock
POLICY = RetryPolicy(max_attempts=50, initial_delay=DELAY, multiplier=1, max_delay=DELAY,
                     jitter=False, deadline=2.0)


class Clock:
    """An injected monotonic clock; ``sleep`` advances it."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    async def async_sleep(self, seconds: float) -> None:
        self.now += seconds


def slow(clock: Clock, factory, seconds: float):
    """An error factory whose attempt takes ``seconds`` on ``clock`` before it fails."""
    def make() -> BaseException:
        clock.now += seconds
        return factory()
    return make


def retrier(clock: Clock, policy: RetryPolicy = POLICY) -> Retrier:
    return Retrier(lambda _op: policy, ErrorClassifier(), RetryStats(), sleep=clock.sleep,
                   clock=clock, budget=None, async_sleep=clock.async_sleep)


def failing(clock: Clock, seconds: float, calls: list[str], name: str = "attempt"):
    error = slow(clock, errors.network(), seconds)

    def fn() -> None:
        calls.append(name)
        raise error()
    return fn


def test_the_first_attempt_counts_towards_the_deadline():
    """A 1.5 s first attempt leaves 0.5 s of a 2 s deadline: one retry, not two (a clock
    started after the first failure allows a third attempt, ending at 4.7 s)."""
    clock, calls = Clock(), []
    started = clock.now
    with pytest.raises(OSError) as raised:
        retrier(clock).call("get_file_info", "d/f", failing(clock, ATTEMPT, calls))
    assert len(calls) == 2
    assert clock.now - started <= POLICY.deadline + ATTEMPT
    assert "deadline reached" in raised.value.__notes__[-1]


def test_the_first_attempt_counts_towards_the_deadline_async():
    clock, calls = Clock(), []
    started = clock.now

    async def fn() -> None:
        failing(clock, ATTEMPT, calls)()

    with pytest.raises(OSError) as raised:
        asyncio.run(retrier(clock).acall("get_file_info", "d/f", fn))
    assert len(calls) == 2
    assert clock.now - started <= POLICY.deadline + ATTEMPT
    assert "deadline reached" in raised.value.__notes__[-1]


def test_a_first_attempt_past_the_deadline_is_not_retried():
    clock, calls = Clock(), []
    with pytest.raises(OSError):
        retrier(clock).call("get_file_info", "d/f", failing(clock, 2.5, calls))
    assert calls == ["attempt"]


def test_nested_retries_end_by_the_outer_deadline():
    """An operation whose retry makes a retried call of its own (a reopen inside a write
    retry): the inner call's attempts and sleeps are within the outer deadline."""
    clock, calls = Clock(), []
    r = retrier(clock)
    inner = failing(clock, 0.5, calls, "reopen")
    first = failing(clock, 0.5, calls, "write")

    def outer() -> None:
        if not calls:
            first()
        assert operation_end(clock) == 100.0 + POLICY.deadline  # published to nested calls
        r.call("open_output_stream", "d/f", inner)

    started = clock.now
    with pytest.raises(OSError) as raised:
        r.call("write", "d/f", outer)
    assert clock.now - started <= POLICY.deadline + 0.5
    # write fails at 0.5; reopens fail at 1.1, 1.7, 2.3 and the next would start past 2.0
    assert calls == ["write", "reopen", "reopen", "reopen"]
    assert operation_end(clock) is None  # the window closes with the operation
    assert sum("deadline reached" in note for note in raised.value.__notes__) == 2


@pytest.fixture
def faulty() -> FaultyFileSystem:
    mock = pafs._MockFileSystem()
    mock.create_dir("d")
    return FaultyFileSystem(mock)


def test_a_stream_write_with_failing_reopens_ends_by_the_deadline(faulty):
    """Through the wrapper: a write fails, then every reopen of the stream fails (each taking
    0.5 s). The write's retry, reopens and replay included, ends by the deadline plus one
    attempt; with a deadline per nested call it ran 3.5 s."""
    clock = Clock()
    fs = RetryingFileSystem(faulty, POLICY, budget=False)
    fs.retry_handler.retrier.clock = clock
    fs.retry_handler.retrier.sleep = clock.sleep
    faulty.inject("write", slow(clock, errors.network(), 0.5))
    faulty.inject("open_output_stream", slow(clock, errors.network(), 0.5), skip=1, times=None)
    out = fs.open_output_stream("d/f")
    started = clock.now
    with pytest.raises(OSError, match="NETWORK_CONNECTION"):
        out.write(b"x" * GATHERED)  # as large as GATHERED: handed over at once
    assert clock.now - started <= POLICY.deadline + 0.5
    assert faulty.injected["write"] == 1
    assert faulty.injected["open_output_stream"] == 3
    by_op = fs.stats.snapshot()["by_operation"]
    assert by_op["write"]["giveups"] == 1 and by_op["open_output_stream"]["giveups"] == 1
    out.close()  # a stream that gave up discards, never commits
    assert faulty.get_file_info("d/f").type == pafs.FileType.NotFound


def test_a_stalled_call_with_a_timeout_ends_by_deadline_plus_one_timeout(
        s3_fault_endpoint, s3_fault_bucket):
    """On the S3 endpoint, every HeadObject stalls: with ``timeout=0.5, deadline=1`` the
    second timed-out attempt ends past the deadline, so there is no third (with the clock
    started after the first attempt there was, and the call ran about 1.5 s)."""
    import time

    from retryfs.testing.s3 import S3Fault

    ep = s3_fault_endpoint
    ep.put_object(s3_fault_bucket, "k", b"x")
    stall = ep.add_fault(S3Fault.stall(2.0, op="HeadObject", times=None))
    policy = RetryPolicy(max_attempts=10, initial_delay=0.01, multiplier=1, max_delay=0.01,
                         jitter=False, deadline=1.0)
    fs = RetryingFileSystem(ep.pyarrow_fs(), policy, timeout=0.5, budget=False)
    started = time.monotonic()
    with pytest.raises(TimeoutError) as raised:
        fs.get_file_info(f"{s3_fault_bucket}/k")
    elapsed = time.monotonic() - started
    assert fs.stats.snapshot()["by_operation"]["get_file_info"]["attempts"] == 2
    assert ep.fired(stall) == 2
    assert "deadline reached" in raised.value.__notes__[-1]
    assert elapsed <= policy.deadline + 0.5 + 1.0  # generous slack; the attempts are counted

"""Per-attempt timeouts: a black-holed connection becomes a retry, not a hang."""

from __future__ import annotations

import asyncio
import os
import pickle
import threading
import time

import pyarrow.fs as pafs
import pytest
from _helpers import FAST

import retryfs
from retryfs import RetryPolicy, RetryStats
from retryfs.core.classify import ErrorClassifier
from retryfs.core.engine import Retrier
from retryfs.core.timeouts import AttemptTimeoutError, resolve_timeouts, run_with_timeout
from retryfs.testing import FaultyFileSystem

DATA = bytes(range(256)) * 64  # 16 KiB


@pytest.fixture
def store(tmp_path):
    (tmp_path / "data.bin").write_bytes(DATA)
    faulty = FaultyFileSystem(pafs.LocalFileSystem())
    yield faulty, str(tmp_path / "data.bin")
    faulty.release()  # no stalled thread outlives its test


def test_a_stall_on_the_s3_endpoint_becomes_a_retry(s3_fault_endpoint, s3_fault_bucket):
    """GetObject black-holed: the read times out after 0.3 s, reopens and resumes.

    The stall lasts until the test releases it, after the read has returned: the read cannot
    have waited it out, whatever the machine's load. Counted, not timed: each attempt that
    timed out (the stalled one, and any other the load made slower than 0.3 s) is one retry
    and one GetObject more, and the last GetObject resumes at the offset already read.
    """
    from retryfs.testing.s3 import S3Fault

    s3_fault_endpoint.put_object(s3_fault_bucket, "model.pt", DATA)
    stall = s3_fault_endpoint.add_fault(S3Fault.stall(60, op="GetObject", nth=2, times=1))
    fs = retryfs.RetryingFileSystem(s3_fault_endpoint.pyarrow_fs(), FAST,
                                    timeout={"read": 0.3})
    try:
        with fs.open_input_stream(f"{s3_fault_bucket}/model.pt") as f:
            first = f.read(1000)  # GetObject #1
            rest = f.read()  # GetObject #2 stalls: abandoned, reopened at offset 1000
    finally:
        s3_fault_endpoint.release_stalls()  # (a creation of pyarrow's S3 client waits on it)
    assert first + rest == DATA
    assert s3_fault_endpoint.fired(stall) == 1
    snap = fs.stats.snapshot()
    timeouts = snap["timeouts"]
    assert timeouts >= 1 and snap["by_operation"]["read"]["retries"] == timeouts
    assert snap["errors"] == {"AttemptTimeoutError": timeouts}
    gets = [r for r in s3_fault_endpoint.requests() if r.op == "GetObject"]
    assert len(gets) == 2 + timeouts, [r.headers.get("range") for r in gets]
    assert gets[-1].headers.get("range").startswith("bytes=1000-")


def test_a_stalled_metadata_call_on_the_s3_endpoint_is_retried(s3_fault_endpoint,
                                                                s3_fault_bucket):
    from retryfs.testing.s3 import S3Fault

    s3_fault_endpoint.put_object(s3_fault_bucket, "k", b"abc")
    stall = s3_fault_endpoint.add_fault(S3Fault.stall(60, op="HeadObject", times=1))
    fs = retryfs.RetryingFileSystem(s3_fault_endpoint.pyarrow_fs(), FAST, timeout=0.3)
    try:  # answered before the stall is released: it was not waited out
        assert fs.get_file_info(f"{s3_fault_bucket}/k").size == 3
    finally:
        s3_fault_endpoint.release_stalls()
    assert s3_fault_endpoint.fired(stall) == 1
    timeouts = fs.stats.snapshot()["by_operation"]["get_file_info"]["timeouts"]
    # one timeout per attempt slower than 0.3 s (the stalled one, and any the load slowed)
    assert timeouts >= 1 and s3_fault_endpoint.counts()["HeadObject"] == 1 + timeouts


def test_a_stalled_read_is_abandoned_and_resumed(store):
    faulty, path = store
    faulty.inject("read", stall=30, skip=1, times=1)  # the 2nd read hangs
    fs = retryfs.RetryingFileSystem(faulty, FAST, timeout=0.2)
    started = time.monotonic()
    with fs.open_input_file(path) as f:
        assert f.read(100) == DATA[:100]
        assert f.read(100) == DATA[100:200]  # timed out once, reopened, read at offset 100
        assert f.read() == DATA[200:]
    assert time.monotonic() - started < 3
    snap = fs.stats.snapshot()
    assert snap["timeouts"] == 1 and snap["by_operation"]["read"]["recovered"] == 1
    assert faulty.calls["open_input_file"] == 2


def test_the_abandoned_stream_is_closed_when_its_call_returns(store):
    faulty, path = store
    faulty.inject("read", stall=30, times=1)
    fs = retryfs.RetryingFileSystem(faulty, FAST, timeout=0.2)
    handler = fs.retry_handler
    opened = []
    real_open = handler.inner.open_input_stream

    def spy(p, **options):
        stream = real_open(p, **options)
        opened.append(stream)
        return stream

    handler.inner = type("Spy", (), {"open_input_stream": staticmethod(spy),  # resumes with
                                     "open_input_file": handler.inner.open_input_file})()
    with fs.open_input_stream(path) as f:
        assert f.read() == DATA
    first = opened[0]
    assert not first.closed  # still inside the stalled read: not closed under its feet
    faulty.release()
    deadline = time.monotonic() + 5
    while not first.closed and time.monotonic() < deadline:
        time.sleep(0.01)
    assert first.closed


def test_a_stall_shorter_than_the_timeout_is_just_slow(store):
    faulty, path = store
    faulty.inject("get_file_info", stall=0.05, times=1)
    fs = retryfs.RetryingFileSystem(faulty, FAST, timeout=2)
    assert fs.get_file_info(path).size == len(DATA)
    assert fs.stats.snapshot()["retries"] == 0


def test_every_attempt_stalling_gives_up_in_bounded_time(store):
    faulty, path = store
    faulty.inject("get_file_info", stall=30, times=None)
    fs = retryfs.RetryingFileSystem(faulty, FAST, timeout=0.1)
    started = time.monotonic()
    with pytest.raises(AttemptTimeoutError) as raised:
        fs.get_file_info(path)
    assert time.monotonic() - started < 2
    assert isinstance(raised.value, TimeoutError)
    assert "per-attempt timeout" in str(raised.value)
    snap = fs.stats.snapshot()
    assert snap["giveups"] == 1 and snap["attempts"] == FAST.max_attempts
    # an attempt's thread may time out before it reaches the store on a loaded machine (seen
    # under mutmut: 3 of 4 had), so the store counts at most one call per attempt
    assert 1 <= faulty.calls["get_file_info"] <= FAST.max_attempts


def test_no_timeout_by_default_and_no_thread_hop(store):
    faulty, path = store
    fs = retryfs.RetryingFileSystem(faulty, FAST)
    assert fs.retry_handler.timeouts == {}
    assert "_call" not in vars(fs.retry_handler)  # the untimed path is the plain method
    seen = []
    real = fs.retry_handler.inner.get_file_info

    def where(paths):
        seen.append(threading.current_thread().name)
        return real(paths)

    fs.retry_handler.inner = type("Spy", (), {"get_file_info": staticmethod(where)})()
    fs.get_file_info(path)
    assert seen == [threading.current_thread().name]


def test_timeout_configuration():
    assert resolve_timeouts(None) == {}
    every = resolve_timeouts(5)
    assert every["read"] == every["open_input_stream"] == every["get_file_info"] == 5.0
    assert "write" not in every and "close" not in every and "delete_file" not in every
    mixed = resolve_timeouts({"read": 30, "get_file_info": 2, "metadata": 10})
    assert (mixed["read"], mixed["get_file_info"], mixed["create_dir"]) == (30, 2, 10)
    with pytest.raises(ValueError, match="only reads and metadata"):
        resolve_timeouts({"write": 10})
    with pytest.raises(ValueError, match="only reads and metadata"):
        resolve_timeouts({"close": 10})
    with pytest.raises(ValueError, match="neither a group"):
        resolve_timeouts({"reads": 10})
    with pytest.raises(ValueError, match="> 0"):
        resolve_timeouts(0)


def test_timeouts_travel_by_pickle_and_decide_equality():
    fs = retryfs.RetryingFileSystem(pafs.LocalFileSystem(), timeout={"read": 30})
    clone = pickle.loads(pickle.dumps(fs))
    assert clone == fs and clone.retry_handler.timeouts["read"] == 30
    assert fs != retryfs.RetryingFileSystem(pafs.LocalFileSystem(), timeout={"read": 31})
    assert fs != retryfs.RetryingFileSystem(pafs.LocalFileSystem())


def test_a_timeout_error_of_the_operation_itself_is_not_mistaken():
    def raises():
        raise TimeoutError("the server said so")

    with pytest.raises(TimeoutError, match="the server said so") as raised:
        run_with_timeout(raises, 5, "read", "p")
    assert not isinstance(raised.value, AttemptTimeoutError)


def test_timed_streams_keep_read_buffer_where_the_inner_file_has_it():
    import io

    import pyarrow as pa

    from retryfs.core.timeouts import TimedInputStream

    native = TimedInputStream(pa.BufferReader(b"abcdef"), 5, "read", "p")
    assert native.read_buffer(2).to_pybytes() == b"ab"
    assert native.read_buffer().to_pybytes() == b"cdef"
    assert not hasattr(TimedInputStream(io.BytesIO(b"x"), 5, "read", "p"), "read_buffer")


def test_workers_are_reused():
    names = {run_with_timeout(lambda: threading.current_thread().name, 5, "read", "p")
             for _ in range(20)}
    assert len(names) == 1


def test_a_forked_child_runs_its_timed_attempts():
    """A forked child (multiprocessing's fork, a DataLoader's workers, mutmut's test runs) has
    none of its parent's worker threads: its first timed attempt must run, not go to an idle
    worker of the parent and time out (30 s here, for nothing)."""
    assert run_with_timeout(lambda: "parent", 30, "read", "p") == "parent"  # a worker is idle
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports how its attempt ended, and leaves without pytest
        try:
            outcome = run_with_timeout(lambda: "ran", 30, "read", "p")
        except BaseException as exc:  # noqa: BLE001 - reported to the parent
            outcome = type(exc).__name__
        os.write(write_end, outcome.encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        outcome = reader.read().decode()
    os.waitpid(pid, 0)
    assert outcome == "ran"


# -- the async hook (the fsspec face) ----------------------------------------------------------

def _retrier(timeouts=None, budget=None):
    return Retrier(lambda op: FAST, ErrorClassifier(), RetryStats(), timeouts=timeouts,
                   budget=budget)


def test_acall_times_out_an_attempt_and_retries():
    retrier = _retrier({"cat_file": 0.1})
    calls = []

    async def cat_file(path):
        calls.append(path)
        if len(calls) == 1:
            await asyncio.sleep(30)  # black-holed
        return b"data"

    started = time.monotonic()
    assert asyncio.run(retrier.acall("cat_file", "b/k", cat_file, "b/k")) == b"data"
    assert time.monotonic() - started < 2
    snap = retrier.stats.snapshot()
    assert (snap["retries"], snap["timeouts"], snap["recovered"]) == (1, 1, 1)


def test_acall_retries_transient_errors_and_raises_permanent_ones():
    retrier = _retrier()
    attempts = []

    async def flaky():
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionResetError(104, "Connection reset by peer")
        return 42

    assert asyncio.run(retrier.acall("info", "p", flaky)) == 42

    async def missing():
        raise FileNotFoundError("p")

    with pytest.raises(FileNotFoundError):
        asyncio.run(retrier.acall("info", "p", missing))
    snap = retrier.stats.snapshot()
    assert (snap["calls"], snap["attempts"], snap["retries"]) == (2, 4, 2)


def test_acall_cancellation_reaches_the_attempt():
    retrier = _retrier({"info": 10})

    async def main():
        gate = asyncio.Event()
        stopped = asyncio.Event()

        async def hang():
            gate.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                stopped.set()
                raise

        task = asyncio.ensure_future(retrier.acall("info", "p", hang))
        await gate.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.wait_for(stopped.wait(), 2)

    asyncio.run(main())


def test_acall_in_test_mode_does_not_sleep():
    retrier = Retrier(lambda op: RetryPolicy(max_attempts=3, initial_delay=60, max_delay=600,
                                              jitter=False),
                      ErrorClassifier(), RetryStats())
    attempts = []

    async def flaky():
        attempts.append(1)
        if len(attempts) < 3:
            raise ConnectionResetError(104, "reset")
        return "ok"

    started = time.monotonic()
    with retryfs.no_sleep():
        assert asyncio.run(retrier.acall("info", "p", flaky)) == "ok"
    assert time.monotonic() - started < 1

"""The output side of `retryfs.datapath.streams`, one stream at a time: what lands, which uploads are
aborted and which are never touched again, what is counted, what the caller gets after a
give-up, and how a stream is dropped (`discard`, `abandon_stream`, the replay spool).

`ReplayableOutputStream` writes into in-memory uploads (an object store's semantics: nothing
visible before a successful close) whose faults come from a `FaultyFileSystem` plan (skip,
times, stalls, counted). Timed attempts go through retryfs's own worker pool, made
deterministic: an attempt is running before its timeout starts counting, or is never started
at all (a pool too busy to start it in time). A timed-out attempt is one that cannot finish
until the test releases its stall: no wall-clock margin, no sleep.
"""

from __future__ import annotations

import array
import gc
import gzip
import io
import os
import tempfile
import threading
import weakref
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pytest
from _helpers import open_files_under, sha256
from fsspec.implementations.local import LocalFileSystem as FsspecLocalFileSystem
from fsspec.spec import AbstractBufferedFile
from hypothesis import given, settings
from hypothesis import strategies as st

from retryfs import CommitNotVisibleError, RetryPolicy
from retryfs.core import timeouts
from retryfs.core.classify import ErrorClassifier
from retryfs.core.engine import Retrier
from retryfs.core.stats import RetryEvent, RetryStats
from retryfs.core.timeouts import AttemptTimeoutError
from retryfs.datapath import streams as streams_module
from retryfs.datapath.commits import copy_session
from retryfs.datapath.spool import STAGE, ReplaySpool, replay_spool
from retryfs.datapath.streams import (
    ReplayableOutputStream,
    _drop_abandoned,
    _Sink,
    abandon_stream,
    discard,
)
from retryfs.testing import FaultyFileSystem

PATH = "bucket/model.pt"
POLICY = RetryPolicy(max_attempts=3, initial_delay=0.001, multiplier=1, max_delay=0.001,
                     jitter=False)
ONCE = POLICY.replace(max_attempts=1)
LONG = 60.0  # an attempt's timeout that it always finishes within
TINY = 0.01  # the timeout of an attempt that stalls until the test releases it
STALL = 5.0  # a stall ends by itself after this (only broken code waits that long)
LIMIT = 64 << 20  # the largest object an upload accepts (a runaway replay fails, not hangs)


def reset() -> ConnectionResetError:
    return ConnectionResetError(104, "Connection reset by peer")


class Store:
    """Objects committed by path, every upload opened (in order), and the faults of a
    `FaultyFileSystem` plan: upload ``n`` is ``PATH#n`` to them, so a fault can aim at one."""

    def __init__(self) -> None:
        self.faults = FaultyFileSystem()  # only its fault plan is used
        self.objects: dict[str, bytes] = {}
        self.uploads: list[Upload] = []
        self.lose = 0  # commits to acknowledge and drop (a commit that landed nothing)

    def inject(self, operation: str, error: Any = None, **fault: Any) -> None:
        self.faults.inject(operation, error, **fault)

    def open(self, kind: type[Upload] | None = None) -> Upload:
        self.faults.plan.maybe_fail("open_output_stream", PATH)
        upload = (kind or DiscardableUpload)(self, f"{PATH}#{len(self.uploads) + 1}")
        self.uploads.append(upload)
        return upload


class Upload:
    """One upload, as pyarrow's native output streams: no ``discard``, and closing commits
    (from the destructor too). A failed call breaks it: its later calls fail."""

    def __init__(self, store: Store, key: str) -> None:
        self.store, self.key = store, key
        self.received = bytearray()
        self.write_sizes: list[int] = []
        self.flushes = 0
        self.state = "open"  # open, broken, committed, aborted
        self.threads: set[int] = set()

    def write(self, data: Any) -> int:
        return self._call("write", lambda: self._receive(bytes(data)))

    def flush(self) -> None:
        self._call("flush", self._flushed)

    def close(self) -> None:
        if self.state in ("committed", "aborted"):
            return
        self._call("close", self._commit)

    def __del__(self) -> None:
        if self.state == "open":
            try:
                self.close()
            except Exception:  # noqa: BLE001 - a destructor's close
                pass

    def _call(self, operation: str, work: Callable[[], Any]) -> Any:
        self.threads.add(threading.get_ident())
        if self.state == "broken":
            raise PermissionError(f"upload {self.key} failed earlier")
        try:
            return self.store.faults.plan.run(operation, self.key, work)
        except BaseException:
            self.state = "broken"
            raise

    def _receive(self, data: bytes) -> int:
        if len(self.received) + len(data) > LIMIT:
            raise ValueError("EntityTooLarge")
        self.received += data
        self.write_sizes.append(len(data))
        return len(data)

    def _flushed(self) -> None:
        self.flushes += 1

    def _commit(self) -> None:
        self.state = "committed"
        if self.store.lose:
            self.store.lose -= 1
        else:
            self.store.objects[PATH] = bytes(self.received)


class DiscardableUpload(Upload):
    """An upload that can be aborted (fsspec files: s3fs aborts the multipart upload)."""

    def __init__(self, store: Store, key: str) -> None:
        super().__init__(store, key)
        self.aborted = threading.Event()

    def discard(self) -> None:
        self.state = "aborted"
        self.aborted.set()


class Timeouts:
    """An ``attempt_timeout`` that remembers what it was asked and answers from a script,
    then `LONG`."""

    def __init__(self, *script: float) -> None:
        self.script = list(script)
        self.asked: list[tuple[str, int]] = []

    def __call__(self, operation: str, in_flight: int) -> float:
        self.asked.append((operation, in_flight))
        return self.script.pop(0) if self.script else LONG


class Workers:
    """retryfs's worker pool, deterministic: an attempt is running before its timeout starts
    counting, or (the next ``hold`` ones) is never started: a pool too busy to start it in
    time, which ``run_with_timeout`` then cancels. One that is still waited for after `STALL`
    fails (only an attempt waited for without its timeout gets there), so that broken code
    fails the test instead of hanging it."""

    def __init__(self, pool: Any) -> None:
        self.pool, self.hold = pool, 0

    def submit(self, fn: Callable[[], Any]) -> Future[Any]:
        if self.hold:
            self.hold -= 1
            return self._never_started()
        started = threading.Event()

        def run() -> Any:
            started.set()
            return fn()

        future = self.pool.submit(run)
        started.wait()
        return future

    @staticmethod
    def _never_started() -> Future[Any]:
        held: Future[Any] = Future()

        def overdue() -> None:
            if held.set_running_or_notify_cancel():  # not cancelled by its timeout
                held.set_exception(RuntimeError(f"an attempt never started was waited for "
                                                f"{STALL} s: it had no timeout"))

        timer = threading.Timer(STALL, overdue)
        timer.daemon = True
        held.add_done_callback(lambda _: timer.cancel())
        timer.start()
        return held


@pytest.fixture
def workers(monkeypatch: pytest.MonkeyPatch) -> Workers:
    pool = Workers(timeouts._workers)
    monkeypatch.setattr(timeouts, "_workers", pool)
    return pool


@pytest.fixture
def ungathered(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every timed write its own attempt, as a write of `streams.GATHERED` bytes or more is:
    the tests of per-attempt timeouts write a few bytes at a time."""
    monkeypatch.setattr(streams_module, "GATHERED", 0)


@pytest.fixture
def store() -> Store:
    return Store()


def stream_over(store: Store, *, policy: RetryPolicy = POLICY, kind: type[Upload] | None = None,
                stats: RetryStats | None = None, **options: Any) -> ReplayableOutputStream:
    """A replayable stream over ``store``'s first upload, reopening uploads of ``kind``."""
    retrier = Retrier(lambda _op: policy, ErrorClassifier(), stats or RetryStats(),
                      sleep=lambda _s: None)
    return ReplayableOutputStream(PATH, store.open(kind), lambda: store.open(kind), retrier,
                                  **options)


def by_operation(stats: RetryStats, operation: str) -> dict[str, Any]:
    return stats.snapshot()["by_operation"][operation]


def retried(stats: RetryStats) -> list[RetryEvent]:
    """Every retry that ``stats`` hears of from now on."""
    events: list[RetryEvent] = []
    stats.on_retry(events.append)
    return events


def pairs(events: list[RetryEvent]) -> list[tuple[str, str]]:
    return [(event.operation, event.path) for event in events]


# -- the happy path ---------------------------------------------------------------------------

def test_bytes_land_through_the_first_upload_on_the_callers_thread(store: Store) -> None:
    stats, commits = RetryStats(), []
    stream = stream_over(store, stats=stats, on_commit=lambda *c: commits.append(c))
    data = [b"a", b"bc", bytearray(b"def"), memoryview(array.array("i", [7, 8]))]
    assert [stream.write(chunk) for chunk in data] == [1, 2, 3, 8]
    assert stream.tell() == stream.bytes_written == 14
    stream.flush()
    stream.close()
    assert store.objects[PATH] == b"abcdef" + array.array("i", [7, 8]).tobytes()
    [upload] = store.uploads  # no replay, no fresh upload
    assert upload.flushes == 1  # the caller's flush reached it; the close's own flush did not
    assert upload.threads == {threading.get_ident()}  # untimed: no hop to a worker thread
    assert commits == [(PATH, None)]
    assert stats.snapshot()["bytes_replayed"] == 0
    assert by_operation(stats, "write")["calls"] == 4
    assert by_operation(stats, "close")["calls"] == 1


def test_a_closed_stream_refuses_writes_and_ignores_flush_and_close(store: Store) -> None:
    stream = stream_over(store)
    stream.write(b"abc")
    stream.close()
    stream.flush()
    stream.close()
    with pytest.raises(ValueError) as caught:
        stream.write(b"more")
    assert str(caught.value) == "I/O operation on closed retryfs output stream"
    assert store.objects[PATH] == b"abc" and len(store.uploads) == 1
    assert store.uploads[0].flushes == 0


def test_pythons_buffered_writer_accepts_it_as_its_raw_stream(store: Store) -> None:
    with io.BufferedWriter(stream_over(store), buffer_size=4) as out:
        out.write(b"abcdefgh")
        out.write(b"ij")
    assert store.objects[PATH] == b"abcdefghij"


class NoCloseWriter(io.IOBase):
    """torch DCP's wrapper of its raw stream (``transform_save_stream``): its close, run by
    ``io.IOBase.__del__`` when the collector finds it, flushes the raw stream."""

    def __init__(self, raw: Any) -> None:
        self.raw = raw

    def close(self) -> None:
        self.raw.flush()


class HeldSpool:
    """A replay spool whose next write runs ``during`` first: a write of the stream is then
    in progress, its lock held and its upload there, as while it spools a large write."""

    def __init__(self, spool: Any, during: Callable[[], Any]) -> None:
        self.spool, self.during = spool, during

    def write(self, data: Any) -> Any:
        during, self.during = self.during, lambda: None
        during()
        return self.spool.write(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.spool, name)


def _returns(call: Callable[[], Any]) -> bool:
    """Whether ``call`` returned (on a helper thread, so that a deadlocked call fails the test
    instead of hanging it; only broken code reaches the bound)."""
    done = threading.Event()
    threading.Thread(target=lambda: (call(), done.set()), daemon=True).start()
    return done.wait(STALL)


def test_a_finalizer_s_flush_inside_a_write_on_its_own_thread_returns(store: Store) -> None:
    """The collector runs a dropped wrapper's finalizer on whichever thread allocates: here
    the writing thread, inside the write (a plain lock taken again would never be given)."""
    stream = stream_over(store)

    def collect() -> None:
        wrapper = NoCloseWriter(stream)
        del wrapper  # its __del__ flushes the stream whose write is in progress

    stream._spool = HeldSpool(stream._spool, collect)  # type: ignore[assignment]
    assert _returns(lambda: stream.write(b"abc"))
    assert store.uploads[0].flushes == 0  # that flush found the write and left it the bytes
    stream.close()
    assert store.objects[PATH] == b"abc"


def test_a_flush_from_another_thread_during_a_write_returns_at_once(store: Store) -> None:
    """As DCP's wrapper, collected on fsspec's event loop while a write that will need that
    loop holds the stream: waiting for the write would wait for ever."""
    entered, release = threading.Event(), threading.Event()
    stream = stream_over(store)
    stream._spool = HeldSpool(  # type: ignore[assignment]
        stream._spool, lambda: (entered.set(), release.wait(STALL)))
    writer = threading.Thread(target=stream.write, args=(b"abc",))
    writer.start()
    assert entered.wait(STALL)
    try:
        assert _returns(stream.flush)
        assert store.uploads[0].flushes == 0
    finally:
        release.set()
        writer.join()
    stream.flush()  # nothing in progress: this one reaches the upload
    stream.close()
    assert store.objects[PATH] == b"abc" and store.uploads[0].flushes == 1


class ItemUpload(DiscardableUpload):
    """An upload that reads its argument item by item, as Python code that treats it like
    ``bytes`` does (a pure-Python checksum, ``data[0]``, ``data == b"..."``)."""

    def __init__(self, store: Store, key: str) -> None:
        super().__init__(store, key)
        self.items: list[list[int]] = []

    def write(self, data: Any) -> int:
        self.items.append(list(data))
        return super().write(data)


def test_the_upload_is_handed_unsigned_bytes_whatever_the_callers_buffer(store: Store) -> None:
    stream = stream_over(store, kind=ItemUpload)
    stream.write(array.array("b", [-1, -128, 5]))  # signed items
    stream.write(b"\xff\x80")
    stream.close()
    [upload] = store.uploads
    assert isinstance(upload, ItemUpload)
    assert upload.items == [[255, 128, 5], [255, 128]]  # what bytes(...) of each would index
    assert store.objects[PATH] == b"\xff\x80\x05\xff\x80"

# -- a failed call: a fresh upload, the spool replayed ---------------------------------------

@pytest.mark.parametrize("spool_memory", [0, 1 << 20])  # a temporary file / memory
def test_a_failed_write_is_replayed_into_a_fresh_upload(store: Store, spool_memory: int) -> None:
    stats = RetryStats()
    events = retried(stats)
    store.inject("write", reset, skip=2)  # the third write breaks the first upload
    stream = stream_over(store, stats=stats, spool_memory=spool_memory)
    for chunk in (b"a", b"bc", b"def", b"ghij"):
        stream.write(chunk)
    stream.close()
    assert store.objects[PATH] == b"abcdefghij"
    first, fresh = store.uploads
    assert first.state == "aborted"  # dropped without a commit
    assert fresh.write_sizes == [6, 4]  # the replay (the failed write in it), then the next
    assert store.faults.injected["write"] == 1
    assert pairs(events) == [("write", PATH)]
    assert by_operation(stats, "write")["retries"] == 1
    assert by_operation(stats, "write")["bytes_replayed"] == 6


@pytest.mark.parametrize("operation", ["flush", "close"])
def test_a_failed_flush_or_close_is_replayed_into_a_fresh_upload(store: Store,
                                                                 operation: str) -> None:
    stats = RetryStats()
    events = retried(stats)
    store.inject(operation, reset)
    stream = stream_over(store, stats=stats)
    stream.write(b"abc")
    stream.flush()
    stream.close()
    assert store.objects[PATH] == b"abc"
    first, fresh = store.uploads
    assert first.state == "aborted" and fresh.state == "committed"
    assert fresh.flushes == (1 if operation == "flush" else 0)
    assert pairs(events) == [(operation, PATH)]
    assert by_operation(stats, operation)["retries"] == 1
    assert by_operation(stats, "write")["bytes_replayed"] == 3


def test_a_reopen_that_fails_is_retried_with_its_replay(store: Store) -> None:
    stats = RetryStats()
    store.inject("write", reset, skip=1)
    store.inject("open_output_stream", reset, skip=1)  # the first reopen fails
    stream = stream_over(store, stats=stats)
    stream.write(b"ab")
    stream.write(b"cd")
    stream.close()
    assert store.objects[PATH] == b"abcd"
    assert [u.state for u in store.uploads] == ["aborted", "committed"]
    assert store.faults.injected["open_output_stream"] == 1
    assert by_operation(stats, "write")["retries"] == 2


def test_a_replay_larger_than_a_chunk_goes_out_in_chunks(store: Store) -> None:
    chunk = streams_module.REPLAY_CHUNK
    data = [os.urandom(chunk), os.urandom(1000), b"xyz"]
    stats = RetryStats()
    store.inject("write", reset, skip=2)
    stream = stream_over(store, stats=stats)
    for piece in data:
        stream.write(piece)
    stream.close()
    assert store.uploads[1].write_sizes == [chunk, 1003]  # never more than a chunk in memory
    assert by_operation(stats, "write")["bytes_replayed"] == chunk + 1003
    assert sha256(store.objects[PATH]) == sha256(b"".join(data))  # (a cheap diff if not)


# -- give-ups: nothing committed, the stream refuses to go on --------------------------------

@pytest.mark.parametrize("with_hook", [True, False])
def test_a_write_that_gives_up_commits_nothing_and_refuses_more(store: Store,
                                                               with_hook: bool) -> None:
    gave_up: list[bool] = []
    stats = RetryStats()
    store.inject("write", reset, times=None)
    stream = stream_over(store, stats=stats,
                         on_give_up=(lambda: gave_up.append(True)) if with_hook else None)
    with pytest.raises(ConnectionResetError):  # the error itself, not the hook's
        stream.write(b"abc")
    assert gave_up == ([True] if with_hook else [])
    with pytest.raises(OSError) as caught:
        stream.write(b"more")
    assert str(caught.value) == (f"retryfs output stream for {PATH!r} failed earlier; "
                                 "it cannot be written to")
    stream.flush()
    stream.close()
    assert store.objects == {}
    assert [u.state for u in store.uploads] == ["aborted"] * 3
    assert sum(u.flushes for u in store.uploads) == 0
    assert by_operation(stats, "write")["giveups"] == 1
    assert gave_up == ([True] if with_hook else [])  # once


def test_a_close_that_gives_up_is_reported_as_a_failed_commit(store: Store) -> None:
    commits: list[tuple[str, BaseException | None]] = []
    store.inject("close", reset, times=None)
    with copy_session() as session:
        stream = stream_over(store, on_commit=lambda *c: commits.append(c))
        stream.write(b"abc")
        with pytest.raises(ConnectionResetError) as caught:
            stream.close()
    assert stream.closed
    assert commits == [(PATH, caught.value)]
    assert session.failed == {PATH: caught.value}  # the copy_files guard hears of it
    assert store.objects == {}


# -- verification after the commit ------------------------------------------------------------

class Verify:
    """``verify(path, size)``: whether ``store`` holds ``size`` bytes at ``path``, after the
    errors in ``errors`` (one per call)."""

    def __init__(self, store: Store, *errors: BaseException) -> None:
        self.store, self.errors = store, list(errors)
        self.asked: list[tuple[str, int]] = []

    def __call__(self, path: str, size: int, digest: object = None,
                 before: object = None) -> bool:
        # (the stream hands its digest and the earlier state too: `retryfs.core.proof`)
        self.asked.append((path, size))
        if self.errors:
            raise self.errors.pop(0)
        landed = self.store.objects.get(path)
        return landed is not None and len(landed) == size


def test_a_failed_check_is_retried_alone_and_sends_nothing_again(store: Store) -> None:
    stats = RetryStats()
    events = retried(stats)
    verify = Verify(store, reset())
    stream = stream_over(store, stats=stats, verify=verify)
    stream.write(b"abc")
    stream.close()
    assert verify.asked == [(PATH, 3), (PATH, 3)]
    assert len(store.uploads) == 1 and store.objects[PATH] == b"abc"
    assert pairs(events) == [("verify", PATH)]
    assert by_operation(stats, "verify")["retries"] == 1


def test_a_commit_that_landed_nothing_is_committed_again(store: Store) -> None:
    stats = RetryStats()
    store.lose = 1
    stream = stream_over(store, stats=stats, verify=Verify(store))
    stream.write(b"abc")
    stream.close()
    assert store.objects[PATH] == b"abc"
    assert [u.state for u in store.uploads] == ["committed", "committed"]
    assert by_operation(stats, "close")["retries"] == 1
    assert by_operation(stats, "write")["bytes_replayed"] == 3


def test_an_unchanged_destination_is_committed_again_a_second_later(store: Store) -> None:
    """The check finds the object just as it was before the write (`UNCHANGED`: its commit
    lost, or the same bytes within the old object's second): the commit is made again after
    one second, not on the backoff schedule, so that it lands in another second."""
    from retryfs.core.proof import UNCHANGED

    slept: list[float] = []
    verdicts = [UNCHANGED, True]
    retrier = Retrier(lambda _op: RetryPolicy(max_attempts=3, initial_delay=0.001,
                                              max_delay=30, jitter=False),
                      ErrorClassifier(), RetryStats(), sleep=slept.append)
    stream = ReplayableOutputStream(PATH, store.open(), store.open, retrier,
                                    verify=lambda *_: verdicts.pop(0))
    stream.write(b"abc")
    stream.close()
    assert slept == [1.0] and verdicts == []
    assert [u.state for u in store.uploads] == ["committed", "committed"]


def test_the_retry_after_of_an_unchanged_destination_is_capped_by_max_delay(
        store: Store) -> None:
    from retryfs.core.proof import UNCHANGED

    slept: list[float] = []
    retrier = Retrier(lambda _op: POLICY, ErrorClassifier(), RetryStats(), sleep=slept.append)
    stream = ReplayableOutputStream(PATH, store.open(), store.open, retrier,
                                    verify=lambda *_: UNCHANGED)
    stream.write(b"abc")
    with pytest.raises(CommitNotVisibleError) as caught:
        stream.close()
    assert caught.value.retry_after == 1.0
    assert slept == [POLICY.max_delay] * 2  # the policy's own bound still holds


def test_a_commit_that_never_lands_raises_commit_not_visible(store: Store) -> None:
    commits: list[tuple[str, BaseException | None]] = []
    store.lose = 99
    stream = stream_over(store, verify=Verify(store), on_commit=lambda *c: commits.append(c))
    stream.write(b"abc")
    with pytest.raises(CommitNotVisibleError) as caught:
        stream.close()
    assert str(caught.value).startswith(
        f"{PATH!r} was committed but does not hold the 3 bytes written")
    assert commits == [(PATH, caught.value)]
    assert len(store.uploads) == POLICY.max_attempts


def test_a_check_that_gives_up_raises_its_error_after_one_commit(store: Store) -> None:
    commits: list[tuple[str, BaseException | None]] = []
    denied = PermissionError("HeadObject: Access Denied")
    stream = stream_over(store, verify=Verify(store, denied),
                         on_commit=lambda *c: commits.append(c))
    stream.write(b"abc")
    with pytest.raises(PermissionError) as caught:
        stream.close()
    assert caught.value is denied and commits == [(PATH, denied)]
    assert stream.closed
    assert store.objects[PATH] == b"abc" and len(store.uploads) == 1  # not sent again


# -- per-attempt timeouts ----------------------------------------------------------------------

def test_timed_attempts_run_on_a_worker_with_time_for_their_bytes(store: Store,
                                                                  workers: Workers, ungathered: None) -> None:
    limits = Timeouts()
    stream = stream_over(store, attempt_timeout=limits)
    stream.write(b"abc")
    stream.write(b"defg")
    stream.flush()
    stream.close()
    assert store.objects[PATH] == b"abcdefg"
    assert limits.asked == [("write", 3), ("write", 4), ("flush", 7), ("close", 7)]
    assert threading.get_ident() not in store.uploads[0].threads


def test_small_timed_writes_are_handed_over_together(store: Store, workers: Workers,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streams_module, "GATHERED", 8)
    limits = Timeouts()
    stream = stream_over(store, attempt_timeout=limits)
    stream.write(b"abc")
    stream.write(b"defg")
    assert limits.asked == [] and store.uploads[0].write_sizes == []  # gathered, not sent
    assert stream.tell() == 7
    stream.write(b"hi")  # reaches GATHERED: one attempt hands over what waits, then it
    stream.write(b"jk")
    stream.flush()  # hands over what waits first
    stream.write(b"l" * 8)  # as large as GATHERED: handed over at once
    stream.write(b"m")
    stream.close()  # hands over what waits, then commits
    assert store.objects[PATH] == b"abcdefghijk" + b"l" * 8 + b"m"
    [upload] = store.uploads
    assert upload.write_sizes == [7, 2, 2, 8, 1] and upload.flushes == 1
    assert limits.asked == [("write", 9), ("write", 2), ("flush", 11), ("write", 8),
                            ("write", 1), ("close", 20)]


def test_untimed_writes_are_handed_over_at_once(store: Store) -> None:
    stream = stream_over(store)
    stream.write(b"abc")
    assert store.uploads[0].write_sizes == [3]
    stream.close()
    assert store.objects[PATH] == b"abc"


@pytest.mark.parametrize("when", ["write", "flush", "close"])
def test_a_failed_hand_over_of_gathered_writes_replays_them_all(
        store: Store, workers: Workers, monkeypatch: pytest.MonkeyPatch, when: str) -> None:
    monkeypatch.setattr(streams_module, "GATHERED", 8)
    stats = RetryStats()
    events = retried(stats)
    store.inject("write", reset, times=1)  # the first hand-over to the first upload
    stream = stream_over(store, stats=stats, attempt_timeout=Timeouts())
    stream.write(b"abc")
    stream.write(b"defg")
    if when == "write":
        stream.write(b"h" * 8)
    elif when == "flush":
        stream.flush()
    stream.close()
    expected = b"abcdefg" + (b"h" * 8 if when == "write" else b"")
    assert store.objects[PATH] == expected
    assert store.faults.injected["write"] == 1
    broken, fresh = store.uploads
    assert broken.state == "aborted" and fresh.received == expected
    assert pairs(events) == [("write", PATH)]
    assert stats.snapshot()["bytes_replayed"] == len(expected)


def test_gathered_writes_that_give_up_commit_nothing(store: Store, workers: Workers,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(streams_module, "GATHERED", 8)
    store.inject("write", reset, times=None)
    stream = stream_over(store, attempt_timeout=Timeouts())
    stream.write(b"abc")  # gathered: its failure comes with the hand-over, at close
    with pytest.raises(ConnectionResetError):
        stream.close()
    assert store.faults.injected["write"] == POLICY.max_attempts  # one per attempt
    assert stream.closed and store.objects == {}
    assert len(store.uploads) == POLICY.max_attempts
    assert all(upload.state == "aborted" for upload in store.uploads)


def test_a_replay_attempt_gets_time_for_every_byte_it_sends(store: Store,
                                                            workers: Workers, ungathered: None) -> None:
    limits = Timeouts()
    store.inject("write", reset, skip=1)
    stream = stream_over(store, attempt_timeout=limits)
    stream.write(b"abc")
    stream.write(b"defg")
    stream.close()
    assert store.objects[PATH] == b"abcdefg"
    assert limits.asked == [("write", 3), ("write", 4), ("write", 7), ("close", 7)]


def test_a_stalled_write_is_retried_and_its_upload_aborted_when_it_ends(
        store: Store, workers: Workers, ungathered: None) -> None:
    stats = RetryStats()
    limits = Timeouts(LONG, TINY)
    store.inject("write", stall=STALL, skip=1, path=f"{PATH}#1")
    stream = stream_over(store, stats=stats, attempt_timeout=limits)
    stream.write(b"abc")
    stream.write(b"defg")  # stalls, times out: a fresh upload gets the replay
    stream.close()
    assert store.objects[PATH] == b"abcdefg"
    stalled, fresh = store.uploads
    assert stalled.state == "open"  # still stalled: never closed under it
    store.faults.release()
    assert stalled.aborted.wait(STALL)  # dropped when its write ended, never committed
    assert stalled.state == "aborted" and store.objects[PATH] == b"abcdefg"
    assert fresh.write_sizes == [7]
    assert limits.asked == [("write", 3), ("write", 4), ("write", 7), ("close", 7)]
    assert stats.snapshot()["timeouts"] == 1


def test_a_write_that_times_out_every_time_gives_up_with_the_timeout(
        store: Store, workers: Workers, ungathered: None) -> None:
    store.inject("write", stall=STALL)
    stream = stream_over(store, policy=ONCE, attempt_timeout=Timeouts(TINY))
    with pytest.raises(AttemptTimeoutError) as caught:
        stream.write(b"abc")
    assert (caught.value.operation, caught.value.path) == ("write", PATH)
    stream.close()
    store.faults.release()
    assert store.uploads[0].aborted.wait(STALL)
    assert store.objects == {}


def test_an_attempt_never_started_is_retried_on_the_same_upload(store: Store,
                                                                workers: Workers, ungathered: None) -> None:
    stats = RetryStats()
    limits = Timeouts(LONG, TINY)
    stream = stream_over(store, stats=stats, attempt_timeout=limits)
    stream.write(b"abc")
    workers.hold = 1
    stream.write(b"defg")
    stream.close()
    assert store.objects[PATH] == b"abcdefg"
    [upload] = store.uploads  # untouched by the timed-out attempt: no replay needed
    assert upload.write_sizes == [3, 4]
    assert limits.asked == [("write", 3), ("write", 4), ("write", 4), ("close", 7)]
    assert stats.snapshot()["timeouts"] == 1 and stats.snapshot()["bytes_replayed"] == 0


@pytest.mark.parametrize("kind", [Upload, DiscardableUpload])
def test_a_give_up_on_an_attempt_never_started_never_commits_its_upload(
        store: Store, workers: Workers, ungathered: None, kind: type[Upload]) -> None:
    """The upload is untouched and healthy, holding a prefix: closing it would commit that
    prefix. It is aborted where it can be, else kept unclosed (`abandon_stream`)."""
    stream = stream_over(store, policy=ONCE, kind=kind, attempt_timeout=Timeouts(LONG, TINY))
    stream.write(b"abc")
    workers.hold = 1
    with pytest.raises(AttemptTimeoutError):
        stream.write(b"defg")
    stream.flush()
    stream.close()
    [upload] = store.uploads
    del stream
    gc.collect()
    assert store.objects == {}
    assert upload.flushes == 0  # nothing more was sent after the give-up
    assert upload.state == ("open" if kind is Upload else "aborted")


# -- dropping a stream --------------------------------------------------------------------------

class BufferedUpload(AbstractBufferedFile):
    """An fsspec buffered upload, as s3fs's: parts go out as the buffer fills, the last one
    commits at close (and from ``__del__``, as fsspec files do); ``discard`` aborts."""

    def __init__(self, store: Store, **kwargs: Any) -> None:
        self.store, self.sent, self.aborted = store, bytearray(), False
        super().__init__(None, PATH, **kwargs)

    def _initiate_upload(self) -> None:
        pass

    def _upload_chunk(self, final: bool = False) -> bool:
        self.sent += self.buffer.getvalue()
        if final:
            self.store.objects[PATH] = bytes(self.sent)
        return True

    def discard(self) -> None:
        self.aborted = True


class BufferedDownload(AbstractBufferedFile):
    """An fsspec read file whose close releases its connection (HTTP, streamed reads)."""

    def __init__(self, data: bytes) -> None:
        self.data, self.released = data, False
        super().__init__(None, PATH, mode="rb", size=len(data))

    def _fetch_range(self, start: int, end: int) -> bytes:
        return self.data[start:end]

    def close(self) -> None:
        self.released = True
        super().close()


class UpdateFile:
    """A file open for reading and writing (``rb+``): its close would write."""

    mode = "rb+"

    def __init__(self) -> None:
        self.discarded = self.closed = False

    def discard(self) -> None:
        self.discarded = True

    def close(self) -> None:
        self.closed = True


def test_discard_aborts_an_upload_and_never_closes_it(store: Store) -> None:
    upload = store.open()
    upload.write(b"abc")
    discard(upload)
    assert upload.state == "aborted" and store.objects == {}


def test_discard_of_an_fsspec_upload_aborts_it_and_its_destructor_commits_nothing(
        store: Store) -> None:
    upload = BufferedUpload(store, mode="wb")
    upload.write(b"abc")
    discard(upload)
    assert upload.aborted and upload.closed
    del upload
    gc.collect()
    assert store.objects == {}


def test_discard_closes_a_read_only_file(tmp_path: Any) -> None:
    download = BufferedDownload(b"abc")
    assert download.read(1) == b"a"
    discard(download)
    assert download.released and download.closed
    (tmp_path / "f").write_bytes(b"abc")
    plain = open(tmp_path / "f", "rb")  # noqa: SIM115 - discard closes it
    discard(plain)
    assert plain.closed


def test_discard_never_closes_a_file_open_for_update() -> None:
    update = UpdateFile()
    discard(update)
    assert update.discarded and not update.closed


def test_discard_closes_what_cannot_be_discarded(store: Store, tmp_path: Any) -> None:
    packed = gzip.GzipFile(fileobj=io.BytesIO(), mode="wb")  # its mode is a number
    discard(packed)
    assert packed.closed
    local = FsspecLocalFileSystem().open(str(tmp_path / "f"), "wb")  # discard() refuses
    local.write(b"abc")
    discard(local)
    assert local.closed and (tmp_path / "f").read_bytes() == b"abc"
    broken = store.open(Upload)
    store.inject("write", reset)
    with pytest.raises(ConnectionResetError):
        broken.write(b"abc")
    discard(broken)  # its close fails: the error is swallowed
    assert store.objects == {}


def test_abandon_stream_aborts_what_it_can_and_keeps_the_rest_unclosed(store: Store) -> None:
    discardable = store.open()
    abandon_stream(discardable)
    assert discardable.state == "aborted"
    native = Upload(store, "native")  # nothing else holds it
    native.write(b"prefix")
    kept = weakref.ref(native)
    abandon_stream(native)
    del native
    gc.collect()
    survivor = kept()  # never destroyed: its destructor would commit the prefix
    assert survivor is not None and survivor.state == "open" and store.objects == {}


def test_an_abandoned_attempt_that_committed_is_let_go(store: Store) -> None:
    committed = Upload(store, "committed")  # nothing else holds it
    committed.close()
    sink = _Sink(committed)
    sink.closed = True
    gone = weakref.ref(committed)
    _drop_abandoned(sink)
    del committed, sink
    gc.collect()
    assert gone() is None  # not kept forever: it committed already
    _drop_abandoned(None)  # a replay whose reopen never returned: nothing to drop
    live = store.open()
    _drop_abandoned(_Sink(live))
    assert live.state == "aborted"


# -- the replay spool -----------------------------------------------------------------------------

@pytest.mark.parametrize("memory", [0, 1, 1000])
def test_the_spool_spills_to_a_temporary_file_past_its_memory(
        memory: int, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    spool = replay_spool(memory)
    spool.write(b"x" * memory)
    assert open_files_under(tmp_path) == []  # no file before a byte goes past the memory
    spool.write(b"y")
    assert len(open_files_under(tmp_path)) == 1
    spool.seek(0)
    assert spool.read() == b"x" * memory + b"y"
    spool.close()
    assert open_files_under(tmp_path) == []


def _file_bytes_under(directory: Any) -> int:
    return sum(os.stat(f"/proc/self/fd/{fd}").st_size for fd in os.listdir("/proc/self/fd")
               if os.path.exists(f"/proc/self/fd/{fd}")
               and os.readlink(f"/proc/self/fd/{fd}").startswith(str(directory) + os.sep))


@settings(max_examples=50, deadline=None)
@given(memory=st.integers(0, 64), writes=st.lists(st.binary(max_size=40), max_size=8),
       reads=st.lists(st.tuples(st.integers(0, 300), st.integers(1, 50)), max_size=8))
def test_the_spool_keeps_its_memory_part_when_it_spills_and_reads_back_every_byte(
        memory: int, writes: list[bytes], reads: list[tuple[int, int]]) -> None:
    """Only the bytes past ``memory`` go to the file (``SpooledTemporaryFile`` would move
    all it held there), in whole stages (16 bytes here), and a read from any offset gives the
    bytes written there: from memory, the file or the stage being filled."""
    with tempfile.TemporaryDirectory() as directory, ReplaySpool(memory, stage=16) as spool:
        original = tempfile.tempdir
        tempfile.tempdir = directory
        try:
            for data in writes:
                spool.write(data)
        finally:
            tempfile.tempdir = original
        written = b"".join(writes)
        for offset, size in reads:
            spool.seek(offset)
            got = b""
            while len(got) < size and (chunk := spool.read(size - len(got))):
                got += chunk
            assert got == written[offset:offset + size]
        spool.seek(0)
        assert spool.read() == written
        assert _file_bytes_under(directory) == max(0, len(written) - memory) // 16 * 16


def _direct_io(fd: int) -> bool:
    flags = next(line for line in open(f"/proc/self/fdinfo/{fd}") if line.startswith("flags"))
    return bool(int(flags.split()[1], 8) & getattr(os, "O_DIRECT", 0))


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="direct I/O is Linux's")
def test_the_spill_file_is_written_with_direct_io_and_read_back_through_the_page_cache(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A spool is written once and read only for a replay: its file bypasses the page cache
    (whole, aligned stages), and a replay's reads of any offset and size turn that off."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    data = os.urandom(2 * STAGE + 12345)
    with replay_spool(1000) as spool:
        for start in range(0, len(data), 777_777):
            spool.write(data[start:start + 777_777])
        [name] = open_files_under(tmp_path)
        fd = next(int(fd) for fd in os.listdir("/proc/self/fd")
                  if os.path.exists(f"/proc/self/fd/{fd}")
                  and os.readlink(f"/proc/self/fd/{fd}") == name)
        assert _direct_io(fd)
        spool.seek(999)  # straddles memory, file, and the stage being filled
        assert spool.read() == data[999:]
        assert not _direct_io(fd) and os.fstat(fd).st_size == 2 * STAGE  # whole stages only
        spool.write(b"more")  # after a replay's reads: the next stage through the page cache
        spool.seek(len(data) - 3)
        assert spool.read() == data[-3:] + b"more"


@pytest.mark.skipif(not hasattr(os, "O_DIRECT"), reason="direct I/O is Linux's")
def test_a_spill_file_where_direct_io_is_refused_goes_through_the_page_cache(
        tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import errno
    import fcntl

    def refusing(fd: int, command: int, arg: int = 0) -> int:  # as some filesystems do
        if command == fcntl.F_SETFL and arg & os.O_DIRECT:
            raise OSError(errno.EINVAL, "Invalid argument")
        return real(fd, command, arg)

    real = fcntl.fcntl
    monkeypatch.setattr(fcntl, "fcntl", refusing)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    data = os.urandom(STAGE + 5)
    with replay_spool(0) as spool:
        spool.write(data)
        assert spool._tail is not None and spool._tail.direct is False
        spool.seek(0)
        assert spool.read() == data


@pytest.mark.parametrize("memory", [0, 10])
def test_a_spill_file_is_named_for_retryfs_where_it_has_a_name(
        memory: int, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without O_TMPFILE (macOS, Windows, some filesystems) the temporary file has a name
    while it is created: ``retryfs-...``."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(tempfile, "_O_TMPFILE_WORKS", False, raising=False)
    with replay_spool(memory) as spool:
        spool.write(b"z" * 11)
        [name] = open_files_under(tmp_path)
    assert os.path.basename(name).startswith("retryfs-")


def test_the_stream_spills_past_spool_memory_and_drops_the_spill_at_close(
        store: Store, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    stream = stream_over(store, spool_memory=4)
    stream.write(b"abcd")
    assert open_files_under(tmp_path) == []
    stream.write(b"e")
    assert len(open_files_under(tmp_path)) == 1
    stream.close()
    assert open_files_under(tmp_path) == [] and store.objects[PATH] == b"abcde"


def test_a_spool_that_cannot_keep_a_write_fails_the_stream_and_commits_nothing(
        store: Store, tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk under the spill file: a stage's write fails on its worker thread, the next
    write raises it, and the stream never commits (a replay would have a hole)."""
    import errno

    from retryfs.datapath import spool as spool_module

    def full(file: Any, data: Any, offset: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(spool_module, "_write_all", full)
    stream = stream_over(store, spool_memory=0)
    stream.write(b"a" * STAGE)  # the first stage, on its way
    with pytest.raises(OSError, match="No space left"):
        stream.write(b"b" * STAGE)  # the second stage waits for the first: its error
    with pytest.raises(OSError, match="failed earlier"):
        stream.write(b"c")
    stream.close()
    assert store.objects == {} and open_files_under(tmp_path) == []


def test_the_spool_seeks_from_its_start_or_its_end_only() -> None:
    with replay_spool(8) as spool:
        spool.write(b"abcdef")
        assert spool.seek(-2, io.SEEK_END) == 4 and spool.read() == b"ef"
        with pytest.raises(ValueError, match="start or end"):
            spool.seek(1, io.SEEK_CUR)
        spool.write(b"g")  # the head grows after a read of it: no view of it is left open
        spool.seek(0)
        assert spool.read() == b"abcdefg"

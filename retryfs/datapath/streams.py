"""Streams that survive a failure in the middle: replayable output, resumable input.

Both are plain Python file objects; the pyarrow face hands them to Arrow wrapped in
``pyarrow.PythonFile``. Every read, write, flush and close goes through the same retry engine
as the filesystem operations, under the operation names ``read``, ``write``, ``flush`` and
``close``.
"""

from __future__ import annotations

import collections
import ctypes
import functools
import io
import platform
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future
from concurrent.futures import wait as futures_wait
from typing import Any, Protocol, cast

import pyarrow as pa
from fsspec.spec import AbstractBufferedFile

from retryfs.config import DEFAULT_SPOOL_MEMORY
from retryfs.core.engine import Retrier, operation_end
from retryfs.core.proof import UNKNOWN, Verdict, WriteDigest, state_before
from retryfs.core.timeouts import AttemptSignal, in_background, run_with_timeout, settle
from retryfs.errors import CommitNotVisibleError, InnerFileClosedError

from .commits import report_commit, watching
from .iopool import keep_unclosed
from .spool import REPLAY_CHUNK, replay_spool

__all__ = ["ReplayableOutputStream", "ResumableInputFile", "DEFAULT_SPOOL_MEMORY", "SUB_READ",
           "abandon_stream", "discard"]


#: The largest read one attempt makes: a larger read is served as sub-reads of this size, so a
#: fault costs at most this many bytes again (on S3 each sub-read is one ranged GET).
SUB_READ = 8 * 1024 * 1024
#: Timed writes (each attempt on a worker thread, bounded) smaller than this are gathered and
#: handed to the inner stream together, with the next larger write, ``flush`` or ``close``:
#: ``torch.save`` of a 200 MiB state_dict makes about 470 writes, most of them a few hundred
#: bytes, and one thread hop each cost more than the upload's own work on a busy interpreter.
GATHERED = 1024 * 1024
#: How many sub-reads of one large read from a random-access file are in flight at once
#: (boto3's downloads: 8 MiB ranged GETs, 10 in flight).
READ_AHEAD = 4


class _Writable(Protocol):
    def write(self, data: Any) -> Any: ...
    def flush(self) -> Any: ...
    def close(self) -> Any: ...


def discard(stream: Any) -> None:
    """Drop a broken stream without committing what it holds, where the backend allows it:
    the one way retryfs gives up a stream (a retry's replay, a copy's abandoned upload).

    A read-only file is closed. An fsspec buffered file is discarded (s3fs aborts the multipart
    upload) and marked closed, so that its ``__del__`` never commits the broken upload. Another
    file with ``discard()`` is discarded, or closed when it cannot be (an autocommit local
    file: the replay rewrites it from the start). The rest (pyarrow streams: one whose part
    upload failed does not commit on close) are closed.
    """
    try:
        mode = getattr(stream, "mode", "")
        if isinstance(mode, str) and "r" in mode and "+" not in mode:
            stream.close()
        elif isinstance(stream, AbstractBufferedFile):
            try:
                stream.discard()
            finally:
                stream.closed = True
        elif hasattr(stream, "discard"):
            try:
                stream.discard()
            except Exception:  # noqa: BLE001 - cannot be discarded: close it
                stream.close()
        else:
            stream.close()
    except Exception:  # noqa: BLE001 - the stream is broken already; its error was handled
        pass


def abandon_stream(stream: Any) -> None:
    """Drop a stream whose timed-out attempt was left behind, without ever committing it.

    fsspec files are discarded (s3fs aborts the multipart upload). Anything else is kept
    alive, unclosed, for the rest of the process: closing it (or letting it be destroyed:
    pyarrow's native streams close from their destructor) would commit what it holds, maybe a
    prefix of the object, perhaps after the replay committed the whole; pyarrow offers no
    abort from Python. The upload stays incomplete (an S3 lifecycle rule reaps those).
    """
    if hasattr(stream, "discard"):
        discard(stream)
    else:  # a reference never given back: not even the interpreter's exit destroys it
        keep_unclosed(stream)

#: ``(operation, bytes in flight) -> seconds``: the per-attempt timeout of a write, flush or
#: close (``None``: the attempt runs on the caller's thread, unbounded).
AttemptTimeout = Callable[[str, int], "float | None"]


class _Sink:
    """One inner stream, and how many bytes a replay wrote into it."""

    __slots__ = ("stream", "replayed", "closed")

    def __init__(self, stream: _Writable) -> None:
        self.stream = stream
        self.replayed = 0  # the write whose attempt replayed finds its own bytes among them
        self.closed = False


class ReplayableOutputStream(io.RawIOBase):
    """Writes through to an inner stream and keeps every byte in a bounded replay spool.

    When a write, flush or close fails transiently, the broken inner stream is discarded, a
    fresh one is opened at the same path, the spool is replayed into it, and the operation
    goes on. After the commit (close) the object is checked to hold exactly the bytes written
    (``verify``, its own retried metadata call under the operation name ``verify``); only a
    proven missing or short object is committed again. The spool keeps up to
    ``spool_memory`` bytes in memory and spills to a temporary file beyond that.

    ``on_give_up`` runs once when a write, flush or close finally fails (after the broken
    inner stream was dropped): the pyarrow face removes the empty object some clients create at
    open (`retryfs.datapath.placeholders`).

    With ``attempt_timeout``, each attempt (reopen and replay included) runs on a worker
    thread and is abandoned when it takes longer: a stalled upload becomes a retry into a
    fresh stream, and the stalled one is dropped without a commit (:func:`abandon_stream`).

    With ``spool_memory=None`` the stream keeps no spool and makes one attempt of each write,
    flush and close: the first failure drops the inner stream unclosed (nothing is committed)
    and is kept as `failure`, for a caller that can write the whole object again from its
    source (`retryfs.datapath.regenerate`). ``in_flight`` is then that caller's list of close
    attempts abandoned mid-commit, shared by its streams, so that the last one's close waits
    for the earlier ones' before it reports success.
    """

    def __init__(
        self,
        path: str,
        inner: _Writable,
        reopen: Callable[[], _Writable],
        retrier: Retrier,
        *,
        verify: Callable[..., Verdict] | None = None,
        on_commit: Callable[[str, BaseException | None], None] | None = None,
        spool_memory: int | None = DEFAULT_SPOOL_MEMORY,
        attempt_timeout: AttemptTimeout | None = None,
        on_give_up: Callable[[], Any] | None = None,
        state_of: Callable[[str], Any] | None = None,
        in_flight: list[AttemptSignal] | None = None,
    ) -> None:
        super().__init__()
        self.path = path
        self._on_give_up = on_give_up  # once, when a write, flush or close gave up
        self._sink: _Sink | None = _Sink(inner)
        self._reopen = reopen
        self._retrier = retrier
        self._verify = verify
        self._on_commit = on_commit
        self._attempt_timeout = attempt_timeout
        self._spool = None if spool_memory is None else replay_spool(spool_memory)
        #: the error of the one attempt that failed, without a spool (``spool_memory=None``)
        self.failure: BaseException | None = None
        self._spool_lock = threading.Lock()  # an abandoned replay may still be reading it
        self._size = 0  # bytes the caller wrote
        # the last of them, not yet handed to the inner stream: timed small writes are
        # gathered, so that each does not cost a thread hop (`GATHERED`)
        self._pending = bytearray()
        self._failed = False
        self._unverified: Exception | None = None  # the error of a verification that gave up
        self._lock = threading.Lock()
        self._watchers = watching()  # the copy_files calls running now hear of its commit
        # abandoned close attempts mid-commit
        self._in_flight: list[AttemptSignal] = [] if in_flight is None else in_flight
        # what proves the commit (`retryfs.core.proof`): the bytes' MD5 while they are few, else
        # the destination's state before the commit (``state_of``, taken once, when it grows
        # past `retryfs.core.proof.HASHED`)
        self._digest = WriteDigest() if verify is not None else None
        self._state_of = state_of
        self._before: Any = UNKNOWN

    # -- io.RawIOBase ------------------------------------------------------------------------
    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._size

    @property
    def bytes_written(self) -> int:
        return self._size

    def write(self, data: Any) -> int:
        self._check_usable()
        view = memoryview(data).cast("B")
        with self._lock:
            if self._spool is not None:
                self._keep(view)
            self._size += len(view)
            self._note(view)
            if self._attempt_timeout is not None and len(self._pending) + len(view) < GATHERED:
                self._pending += view  # handed over with the next write, flush or close
            else:
                self._write_pending(view)
        return len(view)

    def flush(self) -> None:
        """Hand what was written to the inner stream and flush it; never waits for another call.

        A flush that finds a write, flush or close of this stream in progress returns at once:
        that call hands the bytes over, and nothing is stored before the close commits. Waiting
        could deadlock: a wrapper's finalizer flushes its raw stream (torch DCP's
        ``NoCloseWriter``, any ``io.IOBase`` at garbage collection), and the collector runs it on
        whichever thread allocates, the event loop that the write in progress waits on, or the
        writing thread itself, inside the write.
        """
        if self.closed or self._failed or self._sink is None:
            return
        if not self._lock.acquire(blocking=False):
            return
        try:
            self._write_pending()
            self._guarded("flush", lambda sink: sink.stream.flush(), self._size)
        finally:
            self._lock.release()

    def close(self) -> None:
        if self.closed:
            return
        try:
            with self._lock:
                if self._failed:  # a write already gave up: never commit a partial object
                    if self._sink is not None:  # its last attempt never started: the stream
                        # is healthy, and closing it would commit what it holds (a prefix)
                        abandon_stream(self._sink.stream)
                    return
                try:
                    started = self._retrier.clock()
                    self._write_pending()
                    self._guarded("close", self._commit, self._size)
                    self._settle(started)
                    if self._unverified is not None:  # committed, but the check gave up
                        raise self._unverified
                except BaseException as exc:
                    self._committed(exc)
                    raise
                self._committed(None)
        finally:
            self._sink = None  # so that RawIOBase.close() does not flush again
            self._close_spool()
            super().close()

    def abort(self) -> None:
        """Give the stream up and commit nothing: what a ``with`` block that raised does (the
        caller's own code failed in the middle, say ``torch.save``). The inner stream is dropped
        unclosed (`abandon_stream`): an object store shows no object, and no earlier one is
        replaced; a local file, written in place, keeps what was written so far. The empty
        object some clients create at open is removed (``on_give_up``). Then closed."""
        if self.closed:
            return
        try:
            with self._lock:
                self._failed = True
                sink, self._sink = self._sink, None
                if sink is not None and not sink.closed:
                    abandon_stream(sink.stream)
                if self._on_give_up is not None:
                    self._on_give_up()
        finally:
            self._close_spool()
            super().close()

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        """A ``with`` block that raises commits nothing (`abort`), where ``io.IOBase`` closes:
        an fsspec file (this stream is the fsspec face's) or a pyarrow stream would store
        what was written so far as the whole object."""
        if exc_type is None:
            self.close()
        else:
            self.abort()

    # -- internals -----------------------------------------------------------------------------
    def _keep(self, view: memoryview) -> None:
        """``view`` into the replay spool. A spool that cannot keep it (a full disk) fails the
        stream: a replay would send an object with a hole, so nothing is ever committed."""
        assert self._spool is not None
        try:
            with self._spool_lock:
                self._spool.seek(0, io.SEEK_END)
                self._spool.write(view)
        except BaseException:
            self._failed = True
            raise

    def _close_spool(self) -> None:
        if self._spool is not None:
            self._spool.close()

    def _committed(self, error: BaseException | None) -> None:
        if self._on_commit is not None:
            self._on_commit(self.path, error)
        report_commit(self._watchers, self.path, error)

    def _check_usable(self) -> None:
        if self.closed:
            raise ValueError("I/O operation on closed retryfs output stream")
        if self._failed:
            raise OSError(f"retryfs output stream for {self.path!r} failed earlier; "
                          "it cannot be written to")

    def _note(self, view: memoryview) -> None:
        """The write's bytes into its digest; past `HASHED`, the destination's state before
        the commit (a retried metadata call; unknown if it gives up)."""
        if (self._digest is not None and self._digest.update(view)
                and self._state_of is not None):
            self._before = state_before(self._retrier.call, self.path, self._state_of)

    def _write_pending(self, view: memoryview | None = None) -> None:
        """The gathered small writes, then ``view``, handed to the inner stream: one attempt."""
        gathered, self._pending = self._pending, bytearray()  # an abandoned attempt keeps its own
        pending = memoryview(gathered) if gathered else None
        if pending is None and view is None:
            return
        size = len(gathered) + (0 if view is None else len(view))
        self._guarded("write", lambda sink: self._write_through(sink, pending, view), size)

    def _write_through(self, sink: _Sink, *views: memoryview | None) -> None:
        if sink.replayed == self._size:  # this attempt's replay wrote these bytes already
            return
        for view in views:
            if view is not None:
                sink.stream.write(view)

    def _commit(self, sink: _Sink) -> None:
        sink.stream.close()
        sink.closed = True  # a retry must open a fresh stream and replay
        if self._verify is None:
            return
        # The check is a metadata call retried on its own: a failed HEAD proves nothing about
        # the object, so it never sends the object again. Only a proven missing or short
        # object fails this commit attempt, and the close loop commits it again.
        try:
            landed = self._retrier.call("verify", self.path, self._verify, self.path, self._size,
                                        self._digest, self._before)
        except Exception as exc:  # noqa: BLE001 - raised by close(), after the close loop
            self._unverified = exc
            return
        if not landed:
            raise CommitNotVisibleError.written(self.path, self._size, landed)

    def _settle(self, started: float) -> None:
        """Before a close reports success: wait for the close attempts abandoned in the middle
        of their commit (`retryfs.core.timeouts.settle`), within the close's deadline."""
        if not self._in_flight:
            return
        clock = self._retrier.clock
        end = operation_end(clock)
        deadline = self._retrier.policy_for("close").deadline
        if deadline is not None and (end is None or started + deadline < end):
            end = started + deadline
        settle(self._in_flight, self.path, end, clock)

    def _guarded(self, operation: str, action: Callable[[_Sink], None], in_flight: int) -> None:
        def attempt() -> None:
            box = [self._sink]  # this attempt's stream: the one there, or the replay's
            self._sink = None
            ran, abandoned = [], []
            # a close that is abandoned before its commit never commits (it may have been
            # replaying); one abandoned during its commit is waited for before success
            signal = None  # set below for a timed close

            def work() -> None:
                ran.append(True)
                try:
                    sink = box[0]
                    if sink is None or sink.closed:
                        sink = self._replay(box)
                    if signal is not None:
                        signal.start_commit()
                    action(sink)
                finally:
                    if signal is not None:
                        signal.ended.set()

            def abandon(future: Future[Any]) -> None:
                abandoned.append(True)
                future.add_done_callback(lambda _: _drop_abandoned(box[0]))
                if signal is not None and signal.abandon():
                    self._in_flight.append(signal)

            seconds = None
            if self._attempt_timeout is not None:
                replaying = box[0] is None or box[0].closed
                seconds = self._attempt_timeout(operation,
                                                self._size if replaying else in_flight)
            if operation == "close" and seconds is not None:
                signal = AttemptSignal(seconds)
            try:
                if seconds is None:
                    work()
                else:
                    run_with_timeout(work, seconds, operation, self.path, on_abandon=abandon)
            except BaseException:
                if abandoned:  # still running: its stream is dropped when it ends
                    raise
                if not ran:  # timed out before it started: the stream is untouched
                    self._sink = box[0]
                elif box[0] is not None and not box[0].closed:
                    discard(box[0].stream)
                raise
            self._sink = box[0]  # the stream that worked (after a commit, close() drops it)

        try:
            if self._spool is None:  # one attempt: the caller writes it all again
                attempt()
            else:
                self._retrier.call(operation, self.path, attempt)
        except BaseException as exc:
            if self._spool is None:
                self.failure = exc
            self._failed = True
            if self._on_give_up is not None:
                self._on_give_up()
            raise

    def _replay(self, box: list[_Sink | None]) -> _Sink:
        sink = box[0] = _Sink(self._reopen())
        while chunk := self._read_spool(sink.replayed):
            sink.stream.write(chunk)
            sink.replayed += len(chunk)
        self._retrier.stats.record_replay("write", sink.replayed)
        return sink

    def _read_spool(self, offset: int) -> bytes:
        assert self._spool is not None  # a stream without one makes one attempt: no replay
        with self._spool_lock:
            self._spool.seek(offset)
            return self._spool.read(REPLAY_CHUNK)


def _drop_abandoned(sink: _Sink | None) -> None:
    """After a timed-out attempt finally ended: drop its stream, unless it committed."""
    if sink is not None and not sink.closed:
        abandon_stream(sink.stream)


class ResumableInputFile(io.RawIOBase):
    """Reads from an inner stream; when a read fails, reopens and continues at the same offset.

    With ``seekable`` the inner file is random access (``open_input_file``): seeking is
    supported and the reopened file is positioned with ``seek``. Otherwise (``open_input_stream``)
    the reopened stream is positioned by seeking when it can, by skipping bytes when it cannot.
    """

    def __init__(
        self,
        path: str,
        inner: Any,
        reopen: Callable[[], Any],
        retrier: Retrier,
        *,
        seekable: bool,
    ) -> None:
        super().__init__()
        self.path = path
        self._inner: Any = inner
        self._inner_pos = 0
        self._pos = 0
        self._reopen = reopen
        self._retrier = retrier
        self._seekable = seekable
        self._size: int | None = None
        self._lock = threading.Lock()

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return self._seekable

    def tell(self) -> int:
        return self._pos

    def size(self) -> int:
        if self._size is None:
            self._size = self._retrier.call("read", self.path, self._attempt, _size_of)
        return self._size

    def metadata(self) -> dict[str, bytes]:
        """The inner stream's metadata (``Content-Type``...: what the object store sent)."""
        return self._retrier.call("read", self.path, self._attempt, _metadata_of)

    def _end(self) -> int:
        """The file's size, for ``SEEK_END`` (subclasses whose ``size`` is not a method)."""
        return self.size()

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if not self._seekable:
            raise io.UnsupportedOperation("seek on a retryfs input stream")
        if whence == io.SEEK_SET:
            target = offset
        elif whence == io.SEEK_CUR:
            target = self._pos + offset
        elif whence == io.SEEK_END:
            target = self._end() + offset
        else:
            raise ValueError(f"invalid whence {whence!r}")
        if target < 0:
            raise ValueError(f"negative seek position {target}")
        self._pos = target
        return target

    def read(self, size: int | None = -1) -> bytes:
        return self.read_bytes(size)

    def read_bytes(self, size: int | None = -1) -> bytes:
        """At most ``size`` bytes (all that is left: ``None`` or negative). A large read of a
        native random-access file is read by ranged sub-reads straight into the ``bytes`` it
        returns, as pyarrow's own ``read`` does: `read_buffer` and a copy into ``bytes`` would
        allocate and write every byte twice (a 1 GiB ``read()``: 1 GiB more memory touched)."""
        if self.closed:
            raise ValueError("I/O operation on closed retryfs input file")
        wanted = None if size is None or size < 0 else size
        with self._lock:
            small = wanted is not None and wanted <= SUB_READ
            inner = None if small or not self._seekable else self._random_access()
            if inner is not None:
                left = self._remaining()
                wanted = left if wanted is None else min(wanted, left)
                if wanted > SUB_READ and _FRESH_BYTES is not None:
                    return self._read_ranges_to_bytes(inner, wanted)
        data = self.read_buffer(size)
        return data if isinstance(data, bytes) else data.to_pybytes()

    def read_buffer(self, size: int | None = -1) -> Any:
        """Read into a pyarrow ``Buffer`` where the inner file can (``pyarrow.PythonFile`` uses
        this when present): a native file sizes the buffer to what is left, where ``read(n)``
        would allocate ``n`` bytes first (64 MiB per small file in a ``copy_files``).

        A read of more than `SUB_READ` bytes (or of the whole rest) is served as sub-reads of
        at most `SUB_READ` into one buffer, each its own retried read: a fault in the middle
        costs what that sub-read had received, not what the whole read had."""
        if self.closed:
            raise ValueError("I/O operation on closed retryfs input file")
        wanted = None if size is None or size < 0 else size
        with self._lock:
            if wanted is not None and wanted <= SUB_READ:
                return self._read_piece(wanted)
            if self._seekable:  # what is left bounds the buffer
                left = self._remaining()
                wanted = left if wanted is None else min(wanted, left)
                if wanted <= SUB_READ:
                    return self._read_piece(wanted)
            return self._read_large(wanted)

    def readall(self) -> bytes:
        return self.read()

    def readinto(self, buffer: Any) -> int:
        if self.closed:
            raise ValueError("I/O operation on closed retryfs input file")
        with self._lock:
            return self._fill(memoryview(buffer).cast("B"))

    # -- reads ---------------------------------------------------------------------------------
    def _remaining(self) -> int:
        return max(0, self._end() - self._pos)

    def _read_piece(self, size: int) -> Any:
        data = self._retrier.call("read", self.path, self._attempt, _read_from, size)
        self._pos += len(data)
        self._inner_pos = self._pos
        return data

    def _fill(self, view: memoryview) -> int:
        """Fill ``view`` in sub-reads of at most `SUB_READ` bytes, each retried on its own;
        stops early at the end of the file. Returns the bytes read. On a native random-access
        file a view larger than one sub-read is filled by `READ_AHEAD` sub-reads in flight
        (`_ranged`): torch's loaders (``torch.load``, DCP) read each tensor with one
        ``readinto`` of its size."""
        if len(view) > SUB_READ:
            ranged = self._random_access()
            if ranged is not None:
                wanted = min(len(view), max(0, ranged.size() - self._pos))
                return self._read_ranges_into(ranged, view[:wanted])
        filled = 0
        while filled < len(view):
            piece = view[filled:filled + SUB_READ]
            got = self._retrier.call("read", self.path, self._attempt, _read_into, piece)
            if not got:
                break
            filled += got
            self._pos += got
            self._inner_pos = self._pos
        return filled

    def _read_large(self, wanted: int | None) -> pa.Buffer:
        """``wanted`` bytes (``None``: up to the end, size unknown) into one buffer, which
        grows when the size is unknown and is cut to what was read. A failed read leaves the
        position where it was (the caller gets none of its bytes)."""
        start = self._pos
        try:
            ranged = self._random_access()
            if ranged is not None:
                left = max(0, ranged.size() - start)
                return self._read_ranges(ranged, left if wanted is None else min(wanted, left))
            return self._read_sequential(wanted)
        except BaseException:
            self._pos = start
            raise

    def _random_access(self) -> Any:
        """The inner file if it is a native random-access one (S3, GCS, Azure, local), else
        ``None``. A sequential stream is not swapped for one: opening pyarrow's GCS input file
        starts its download lazily with the GIL held (an in-process server never answers)."""
        inner = self._inner
        if not isinstance(inner, pa.NativeFile) or isinstance(inner, pa.PythonFile):
            return None  # (a PythonFile claims to seek)
        try:
            return inner if inner.seekable() else None
        except ValueError:  # it closed itself: a read (`_attempt`) reopens it
            return None

    def read_range(self, offset: int, size: int) -> pa.Buffer:
        """``size`` bytes at ``offset`` (fewer at the end) as a Buffer: one retried ranged read
        of a native random-access file (on S3 one GET), a retry on a fresh file. The position
        is untouched; the caller holds the file's lock."""
        read = _RangedRead(self._random_access(), self._reopen)
        return cast(pa.Buffer, self._retrier.call("read", self.path, read, offset, size))

    def _read_ranges(self, inner: Any, wanted: int) -> pa.Buffer:
        """``wanted`` bytes from the position into one buffer, as `ranged_buffers` (`READ_AHEAD`
        sub-reads in flight), each sub-read straight into its slice of it (no second copy)."""
        buffer = pa.allocate_buffer(wanted)
        total = self._read_ranges_into(inner, memoryview(buffer).cast("B"))
        return buffer if total == wanted else buffer.slice(0, total)

    def _read_ranges_to_bytes(self, inner: Any, wanted: int) -> bytes:
        """`_read_ranges` into a new ``bytes`` object; cut to what was read (a copy) only when
        the file ended early. A failed read leaves the position where it was."""
        assert _FRESH_BYTES is not None  # checked by the caller
        data, view = _FRESH_BYTES(wanted)
        try:
            total = self._read_ranges_into(inner, view)
        finally:
            view.release()
        return data if total == wanted else data[:total]

    def _read_ranges_into(self, inner: Any, view: memoryview) -> int:
        """``view``'s length from the position straight into ``view``, as `ranged_buffers`
        (`READ_AHEAD` sub-reads in flight); the bytes read, fewer only at the end of the file.
        A failed read leaves the position where it was."""
        start = self._pos
        try:
            return sum(self._ranged(inner, len(view), READ_AHEAD, into=view))
        except BaseException:
            self._pos = start
            raise

    def ranged_buffers(self, window: int | Callable[[], int]) -> Iterator[Any]:
        """The rest of the file as Buffers of at most `SUB_READ`, in order, each handed out as
        it is (no copy into a larger buffer), with ``window`` sub-reads in flight on a native
        random-access file; on any other file, one sub-read at a time. What a download
        through native streams reads with (`retryfs.datapath.download`): on S3 one read of Ray
        Train's 64 MiB chunk is one GET, its sub-reads one after the other would be eight
        GETs, each waiting for its round trip. ``window`` may be a function, asked again each
        time a sub-read is handed out (a tree's share of the IO threads, which grows as its
        other files end). Close the iterator before the file."""
        if self.closed:
            raise ValueError("I/O operation on closed retryfs input file")
        with self._lock:
            inner = self._random_access()
            if inner is not None:
                yield from self._ranged(inner, max(0, inner.size() - self._pos), window)
                return
            while piece := self._read_piece(SUB_READ):
                yield piece

    def _ranged(self, inner: Any, wanted: int, window: int | Callable[[], int],
                into: memoryview | None = None) -> Iterator[Any]:
        """``wanted`` bytes from the position as ranged sub-reads of `SUB_READ`, in order,
        ``window`` of them in flight (on S3 each is one GET: one at a time, every one would
        wait for its request's round trip). Each is retried on its own, a retry on a fresh
        file. Yields each sub-read's Buffer, or with ``into`` (``wanted`` bytes long) reads
        each into its slice of it and yields the bytes it read. The position moves past each
        piece handed out. A failure is raised once the sub-reads in flight are done, and so is
        the end of the iteration: no read outlives it on a file its caller may close.

        Buffers are held until handed out, so at most ``window`` sub-reads are read ahead of
        the caller, done or not (the memory bound). With ``into`` a finished sub-read holds
        nothing (its bytes are in the caller's view): only the unfinished ones count against
        ``window``: a sub-read that waits to be retried does not hold up the ones after it (held
        in order, one 503 would stall the window behind it for its wait and its retry). Once
        a sub-read has failed for good, none is started."""
        start, end = self._pos, self._pos + wanted
        offsets = iter(range(start, end, SUB_READ))
        pending: collections.deque[tuple[int, Future[Any]]] = collections.deque()
        in_flight = window if callable(window) else functools.partial(int, window)

        def launch(offset: int) -> None:
            size = min(SUB_READ, end - offset)
            read = _RangedRead(inner, self._reopen)
            task = (functools.partial(read, offset, size) if into is None else
                    functools.partial(read.into, offset,
                                      into[offset - start:offset - start + size]))
            pending.append((size, in_background(functools.partial(
                self._retrier.call, "read", self.path, task))))

        try:
            while True:
                unfinished = [future for _, future in pending if not future.done()]
                held = len(pending) if into is None else len(unfinished)
                failed = any(f.done() and f.exception() for _, f in pending)  # start no more
                while (not failed and held < max(1, in_flight())
                       and (offset := next(offsets, None)) is not None):
                    launch(offset)
                    held += 1
                    unfinished.append(pending[-1][1])
                if not pending:
                    return
                size, future = pending[0]
                if not future.done():
                    futures_wait(unfinished, return_when=FIRST_COMPLETED)
                    continue
                pending.popleft()
                piece = future.result()
                got = piece if isinstance(piece, int) else piece.size
                self._pos += got
                self._inner_pos = -1  # ranged reads leave the file's own position unspecified
                if got:
                    yield piece
                if got < size:  # the file ended early (shorter than it was)
                    return
        finally:  # those in flight end before the caller goes on
            futures_wait([future for _, future in pending])

    def _read_sequential(self, wanted: int | None) -> pa.Buffer:
        capacity = wanted if wanted is not None else 4 * SUB_READ
        buffer = pa.allocate_buffer(capacity, resizable=True)
        filled = self._fill(memoryview(buffer).cast("B"))
        while wanted is None and filled == capacity:  # the rest, size unknown: grow to the end
            capacity *= 2
            buffer.resize(capacity)
            filled += self._fill(memoryview(buffer).cast("B")[filled:])
        buffer.resize(filled)
        return buffer

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._drop_inner()
        finally:
            super().close()

    def _attempt(self, action: Callable[..., Any], *args: Any) -> Any:
        if self._inner is None:
            self._inner, self._inner_pos = self._reopen(), 0
        try:
            if self._inner_pos != self._pos:
                self._position()
            return action(self._inner, *args)
        except ValueError as exc:
            # not ``self._inner.closed``: that would make pyarrow's GCS file open it once more
            if str(exc) != _NATIVE_CLOSED:
                self._drop_inner()
                raise
            self._drop_inner()
        except BaseException:
            self._drop_inner()
            raise
        # raised outside the handler, so that the permanent ValueError is not its context
        raise InnerFileClosedError(f"{self.path!r}: the inner file closed itself "
                                   f"({_NATIVE_CLOSED}): a lazily opened download failed")

    def _drop_inner(self) -> None:
        if self._inner is not None:
            discard(self._inner)
            self._inner = None

    def _position(self) -> None:
        inner = self._inner
        can_seek = getattr(inner, "seekable", lambda: False)()
        if can_seek:
            inner.seek(self._pos)
        elif self._inner_pos < self._pos:
            remaining = self._pos - self._inner_pos
            while remaining:
                skipped = inner.read(min(remaining, REPLAY_CHUNK))
                if not skipped:
                    raise OSError(f"{self.path!r} ended before offset {self._pos} on reopen")
                remaining -= len(skipped)
        else:
            raise OSError(f"cannot go back to offset {self._pos} in {self.path!r}")
        self._inner_pos = self._pos


#: What a pyarrow ``NativeFile`` raises once closed; retryfs never closes an inner file it keeps.
_NATIVE_CLOSED = "I/O operation on closed file"


def _cpython_bytes_allocator() -> Callable[[int], tuple[bytes, memoryview]] | None:
    """On CPython, a function giving a new ``bytes`` of ``size`` uninitialised bytes and a
    writable view of them: what pyarrow's ``NativeFile.read`` fills in C
    (``PyBytes_FromStringAndSize(NULL, n)``). Only for a fresh object that nothing else holds,
    filled before it is handed out. Elsewhere ``None``: a read into a Buffer, then a copy."""
    if platform.python_implementation() != "CPython":
        return None
    new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_char_p, ctypes.c_ssize_t)(
        ("PyBytes_FromStringAndSize", ctypes.pythonapi))
    offset = bytes.__basicsize__ - 1  # ob_sval: the end of the header, less its final NUL

    def fresh(size: int) -> tuple[bytes, memoryview]:
        data = new(None, size)
        cells = (ctypes.c_char * size).from_address(id(data) + offset)
        # the view keeps ``data`` alive: a read attempt abandoned by its timeout may still be
        # writing into its slice after the read failed and dropped ``data``
        cells.owner = data  # type: ignore[attr-defined]
        return data, memoryview(cells).cast("B")

    return fresh


_FRESH_BYTES = _cpython_bytes_allocator()


def _read_from(inner: Any, size: int) -> Any:
    """At most ``size`` bytes: bytes, or a pyarrow Buffer when the inner file is a native one."""
    if hasattr(inner, "read_buffer"):
        return inner.read_buffer(size)
    data = inner.read(size)
    return data if isinstance(data, bytes) else bytes(data)


class _RangedRead:
    """One sub-read's attempts: a segment of the shared file, after a failure of a fresh one
    (a failed GET leaves S3's file usable, but another backend's may not be)."""

    __slots__ = ("_shared", "_reopen")

    def __init__(self, shared: Any, reopen: Callable[[], Any]) -> None:
        self._shared = shared  # None once an attempt on it failed
        self._reopen = reopen

    def __call__(self, offset: int, size: int) -> Any:
        return self._attempt(_read_segment, offset, size)

    def into(self, offset: int, view: memoryview) -> int:
        """Read ``view``'s length at ``offset`` into ``view``; the bytes read."""
        return int(self._attempt(_read_segment_into, offset, view))

    def _attempt(self, read: Callable[..., Any], offset: int, arg: Any) -> Any:
        own = None  # this attempt's fresh file, dropped when it ends
        try:
            inner = self._shared
            if inner is None:
                inner = own = self._reopen()
            return read(inner, offset, arg)
        except BaseException:
            self._shared = None
            raise
        finally:
            if own is not None:
                discard(own)


def _read_segment(inner: Any, offset: int, size: int) -> Any:
    """``size`` bytes at ``offset`` (fewer at the end) as a Buffer, the file's own position
    untouched: its segment stream reads straight into one (``read_at`` would copy it into
    ``bytes``). ``inner`` is a native random-access file (`_random_access`), and so is each
    reopened one: both come from the same ``open_input_file``."""
    return inner.get_stream(offset, size).read_buffer(size)


def _read_segment_into(inner: Any, offset: int, view: memoryview) -> int:
    """`_read_segment` straight into ``view`` (Arrow reads into it with the GIL released);
    the bytes read, fewer than ``len(view)`` only at the end of the file."""
    stream = inner.get_stream(offset, len(view))
    filled = 0
    while filled < len(view):
        got = stream.readinto(view[filled:])
        if not got:
            break
        filled += got
    return filled


def _read_into(inner: Any, view: memoryview) -> int:
    """Read into ``view``: straight into it from a native file, else copied from a read."""
    if isinstance(inner, pa.NativeFile):
        return int(inner.readinto(view))
    data = _read_from(inner, len(view))
    view[: len(data)] = memoryview(data).cast("B")
    return len(data)


def _metadata_of(inner: Any) -> dict[str, bytes]:
    metadata = getattr(inner, "metadata", None)
    return dict(metadata()) if callable(metadata) else {}


def _size_of(inner: Any) -> int:
    size = getattr(inner, "size", None)
    if callable(size):  # pyarrow NativeFile
        return int(size())
    if isinstance(size, int):  # fsspec buffered file
        return size
    position = inner.tell()
    end = inner.seek(0, io.SEEK_END)
    inner.seek(position)
    return int(end)

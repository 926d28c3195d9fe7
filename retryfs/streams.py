"""Streams that survive a failure in the middle: replayable output, resumable input.

Both are plain Python file objects; the pyarrow face hands them to Arrow wrapped in
``pyarrow.PythonFile``. Every read, write, flush and close goes through the same retry engine
as the filesystem operations, under the operation names ``read``, ``write``, ``flush`` and
``close``.
"""

from __future__ import annotations

import io
import tempfile
import threading
from collections.abc import Callable
from typing import Any, Protocol

from .commits import report_commit, watching
from .config import DEFAULT_SPOOL_MEMORY
from .engine import Retrier
from .errors import CommitNotVisibleError

__all__ = ["ReplayableOutputStream", "ResumableInputFile", "DEFAULT_SPOOL_MEMORY"]

_REPLAY_CHUNK = 8 * 1024 * 1024


class _Writable(Protocol):
    def write(self, data: Any) -> Any: ...
    def flush(self) -> Any: ...
    def close(self) -> Any: ...


def discard(stream: Any) -> None:
    """Drop a broken stream without committing what it holds, where the backend allows it.

    fsspec files have ``discard()`` (s3fs aborts the multipart upload). A pyarrow S3 stream
    whose part upload failed does not commit on close; a local file may, but the replay that
    follows rewrites it from the start.
    """
    try:
        if hasattr(stream, "discard"):
            stream.discard()
            # discard() leaves an fsspec file open with no buffer: its __del__ would close
            # it and fail ("Exception ignored ... 'NoneType' object has no attribute 'tell'").
            stream.closed = True
        else:
            stream.close()
    except Exception:  # noqa: BLE001 - the stream is broken already; its error was handled
        pass


class ReplayableOutputStream(io.RawIOBase):
    """Writes through to an inner stream and keeps every byte in a bounded replay spool.

    When a write, flush or close fails transiently, the broken inner stream is discarded, a
    fresh one is opened at the same path, the spool is replayed into it, and the operation
    goes on. After the commit (close) the object is checked to hold exactly the bytes written
    (``verify``, its own retried metadata call under the operation name ``verify``); only a
    proven missing or short object is committed again. The spool keeps up to
    ``spool_memory`` bytes in memory and spills to a temporary file beyond that.
    """

    def __init__(
        self,
        path: str,
        inner: _Writable,
        reopen: Callable[[], _Writable],
        retrier: Retrier,
        *,
        verify: Callable[[str, int], bool] | None = None,
        on_commit: Callable[[str, BaseException | None], None] | None = None,
        spool_memory: int = DEFAULT_SPOOL_MEMORY,
    ) -> None:
        super().__init__()
        self.path = path
        self._inner: _Writable | None = inner
        self._reopen = reopen
        self._retrier = retrier
        self._verify = verify
        self._on_commit = on_commit
        self._spool = tempfile.SpooledTemporaryFile(max_size=spool_memory, prefix="retryfs-")
        self._size = 0  # bytes the caller wrote
        self._inner_size = 0  # bytes the current inner stream has been given
        self._failed = False
        self._unverified: Exception | None = None  # the error of a verification that gave up
        self._lock = threading.Lock()
        self._watchers = watching()  # the copy_files calls running now hear of its commit

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
            self._spool.write(view)
            self._size += len(view)
            self._guarded("write", lambda inner: self._write_through(inner, view))
        return len(view)

    def flush(self) -> None:
        if self.closed or self._failed or self._inner is None:
            return
        with self._lock:
            self._guarded("flush", lambda inner: inner.flush())

    def close(self) -> None:
        if self.closed:
            return
        try:
            with self._lock:
                if self._failed:  # a write already gave up: never commit a partial object
                    if self._inner is not None:
                        discard(self._inner)
                    return
                try:
                    self._guarded("close", self._commit)
                    if self._unverified is not None:  # committed, but the check gave up
                        raise self._unverified
                except BaseException as exc:
                    self._committed(exc)
                    raise
                self._committed(None)
        finally:
            self._inner = None  # so that RawIOBase.close() does not flush again
            self._spool.close()
            super().close()

    # -- internals -----------------------------------------------------------------------------
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

    def _write_through(self, inner: _Writable, view: memoryview) -> None:
        if self._inner_size == self._size:  # a replay already wrote these bytes
            return
        inner.write(view)
        self._inner_size += len(view)

    def _commit(self, inner: _Writable) -> None:
        inner.close()
        self._inner = None  # closed: a retry must open a fresh stream and replay
        if self._verify is None:
            return
        # The check is a metadata call retried on its own: a failed HEAD proves nothing about
        # the object, so it never sends the object again. Only a proven missing or short
        # object fails this commit attempt, and the close loop commits it again.
        try:
            landed = self._retrier.call("verify", self.path, self._verify, self.path, self._size)
        except Exception as exc:  # noqa: BLE001 - raised by close(), after the close loop
            self._unverified = exc
            return
        if not landed:
            raise CommitNotVisibleError(
                f"{self.path!r} was committed but does not hold the {self._size} bytes written")

    def _guarded(self, operation: str, action: Callable[[_Writable], None]) -> None:
        def attempt() -> None:
            try:
                if self._inner is None:
                    self._replay()
                assert self._inner is not None
                action(self._inner)
            except BaseException:
                if self._inner is not None:
                    discard(self._inner)
                    self._inner = None
                raise

        try:
            self._retrier.call(operation, self.path, attempt)
        except BaseException:
            self._failed = True
            raise

    def _replay(self) -> None:
        inner = self._reopen()
        self._inner, self._inner_size = inner, 0
        self._spool.seek(0)
        while chunk := self._spool.read(_REPLAY_CHUNK):
            inner.write(chunk)
            self._inner_size += len(chunk)
        self._spool.seek(0, io.SEEK_END)
        self._retrier.stats.record_replay("write", self._inner_size)


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
        data = self.read_buffer(size)
        return data if isinstance(data, bytes) else data.to_pybytes()

    def read_buffer(self, size: int | None = -1) -> Any:
        """Read into a pyarrow ``Buffer`` where the inner file can (``pyarrow.PythonFile`` uses
        this when present): a native file sizes the buffer to what is left, where ``read(n)``
        would allocate ``n`` bytes first (64 MiB per small file in a ``copy_files``)."""
        if self.closed:
            raise ValueError("I/O operation on closed retryfs input file")
        with self._lock:
            data = self._retrier.call("read", self.path, self._attempt, _read_from, size)
            self._pos += len(data)
            self._inner_pos = self._pos
        return data

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(memoryview(buffer)))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self._inner is not None:
                discard(self._inner)
        finally:
            self._inner = None
            super().close()

    def _attempt(self, action: Callable[..., Any], *args: Any) -> Any:
        if self._inner is None:
            self._inner, self._inner_pos = self._reopen(), 0
        try:
            if self._inner_pos != self._pos:
                self._position()
            return action(self._inner, *args)
        except BaseException:
            if self._inner is not None:
                discard(self._inner)
                self._inner = None
            raise

    def _position(self) -> None:
        inner = self._inner
        can_seek = getattr(inner, "seekable", lambda: False)()
        if can_seek:
            inner.seek(self._pos)
        elif self._inner_pos < self._pos:
            remaining = self._pos - self._inner_pos
            while remaining:
                skipped = inner.read(min(remaining, _REPLAY_CHUNK))
                if not skipped:
                    raise OSError(f"{self.path!r} ended before offset {self._pos} on reopen")
                remaining -= len(skipped)
        else:
            raise OSError(f"cannot go back to offset {self._pos} in {self.path!r}")
        self._inner_pos = self._pos


def _read_from(inner: Any, size: int | None) -> Any:
    """Bytes, or a pyarrow Buffer when the inner file is a native one."""
    whole = size is None or size < 0
    if hasattr(inner, "read_buffer"):
        return inner.read_buffer() if whole else inner.read_buffer(size)
    data = inner.read() if whole else inner.read(size)
    return data if isinstance(data, bytes) else bytes(data)


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

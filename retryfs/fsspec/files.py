"""The files of the fsspec face: reads that resume, writes that replay, an async reader.

`RetryReadFile` and `RetryWriteFile` are the pyarrow face's resumable/replayable streams
(`retryfs.datapath.streams`) dressed as fsspec files; `InnerFile` is how those streams see an fsspec file
(``discard`` drops a broken upload, never commits it).
"""

from __future__ import annotations

import asyncio
import errno
import inspect
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Protocol, cast

import pyarrow as pa
from fsspec.spec import AbstractBufferedFile

from retryfs.core.engine import Retrier
from retryfs.core.proof import Verdict
from retryfs.core.redact import redact
from retryfs.core.timeouts import AttemptTimeoutError, wait_for_attempt
from retryfs.datapath.streams import (
    AttemptTimeout,
    ReplayableOutputStream,
    ResumableInputFile,
    abandon_stream,
    discard,
)

__all__ = ["AsyncRetryReadFile", "AsyncTimedWriteFile", "InnerFile", "PartsInBackground",
           "RetryReadFile", "RetryWriteFile", "defuse_half_open", "fsspec_errors"]

#: On pyarrow's file (``file_client``), a read of at most this many bytes is served from
#: blocks of `SMALL_BLOCK` kept in memory, as fsspec's files serve them from their cache:
#: ``torch.load`` reads a checkpoint's zip headers a few bytes at a time, and each of those
#: reads would be a GET of its own. Larger reads go to the store, 4 ranged GETs in flight.
SMALL_READ = 64 * 1024
SMALL_BLOCK = 256 * 1024
#: Blocks kept: the headers at both ends of one stored item, and the next item's.
SMALL_BLOCKS = 4


class _Face(Protocol):
    """What the files need of the filesystem that opened them."""

    retrier: Retrier

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]: ...

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any: ...


class InnerFile:
    """An fsspec file as the retrying streams see it: ``discard`` drops it, never commits it.

    fsspec's buffered files commit on ``close`` (and on garbage collection), so a broken upload
    is discarded (s3fs aborts the multipart upload) and marked closed; a local file that cannot
    be discarded (``autocommit``) is closed, the replay rewrites it from the start.
    """

    __slots__ = ("file",)

    def __init__(self, file: Any) -> None:
        self.file = file

    def __getattr__(self, name: str) -> Any:
        return getattr(self.file, name)

    def read(self, *args: Any) -> Any:
        return self.file.read(*args)

    def write(self, data: Any) -> Any:
        return self.file.write(data)

    def flush(self) -> Any:
        return self.file.flush()

    def close(self) -> Any:
        return self.file.close()

    def discard(self) -> None:
        discard(self.file)


class PartsInBackground:
    """A pyarrow S3 output stream as the inner stream of an fsspec file (``file_client``):
    ``flush`` asks nothing of it.

    pyarrow's ``flush`` waits until every part queued is uploaded; s3fs's (``force=False``, what
    ``flush()`` is) sends a full block and goes on. On an object store nothing written shows
    before the commit either way. torch DCP's ``FsspecWriter`` flushes after every item: on
    pyarrow's stream each item then waited for its parts before the next was serialised. What
    the stream holds unsent stays bounded: it is flushed every `UNSENT_MAX` bytes written
    (`retryfs.datapath.iopool`).

    A stream given up (a replay, a ``with`` block that raised) is never closed: it is kept
    unclosed (`abandon_stream`). The write client opens its uploads lazily, and such a stream
    whose upload never started stores an empty object at its close
    (`retryfs.datapath.iopool.opens_lazily`)."""

    __slots__ = ("stream",)

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, data: Any) -> Any:
        with fsspec_errors():
            return self.stream.write(data)

    def flush(self) -> None:
        pass

    def close(self) -> Any:
        with fsspec_errors():
            return self.stream.close()

    def discard(self) -> None:
        abandon_stream(self.stream)


#: pyarrow's S3 errors that s3fs raises as Python's own: (the AWS error, the class, its errno).
_AS_FSSPEC = (("AWS Error NO_SUCH_BUCKET", FileNotFoundError, errno.ENOENT),
              ("AWS Error NO_SUCH_KEY", FileNotFoundError, errno.ENOENT),
              ("AWS Error ACCESS_DENIED", PermissionError, errno.EACCES))


@contextmanager
def fsspec_errors() -> Iterator[None]:
    """pyarrow's ``OSError`` for a missing bucket or a refused request raised as s3fs raises
    it (``FileNotFoundError``, ``PermissionError``), the message kept: a file of the fsspec
    face raises the same classes whichever client writes it."""
    try:
        yield
    except OSError as error:
        if type(error) is OSError:
            for marker, kind, code in _AS_FSSPEC:
                if marker in str(error):
                    raise kind(code, str(error)) from error
        raise


def defuse_half_open(error: BaseException) -> None:
    """Mark closed any fsspec buffered file for writing whose constructor raised ``error``.

    s3fs's append mode asks for the object (``exists``, ``head_object``) after
    ``AbstractBufferedFile.__init__`` has run: when that request fails, the half-built file is
    garbage-collected with ``closed`` False, and its ``__del__`` commits what it holds, an empty
    PUT (``touch``) over the object being appended to. A retried open leaves one such file per
    failed attempt; marked closed, it is dropped with nothing sent.
    """
    from fsspec.spec import AbstractBufferedFile

    tb = error.__traceback__
    while tb is not None:
        candidate = tb.tb_frame.f_locals.get("self")
        if (isinstance(candidate, AbstractBufferedFile) and candidate.mode != "rb"
                and not candidate.closed):
            candidate.closed = True
        tb = tb.tb_next


class RetryReadFile(ResumableInputFile):
    """A file open for reading whose reads resume after a failure (see `ResumableInputFile`).

    Quacks like an fsspec file: ``size``, ``path``, ``fs``, ``mode``, ``loc``, ``info()``,
    ``readline``, iteration, ``seek``/``tell``, context manager.
    """

    def __init__(self, fs: _Face, path: str, mode: str, inner: InnerFile | pa.NativeFile,
                 reopen: Callable[[], InnerFile | pa.NativeFile], retrier: Retrier) -> None:
        seekable = bool(getattr(inner, "seekable", lambda: False)())
        super().__init__(path, inner, reopen, retrier, seekable=seekable)
        self.fs = fs
        self.mode = mode
        self._details = getattr(getattr(inner, "file", None), "details", None)
        self._blocks: _Blocks | None = None  # small reads of pyarrow's file
        self._native = isinstance(inner, pa.NativeFile)
        if self._native:  # known from the open's HEAD: asking later would position the file
            self._size = inner.size()

    def read_bytes(self, size: int | None = -1) -> bytes:
        small = self._small_read(size)
        return small if small is not None else super().read_bytes(size)

    def read_buffer(self, size: int | None = -1) -> Any:
        small = self._small_read(size)
        return small if small is not None else super().read_buffer(size)

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        small = self._small_read(len(view))
        if small is not None:
            view[:len(small)] = small
            return len(small)
        if not self._native:
            return super().readinto(view)
        return self._readinto_past_blocks(view)

    def _small_read(self, size: int | None) -> bytes | None:
        """A read of at most `SMALL_READ` bytes of pyarrow's file, from the blocks kept
        (``None``: not one)."""
        if not self._native or size is None or size < 0 or size > SMALL_READ:
            return None
        if self.closed:
            raise ValueError("I/O operation on closed file")
        with self._lock:
            data = self._kept().read(self._pos, min(self._pos + size, self._length()))
            self._pos += len(data)
            self._inner_pos = -1  # ranged reads leave the file's own position unspecified
        return data

    def _readinto_past_blocks(self, view: memoryview) -> int:
        """A large ``readinto`` of pyarrow's file whose first and last bytes the blocks kept
        hold already (``torch.load`` reads an item's headers at both ends, then its data in
        one read between them): those are copied, only the bytes between are fetched."""
        if self.closed:
            raise ValueError("I/O operation on closed file")
        with self._lock:
            start = self._pos
            end = min(start + len(view), self._length())
            if end <= start:
                return 0
            blocks = self._kept()
            head = blocks.held(start, end)
            tail = blocks.held_before(end, start + len(head))
            view[:len(head)] = head
            view[end - start - len(tail):end - start] = tail
            self._pos = start + len(head)
        middle = view[len(head):end - start - len(tail)]
        try:
            got = super().readinto(middle) if len(middle) else 0
        except BaseException:
            self._pos = start  # a failed read moves nothing, the blocks' bytes included
            raise
        with self._lock:
            if got < len(middle):  # the file ended early (shorter than it was)
                return len(head) + got
            self._pos = end
        return end - start

    def _readline_from_blocks(self, limit: int) -> bytes:
        """A line (at most ``limit`` bytes when ``limit`` >= 0) of pyarrow's file, read from
        the blocks kept, `SMALL_READ` bytes at a time."""
        if self.closed:
            raise ValueError("I/O operation on closed file")
        parts: list[bytes] = []
        taken = 0
        with self._lock:
            while limit < 0 or taken < limit:
                want = SMALL_READ if limit < 0 else min(SMALL_READ, limit - taken)
                chunk = self._kept().read(self._pos, min(self._pos + want, self._length()))
                end = chunk.find(b"\n") + 1
                line = chunk[:end] if end else chunk
                parts.append(line)
                taken += len(line)
                self._pos += len(line)
                self._inner_pos = -1
                if end or not chunk:
                    break
        return b"".join(parts)

    def _kept(self) -> _Blocks:
        if self._blocks is None:
            self._blocks = _Blocks(self._fetch_block, self._length())
        return self._blocks

    def _fetch_block(self, start: int, end: int) -> bytes:
        return cast("bytes", self.read_range(start, end - start).to_pybytes())

    @property
    def size(self) -> int:  # type: ignore[override]
        return self._length()

    def _drop_inner(self) -> None:
        """After a failed read: an fsspec buffered file that is still open is kept for the
        retry. Each of its reads is a request of its own (a ranged GET) and a failed one leaves
        the file where it was, so the retry reads on from there, with the blocks it holds
        (a fresh file would fetch them again: 8 MiB a block for DCP's loads)."""
        inner = self._inner
        if (inner is not None and isinstance(getattr(inner, "file", None), AbstractBufferedFile)
                and not inner.file.closed):
            return
        super()._drop_inner()

    def _length(self) -> int:
        if self._size is None:
            self._size = ResumableInputFile.size(self)
        return self._size

    @property
    def loc(self) -> int:
        return self.tell()

    def _end(self) -> int:
        return self._length()

    def readline(self, size: int | None = -1) -> bytes:
        if self._native:  # pyarrow's files have no readline: lines from the blocks kept
            return self._readline_from_blocks(-1 if size is None else size)
        if size is not None and size >= 0:
            return super().readline(size)
        if self.closed:
            raise ValueError("I/O operation on closed file")
        with self._lock:
            line = self._retrier.call("read", self.path, self._attempt, _readline)
            self._pos += len(line)
            self._inner_pos = self._pos
        return cast("bytes", line)

    def info(self) -> dict[str, Any]:
        if self._details is not None:
            return dict(self._details)
        return self.fs.info(self.path)

    @property
    def details(self) -> dict[str, Any]:
        return self.info()

    def __reduce__(self) -> tuple[Any, ...]:
        return _reopen_read, (self.fs, self.path, self.mode, self.tell())

    def __repr__(self) -> str:
        return redact(f"<RetryReadFile {self.path!r} at {self._pos}>")


class _Blocks:
    """Blocks of `SMALL_BLOCK` bytes of one file, by offset, the last `SMALL_BLOCKS` fetched
    kept (fsspec's ``BlockCache`` does not say which bytes it holds, and a large read is to
    take those instead of fetching them again)."""

    def __init__(self, fetch: Callable[[int, int], bytes], size: int) -> None:
        self._fetch = fetch
        self._size = size
        self._kept: OrderedDict[int, bytes] = OrderedDict()

    def read(self, start: int, end: int) -> bytes:
        """Bytes ``start`` to ``end``, each block fetched once while it is kept."""
        if start >= end:
            return b""
        parts = []
        for number in range(start // SMALL_BLOCK, (end - 1) // SMALL_BLOCK + 1):
            base = number * SMALL_BLOCK
            parts.append(self._block(number)[max(start - base, 0):end - base])
        return b"".join(parts)

    def held(self, start: int, end: int) -> bytes:
        """The bytes from ``start`` on (not past ``end``) that kept blocks hold, fetching none."""
        parts = []
        while start < end:
            block = self._kept.get(start // SMALL_BLOCK)
            if block is None:
                break
            offset = start % SMALL_BLOCK
            piece = block[offset:offset + end - start]
            if not piece:
                break
            parts.append(piece)
            start += len(piece)
        return b"".join(parts)

    def held_before(self, end: int, floor: int) -> bytes:
        """The bytes up to ``end`` (not before ``floor``) that kept blocks hold, fetching none."""
        parts: list[bytes] = []
        while end > floor:
            number = (end - 1) // SMALL_BLOCK
            block = self._kept.get(number)
            base = number * SMALL_BLOCK
            if block is None or end - base > len(block):
                break
            piece = block[max(floor - base, 0):end - base]
            parts.insert(0, piece)
            end -= len(piece)
        return b"".join(parts)

    def _block(self, number: int) -> bytes:
        block = self._kept.get(number)
        if block is None:
            start = number * SMALL_BLOCK
            block = self._fetch(start, min(self._size, start + SMALL_BLOCK))
            self._kept[number] = block
            if len(self._kept) > SMALL_BLOCKS:
                self._kept.popitem(last=False)
        else:
            self._kept.move_to_end(number)
        return block


def _readline(inner: Any) -> bytes:
    line = inner.readline()
    return bytes(line) if not isinstance(line, bytes) else line


def _reopen_read(fs: _Face, path: str, mode: str, position: int) -> RetryReadFile:
    file = fs.open(path, mode)
    file.seek(position)
    return cast("RetryReadFile", file)


class RetryWriteFile(ReplayableOutputStream):
    """A file open for writing that replays into a fresh upload when one fails (see
    `ReplayableOutputStream`). Quacks like an fsspec file: ``path``, ``fs``, ``mode``, ``loc``,
    ``commit()``/``discard()`` (transactions), context manager."""

    def __init__(self, fs: _Face, path: str, mode: str, inner: Any,
                 reopen: Callable[[], Any], retrier: Retrier, *,
                 verify: Callable[..., Verdict] | None, spool_memory: int,
                 autocommit: bool, attempt_timeout: AttemptTimeout | None = None,
                 state_of: Callable[[str], Any] | None = None,
                 after_close: Callable[[], None] | None = None) -> None:
        """``inner``: an `InnerFile` (an fsspec file), or a pyarrow stream (``file_client``),
        which ``reopen`` gives again for each attempt; ``after_close`` runs once the file is
        closed, committed or not (the fsspec listings cache forgets the path)."""
        super().__init__(path, inner, reopen, retrier, verify=verify, spool_memory=spool_memory,
                         attempt_timeout=attempt_timeout, state_of=state_of)
        self.fs = fs
        self.mode = mode
        self.autocommit = autocommit
        self._last_inner = inner
        self._after_close = after_close

    @property
    def loc(self) -> int:
        return self.tell()

    def close(self) -> None:
        if self.closed:
            return
        try:
            super().close()
        finally:
            if self._after_close is not None:
                self._after_close()

    def commit(self) -> None:
        """Commit a file written inside a transaction (``autocommit=False``)."""
        inner = self._last_inner
        self._retrier.call("commit", self.path, inner.file.commit)

    def discard(self) -> None:
        """Throw the file away without committing it."""
        if not self.closed:
            self._failed = True  # close() now discards instead of committing
            self.close()
        else:
            discard_file = getattr(getattr(self._last_inner, "file", None), "discard", None)
            if discard_file is not None:
                discard_file()

    def __reduce__(self) -> tuple[Any, ...]:
        raise RuntimeError("Pickling a writeable file is not supported")

    def __repr__(self) -> str:
        return redact(f"<RetryWriteFile {self.path!r} {self.tell()} bytes written>")


class AsyncRetryReadFile:
    """The async reader of `AsyncRetryFileSystem.open_async`: reads resume after a failure.

    Async streams cannot seek, so after a failure the reads go on as ranged reads from the
    offset (``_cat_file(path, start, end)``, S3: ``Range: bytes=<offset>-...``): the bytes
    before the offset are never downloaded again.
    """

    def __init__(self, fs: Any, path: str, mode: str,
                 kwargs: Mapping[str, Any]) -> None:
        self.fs = fs
        self.path = path
        self.mode = mode
        self._kwargs = dict(kwargs)
        self._inner: Any = None
        self._ranged_size: int | None = None  # set once reads go on as ranged reads
        self.loc = 0
        self.closed = False
        self._lock = asyncio.Lock()

    @property
    def size(self) -> int | None:
        if self._ranged_size is not None:
            return self._ranged_size
        return getattr(self._inner, "size", None)

    def tell(self) -> int:
        return self.loc

    async def _first_open(self) -> None:
        await self.fs.retrier.acall("open_input_file", self.path, self._open)

    async def _open(self) -> None:
        self._inner = await self.fs.fs.open_async(self.path, self.mode, **self._kwargs)

    async def _ranged_read(self, length: int) -> bytes:
        if self._ranged_size is None:
            info = await self.fs.fs._info(self.path)
            self._ranged_size = int(info["size"])
        end = self._ranged_size if length < 0 else min(self._ranged_size, self.loc + length)
        if end <= self.loc:
            return b""
        return bytes(await self.fs.fs._cat_file(self.path, start=self.loc, end=end))

    async def read(self, length: int = -1) -> bytes:
        if self.closed:
            raise ValueError("I/O operation on closed file")

        async def attempt() -> bytes:
            if self._inner is None:
                if self.loc == 0 and self._ranged_size is None:
                    await self._open()
                else:
                    return await self._ranged_read(length)
            try:
                return cast("bytes", await self._inner.read(length))
            except BaseException:
                inner, self._inner = self._inner, None
                await _aclose_quietly(inner)
                raise

        async with self._lock:
            data = await self.fs.retrier.acall("read", self.path, attempt)
            self.loc += len(data)
        return cast("bytes", data)

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            inner, self._inner = self._inner, None
            if inner is not None:
                await _aclose_quietly(inner)

    async def __aenter__(self) -> AsyncRetryReadFile:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


class AsyncTimedWriteFile:
    """The async writer of `AsyncRetryFileSystem.open_async`: every write, flush and close is
    bounded as the sync faces' are (``write_timeout`` plus its bytes in flight at
    ``min_throughput``).

    An async file is not replayable (nothing keeps its bytes), so an attempt that times out is
    not retried: it is cancelled (its request abandoned), the file is discarded where the
    backend allows (``discard()``) and never committed afterwards (a later ``close`` does not
    send what it holds), and the caller gets a retryable `AttemptTimeoutError` to redo the
    whole write."""

    def __init__(self, inner: Any, path: str, attempt_timeout: AttemptTimeout) -> None:
        self._inner = inner
        self.path = path
        self._attempt_timeout = attempt_timeout
        self._broken: AttemptTimeoutError | None = None

    def __getattr__(self, name: str) -> Any:  # loc, tell, mode, blocksize... of the file
        return getattr(self.__dict__["_inner"], name)

    @property
    def closed(self) -> bool:
        return bool(self._broken is not None or self._inner.closed)

    async def write(self, data: Any) -> Any:
        return await self._bounded("write", lambda: self._inner.write(data), len(data))

    async def flush(self, force: bool = False) -> Any:
        return await self._bounded("flush", lambda: self._inner.flush(force=force), 0)

    async def close(self) -> None:
        if self._broken is not None:
            return  # discarded: nothing is committed
        await self._bounded("close", self._inner.close, 0)

    async def _bounded(self, operation: str, start: Callable[[], Any], size: int) -> Any:
        if self._broken is not None:
            raise ValueError(f"{self.path!r}: the file was discarded after {self._broken}")
        seconds = self._attempt_timeout(operation, size + _buffered(self._inner))
        if seconds is None:
            return await start()
        try:
            return await wait_for_attempt(start(), seconds, operation, self.path)
        except AttemptTimeoutError as timeout:
            self._broken = timeout
            try:
                if hasattr(self._inner, "discard"):
                    self._inner.discard()
                self._inner.closed = True  # so that its __del__ never commits it either
            except Exception:  # noqa: BLE001 - best effort: it is never committed by us
                pass
            raise

    async def __aenter__(self) -> AsyncTimedWriteFile:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    def __repr__(self) -> str:
        return redact(f"<AsyncTimedWriteFile {self.path!r}>")


def _buffered(file: Any) -> int:
    """The bytes a buffered fsspec file holds (sent by its next flush or its close)."""
    buffer = getattr(file, "buffer", None)
    try:
        return int(buffer.tell()) if buffer is not None else 0
    except (ValueError, AttributeError, TypeError):
        return 0


async def _aclose_quietly(file: Any) -> None:
    try:
        result = file.close()
        if inspect.isawaitable(result):
            await result
    except Exception:  # noqa: BLE001 - a broken stream
        pass


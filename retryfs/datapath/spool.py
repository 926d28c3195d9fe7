"""The replay spool: every byte written to a stream, kept until its commit so that a failed
upload can be replayed whole into a fresh one (`retryfs.datapath.streams`).

The first ``memory`` bytes stay in memory; the rest goes to a temporary file, through a staging
buffer of `STAGE` bytes written out whole with direct I/O (``O_DIRECT``) where the file's
filesystem takes it. A spool is written once and read only when an upload fails, so keeping it
out of the page cache costs nothing later. Writing 1 GiB to a temporary file through the page
cache cost 0.2-1.9 s of the kernel's CPU time on this project's 2-core benchmark machine (pages
found, filled and written back), direct 0.05 s: the server beside the client gets those seconds.
Where direct I/O is refused (tmpfs, a platform without it) the same staged writes go through
the page cache.
"""

from __future__ import annotations

import contextlib
import io
import mmap
import os
import tempfile
from concurrent.futures import Future
from typing import IO, Any

from retryfs.core.timeouts import in_background

__all__ = ["REPLAY_CHUNK", "STAGE", "ReplaySpool", "replay_spool"]

#: The size of each read of a replay (and of a skip to an offset in a reopened stream).
REPLAY_CHUNK = 8 * 1024 * 1024
#: The staging buffer of the file part: written out whole, at offsets that are multiples of it
#: (what direct I/O needs: a multiple of the block size, from page-aligned memory).
STAGE = 4 * 1024 * 1024
_BLOCK = 4096  # direct I/O is tried only for a stage that is a multiple of this


def replay_spool(memory: int) -> ReplaySpool:
    """Memory up to ``memory`` bytes, then a temporary file; ``0``: a temporary file from the
    first byte."""
    return ReplaySpool(memory)


class ReplaySpool:
    """Every byte written to a stream, kept to replay it: the first ``memory`` bytes in
    memory, the rest in a temporary file (``retryfs-...``) made at the first byte past them.
    ``SpooledTemporaryFile`` would move what it holds into the file when it spills: at a
    1 GiB spool, a 1 GiB burst of writes to the disk in the middle of an upload. Writes
    append; reads start where ``seek`` put the position and may end early at the memory's
    end (a caller reads until it gets ``b""``); ``read()`` reads all the rest."""

    def __init__(self, memory: int, stage: int = STAGE) -> None:
        self._memory = max(0, memory)
        self._head = bytearray()
        self._tail: _Tail | None = None
        self._stage = stage
        self._size = 0
        self._pos = 0
        self.closed = False

    def __enter__(self) -> ReplaySpool:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        room = max(0, self._memory - len(self._head))
        if room:
            self._head += view[:room]
        if len(view) > room:
            if self._tail is None:
                self._tail = _Tail(self._stage)
            self._tail.write(view[room:])
        self._size += len(view)
        self._pos = self._size
        return len(view)

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if whence not in (io.SEEK_SET, io.SEEK_END):
            raise ValueError(f"a replay spool seeks from its start or end, not {whence!r}")
        self._pos = offset if whence == io.SEEK_SET else self._size + offset
        return self._pos

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            chunks = []
            while chunk := self.read(REPLAY_CHUNK):
                chunks.append(chunk)
            return b"".join(chunks)
        start, end = self._pos, min(self._size, self._pos + size)
        if start >= end:
            return b""
        if start < len(self._head):
            with memoryview(self._head) as head:  # released at once: the head grows
                data = bytes(head[start:min(end, len(self._head))])
        else:
            assert self._tail is not None  # bytes past the memory are in the file
            data = self._tail.read(start - len(self._head), end - start)
        self._pos += len(data)
        return data

    def close(self) -> None:
        self.closed = True
        self._head = bytearray()
        if self._tail is not None:
            self._tail.close()


class _Tail:
    """The file part of a spool: a temporary file holding whole stages, and two stages
    (page-aligned memory): one being filled while the other, full, is written out on a worker
    thread (`retryfs.core.timeouts.in_background`), so that the disk's time overlaps the
    writer's. Bytes at ``offset`` < `written` are in the file (or on their way to it), the
    rest in the stage being filled. The file is opened for direct I/O where its filesystem
    takes it; the first read turns that off (a read of any size and offset, through the page
    cache). A failed write of a stage is raised by the next write, read or close."""

    def __init__(self, stage: int) -> None:
        self.file: IO[bytes] = tempfile.TemporaryFile(prefix="retryfs-", buffering=0)
        self.stages = [mmap.mmap(-1, stage), mmap.mmap(-1, stage)]
        self.stage = self.stages[0]  # the one being filled
        self.staged = 0
        self.written = 0
        self.pending: Future[None] | None = None  # the other stage's write
        self.direct = stage % _BLOCK == 0 and _set_direct(self.file.fileno(), True)

    def write(self, view: memoryview) -> None:
        size = len(self.stage)
        while len(view):
            n = min(len(view), size - self.staged)
            self.stage[self.staged:self.staged + n] = view[:n]
            self.staged += n
            view = view[n:]
            if self.staged == size:
                self._write_out()

    def _write_out(self) -> None:
        """The full stage on its way to the file, once the other one has got there."""
        self.wait()
        full, offset = self.stage, self.written
        self.pending = in_background(lambda: _write_all(self.file, full, offset))
        self.written += len(full)
        self.stage = self.stages[1] if full is self.stages[0] else self.stages[0]
        self.staged = 0

    def wait(self) -> None:
        pending, self.pending = self.pending, None
        if pending is not None:
            pending.result()

    def read(self, offset: int, size: int) -> bytes:
        if offset >= self.written:
            start = offset - self.written
            return self.stage[start:min(start + size, self.staged)]
        self.wait()
        if self.direct:
            self.direct = not _set_direct(self.file.fileno(), False)
        self.file.seek(offset)
        return self.file.read(min(size, self.written - offset)) or b""

    def close(self) -> None:
        with contextlib.suppress(Exception):  # its error no longer matters, but the file and
            self.wait()  # the stage it writes from must not close under it
        self.file.close()
        for stage in self.stages:
            stage.close()


def _set_direct(fd: int, on: bool) -> bool:
    """Direct I/O on ``fd`` turned on or off; whether that was done (Linux only; a filesystem
    that does not support it refuses)."""
    direct = getattr(os, "O_DIRECT", 0)
    if not direct:
        return False
    import fcntl

    with contextlib.suppress(OSError):
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | direct if on else flags & ~direct)
        return True
    return False


def _write_all(file: IO[bytes], data: mmap.mmap, offset: int) -> None:
    """All of ``data`` written at ``offset`` (an unbuffered file's write may write less). The
    file's position is this call's while it runs: a read waits for it first."""
    file.seek(offset)
    with memoryview(data) as view:
        done = 0
        while done < len(view):
            done += file.write(view[done:]) or 0

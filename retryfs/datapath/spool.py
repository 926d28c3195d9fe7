"""The replay spool: every byte written to a stream, kept until its commit so that a failed
upload can be replayed whole into a fresh one (`retryfs.datapath.streams`)."""

from __future__ import annotations

import io
import tempfile
from typing import IO, Any

__all__ = ["REPLAY_CHUNK", "ReplaySpool", "replay_spool"]

#: The size of each read of a replay (and of a skip to an offset in a reopened stream).
REPLAY_CHUNK = 8 * 1024 * 1024


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

    def __init__(self, memory: int) -> None:
        self._memory = max(0, memory)
        self._head = bytearray()
        self._tail: IO[bytes] | None = None
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
                self._tail = tempfile.TemporaryFile(prefix="retryfs-")
            self._tail.seek(0, io.SEEK_END)
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
            self._tail.seek(start - len(self._head))
            data = self._tail.read(end - start)
        self._pos += len(data)
        return data

    def close(self) -> None:
        self.closed = True
        self._head = bytearray()
        if self._tail is not None:
            self._tail.close()

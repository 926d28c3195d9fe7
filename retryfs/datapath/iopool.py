"""Arrow's IO thread pool: lend it a thread while one of its own waits on it.

``pyarrow.fs.copy_files(use_threads=True)`` runs every file's copy as a task on Arrow's IO
pool (8 threads by default), and a native S3, GCS or Azure output stream with background
writes uploads its parts as further tasks on that same pool; its ``close()`` (and ``flush()``)
waits for them. When every pool thread is a copy waiting in ``close()`` for parts queued behind
it, nothing runs again: apache/arrow#15233. Through retryfs it happens as soon as the closes
overlap (measured: with 2 IO threads the first or second copy of a 41-file checkpoint hangs
for good; with 8, under faults that hold threads in retries and a loaded machine, rarely).

:func:`lend_io_thread` is the managed-blocking answer (as ``ForkJoinPool.managedBlock``):
around a call that may wait on pool tasks, the pool gets one more thread, and gives it back
after. Queued part uploads then always find a thread; the streams keep their background
writes (parallel parts of one large object).

The same streams give no backpressure: pyarrow's S3 output stream queues a part for upload at
each write and holds it in memory until it is sent, so a source faster than the network piles
the object up in memory (a 1 GiB upload from a local disk: +542 MiB peak RSS on this machine).
Its ``flush()`` waits for the queued parts and uploads no partial one (parts keep their size):
:func:`write_bounded` flushes every `UNSENT_MAX` bytes written, which bounds what one upload
holds unsent by that plus a write. It hands a large write over in `PART_SLICE` slices (no
copy; in the first `SLICED_MAX` bytes, so that an upload stays within S3's 10,000 parts): the
stream uploads each as a part of its own, in parallel, where a 64 MiB buffer (a
``copy_files`` chunk) would be one part, and a window of one part a serial upload. Not
Azure's: its flush commits the block list (the prefix would become the object).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs

from retryfs.core.locations import subtree_base

__all__ = ["ONE_PART", "PART_SLICE", "SLICED_MAX", "UNSENT_MAX", "LazyUploadStream",
           "PoolSafeOutputStream", "holds_unsent_parts", "keep_unclosed", "lend_io_thread",
           "opens_lazily", "write_bounded", "writes_in_background"]

T = TypeVar("T")

_lock = threading.Lock()

#: Native filesystems whose output streams upload parts on Arrow's IO pool.
_BACKGROUND_WRITERS: tuple[type, ...] = tuple(
    cls for cls in (getattr(pafs, name, None) for name in
                    ("S3FileSystem", "GcsFileSystem", "AzureFileSystem")) if cls is not None)


def writes_in_background(fs: Any) -> bool:
    """Whether ``fs``'s output streams wait on Arrow's IO pool when they flush or close."""
    return isinstance(fs, _BACKGROUND_WRITERS)


#: Below this size a file is one part of a native S3 upload (S3's minimum part size; pyarrow's
#: part upload threshold is at least that): its close waits for that one part anyway.
ONE_PART = 5 * 1024 * 1024

#: Bytes written to a native S3 output stream between two flushes: at most this much (and one
#: write) waits in memory for the network; 8 parts of `PART_SLICE` (Arrow's 8 IO threads).
UNSENT_MAX = 128 * 2**20
#: The largest slice of a write handed to a bounded stream: a part of its own (S3's minimum is
#: 5 MiB). Only the first `SLICED_MAX` bytes of an upload are sliced: S3 takes 10,000 parts,
#: and past them a 64 MiB ``copy_files`` chunk goes whole, one part, as unwrapped pyarrow sends
#: it (1,000 parts of 16 MiB and 9,000 of 64 MiB: 578 GiB, against unwrapped's 625).
PART_SLICE = 16 * 2**20
SLICED_MAX = 1_000 * PART_SLICE


def holds_unsent_parts(fs: Any) -> bool:
    """Whether ``fs``'s output streams keep every queued part in memory until it is sent, with
    no bound (pyarrow's S3), so that their writers should `write_bounded`."""
    return isinstance(subtree_base(fs), pafs.S3FileSystem)


def write_bounded(stream: Any, buffer: pa.Buffer, unflushed: int, written: int) -> int:
    """``buffer`` written to ``stream`` (which holds ``written`` bytes before it) in slices of
    at most `PART_SLICE` (no copy; within the first `SLICED_MAX` bytes), the stream flushed
    (its queued parts sent, Arrow's IO pool lent a thread meanwhile) each time the bytes
    written since the last flush (``unflushed`` before) reach `UNSENT_MAX`; the bytes left
    unflushed after."""
    slice_size = PART_SLICE if written < SLICED_MAX else max(buffer.size, 1)
    for start in range(0, buffer.size, slice_size):
        piece = buffer.slice(start, min(slice_size, buffer.size - start))
        stream.write(piece)
        unflushed += piece.size
        if unflushed >= UNSENT_MAX:
            with lend_io_thread():
                stream.flush()
            unflushed = 0
    return unflushed


@contextmanager
def lend_io_thread() -> Iterator[None]:
    """One more thread in Arrow's IO pool for the duration (the pool shrinks back after)."""
    with _lock:
        pa.set_io_thread_count(pa.io_thread_count() + 1)
    try:
        yield
    finally:
        with _lock:
            pa.set_io_thread_count(max(1, pa.io_thread_count() - 1))


class PoolSafeOutputStream:
    """A native output stream whose ``flush`` and ``close`` lend Arrow's IO pool a thread.

    Writes go straight through, flushed every `UNSENT_MAX` bytes with ``bounded`` (see
    `holds_unsent_parts`); everything else is the inner stream's.
    """

    __slots__ = ("_inner", "_bounded", "_unflushed", "_written")

    def __init__(self, inner: Any, *, bounded: bool = False) -> None:
        self._inner = inner
        self._bounded = bounded
        self._unflushed = self._written = 0

    def write(self, data: Any) -> Any:
        if not self._bounded:
            return self._inner.write(data)
        buffer = data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
        self._unflushed = write_bounded(self._inner, buffer, self._unflushed, self._written)
        self._written += buffer.size
        return buffer.size

    def flush(self) -> None:
        self._blocking(self._inner.flush)

    def close(self) -> None:
        self._blocking(self._inner.close)

    def _blocking(self, fn: Callable[[], T]) -> T:
        with lend_io_thread():
            return fn()

    @property
    def closed(self) -> bool:
        return bool(self._inner.closed)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def opens_lazily(fs: Any) -> bool:
    """Whether ``fs`` is pyarrow's S3 client with ``allow_delayed_open``: its output streams
    start their upload with their first part, and one whose CreateMultipartUpload failed
    stores an empty object when it is closed (pyarrow 26, measured), over the object there.
    A broken stream of such a client is never closed (`LazyUploadStream`)."""
    base = subtree_base(fs)
    if not isinstance(base, pafs.S3FileSystem):
        return False
    _, (options,) = base.__reduce__()
    return bool(options.get("allow_delayed_open"))


def keep_unclosed(stream: Any) -> None:
    """Keep ``stream`` alive, unclosed, for the rest of the process: a reference never given
    back (pyarrow's native streams close from their destructor, and the close commits)."""
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(stream))


class LazyUploadStream(PoolSafeOutputStream):
    """An output stream of a client that opens its uploads lazily (`opens_lazily`):
    ``discard`` (how retryfs drops a broken stream) keeps it unclosed (`keep_unclosed`)
    instead of closing it, which would store an empty object if its upload never started."""

    __slots__ = ()

    def discard(self) -> None:
        keep_unclosed(self._inner)

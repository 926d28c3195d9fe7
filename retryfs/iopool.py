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
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

import pyarrow as pa
import pyarrow.fs as pafs

__all__ = ["PoolSafeOutputStream", "lend_io_thread", "writes_in_background"]

T = TypeVar("T")

_lock = threading.Lock()

#: Native filesystems whose output streams upload parts on Arrow's IO pool.
_BACKGROUND_WRITERS: tuple[type, ...] = tuple(
    cls for cls in (getattr(pafs, name, None) for name in
                    ("S3FileSystem", "GcsFileSystem", "AzureFileSystem")) if cls is not None)


def writes_in_background(fs: Any) -> bool:
    """Whether ``fs``'s output streams wait on Arrow's IO pool when they flush or close."""
    return isinstance(fs, _BACKGROUND_WRITERS)


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

    Writes go straight through; everything else is the inner stream's.
    """

    __slots__ = ("_inner",)

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def write(self, data: Any) -> Any:
        return self._inner.write(data)

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

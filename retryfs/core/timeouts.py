"""Per-attempt timeouts: a black-holed connection becomes a retryable error.

A blocking call in Python cannot be interrupted from outside, so a timed attempt runs on a
worker thread and the caller waits for it at most ``seconds``. When the time is up the caller
raises :class:`AttemptTimeoutError` (a ``TimeoutError``: transient, so the engine retries) and
*abandons* the attempt: the worker keeps waiting on the dead connection until the client's own
socket timeout ends it, and whatever it returns then is thrown away. The workers are an elastic
pool: idle ones are reused, a new one is started when none is idle (so hung attempts can never
starve the others), and idle workers exit after a minute.

``timeout`` times the idempotent operations: reads (opening, reading, sizing, seeking an
input stream) and metadata calls. Writes, flushes and commits of output streams are timed too,
by default, with :func:`write_attempt_timeout`: a floor plus the bytes in flight at a minimum
throughput. The output stream abandons a stalled attempt
with care (``retryfs.datapath.streams``): its stream is never closed, since closing could commit a
prefix after the replay committed the whole.

Async operations (the fsspec face) are timed with :func:`wait_for_attempt`, on the event loop:
no thread is involved and the attempt is cancelled.
"""

from __future__ import annotations

import asyncio
import contextvars
import os
import queue
import threading
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from typing import Any, TypeVar, cast

import pyarrow.fs as pafs
from fsspec.implementations.arrow import ArrowFSWrapper
from fsspec.implementations.local import LocalFileSystem as FsspecLocalFileSystem

from retryfs.errors import AttemptAbandoned, AttemptTimeoutError, CommitInFlightError

from .policy import GROUPS, OPERATION_GROUPS

__all__ = [
    "AttemptAbandoned",
    "AttemptSignal",
    "AttemptTimeoutError",
    "DEFAULT_MIN_THROUGHPUT",
    "DEFAULT_WRITE_TIMEOUT",
    "settle",
    "write_attempt_timeout",
    "writes_locally",
    "TIMED_GROUPS",
    "TimedInputStream",
    "in_background",
    "resolve_timeouts",
    "run_with_timeout",
    "wait_for_attempt",
]

T = TypeVar("T")

#: The policy groups whose operations may be timed (idempotent: an abandoned attempt is harmless).
TIMED_GROUPS: tuple[str, ...] = ("read", "metadata")
_IDLE_SECONDS = 60.0

#: The floor of a write, flush or commit attempt's timeout, in seconds.
DEFAULT_WRITE_TIMEOUT = 60.0
#: Below this many bytes per second, an upload attempt counts as stalled.
DEFAULT_MIN_THROUGHPUT = 1024 * 1024


def write_attempt_timeout(floor: float, min_throughput: float, in_flight: int) -> float:
    """Seconds one write/flush/commit attempt may take: ``floor`` plus ``in_flight`` bytes at
    ``min_throughput`` bytes/s."""
    return floor + in_flight / min_throughput


def writes_locally(fs: Any) -> bool:
    """Whether ``fs`` writes files on this machine (pyarrow's or fsspec's ``LocalFileSystem``):
    its output streams then write and close on the caller's thread, untimed. A local write
    waits on the kernel, not on a connection that a fresh stream would replace, and timing
    it costs a hop to a worker thread and back per write and per close: several times the
    write of a small file. (A hung NFS mount holds the caller as it holds unwrapped pyarrow.)
    """
    if isinstance(fs, ArrowFSWrapper):
        fs = fs.fs
    return isinstance(fs, (pafs.LocalFileSystem, FsspecLocalFileSystem))


def resolve_timeouts(timeout: float | Mapping[str, float] | None,
                     operation_groups: Mapping[str, str] = OPERATION_GROUPS, *,
                     strict: bool = True) -> dict[str, float]:
    """``{operation: seconds}`` for every timed operation.

    A number applies to every read and metadata operation. A mapping names groups (``read``,
    ``metadata``) or operations (``read``, ``get_file_info``, ``open_input_file``...); an
    operation's own entry beats its group's. ``None`` or an empty mapping: no timeouts.
    ``operation_groups`` names the operations of a face and their groups (the pyarrow face's by
    default; the fsspec face adds its own method names). ``strict=False`` skips the names of
    other faces' operations (settings already checked, handed from one face to the other).
    """
    if timeout is None:
        return {}
    if isinstance(timeout, Mapping):
        entries = dict(timeout)
    else:
        entries = {group: timeout for group in TIMED_GROUPS}
    if not strict:
        entries = {k: v for k, v in entries.items() if k in GROUPS or k in operation_groups}
    for key, seconds in entries.items():
        if key not in GROUPS and key not in operation_groups:
            raise ValueError(f"timeout key {key!r} is neither a group ({', '.join(GROUPS)}) "
                             f"nor an operation ({', '.join(sorted(operation_groups))})")
        group = key if key in GROUPS else operation_groups[key]
        if group not in TIMED_GROUPS:
            raise ValueError(
                f"timeout for {key!r}: only reads and metadata calls can be timed "
                f"({', '.join(TIMED_GROUPS)}); writes and commits have write_timeout and "
                "min_throughput instead")
        if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not (
                0 < seconds < float("inf")):
            raise ValueError(f"timeout for {key!r} must be a number of seconds > 0, "
                             f"got {seconds!r}")
    resolved: dict[str, float] = {}
    for operation, group in operation_groups.items():
        if operation in entries:
            resolved[operation] = float(entries[operation])
        elif group in entries:
            resolved[operation] = float(entries[group])
    return resolved


# -- the elastic worker pool ------------------------------------------------------------------

class _Worker:
    __slots__ = ("inbox",)

    def __init__(self) -> None:
        self.inbox: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]]] = queue.SimpleQueue()


class _Workers:
    """Reuses idle threads, starts one when none is idle; never blocks a submit."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: list[_Worker] = []
        self._started = 0

    def submit(self, fn: Callable[[], T]) -> Future[T]:
        future: Future[T] = Future()
        with self._lock:
            worker = self._idle.pop() if self._idle else None
            if worker is None:
                self._started += 1
                number = self._started
        if worker is not None:
            worker.inbox.put((future, fn))
        else:
            worker = _Worker()
            worker.inbox.put((future, fn))
            threading.Thread(target=self._work, args=(worker,), daemon=True,
                             name=f"retryfs-attempt-{number}").start()
        return future

    def _work(self, worker: _Worker) -> None:
        while True:
            try:
                future, fn = worker.inbox.get(timeout=_IDLE_SECONDS)
            except queue.Empty:
                with self._lock:
                    if worker in self._idle:  # nobody picked us meanwhile: retire
                        self._idle.remove(worker)
                        return
                future, fn = worker.inbox.get()  # picked just now: the task is on its way
            if not future.set_running_or_notify_cancel():  # cancelled before it started
                with self._lock:
                    self._idle.append(worker)
                continue
            failed: BaseException | None = None
            try:
                result = fn()
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
                failed, result = exc, None
            del fn
            with self._lock:  # idle again *before* the caller hears back: its next call reuses us
                self._idle.append(worker)
            if failed is not None:
                future.set_exception(failed)
            else:
                future.set_result(result)
            del future, failed, result


_workers = _Workers()


def _forget_parent_workers() -> None:
    """A forked child gets a pool of its own: its parent's workers are no threads here, and
    each idle one would take an attempt and never run it (timed out for nothing)."""
    global _workers
    _workers = _Workers()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forget_parent_workers)


class AttemptSignal(threading.Event):
    """An attempt's abandoned flag (set: abandoned by its timeout), and whether it had begun its
    commit first: an attempt abandoned before its commit never commits (`start_commit` raises
    in it), one abandoned during its commit has a request on its way that may still land. The
    call that abandoned it `settle`s such attempts before it reports success."""

    def __init__(self, seconds: float | None = None) -> None:
        super().__init__()
        self._decide = threading.Lock()
        self.committing = False
        self.seconds = seconds  # the attempt's own timeout: how long its commit is waited for
        self.ended = threading.Event()  # set by the attempt when it returns or raises

    def start_commit(self) -> None:
        """In the attempt, right before its commit: `AttemptAbandoned` if it was abandoned;
        else it is committing from now on."""
        with self._decide:
            if self.is_set():
                raise AttemptAbandoned()
            self.committing = True

    def abandon(self) -> bool:
        """Mark the attempt abandoned; whether its commit was already under way."""
        with self._decide:
            self.set()
            return self.committing


def settle(in_flight: list[AttemptSignal], path: str, end: float | None,
           clock: Callable[[], float]) -> None:
    """Wait until each abandoned attempt whose commit was under way has ended (its outcome
    does not matter: it sent the same bytes as the retry that succeeded). A call must not
    report success while one of its own commit requests may still land, after it returned,
    over a later write. Each is waited for one more of its own attempt timeouts at most, and
    never past ``end`` (on ``clock``; ``None``: no deadline): then `CommitInFlightError`."""
    for signal in in_flight:
        limit = None if end is None else max(0.0, end - clock())
        if signal.seconds is not None:
            limit = signal.seconds if limit is None else min(limit, signal.seconds)
        if not signal.ended.wait(limit):
            raise CommitInFlightError(path)


def run_with_timeout(fn: Callable[[], T], seconds: float, operation: str, path: str,
                     *, on_abandon: Callable[[Future[T]], None] | None = None) -> T:
    """``fn()`` on a worker thread; :class:`AttemptTimeoutError` if it takes over ``seconds``.

    On a timeout, ``on_abandon(future)`` (if given) is called; the abandoned call goes on in
    the background and its outcome is discarded. ``fn`` runs in a copy of the caller's context,
    so the calls it makes see the enclosing operation's deadline.
    """
    context = contextvars.copy_context()
    future = _workers.submit(lambda: context.run(fn))
    done, _ = wait_futures((future,), timeout=seconds)
    if not done:
        if not future.cancel() and on_abandon is not None:
            on_abandon(future)
        raise AttemptTimeoutError(operation, path, seconds)
    return future.result()


def in_background(fn: Callable[[], T], context: contextvars.Context | None = None
                  ) -> Future[T]:
    """``fn()`` on the worker pool, in ``context`` (default: a copy of the caller's), not
    waited for: its outcome is the future's."""
    context = contextvars.copy_context() if context is None else context
    return _workers.submit(lambda: context.run(fn))


def timed(fn: Callable[..., T], seconds: float, operation: str,
          path: str) -> Callable[..., T]:
    """``fn`` with each call bounded by ``seconds`` (see :func:`run_with_timeout`)."""

    def call(*args: Any, **kwargs: Any) -> T:
        return run_with_timeout(lambda: fn(*args, **kwargs), seconds, operation, path)

    return call


async def wait_for_attempt(awaitable: Awaitable[T], seconds: float, operation: str,
                           path: str) -> T:
    """Await ``awaitable`` for at most ``seconds``; cancel it and raise a timeout past that.

    Unlike ``asyncio.wait_for``, a ``TimeoutError`` raised by the operation itself is told
    apart from the deadline passing (the former is raised as it is).
    """
    task = asyncio.ensure_future(awaitable)
    try:
        done, _ = await asyncio.wait((task,), timeout=seconds)
    except BaseException:  # the caller was cancelled: take the attempt down with it
        task.cancel()
        raise
    if not done:
        task.cancel()
        task.add_done_callback(_retrieve)
        raise AttemptTimeoutError(operation, path, seconds)
    return task.result()


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # mark it retrieved: the attempt was abandoned on purpose


# -- timed input streams ---------------------------------------------------------------------

class TimedInputStream:
    """An input stream whose every call is bounded by a per-attempt timeout.

    Wraps the inner stream of a resumable input (pyarrow ``NativeFile`` or a Python file).
    After a timeout the stream is *poisoned*: the caller's resumable stream discards it and
    opens a fresh one at the same offset, while the abandoned call finishes in the background
    and then closes the old stream (closing it under a running read is not safe).
    """

    def __init__(self, inner: Any, seconds: float, operation: str, path: str) -> None:
        self._inner = inner
        self._seconds = seconds
        self._operation = operation
        self._path = path
        self._lock = threading.Lock()
        self._busy: Future[Any] | None = None
        self._close_when_done = False
        self._closed = False

    def _run(self, fn: Callable[[], T]) -> T:
        if self._busy is not None:
            raise OSError(f"retryfs: input stream for {self._path!r} timed out earlier")
        result: T = run_with_timeout(fn, self._seconds, self._operation, self._path,
                                     on_abandon=self._abandoned)
        return result

    def _abandoned(self, future: Future[Any]) -> None:
        with self._lock:
            self._busy = future
        future.add_done_callback(lambda _: self._finish_abandoned())

    def _finish_abandoned(self) -> None:
        with self._lock:
            close = self._close_when_done and not self._closed
            self._closed = self._closed or close
        if close:
            _quiet_close(self._inner)

    # -- the file protocol ResumableInputFile uses ----------------------------------------------
    def read(self, size: int = -1) -> Any:
        inner = self._inner
        if size is None or size < 0:
            return self._run(inner.read)
        return self._run(lambda: inner.read(size))

    def __getattr__(self, name: str) -> Any:
        # read_buffer only where the inner file has it (the resumable stream asks with hasattr):
        # a native file then sizes its buffer to what is left instead of allocating ``size``.
        inner = self.__dict__.get("_inner")
        if name == "read_buffer" and inner is not None and hasattr(inner, "read_buffer"):
            def read_buffer(size: int | None = -1) -> Any:
                if size is None or size < 0:
                    return self._run(inner.read_buffer)
                return self._run(lambda: inner.read_buffer(size))

            return read_buffer
        raise AttributeError(name)

    def size(self) -> int:
        inner = self._inner
        size = getattr(inner, "size", None)
        if callable(size):
            return int(self._run(size))
        if isinstance(size, int):
            return size
        raise AttributeError("size")

    def seekable(self) -> bool:
        return bool(getattr(self._inner, "seekable", lambda: False)())

    def seek(self, offset: int, whence: int = 0) -> int:
        return cast("int", self._run(lambda: self._inner.seek(offset, whence)))

    def tell(self) -> int:
        return int(self._inner.tell())

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            if self._busy is not None and not self._busy.done():
                self._close_when_done = True  # the abandoned call closes it when it returns
                return
            self._closed = True
        _quiet_close(self._inner)


def _quiet_close(stream: Any) -> None:
    try:
        stream.close()
    except Exception:  # noqa: BLE001 - an abandoned stream; its errors no longer matter
        pass

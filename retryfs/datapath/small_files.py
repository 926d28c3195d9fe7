"""The small files of a threaded local tree copy: one worker, one tight loop, same promises.

Through the generic path (`retryfs.datapath.upload`) each file of a threaded ``copy_files`` is a
pool task with a watchdog, a pair of native streams, a temporary name, a rename, a retried
check and a report: 0.3-0.6 ms a file onto tmpfs, where Arrow's own copy of a 64 KiB file
costs 40-60 us, so a checkpoint of hundreds of small files copied at a fraction of unwrapped
speed. When the source and the destination of a file are both plain local paths
(``LocalFileSystem``, or a ``SubTreeFileSystem`` of one) and it holds at most `SMALL_FILE`
bytes, it joins a batch that `WORKERS` worker copies in listing order, while the big files go
on as before beside it. Each file of the batch keeps the generic path's promises:

- the kernel copies it (``sendfile``; reads and writes where that is refused) into
  ``.name.retryfs-<tag><n>.tmp``, created exclusively beside its destination, renamed into
  place after: a destination never holds a prefix;
- with ``verify_writes`` its size after the rename is checked, as its own ``verify`` call
  (retried if the stat fails; a short or missing file is copied again; a check that gives up
  leaves it unverified);
- its attempt is bounded by its own ``write_timeout`` (plus its bytes at ``min_throughput``),
  watched lazily (`_Worker`). When that expires (a stalled NFS write), the worker is left
  behind, marked expired: it never renames again. The stalled file goes on with its retries,
  counted as an attempt that timed out, and the rest of the batch on a fresh worker;
- a failure the destination's classifier retries becomes that file's retries, the failed
  attempt counted; any other failure sends the file through the generic path from its first
  attempt (Arrow's streams), so that a permanent error is the one unwrapped pyarrow raises
  (the loop's attempt is then not counted: it is redone, not retried);
- its outcome is recorded and reported to the ``copy_files`` guard, as every file's is.
"""

from __future__ import annotations

import contextvars
import errno
import functools
import itertools
import os
import posixpath
import secrets
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Protocol

import pyarrow.fs as pafs

from retryfs.core.classify import Decision
from retryfs.core.engine import Retrier
from retryfs.core.locations import temporary_beside
from retryfs.core.timeouts import AttemptAbandoned, AttemptTimeoutError, in_background
from retryfs.core.watchdog import watch

from .verify import proof


class BatchTarget(Protocol):
    """What the batch needs of the destination's handler (`retryfs.datapath.upload.CopyTarget`)."""

    retrier: Retrier

    @property
    def verify_writes(self) -> bool: ...
    def write_attempt_timeout(self, operation: str, in_flight: int) -> float | None: ...


#: ``(source, destination, read size, size)`` of one file of a tree copy
#: (`retryfs.datapath.upload.plan_tree`).
PlannedFile = tuple[str, str, int, "int | None"]

__all__ = ["SMALL_FILE", "WORKERS", "LocalFile", "SmallFileBatch", "local_path", "local_root",
           "split_local"]

#: A file of at most this many bytes joins the batch (a bigger one costs more to copy than
#: the generic path's overhead, and gets Arrow's one-file copy with the GIL released).
SMALL_FILE = 1 << 20

#: Workers per batch. One: a second one beside it did not copy the 300 small files of the
#: benchmark's tree faster on 2 cores (the Python between the syscalls waits for the GIL), and
#: cost 1.2-1.8x the CPU.
WORKERS = 1

_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0)
_READ = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
_SENDFILE = sys.platform.startswith("linux")
_NO_SENDFILE = frozenset({errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP})


def local_root(fs: pafs.FileSystem) -> str | None:
    """What turns a path of ``fs`` into the operating system's when ``fs`` is a
    `LocalFileSystem` (``""``: the path is the operating system's) or a chain of
    ``SubTreeFileSystem`` over one (the base path, prefixed to the path without its leading
    slashes); ``None`` otherwise (the generic path then copies its files)."""
    root = ""
    while isinstance(fs, pafs.SubTreeFileSystem):
        root = fs.base_path + root.lstrip("/")  # the outer subtree lies inside the inner
        fs = fs.base_fs
    if type(fs) is not pafs.LocalFileSystem or os.sep != "/":
        return None
    return root


def local_path(root: str, path: str) -> str | None:
    """``path`` under ``root`` (`local_root`), if the result is absolute and normal (no
    ``..``, ``.`` or ``//``: the generic path copies anything else as pyarrow would)."""
    if root:
        path = root + path.lstrip("/")
    if not path.startswith("/") or posixpath.normpath(path) != path:
        return None
    return path


@dataclass(frozen=True)
class LocalFile:
    """One small file of the batch: its planned copy and both operating-system paths."""

    planned: PlannedFile
    source: str
    destination: str

    def temporary(self, tag: str) -> str:
        """Where the copy is written before its rename: ``.name.retryfs-<tag>.tmp`` beside it
        (`retryfs.core.locations.temporary_beside`: within NAME_MAX whatever the name's length)."""
        return temporary_beside(self.destination, tag)


def split_local(source_fs: pafs.FileSystem, writer: pafs.FileSystem,
                files: list[PlannedFile]) -> tuple[list[LocalFile], list[PlannedFile]]:
    """The files the batch copies (small, both ends local paths) and the others."""
    source_root, destination_root = local_root(source_fs), local_root(writer)
    if source_root is None or destination_root is None:
        return [], files
    batch: list[LocalFile] = []
    rest: list[PlannedFile] = []
    for planned in files:
        source, destination, _, size = planned
        if size is not None and 0 <= size <= SMALL_FILE:
            source_os = local_path(source_root, source)
            destination_os = local_path(destination_root, destination)
            if source_os is not None and destination_os is not None:
                batch.append(LocalFile(planned, source_os, destination_os))
                continue
        rest.append(planned)
    return batch, rest


#: ``retry(file, error, started, seconds)``: a file's retries after its first attempt failed
#: with ``error`` (begun at ``started``), reported; ``copy(file)``: the generic path's whole
#: copy of a file, reported; ``report(destination, error)``: how a file's commit ended.
Retry = Callable[[PlannedFile, Exception, float, "float | None"], None]
Copy = Callable[[PlannedFile], None]
Report = Callable[[str, "BaseException | None"], None]


class _Worker:
    """One worker of the batch and the file it copies now, watched lazily: the watchdog is
    armed once, for the first file's timeout; when it fires it looks again when the current
    file is due (or one timeout later, between two files), and expires the worker when that
    file is overdue. Two stores per file instead of a watch each; a stalled file is expired
    within twice its timeout at worst."""

    __slots__ = ("lock", "current", "seconds", "expired", "ended")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.current: tuple[int, float, float] | None = None  # index, due, started
        self.seconds = 0.0  # the timeout of the file copied last
        self.expired = False
        self.ended = False


class SmallFileBatch:
    """Copies its files on `WORKERS` worker(s) (`start`); `wait` returns when each has ended."""

    def __init__(self, handler: BatchTarget, files: list[LocalFile], retry: Retry,
                 copy: Copy, report: Report) -> None:
        self.handler = handler
        self.files = files
        self._retry, self._copy, self._report = retry, copy, report
        self._next = itertools.count()  # the index of the next file to copy (next() is atomic)
        self._lock = threading.Lock()
        self._live = 0  # workers not yet ended or expired
        self._escaped: list[BaseException] = []
        self._handed: list[Future[None]] = []  # files sent on elsewhere (appended before done)
        self._done: Future[None] = Future()  # set when the last live worker ends
        self._tag = secrets.token_hex(4)  # with the file's index: a name never used before
        self._context = contextvars.copy_context()

    def start(self) -> None:
        for _ in range(min(WORKERS, len(self.files))):
            self._spawn()

    def wait(self) -> list[BaseException]:
        """Every file's end; the errors that escaped a file's handling (not its failures,
        which are reported to the guard)."""
        self._done.result()
        escaped = list(self._escaped)
        for handed in self._handed:  # complete: each was appended before its worker ended
            try:
                handed.result()
            except BaseException as exc:  # noqa: BLE001 - raised by copy_files's thread
                escaped.append(exc)
        return escaped

    def _spawn(self) -> None:
        with self._lock:
            self._live += 1
        in_background(self._work, self._context.copy())

    def _retire(self) -> None:
        with self._lock:
            self._live -= 1
            last = self._live == 0
        if last:
            self._done.set_result(None)

    def _hand(self, fn: Callable[[], None]) -> None:
        self._handed.append(in_background(fn, self._context.copy()))

    def _work(self) -> None:
        worker = _Worker()
        try:
            self._loop(worker)
        except BaseException as exc:  # noqa: BLE001 - handed to copy_files's thread
            self._escaped.append(exc)
        with worker.lock:
            worker.ended = True
            if worker.expired:
                return  # retired when it expired; a fresh worker took over
        self._retire()

    def _loop(self, worker: _Worker) -> None:
        handler = self.handler
        retrier = handler.retrier
        verify = handler.verify_writes
        armed = False
        while True:
            index = next(self._next)
            if index >= len(self.files):
                return
            file = self.files[index]
            seconds = handler.write_attempt_timeout("copy_files", file.planned[3] or 0)
            started = retrier.clock()
            if seconds is not None:
                worker.current = (index, time.monotonic() + seconds, started)
                worker.seconds = seconds
                if not armed:
                    armed = True
                    watch(seconds, lambda: self._overdue(worker))
            error: Exception | None = None
            copied = 0
            try:
                copied = self._copy_one(file, index, worker)
            except Exception as exc:  # noqa: BLE001 - classified below
                error = exc
            with worker.lock:
                if worker.expired:
                    return  # this file and the rest went on elsewhere
                worker.current = None  # its check is outside the timeout, as the generic path's
            unproven: Exception | None = None
            if error is None and verify:
                error, unproven = _check(retrier, file.destination, copied)
            if error is None:
                retrier.first_try_succeeded("copy_files")
                self._report(file.planned[1], unproven)
            elif retrier.classifier.classify(error) is Decision.FAIL:
                self._hand(functools.partial(self._copy, file.planned))
            else:
                self._hand(functools.partial(self._retry, file.planned, error, started, seconds))

    def _overdue(self, worker: _Worker) -> None:
        """On the watchdog's thread (keep it short): re-arm, or expire the worker whose file
        outlived its timeout. That file goes on with its retries (the attempt counted as timed
        out), the rest of the batch on a fresh worker; the stalled one never renames again."""
        with worker.lock:
            if worker.ended:
                return
            current, seconds = worker.current, worker.seconds
            wait = max(seconds, 1e-3) if current is None else current[1] - time.monotonic()
            if wait > 0:
                watch(wait, lambda: self._overdue(worker))
                return
            worker.expired = True
        assert current is not None
        index, _, started = current
        planned = self.files[index].planned
        timeout = AttemptTimeoutError("copy_files", planned[1], seconds)
        self._hand(functools.partial(self._retry, planned, timeout, started, seconds))
        self._spawn()  # before the stalled worker retires: the batch never looks done early
        self._retire()

    def _copy_one(self, file: LocalFile, index: int, worker: _Worker) -> int:
        """The file written beside its destination, then renamed into place; its bytes."""
        temporary = file.temporary(f"{self._tag}{index:x}")
        source = os.open(file.source, _READ)
        try:
            descriptor = os.open(temporary, _FLAGS, 0o666)
            try:
                try:
                    copied = _send_all(source, descriptor, file.planned[3] or 0)
                finally:
                    os.close(descriptor)
                if worker.expired:  # the watchdog expired it: it never renames again
                    raise AttemptAbandoned()
                os.replace(temporary, file.destination)
            except BaseException:
                _remove_quietly(temporary)
                raise
        finally:
            os.close(source)
        return copied


def _send_all(source: int, destination: int, size: int) -> int:
    """Every byte of ``source`` into ``destination``, to the source's end even if it grew
    since it was listed; the bytes. On Linux by ``sendfile`` (the kernel copies: nothing
    through Python), elsewhere, or where the filesystem refuses it, by reads and writes."""
    copied = 0
    while _SENDFILE:
        try:
            sent = os.sendfile(destination, source, None, max(size - copied, 1 << 16))
        except OSError as exc:
            if copied or exc.errno not in _NO_SENDFILE:
                raise
            break
        if not sent:
            return copied
        copied += sent
    while True:
        data = os.read(source, 1 << 20)
        if not data:
            return copied
        view = memoryview(data)
        while view:
            view = view[os.write(destination, view):]
        copied += len(data)


def _check(retrier: Retrier, path: str, size: int) -> tuple[Exception | None, Exception | None]:
    """The retried check that ``path`` holds ``size`` bytes (`retryfs.datapath.verify.proof`, by a
    stat): ``(the error that proves it does not, None)`` (the file is then copied again),
    ``(None, the check's error)`` when it gave up (committed, unproven), or ``(None, None)``."""
    unverified: list[Exception] = []
    missing = proof(retrier.call, _holds, path, size, unverified)
    return missing, (unverified[0] if unverified else None)


def _holds(path: str, size: int) -> bool:
    try:
        return os.stat(path).st_size == size
    except FileNotFoundError:
        return False


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass

"""``pyarrow.fs.copy_files`` onto a `RetryingFileSystem`: native streams, the source re-read.

A copy's bytes can always be read again from its source, so there is no need to keep them in a
replay spool: each file is one attempt (open the source, open the destination on the wrapped
filesystem, move pyarrow buffers from one native stream to the other, close), retried as a whole
under the operation ``copy_files`` (policy group ``write``) by reading the source again. The
happy path moves the bytes with Arrow's own streams (no Python copy, no spool), at the wrapped
filesystem's speed; part failures inside a native S3 upload are re-sent by its write client
(``client_write_attempts``), as for any output stream.

After each file, the post-commit check runs as its own retried metadata call (``verify``): a
failed check sends nothing again, a proven missing or short object copies the file again. In a
tree copy onto an object store the files whose first attempt committed are checked together,
after the last one, by one listing of the destination (`retryfs.datapath.verify`) instead of one
HEAD each; a file it shows missing or short is copied again (its retries counted and timed as
if its own check had found it), a store that refuses to list gets the HEADs, and a listing that
gives up leaves every file it was to prove unverified. A file
that finally fails is reported to the guard's session like any failed commit: ``copy_files``
raises its original error with the note naming every object that did not land (never a silent
success), and ``fs.failed_commits()`` lists it. A serial copy stops at that file, as Arrow's
does (a threaded one, as Arrow's, runs every file it submitted).

Per-file cost: in a threaded tree copy each file's first attempt runs on its pool worker under a
watchdog (`retryfs.core.watchdog`), not behind a thread hop to a timed worker (two thread switches
per file, more than copying a small file costs on a loaded machine); a local file of several
chunks is written (beside its destination) by Arrow's own one-file copy, one buffer read into
again and again with the GIL released, as unwrapped ``copy_files`` does. The small files of a
threaded tree copy from a local disk onto one (`retryfs.datapath.small_files`) are copied by one
worker's loop beside the others, each handed back here (`_retried`, `_copy_file`) when its
attempt fails.
"""

from __future__ import annotations

import contextvars
import functools
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.fs as pafs
from pyarrow._fs import _copy_files as _arrow_copy_file  # the unguarded one, one file

from retryfs.core.engine import Retrier, holding, operation_end
from retryfs.core.locations import subtree_base, temporary_beside
from retryfs.core.proof import UNKNOWN, Proofs, Verdict, WriteDigest, arrow_state, state_before
from retryfs.core.timeouts import (
    AttemptAbandoned,
    AttemptSignal,
    AttemptTimeoutError,
    in_background,
    run_with_timeout,
    settle,
)
from retryfs.core.watchdog import watch
from retryfs.errors import CommitInFlightError, CommitNotVisibleError

from .commits import FailedCommits, report_commit, watching
from .iopool import holds_unsent_parts, opens_lazily, write_bounded
from .placeholders import EmptyAtOpen
from .small_files import PlannedFile, SmallFileBatch, split_local
from .streams import SUB_READ, abandon_stream, discard
from .verify import REFUSED, Listed, listed_files, note_unproven, proof

__all__ = ["CopyTarget", "PlannedFile", "copy_file_tree", "copy_single_file", "join_abstract", "plan_tree",
           "prepare_tree", "pump_into", "writes_through", "written_whole"]


class CopyTarget(Protocol):
    """What a copy needs of the destination's handler (`retryfs.arrow.filesystem.RetryingHandler`)."""

    retrier: Retrier
    inner: pafs.FileSystem  # lists the destination of a tree copy (`retryfs.datapath.verify`)
    writer: pafs.FileSystem  # opens the native output streams
    failed_commits: FailedCommits
    proofs: Proofs  # each write's digest and earlier state, for its check (`retryfs.core.proof`)

    @property
    def verify_writes(self) -> bool: ...
    def writer_for(self, size: int | None) -> pafs.FileSystem: ...
    def create_dir(self, path: str, recursive: bool) -> None: ...
    def _landed(self, path: str, size: int) -> bool: ...
    def empty_at_open(self, path: str) -> EmptyAtOpen | None: ...
    def write_attempt_timeout(self, operation: str, in_flight: int) -> float | None: ...


def copy_single_file(handler: CopyTarget, source_fs: pafs.FileSystem, source: str,
                     destination: str, chunk_size: int, use_threads: bool) -> None:
    """What ``pyarrow.fs._copy_files`` does, through ``handler``'s retries."""
    size = source_fs.get_file_info(source).size
    _copy_file(handler, source_fs, source, destination, _buffer_size(chunk_size, size), size)


def copy_file_tree(handler: CopyTarget, source_fs: pafs.FileSystem,
                   selector: pafs.FileSelector, destination_base: str, chunk_size: int,
                   use_threads: bool) -> None:
    """What ``pyarrow.fs._copy_files_selector`` does (the source's directories created, then
    every file copied, ``pyarrow.io_thread_count()`` at a time with ``use_threads``)."""
    files = prepare_tree(source_fs.get_file_info(selector), selector.base_dir, destination_base,
                         chunk_size, lambda directory: handler.create_dir(directory, True))
    later: list[_Unchecked] | None = [] if _lists_tree(handler, files) else None
    before = _listed_before(handler, destination_base) if later is not None else REFUSED
    overwritten = _overwritten(files)
    if not use_threads or len(files) < 2:
        for source, destination, buffer_size, size in files:
            # as Arrow's serial copy: the first file that fails ends it (the guard raises)
            if _copy_file(handler, source_fs, source, destination, buffer_size, size, later):
                break
        _check_later(handler, source_fs, destination_base, later, before, overwritten)
        return
    batch = None
    if later is None:
        batch, files = _small_file_batch(handler, source_fs, files)
    if batch is not None:
        batch.start()  # beside the big files' copies
    failed = run_bounded(files, lambda file, lane: _WatchedCopy(
        handler, source_fs, *file, lane, later).start())
    escaped = batch.wait() if batch is not None else []
    _check_later(handler, source_fs, destination_base, later, before, overwritten)
    if failed or escaped:  # an error that escaped a file's copy (its failures are the guard's)
        raise failed[0][1] if failed else escaped[0]


def _overwritten(files: list[PlannedFile]) -> frozenset[str]:
    """The sources of a tree copy that are also its destinations (a tree copied into itself,
    ``copy_files("a", "a/c")``): by the time the listing finds one of their copies lost, the
    copy may have replaced their bytes, so that a copy made again would not be the file's."""
    return frozenset(file[0] for file in files) & frozenset(file[1] for file in files)


def _small_file_batch(handler: CopyTarget, source_fs: pafs.FileSystem,
                      files: list[PlannedFile]
                      ) -> tuple[SmallFileBatch | None, list[PlannedFile]]:
    """The small local files of a tree copy onto a local disk, copied by one worker
    (`retryfs.datapath.small_files`; ``None`` when there are not two of them), and the other files."""
    small, rest = split_local(source_fs, handler.writer_for(0), files)
    if len(small) < 2:
        return None, files

    def retry(planned: PlannedFile, error: Exception, started: float,
              seconds: float | None) -> None:
        source, destination, buffer_size, size = planned
        _report(handler, destination, _retried(handler, source_fs, source, destination,
                                               buffer_size, size, seconds, error, started))

    def copy(planned: PlannedFile) -> None:
        _copy_file(handler, source_fs, *planned)

    return SmallFileBatch(handler, small, retry, copy,
                          lambda destination, error: _report(handler, destination, error)), rest


def _lists_tree(handler: CopyTarget, files: list[PlannedFile]) -> bool:
    """Whether a tree's commits are checked by one listing: on an object store, for more than
    one file. A local disk keeps its per-file stat (as cheap as a listing's entry)."""
    return handler.verify_writes and len(files) > 1 and not writes_through(handler.inner)


@dataclass(frozen=True)
class _Unchecked:
    """A file of a tree copy whose first attempt committed, its check left to the listing."""

    source: str
    destination: str
    buffer_size: int
    size: int | None
    copied: int  # the bytes the attempt copied: what the destination must hold
    seconds: float | None  # its write attempt timeout
    elapsed: float  # its first attempt's time (the deadline of its retries counts it)


def _listed_before(handler: CopyTarget, base: str) -> dict[str, Listed] | None:
    """The destination's files before a tree copy (`_check_later` tells the new objects by
    them); `REFUSED` when they cannot be listed (each file is then proven by itself)."""
    try:
        return listed_files(handler.retrier, handler.inner.get_file_info, base)
    except Exception:  # noqa: BLE001 - unknown before: each file is proven by itself
        return REFUSED


def _check_later(handler: CopyTarget, source_fs: pafs.FileSystem, base: str,
                 later: list[_Unchecked] | None,
                 before: dict[str, Listed] | None = REFUSED,
                 overwritten: frozenset[str] = frozenset()) -> None:
    """Every file left unchecked, proven by one listing of ``base`` against the one taken
    ``before`` the copy (each by its own check when the store refuses to list, for a single
    file, or for a file listed as it was before: `retryfs.core.proof`) and reported; one the
    listing shows missing or short is copied again, unless its source is ``overwritten`` by
    the copy (`_overwritten`: it fails then). A listing that gives up fails every one of
    them."""
    if not later:
        return
    sizes = None
    if len(later) > 1:
        try:
            sizes = listed_files(handler.retrier, handler.inner.get_file_info, base)
        except Exception as exc:  # noqa: BLE001 - gave up: nothing proven, every file failed
            note_unproven(exc, base, (file.destination for file in later))
            for file in later:
                handler.retrier.first_try_succeeded("copy_files")  # its attempt did commit
                _report(handler, file.destination, exc)
            return
    for file in later:
        _settle(handler, source_fs, file, sizes, before, file.source in overwritten)


def _settle(handler: CopyTarget, source_fs: pafs.FileSystem, file: _Unchecked,
            sizes: dict[str, Listed] | None, before: dict[str, Listed] | None,
            overwritten: bool = False) -> None:
    """One file's check (in the listing ``sizes``, or by itself when None) and its report; a
    file found missing or short goes on with its retries, as its own check would have. The
    listing proves a file only if it was not there ``before`` or is listed otherwise now (a
    file listed as it was is checked by itself: the same object, or a new one written in the
    same second)."""
    unverified: list[Exception] = []
    listed = None if sizes is None else sizes.get(file.destination)
    if sizes is not None and (listed is None or listed[0] not in (None, file.copied)):
        missing: CommitNotVisibleError | None = CommitNotVisibleError.copied(
            file.destination, file.copied)
    elif listed is not None and before is not None and before.get(file.destination) != listed:
        missing = None
        handler.proofs.take(file.destination)
    else:
        missing = proof(handler.retrier.call, handler._landed, file.destination, file.copied,
                        unverified)
    if missing is None or overwritten:
        handler.retrier.first_try_succeeded("copy_files")
        if missing is not None and hasattr(missing, "add_note"):  # (Python 3.11+)
            missing.add_note(f"not copied again: its source {file.source!r} is also a "
                             "destination of this copy, which may have replaced its bytes")
        _report(handler, file.destination, missing or (unverified[0] if unverified else None))
        return
    started = handler.retrier.clock() - file.elapsed
    _report(handler, file.destination, _retried(
        handler, source_fs, file.source, file.destination, file.buffer_size, file.size,
        file.seconds, missing, started))


def _retried(handler: CopyTarget, source_fs: pafs.FileSystem, source: str, destination: str,
             buffer_size: int, size: int | None, seconds: float | None, error: Exception,
             started: float) -> BaseException | None:
    """A file's retries after its first attempt failed with ``error`` (each attempt checked
    by its own HEAD), begun at ``started``: its final error, or ``None``."""
    unverified: list[Exception] = []
    try:
        handler.retrier.recover("copy_files", destination, _attempt,
                                (handler, source_fs, source, destination, buffer_size, size,
                                 seconds, unverified), {}, error, None, started)
    except Exception as exc:  # noqa: BLE001 - reported, then raised by the copy_files guard
        return exc
    return unverified[0] if unverified else None  # committed, the check gave up: unproven


#: Attempts abandoned by their timeout in the middle of their commit, by destination: a
#: success at that destination is reported only once they have ended (`_settle_commits`).
_in_flight: dict[str, list[AttemptSignal]] = {}
_in_flight_lock = threading.Lock()


def _register_in_flight(destination: str, signal: AttemptSignal) -> None:
    with _in_flight_lock:
        _in_flight.setdefault(destination, []).append(signal)


def _settle_commits(handler: CopyTarget, destination: str) -> BaseException | None:
    """Wait for the commits still under way at ``destination`` (`retryfs.core.timeouts.settle`):
    the copy's success is reported after they land, never before (one landing after the call
    returned would replace whatever is written there next). Each is waited for one more of its
    attempt timeouts at most, within the enclosing operation's deadline, else a fresh
    ``deadline`` of the policy; `CommitInFlightError` past that."""
    with _in_flight_lock:
        pending = [s for s in _in_flight.pop(destination, []) if not s.ended.is_set()]
    if not pending:
        return None
    retrier = handler.retrier
    end = operation_end(retrier.clock)
    deadline = retrier.policy_for("copy_files").deadline
    if end is None and deadline is not None:
        end = retrier.clock() + deadline
    try:
        settle(pending, destination, end, retrier.clock)
    except CommitInFlightError as exc:
        return exc
    return None


def _report(handler: CopyTarget, destination: str, error: BaseException | None) -> None:
    """How ``destination``'s commit ended, to the record and to the copy_files guard."""
    if error is None:
        error = _settle_commits(handler, destination)
    handler.failed_commits.record(destination, error)
    report_commit(watching(), destination, error)


class TreeLane:
    """One of a threaded tree copy's ``pyarrow.io_thread_count()`` lanes, held by one file's
    copy: given back when the copy ends, and while it sleeps out a backoff (another file's copy
    runs meanwhile; the sleeper takes a lane again before its next attempt)."""

    __slots__ = ("_slots", "_held", "_lock")

    def __init__(self, slots: threading.Semaphore) -> None:
        self._slots = slots
        self._held = True  # taken by `run_bounded` before the copy starts
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            if not self._held:
                return
            self._held = False
        self._slots.release()

    def acquire(self) -> None:
        self._slots.acquire()
        with self._lock:
            self._held = True


def run_bounded(files: list[PlannedFile],
                start: Callable[[PlannedFile, TreeLane], Future[None]]
                ) -> list[tuple[str, Exception]]:
    """Every file of a threaded tree copy, ``pyarrow.io_thread_count()`` at a time, as Arrow's:
    ``start(file, lane)`` starts one and returns its outcome, releasing ``lane`` when its copy
    ends, however it ends. Every outcome is waited for; the failed ones are returned,
    ``(destination, error)`` in the listing's order."""
    slots = threading.Semaphore(max(1, pa.io_thread_count()))
    running: list[tuple[str, Future[None]]] = []
    for file in files:
        slots.acquire()  # given back by the file's lane
        running.append((file[1], start(file, TreeLane(slots))))
    failed: list[tuple[str, Exception]] = []
    for destination, outcome in running:
        try:
            outcome.result()
        except Exception as exc:  # noqa: BLE001 - every file runs; the caller raises the first
            failed.append((destination, exc))
    return failed


def prepare_tree(infos: list[pafs.FileInfo], base_dir: str, destination_base: str,
                 chunk_size: int, create_dir: Callable[[str], None]) -> list[PlannedFile]:
    """The files of a tree copy (`plan_tree`), once its directories are created, as Arrow's."""
    directories, files = plan_tree(infos, base_dir, destination_base, chunk_size)
    for directory in directories:
        create_dir(directory)
    return files


def plan_tree(infos: list[pafs.FileInfo], base_dir: str, destination_base: str,
              chunk_size: int) -> tuple[list[str], list[PlannedFile]]:
    """What Arrow's tree copy makes of a listing: the destination of each source directory
    (not the base itself), and ``(source, destination, read size, size)`` of each file."""
    base = base_dir.rstrip("/")

    def target(path: str) -> str:
        relative = path[len(base):].lstrip("/") if path.startswith(base) else path
        return join_abstract(destination_base, relative)

    directories = [target(info.path) for info in infos if info.type == pafs.FileType.Directory]
    files = [(info.path, target(info.path), _buffer_size(chunk_size, info.size), info.size)
             for info in infos if info.type == pafs.FileType.File]
    return directories, files


def join_abstract(base: str, relative: str) -> str:
    """``relative`` under ``base`` as Arrow joins abstract paths (``ConcatAbstractPath``): an
    empty base (the root of a ``SubTreeFileSystem``, of a bucket-rooted store) leaves
    ``relative`` as it is, ``"/"`` gives ``"/relative"``; an empty ``relative`` is the base."""
    if not relative:
        return base.rstrip("/") or base
    if not base:
        return relative
    return f"{base.rstrip('/')}/{relative}"


def _buffer_size(chunk_size: int, size: int | None) -> int:
    """The read size of one file: ``chunk_size``, or the file's size if smaller (Ray Train
    copies with 64 MiB chunks: a 1 KiB file must not cost a 64 MiB buffer per read)."""
    if size is None or size < 0:
        return max(1, chunk_size)
    return max(1, min(chunk_size, size))


def _copy_file(handler: CopyTarget, source_fs: pafs.FileSystem, source: str,
               destination: str, buffer_size: int, size: int | None,
               later: list[_Unchecked] | None = None) -> BaseException | None:
    """One file, retried; its final error (reported to the guard, which raises it after the
    call) or ``None``. With ``later``, a first attempt that commits is not checked here: it
    joins ``later``, for the tree's listing, and is reported then."""
    seconds = handler.write_attempt_timeout("copy_files", max(0, size or 0))
    if later is not None:
        return _copy_unchecked(handler, source_fs, source, destination, buffer_size, size,
                               seconds, later)
    unverified: list[Exception] = []
    error: BaseException | None = None
    try:
        handler.retrier.call("copy_files", destination, _attempt, handler, source_fs, source,
                             destination, buffer_size, size, seconds, unverified)
        if unverified:  # committed, but the check gave up: nothing proven either way
            error = unverified[0]
    except Exception as exc:  # noqa: BLE001 - reported, then raised by the copy_files guard
        error = exc
    _report(handler, destination, error)
    return error


def _copy_unchecked(handler: CopyTarget, source_fs: pafs.FileSystem, source: str,
                    destination: str, buffer_size: int, size: int | None,
                    seconds: float | None, later: list[_Unchecked]) -> BaseException | None:
    """`_copy_file` for a tree checked by its listing: a first attempt that commits joins
    ``later``; one that fails goes on with its retries, each checked by its own HEAD."""
    started = handler.retrier.clock()  # the deadline counts the first attempt too
    failed: Exception | None = None
    try:
        copied = _upload_attempt(handler, source_fs, source, destination, buffer_size, size,
                                 seconds)
    except Exception as exc:  # noqa: BLE001 - classified by the retrier
        failed = exc
    if failed is None:
        later.append(_Unchecked(source, destination, buffer_size, size, copied, seconds,
                                handler.retrier.clock() - started))
        return None
    error = _retried(handler, source_fs, source, destination, buffer_size, size, seconds,
                     failed, started)
    _report(handler, destination, error)
    return error


class _WatchedCopy:
    """One file of a threaded tree copy, on a pool worker: its first attempt runs on that
    worker under a `watch` (no thread hop), the later ones as `_attempt` runs them. When the
    first attempt outlives its timeout, the watchdog marks it abandoned (it stops at its next
    read or write and never commits, as `_attempt`'s abandoned ones) and hands the file's
    retries to a fresh worker, the attempt counted as timed out; the stalled worker's outcome is
    ignored when it returns. ``outcome`` is set, and ``lane`` released, once, when the file's
    copy ends; its retries give the lane back while they sleep. With ``later``, a first attempt
    that commits joins it unchecked (see `_copy_file`)."""

    def __init__(self, handler: CopyTarget, source_fs: pafs.FileSystem, source: str,
                 destination: str, buffer_size: int, size: int | None,
                 lane: TreeLane, later: list[_Unchecked] | None = None) -> None:
        self.handler, self.source_fs = handler, source_fs
        self.source, self.destination = source, destination
        self.buffer_size, self.size = buffer_size, size
        self.outcome: Future[None] = Future()
        self._lane = lane
        self._ended = threading.Lock()
        self._unverified: list[Exception] = []
        self._later = later  # list.append is atomic: the workers share it without a lock

    def start(self) -> Future[None]:
        """The copy started on a pool worker; its `outcome`."""
        in_background(self.run)
        return self.outcome

    def run(self) -> None:
        try:
            with holding(self._lane):  # (the retries' context: `_run` copies it)
                self._run()
        except BaseException as exc:  # noqa: BLE001 - handed to copy_files's thread
            self._end(None, exc)

    def _run(self) -> None:
        handler = self.handler
        seconds = handler.write_attempt_timeout("copy_files", max(0, self.size or 0))
        if seconds is None:
            _copy_file(handler, self.source_fs, self.source, self.destination,
                       self.buffer_size, self.size, self._later)
            self._end(None, recorded=True)
            return
        retrier = handler.retrier
        started = retrier.clock()  # the deadline counts the first attempt too
        context = contextvars.copy_context()  # the retries see this operation's deadline
        abandoned = AttemptSignal(seconds)

        def expired() -> None:  # on the watchdog's thread
            if abandoned.abandon():  # its commit is under way: success waits for it
                _register_in_flight(self.destination, abandoned)
            timeout = AttemptTimeoutError("copy_files", self.destination, seconds)
            in_background(lambda: self._retry(timeout, seconds, started), context)

        watched = watch(seconds, expired)
        error: Exception | None = None
        copied = 0
        try:
            copied = _upload(handler, self.source_fs, self.source, self.destination,
                             self.buffer_size, self.size, abandoned)
        except Exception as exc:  # noqa: BLE001 - classified by the retrier
            error = exc
        finally:
            abandoned.ended.set()
        if not watched.finish():
            return  # timed out: the retries went on on another worker
        if error is None and self._later is not None:  # checked by the tree's listing
            self._later.append(_Unchecked(self.source, self.destination, self.buffer_size,
                                          self.size, copied, seconds,
                                          retrier.clock() - started))
            self._end(None, recorded=True)
            return
        if error is None and handler.verify_writes:
            try:
                _verify(retrier.call, handler._landed, self.destination, copied,
                        self._unverified)
            except Exception as exc:  # noqa: BLE001 - proven short or missing: copy it again
                error = exc
        if error is None:
            retrier.first_try_succeeded("copy_files")
            self._end(self._unverified[0] if self._unverified else None)
            return
        self._retry(error, seconds, started)

    def _retry(self, error: Exception, seconds: float, started: float) -> None:
        failure: BaseException | None = None
        try:
            self.handler.retrier.recover(
                "copy_files", self.destination, _attempt,
                (self.handler, self.source_fs, self.source, self.destination, self.buffer_size,
                 self.size, seconds, self._unverified), {}, error, None, started)
            if self._unverified:  # committed, but the check gave up: nothing proven
                failure = self._unverified[0]
        except Exception as exc:  # noqa: BLE001 - reported, then raised by the guard
            failure = exc
        except BaseException as exc:  # noqa: BLE001 - handed to copy_files's thread
            self._end(None, exc)
            return
        self._end(failure)

    def _end(self, error: BaseException | None, escaped: BaseException | None = None,
             recorded: bool = False) -> None:
        if not self._ended.acquire(blocking=False):
            return  # ended already (a stalled first attempt that raised on its way out)
        try:
            if escaped is None and not recorded:
                if error is None:
                    error = _settle_commits(self.handler, self.destination)
                self.handler.failed_commits.record(self.destination, error)
                report_commit(watching(), self.destination, error)
        finally:
            self._lane.release()
            if escaped is None:
                self.outcome.set_result(None)
            else:
                self.outcome.set_exception(escaped)


def _attempt(handler: CopyTarget, source_fs: pafs.FileSystem, source: str,
             destination: str, buffer_size: int, size: int | None, seconds: float | None,
             unverified: list[Exception]) -> None:
    """One whole-file attempt (`_upload_attempt`), then its check. The verification runs
    after, outside the upload's timeout: it is a metadata call with timeouts of its own."""
    copied = _upload_attempt(handler, source_fs, source, destination, buffer_size, size,
                             seconds)
    if handler.verify_writes:
        _verify(handler.retrier.call, handler._landed, destination, copied, unverified)


def _upload_attempt(handler: CopyTarget, source_fs: pafs.FileSystem, source: str,
                    destination: str, buffer_size: int, size: int | None,
                    seconds: float | None) -> int:
    """One whole-file upload, unchecked; the bytes copied. With a per-attempt write timeout
    (``write_timeout`` plus the file's bytes at ``min_throughput``), the upload runs on a
    worker, and a stalled one is left behind and becomes a retry that reads the source again;
    the abandoned attempt never commits (it stops at its next read or write and drops its
    stream unclosed), so it cannot land a partial or stale object over the retry's."""
    abandoned = AttemptSignal(seconds)

    def upload() -> int:
        try:
            return _upload(handler, source_fs, source, destination, buffer_size, size,
                           abandoned)
        finally:
            abandoned.ended.set()

    def abandon(_future: Future[int]) -> None:
        if abandoned.abandon():  # its commit is under way: success waits for it to land
            _register_in_flight(destination, abandoned)

    if seconds is None:
        return upload()
    return run_with_timeout(upload, seconds, "copy_files", destination, on_abandon=abandon)


def _upload(handler: CopyTarget, source_fs: pafs.FileSystem, source: str, destination: str,
            buffer_size: int, size: int | None, abandoned: AttemptSignal) -> int:
    """One file copied and committed; the bytes copied. A local destination is written beside
    it and renamed into place; a local file of several chunks through Arrow's own one-file copy
    (a copy abandoned meanwhile is removed before its rename; its bytes are the temporary
    file's size), anything else through `_pump`. Onto an object store (``verify_writes``) the
    bytes are hashed while few and the destination's state taken once they are many, both
    left in ``handler.proofs`` for the check after the commit (`retryfs.core.proof`): an older
    object of the same size never passes for this one."""
    writer = handler.writer_for(size)

    def write(target: str, beside: bool) -> int:
        if beside and size is not None and size > buffer_size:
            _arrow_copy_file(source_fs, source, writer, target, buffer_size, False)
            # the bytes written, stat'ed before the rename: not the listed size (the file may
            # have grown or shrunk since the listing, and Arrow copies it to its end)
            written = writer.get_file_info(target).size
            return size if written is None else int(written)
        proving = not beside and handler.verify_writes
        digest = WriteDigest() if proving else None
        before: list[Any] = [UNKNOWN]

        def grown() -> None:
            before[0] = state_before(handler.retrier.call, destination,
                                     functools.partial(arrow_state, handler.inner))

        with source_fs.open_input_stream(source, compression=None) as reader:
            copied = pump_into(writer, target, reader, buffer_size, abandoned, beside,
                               empty=handler.empty_at_open(target), listed=size,
                               digest=digest, grown=grown)
        if proving:
            handler.proofs.record(destination, digest, before[0])
        return copied

    return written_whole(writer, destination, write, abandoned)


def written_whole(fs: pafs.FileSystem, destination: str,
                  write: Callable[[str, bool], int], abandoned: AttemptSignal) -> int:
    """``write(target, beside)`` (the bytes written), committed whole at ``destination`` or
    not at all: on a filesystem that writes in place (`writes_through`) the target is a
    temporary file beside it, renamed into place after, removed on any failure."""
    beside = writes_through(fs)
    target = temporary_beside(destination) if beside else destination
    try:
        copied = write(target, beside)
    except BaseException:
        if beside:
            _remove_quietly(fs, target)
        raise
    if beside:
        _rename(fs, target, destination, abandoned)
    return copied


def pump_into(fs: pafs.FileSystem, target: str, reader: Any, buffer_size: int,
              abandoned: AttemptSignal, beside: bool, empty: EmptyAtOpen | None = None,
              listed: int | None = None, digest: WriteDigest | None = None,
              grown: Callable[[], None] | None = None) -> int:
    """``reader``'s bytes (and metadata) into a new output stream of ``fs`` at ``target``,
    committed by `_pump`; a temporary file beside is closed on a source failure (and removed
    by `written_whole`), any other stream never closed. A local file beside has no metadata:
    it is not asked for (a lazily opened pyarrow GCS file opens its download in
    ``metadata()`` holding the GIL). ``empty``: the empty blob the open created (pyarrow's
    Azure client), removed when the attempt fails (its open included), if still that one.
    ``listed``: the file's size in the listing, if known (`_pump`); ``digest`` and
    ``grown``: see `_pump`."""
    metadata = None if beside else (reader.metadata() or None)
    open_output = fs.open_output_stream if empty is None else empty.attempts(
        fs.open_output_stream)
    try:
        writer = open_output(target, compression=None, metadata=metadata)
        if empty is not None:
            empty.opened()
        return _pump(reader, writer, buffer_size, abandoned,
                     drop=discard if beside else abandon_stream, listed=listed,
                     digest=digest, grown=grown, bounded=holds_unsent_parts(fs),
                     broken=abandon_stream if opens_lazily(fs) else discard)
    except BaseException:
        if empty is not None:
            empty.remove()
        raise


def _pump(reader: pa.NativeFile, writer: pa.NativeFile, buffer_size: int,
          abandoned: AttemptSignal, drop: Callable[[Any], None] = abandon_stream,
          listed: int | None = None, digest: WriteDigest | None = None,
          grown: Callable[[], None] | None = None, bounded: bool = False,
          broken: Callable[[Any], None] = discard) -> int:
    """Bytes from ``reader`` into ``writer``, then the commit (its close).

    Only a whole copy is committed. When the *source* fails (or the attempt was abandoned),
    ``writer`` is healthy and its close would commit the prefix it holds as if it were the
    file (and a copy onto itself would then re-read that prefix as its source): it is dropped
    unclosed instead (``drop``, :func:`retryfs.datapath.streams.abandon_stream`; an S3 multipart upload
    stays incomplete; a temporary file beside its destination is closed, then removed). When
    the *writer* failed, it is closed (``broken``): a native stream whose write failed
    does not commit, except a lazily opened S3 one whose upload never started
    (`retryfs.datapath.iopool.opens_lazily`: kept unclosed instead). Each read is a fresh
    Arrow buffer handed on without a copy: a native S3 stream may keep it for a background
    part upload, so a buffer is never reused.

    ``buffer_size`` is the file's size in the listing (``listed``) when smaller than the
    chunk (`_buffer_size`). Once more than ``listed`` bytes were read (the file grew since),
    each read asks for twice as much as the last, up to `SUB_READ` (or ``buffer_size``): not
    reads of its old size to the end (of one byte for a file listed empty; on S3 a GET
    each). ``digest`` takes every byte sent; ``grown`` is called once, when it passes
    `retryfs.core.proof.HASHED` (before the commit). ``bounded``: written by
    `retryfs.datapath.iopool.write_bounded` (backpressure: see `retryfs.datapath.iopool.holds_unsent_parts`).
    """
    size = unflushed = 0
    read_size, most = buffer_size, max(buffer_size, SUB_READ)
    while True:
        try:
            if abandoned.is_set():
                raise AttemptAbandoned()
            buffer = reader.read_buffer(read_size)
            if abandoned.is_set():
                raise AttemptAbandoned()
        except BaseException:
            drop(writer)
            raise
        if not buffer.size:
            break
        try:
            if bounded:
                unflushed = write_bounded(writer, buffer, unflushed, size)
            else:
                writer.write(buffer)
        except BaseException:
            broken(writer)
            raise
        size += buffer.size
        if digest is not None and digest.update(buffer) and grown is not None:
            grown()
        if listed is not None and size > listed and read_size < most:
            read_size = min(2 * read_size, most)
    try:
        abandoned.start_commit()  # abandoned by now: never committed; else committing
    except AttemptAbandoned:
        drop(writer)
        raise
    writer.close()  # the commit: raises when it failed (copy_files would ignore it)
    return size


def writes_through(fs: pafs.FileSystem) -> bool:
    """Whether ``fs``'s output streams write in place as they go (a local disk: the file is
    truncated at open and holds a prefix while written), so that a copy writes beside its
    destination and renames it into place (an object store shows nothing until the commit)."""
    return isinstance(subtree_base(fs), pafs.LocalFileSystem)


def _rename(fs: pafs.FileSystem, target: str, destination: str,
            abandoned: AttemptSignal) -> None:
    try:
        abandoned.start_commit()  # abandoned by now: never renamed; else committing
        fs.move(target, destination)
    except BaseException:
        _remove_quietly(fs, target)
        raise


def _remove_quietly(fs: pafs.FileSystem, path: str) -> None:
    try:
        fs.delete_file(path)
    except Exception:  # noqa: BLE001 - best effort: the attempt's own error is raised
        pass


def _verify(call: Callable[..., Any], landed: Callable[[str, int], Verdict], path: str, size: int,
            unverified: list[Exception]) -> None:
    missing = proof(call, landed, path, size, unverified)
    if missing is not None:
        raise missing


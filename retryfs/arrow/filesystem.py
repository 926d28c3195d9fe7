"""The pyarrow face: `RetryingFileSystem`, a ``pyarrow.fs.PyFileSystem`` that retries.

The handler proxies the 15 ``FileSystemHandler`` methods of any pyarrow filesystem (an fsspec
filesystem is adapted first, the way ``pyarrow.fs.FSSpecHandler`` does), runs each through the
retry engine, and wraps the streams it opens so that their reads, writes, flushes and closes are
retried too. Everything it holds besides configuration (stats, the failed-commit record) is per
process: pickling carries the configuration and the inner filesystem only.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

import pyarrow as pa
import pyarrow.fs as pafs
from fsspec.spec import AbstractFileSystem

from retryfs import patches
from retryfs.clients import (
    confirm_not_found,
    hides_list_errors,
    resends_by_itself,
    with_client_attempts,
)
from retryfs.config import (
    OPTIONS,
    Configured,
    FileClient,
    OnePartClient,
    WrapperConfig,
    check_operation_names,
    checked_size,
    default,
    given,
    renamed,
)
from retryfs.core.budget import RetryBudget, TokenBucket, bucket_for
from retryfs.core.classify import ErrorClassifier
from retryfs.core.engine import Retrier
from retryfs.core.locations import is_local, subtree_base, temporary_beside
from retryfs.core.policy import ALL_OPERATION_GROUPS, OPERATION_GROUPS, RetryPolicy
from retryfs.core.proof import (
    UNKNOWN,
    Proofs,
    Verdict,
    WriteDigest,
    arrow_entry,
    arrow_state,
    is_new,
    moved_here,
    read_md5,
)
from retryfs.core.ratelimit import RateLimit, RateLimiter, limiter_for
from retryfs.core.redact import redact
from retryfs.core.stats import RetryStats
from retryfs.core.timeouts import TimedInputStream, timed, write_attempt_timeout, writes_locally
from retryfs.datapath.commits import FailedCommits
from retryfs.datapath.download import (
    download_file_tree,
    download_single_file,
    reads_ranges_concurrently,
)
from retryfs.datapath.iopool import (
    ONE_PART,
    LazyUploadStream,
    PoolSafeOutputStream,
    holds_unsent_parts,
    opens_lazily,
    writes_in_background,
)
from retryfs.datapath.placeholders import EmptyAtOpen, creates_empty_at_open
from retryfs.datapath.regenerate import write_regenerated
from retryfs.datapath.streams import SUB_READ, ReplayableOutputStream, ResumableInputFile
from retryfs.datapath.upload import copy_file_tree, copy_single_file, writes_through
from retryfs.errors import UnfinishedDeleteError
from retryfs.patches import s3fs_one_try
from retryfs.patches.s3fs_parts import retry_parts_in_place, with_parts_in_flight

from .fsspec_adapter import FsspecHandler
from .obstore_small import ObstoreSmallFiles, obstore_small_client

__all__ = ["RetryingFileSystem", "RetryingHandler", "as_arrow_filesystem"]


def _checked_options(options: dict[str, Any]) -> dict[str, Any]:
    unknown = [name for name in options if name not in OPTIONS]
    if unknown:
        WrapperConfig().replace(**options)  # raises the TypeError that names it
    return options


def as_arrow_filesystem(fs: Any) -> pafs.FileSystem:
    """``fs`` as a pyarrow filesystem: pyarrow ones as they are, fsspec ones adapted."""
    if isinstance(fs, pafs.FileSystem):
        return fs
    if isinstance(fs, AbstractFileSystem):  # pyarrow's adapter, minus checks that hide errors
        return pafs.PyFileSystem(FsspecHandler(fs))
    raise TypeError(
        "RetryingFileSystem wraps a pyarrow.fs.FileSystem or an fsspec AbstractFileSystem, "
        f"got {type(fs).__module__}.{type(fs).__qualname__}")


def _label(paths: list[str]) -> str:
    if len(paths) == 1:
        return paths[0]
    return f"{paths[0]} (+{len(paths) - 1} more)" if paths else ""


def _is_missing(exc: BaseException) -> bool:
    # pyarrow's native S3 raises a plain OSError for a key that is gone in some calls (a
    # CopyObject of a moved source: "AWS Error NO_SUCH_KEY during CopyObject operation").
    return isinstance(exc, FileNotFoundError) or "AWS Error NO_SUCH_KEY" in str(exc)


#: pyarrow AzureFileSystem's errors (plain OSErrors) when sub-requests of its batch delete
#: (``delete_dir``, ``delete_dir_contents``) failed, for one blob and for several. When the
#: Azure SDK re-sends by itself a batch that was applied and whose answer was lost, every
#: sub-request of the re-send is a 404 for a blob the first send deleted.
BATCH_DELETE_FAILED = ("Failed to delete a blob: ", "Failed to delete blobs: ")


def _not_there(exc: BaseException) -> bool:
    """Whether ``exc`` says what a delete was deleting is not there (any more)."""
    return _is_missing(exc) or any(text in str(exc) for text in BATCH_DELETE_FAILED)


def _unless(fn: Any, done: Any) -> Any:
    """``fn`` whose error is success when ``done(error)``: for a client that re-sends a request
    by itself, whose "not found" for this call's own change reaches retryfs's *first* attempt
    (where the engine's ``reconcile`` is not asked). ``done`` runs outside the ``except``
    block: its own errors must not carry this one as their context (classification walks it)."""

    def attempt(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - raised again unless done() proves success
            error = exc
        if done(error):
            return None
        raise error

    return attempt


#: The SDK's own attempts per request of a native S3 write stream when retryfs sets the
#: client's retries (``client_attempts``) and ``client_write_attempts`` is not given: the AWS
#: default, so that a failed UploadPart is re-sent alone by the SDK instead of failing the
#: stream (whose replay would re-send the whole object).
DEFAULT_CLIENT_WRITE_ATTEMPTS = 3


def _write_client(handed: Any, inner: pafs.FileSystem,
                  config: WrapperConfig) -> pafs.FileSystem:
    """The filesystem that opens output streams: ``inner``, except on a native S3 whose
    retries retryfs sets. A pyarrow S3 stream whose UploadPart failed cannot be continued, so
    its write client keeps ``client_write_attempts`` SDK attempts per request: the SDK
    re-sending the failed part costs one part, a replay of the stream the whole object."""
    attempts = config.client_write_attempts
    if attempts is None and config.client_attempts is not None:
        attempts = DEFAULT_CLIENT_WRITE_ATTEMPTS
    if attempts is None or not isinstance(handed, pafs.S3FileSystem):
        return inner
    return with_client_attempts(handed, attempts)


def _native_open(inner: pafs.FileSystem, name: str) -> str:
    """The inner open behind ``name``: a stream of pyarrow S3 or Azure is opened as their
    random-access file (the same HEAD), so that a large read of it keeps its sub-reads in
    flight as ranged reads (`ResumableInputFile.read_buffer`), not one after the other."""
    if name == "open_input_stream" and reads_ranges_concurrently(inner):
        return "open_input_file"
    return name


def _one_part_client(writer: pafs.FileSystem) -> pafs.FileSystem:
    """``writer`` (a native S3 write client) without background writes, for one-part files
    of a ``copy_files``: each such stream's part buffer (a part-size allocation, zero-padded
    at close) is then freed on the thread that allocated it, not on Arrow's IO pool, and is
    reused; with background writes, fresh pages were zeroed for most files (``perf record``
    of a 101-file upload: 23 % fewer client CPU samples). Its uploads open lazily
    (``allow_delayed_open``): a file closed within one part is one PutObject, where a
    stream opened at once costs a CreateMultipartUpload, an UploadPart and a
    CompleteMultipartUpload (a tree of 64 MiB + 100 x 64 KiB: 114 requests against 313);
    a file that grew past one part since its listing still becomes a multipart upload.

    One SDK attempt per request: the file's one request is retried by retryfs, which sends
    the same bytes the SDK would, on retryfs's schedules, under its rate limiter and budget
    (the SDK's retries are unseen: a throttle it retried never told the limiter of a storm).
    A file that grew past one part is retried whole, as a stream of the one-attempt client."""
    _, (options,) = writer.__reduce__()
    return with_client_attempts(pafs.S3FileSystem(**dict(options, background_writes=False,
                                                         allow_delayed_open=True)), 1)


class RetryingHandler(Configured, pafs.FileSystemHandler):  # type: ignore[misc]
    """The ``FileSystemHandler`` behind `RetryingFileSystem`.

    ``fs`` is any pyarrow or fsspec filesystem; a retryfs wrapper of either face is unwrapped
    (one layer of retries, not two) and its settings are the base that ``config`` and
    ``options`` change. ``options`` are `WrapperConfig`'s (``policy`` may come first).
    """

    def __init__(self, fs: Any, policy: RetryPolicy | None = None, *,
                 config: WrapperConfig | None = None, **options: Any) -> None:
        base = None if isinstance(fs, pafs.FileSystem) else getattr(fs, "retry_config", None)
        inherited = isinstance(base, WrapperConfig)
        if inherited:  # the fsspec face: wrap what it wraps, as it does
            fs = fs.unwrap()
        else:
            base = None
        if config is not None:
            if not isinstance(config, WrapperConfig):
                raise TypeError(f"config must be a WrapperConfig, got {type(config).__name__}")
            base = config
        if policy is not None:
            options["policy"] = policy
        if base is None:
            config = WrapperConfig(**_checked_options(options))
        else:
            config = base.replace(**options) if options else base
        # its own operation names; a configuration taken from the fsspec face may also name
        # that face's (they apply there, not here)
        check_operation_names(config, names=ALL_OPERATION_GROUPS if inherited
                              else OPERATION_GROUPS)
        if config.stats is None:
            config = config.replace(stats=RetryStats())
        ensure_copy_files_guard()
        self.retry_config = config
        handed = fs
        if config.client_attempts is not None:
            fs = with_client_attempts(fs, config.client_attempts)
            s3fs_one_try.spare(fs)
        self.original = fs
        self.inner = as_arrow_filesystem(fs)
        self.writer = _write_client(handed, self.inner, config)
        self.proofs = Proofs()  # what the copy data path wrote, for the check after its commit
        self._one_part_writer: pafs.FileSystem | None = None
        if config.one_part_client == "obstore":  # asked for: checked now, not at a first copy
            if self.writer is self.inner:
                raise ValueError(
                    "one_part_client='obstore' needs pyarrow's S3FileSystem with client_attempts "
                    "set (retryfs then builds the write client; from_uri sets it)")
            self._one_part_writer = self._one_part()
        self._resends_by_itself = resends_by_itself(fs)
        self._unsure_not_found = hides_list_errors(fs)
        self._empty_at_open = creates_empty_at_open(self.writer)
        self._background_writes = writes_in_background(self.writer)
        self._timed_writes = not writes_locally(self.writer if isinstance(
            self.original, pafs.FileSystem) else self.original)
        self.failed_commits = FailedCommits()
        self.timeouts = config.timeouts_for(OPERATION_GROUPS)
        budget = cast("RetryBudget | None", config.budget)  # normalized
        bucket = bucket_for(self.inner, budget) if budget is not None else None
        self.retrier = Retrier(self.policy_for, config.effective_classifier, self.stats,
                               budget=bucket, timeouts=self.timeouts,
                               limiter=limiter_for(self.inner, cast(RateLimit, config.rate_limit)))
        if self.timeouts:
            self._call = self._timed_call  # type: ignore[method-assign]

    # -- configuration ---------------------------------------------------------------------------









    @property
    def wrapped_filesystem(self) -> pafs.FileSystem:
        """The pyarrow filesystem whose endpoint this handler calls (for the retry budget)."""
        return self.inner

    def policy_for(self, operation: str) -> RetryPolicy:
        """The policy of a method: its own override, else its group's, else the base policy."""
        return self.retry_config.policy_for(operation, OPERATION_GROUPS)

    @property
    def config(self) -> WrapperConfig:
        """Deprecated: `retry_config` (the name on both faces)."""
        warnings.warn("RetryingHandler.config is deprecated: it is now retry_config",
                      DeprecationWarning, stacklevel=2)
        return self.retry_config

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, RetryingHandler):
            return NotImplemented
        if self.retry_config != other.retry_config or type(self.original) is not type(other.original):
            return False
        return bool(self.original == other.original)

    def __ne__(self, other: object) -> bool:
        result = self.__eq__(other)
        return result if result is NotImplemented else not result

    def __hash__(self) -> int:
        return hash((type(self.original).__name__, self.policy, self.retry_config.classifier))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_handler, (self.original, self.retry_config))

    def call(self, operation: str, path: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` retried as ``operation`` on ``path`` (with its timeout)."""
        return self._call(operation, path, fn, *args, **kwargs)

    # -- the 15 FileSystemHandler methods ------------------------------------------------------
    def _call(self, operation: str, path: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        return self.retrier.call(operation, path, fn, *args, **kwargs)

    def _timed_call(self, operation: str, path: str, fn: Any, *args: Any, **kwargs: Any) -> Any:
        seconds = self.timeouts.get(operation)
        if seconds is not None:
            fn = timed(fn, seconds, operation, path)
        return self.retrier.call(operation, path, fn, *args, **kwargs)

    def get_type_name(self) -> str:
        # "outer::inner", pyarrow's convention for wrappers (its ProxyHandler is "proxy::...")
        return f"retry::{self.inner.type_name}"

    def normalize_path(self, path: str) -> str:
        return cast("str", self._call("normalize_path", path, self.inner.normalize_path, path))

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        infos = self._get_file_info(paths)
        if self._unsure_not_found:
            return [self._confirmed(info) for info in infos]
        return infos

    def _confirmed(self, info: pafs.FileInfo) -> pafs.FileInfo:
        """A "not found" of a client that `retryfs.clients.hides_list_errors`, confirmed by a
        retried listing; any other answer as it is."""
        if info.type != pafs.FileType.NotFound:
            return info
        return cast("pafs.FileInfo", self._call("get_file_info", info.path, confirm_not_found,
                                                self.inner, info))

    def _get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        # The most frequent call, inlined: one try, one counter; the label only on failure.
        if "get_file_info" in self.timeouts:
            infos = self._call("get_file_info", _label(paths), self.inner.get_file_info, paths)
            return cast("list[pafs.FileInfo]", infos)
        retrier = self.retrier
        started = retrier.clock()  # the deadline counts the first attempt too
        if retrier.limiter is not None:
            retrier.pace("get_file_info", started)
        try:
            infos = self.inner.get_file_info(paths)
        except Exception as exc:  # noqa: BLE001 - classified by the retrier
            error = exc
        else:
            retrier.first_try_succeeded("get_file_info")
            return cast("list[pafs.FileInfo]", infos)
        return retrier.recover("get_file_info", _label(paths), self.inner.get_file_info,
                               (paths,), {}, error, None, started)

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        infos = self._call("get_file_info_selector", selector.base_dir,
                           self.inner.get_file_info, selector)
        return cast("list[pafs.FileInfo]", infos)

    # -- ambiguous outcomes: a retry's error that shows an earlier attempt did the work -------
    # Each check is a call of its own through the retry engine (a transient error in it is
    # retried; one that gives up ends the operation, see Retrier._reconciled).
    def _info(self, path: str) -> pafs.FileInfo:
        info = self._call("get_file_info", path, self.inner.get_file_info, path)
        return self._confirmed(info) if self._unsure_not_found else info

    def create_dir(self, path: str, recursive: bool) -> None:
        def exists_now(exc: BaseException) -> bool:
            return (isinstance(exc, FileExistsError)
                    and self._info(path).type == pafs.FileType.Directory)

        self._call("create_dir", path, self.inner.create_dir, path, recursive=recursive,
                   reconcile=exists_now)

    def _was_directory(self, path: str) -> bool:
        """Before the first attempt, on a client that re-sends by itself: whether ``path`` is
        a directory (one metadata call), the proof that a "not found" later is this call's."""
        return bool(self._info(path).type == pafs.FileType.Directory)

    def delete_dir(self, path: str) -> None:
        if not self._resends_by_itself:  # the happy path: one try
            self._call("delete_dir", path, self.inner.delete_dir, path, reconcile=_is_missing)
            return
        # The client's own re-send of a delete whose answer was lost (of one object on GCS,
        # of the batch on Azure) fails retryfs's first attempt with a "not found".
        existed = self._was_directory(path)

        def deleted_here(exc: BaseException) -> bool:
            if not (_not_there(exc) and existed):
                return False
            return self._gone_or_unfinished(path, exc, self._info(path).type
                                            == pafs.FileType.NotFound)

        # every attempt's "not found" is judged by deleted_here: no reconcile of retries
        self._call("delete_dir", path, _unless(self.inner.delete_dir, deleted_here), path)

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        def emptied(exc: BaseException) -> bool:
            # An object store has no empty directories: once an earlier attempt deleted what
            # was under ``path``, the directory itself is gone and the retry finds nothing.
            if not _not_there(exc):
                return False
            selector = pafs.FileSelector(path, recursive=True, allow_not_found=True)
            return not self._call("get_file_info_selector", path, self.inner.get_file_info,
                                  selector)

        delete = self.inner.delete_dir_contents
        if self._resends_by_itself:  # as in delete_dir: a "not found" on the first attempt
            existed = self._was_directory(path)

            def emptied_here(exc: BaseException) -> bool:
                return (_not_there(exc) and existed
                        and self._gone_or_unfinished(path, exc, emptied(exc)))

            delete = _unless(delete, emptied_here)
        self._call("delete_dir_contents", path, delete, path, missing_dir_ok=missing_dir_ok,
                   reconcile=emptied)

    @staticmethod
    def _gone_or_unfinished(path: str, exc: BaseException, gone: bool) -> bool:
        """A directory that existed, whose delete met a "not found": done when ``gone``; when
        not, a FileNotFoundError stopped the delete half-way (the rest is retried, as an
        `UnfinishedDeleteError`), and any other error (a batch that refused some blobs) is
        raised as it came."""
        if gone:
            return True
        if isinstance(exc, FileNotFoundError):
            raise UnfinishedDeleteError(path, exc)
        return False

    def delete_root_dir_contents(self) -> None:
        self._call("delete_root_dir_contents", "/", self.inner.delete_dir_contents, "/",
                   accept_root_dir=True)

    def delete_file(self, path: str) -> None:
        if not self._resends_by_itself:  # the happy path: one try
            self._call("delete_file", path, self.inner.delete_file, path, reconcile=_is_missing)
            return
        # The client re-sends a DELETE whose answer was lost by itself and raises the 404 of
        # its re-send on retryfs's first attempt: only a look before tells that "not found"
        # (this call's own delete) from a file that never existed.
        before = self._info(path)

        def deleted_here(exc: BaseException) -> bool:
            return (_is_missing(exc) and before.type == pafs.FileType.File
                    and self._info(path).type == pafs.FileType.NotFound)

        self._call("delete_file", path, _unless(self.inner.delete_file, deleted_here), path,
                   reconcile=deleted_here)

    def move(self, src: str, dest: str) -> None:
        # What the source and the destination were before the first attempt (one metadata
        # call per move): the only proof that a retry which finds no source was preceded by
        # this call's own move, and not by a third party's delete beside an older object.
        before, dest_before = self._call("get_file_info", f"{src} -> {dest}",
                                         self.inner.get_file_info, [src, dest])

        source_before = arrow_entry(before)

        def moved_already(exc: BaseException) -> bool:
            if not _is_missing(exc) or source_before is None:
                return False
            src_info, dest_info = self._call("get_file_info", f"{src} -> {dest}",
                                             self.inner.get_file_info, [src, dest])
            return (src_info.type == pafs.FileType.NotFound and moved_here(
                arrow_entry(dest_info), source_before, arrow_entry(dest_before)))

        move = self.inner.move
        if self._resends_by_itself:  # its own re-send of the source's lost DELETE: a 404
            move = _unless(move, moved_already)
        self._call("move", f"{src} -> {dest}", move, src, dest, reconcile=moved_already)

    def copy_file(self, src: str, dest: str) -> None:
        self._call("copy_file", f"{src} -> {dest}", self.inner.copy_file, src, dest)

    def open_input_stream(self, path: str) -> pa.NativeFile:
        return self._open_input("open_input_stream", path, seekable=False)

    def open_input_file(self, path: str) -> pa.NativeFile:
        return self._open_input("open_input_file", path, seekable=True)

    def open_output_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        return self.open_replayable(path, metadata)

    def open_replayable(self, path: str, metadata: Any,
                        spool_memory: int | None = None) -> OutputFile:
        """`open_output_stream`, keeping up to ``spool_memory`` bytes of its replay spool in
        memory (``None``: the wrapper's ``spool_memory``)."""
        return self._open_writer(path, metadata, self.spool_memory if spool_memory is None
                                 else spool_memory)

    def write_regenerated(self, path: str, write: Callable[[Any], object],
                          metadata: Any = None) -> None:
        """``write(file)`` into a stream without a spool at ``path``, and all over again into a
        fresh one when that fails (`retryfs.datapath.regenerate`); on a local disk into a
        temporary file beside ``path``, renamed to it once committed."""
        local = is_local(subtree_base(self.original))
        # on a local disk: written beside and renamed, never a partial file under its name
        target = temporary_beside(path) if local else path

        def open_stream(in_flight: list[Any]) -> tuple[OutputFile, ReplayableOutputStream]:
            file = self._open_writer(target, metadata, None, in_flight)
            return file, file.source

        if not local:
            write_regenerated(self.retrier, path, open_stream, write)
            return
        try:
            write_regenerated(self.retrier, target, open_stream, write)
            self.move(target, path)
        except BaseException:
            with contextlib.suppress(Exception):  # nothing, or what a failed attempt left
                self.inner.delete_file(target)
            raise

    def _open_writer(self, path: str, metadata: Any, spool_memory: int | None,
                     in_flight: list[Any] | None = None) -> OutputFile:
        """A `ReplayableOutputStream` at ``path`` (``spool_memory=None``: one attempt of each
        call, no spool; see its ``in_flight``)."""
        empty = self.empty_at_open(path)
        open_output = (self.open_attempt_output if empty is None
                       else empty.attempts(self.open_attempt_output))

        def reopen() -> Any:
            stream = self._call("open_output_stream", path, open_output, path, metadata)
            if empty is not None:
                empty.opened()
            return stream

        first = reopen() if empty is None else empty.first_open(reopen)
        stream = ReplayableOutputStream(
            path, first, reopen, self.retrier,
            verify=self._landed if self.verify_writes else None,
            state_of=self._state_before,
            on_commit=self.failed_commits.record,
            spool_memory=spool_memory,
            attempt_timeout=with_parts_in_flight(self._per_attempt, first),
            on_give_up=None if empty is None else empty.remove,
            in_flight=in_flight,
        )
        return OutputFile(stream, mode="w")

    def open_append_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        # Appends are not replayable: only opening is retried.
        return self._call("open_append_stream", path, self.inner.open_append_stream, path,
                          compression=None, metadata=metadata)

    # -- helpers ---------------------------------------------------------------------------------
    def open_attempt_output(self, path: str, metadata: Any = None) -> Any:
        """The stream one attempt of a write into ``path`` writes into (not retried: the
        replayable stream above it opens one per attempt): the write client's, its parts
        re-sent by its own SDK attempts (``client_write_attempts``)."""
        if not isinstance(self.original, pafs.FileSystem):
            # An fsspec filesystem's own file, not the pyarrow.PythonFile that FSSpecHandler
            # wraps it in: only the raw file has discard() (s3fs aborts the multipart upload).
            # Dropping a broken stream by closing a PythonFile would commit what it holds
            # (a partial object) and send a failed part once more.
            return retry_parts_in_place(self.original.open(path, mode="wb"), self.retrier, path,
                                        self._per_attempt)
        stream = self.writer.open_output_stream(path, compression=None, metadata=metadata)
        if opens_lazily(self.writer):  # a broken one is never closed
            return LazyUploadStream(stream, bounded=holds_unsent_parts(self.writer))
        # Its close waits for part uploads on Arrow's IO pool, which copy_files may have filled
        # with closes like this one (apache/arrow#15233): lend the pool a thread meanwhile.
        if not self._background_writes:
            return stream
        return PoolSafeOutputStream(stream, bounded=holds_unsent_parts(self.writer))

    def _open_input(self, operation: str, path: str, *, seekable: bool) -> pa.NativeFile:
        return InputFile(self.resumable_input(operation, path, seekable=seekable), mode="r")

    def resumable_input(self, operation: str, path: str, *, seekable: bool) -> ArrowSideInput:
        """``path`` opened (``operation``, retried) as the resumable reader itself: what Arrow
        gets inside a ``PythonFile``, and what a ``copy_files`` from this filesystem reads
        from directly (`retryfs.datapath.download`)."""
        read_timeout = self.timeouts.get("read")

        def opened(name: str) -> Any:
            method = _native_open(self.inner, name)
            raw = {"compression": None} if method == "open_input_stream" else {}
            inner = self._call(name, path, getattr(self.inner, method), path, **raw)
            return inner if read_timeout is None else TimedInputStream(inner, read_timeout,
                                                                       "read", path)

        def resume() -> Any:
            # A failed read resumes with a ranged read at its offset: a random-access file,
            # positioned by seek (S3: the next GET asks for ``Range: bytes=<offset>-``), never a
            # fresh stream whose prefix is downloaded again and thrown away.
            try:
                return opened("open_input_file")
            except NotImplementedError:  # a filesystem that only streams: skip to the offset
                return opened("open_input_stream")

        return ArrowSideInput(path, opened(operation), resume, self.retrier, seekable=seekable)

    def writer_for(self, size: int | None) -> pafs.FileSystem:
        """The filesystem that opens the output stream of a file of ``size`` bytes in a
        ``copy_files``: for a one-part file when retryfs built the write client,
        `_one_part_client`, or obstore's (`retryfs.arrow.obstore_small`, by
        ``one_part_client``); else `writer`."""
        if size is None or size >= ONE_PART or self.writer is self.inner:
            return self.writer
        if self._one_part_writer is None:  # built once, on first use (a race builds two)
            self._one_part_writer = self._one_part()
        return self._one_part_writer

    def small_files_reader(self) -> Callable[[str, pafs.FileSystem, str], int] | None:
        """What downloads a small file whole (`ObstoreSmallFiles.fetch`) when obstore writes
        the small files (``one_part_client``) and can be used from this process; else None
        (Arrow's one-file copy)."""
        if (self.retry_config.one_part_client == "arrow" or self.writer is self.inner
                or not isinstance(self.inner, pafs.S3FileSystem)):
            return None
        handler = getattr(self.writer_for(0), "handler", None)
        if isinstance(handler, ObstoreSmallFiles) and handler.usable():
            return handler.fetch
        return None

    def _one_part(self) -> pafs.FileSystem:
        """The one-part writer ``one_part_client`` asks for: `_one_part_client`, or obstore's
        over it; ``"obstore"`` that cannot be built is a ValueError saying why."""
        arrow = _one_part_client(self.writer)
        choice = self.retry_config.one_part_client
        if choice == "arrow":
            return arrow
        built = obstore_small_client(self.writer, arrow)
        if isinstance(built, str):
            if choice == "obstore":
                raise ValueError(f"one_part_client='obstore': cannot be used here: {built}")
            return arrow
        return built

    def empty_at_open(self, path: str) -> EmptyAtOpen | None:
        """What removes the empty blob an open of ``path`` creates, if the write then fails
        (pyarrow's Azure client; None for the others, whose uploads show nothing before
        their commit)."""
        return EmptyAtOpen(self.writer, path, self.retrier) if self._empty_at_open else None

    @property
    def _per_attempt(self) -> Callable[[str, int], float | None] | None:
        """`write_attempt_timeout` where this filesystem's writes are timed, else ``None``."""
        return self.write_attempt_timeout if self._timed_writes else None

    def write_attempt_timeout(self, operation: str, in_flight: int) -> float | None:
        """The timeout of one write/flush/close (or whole-file copy) attempt: ``write_timeout``
        plus the bytes in flight at ``min_throughput``; ``None`` when writes are untimed (the
        deadline stops the retries, not an attempt: an object that needs longer than the
        deadline can still land)."""
        if self.retry_config.write_timeout is None:
            return None
        return write_attempt_timeout(self.retry_config.write_timeout, self.retry_config.min_throughput,
                                     in_flight)

    def _landed(self, path: str, size: int, digest: WriteDigest | None = None,
                before: Any = UNKNOWN) -> Verdict:
        """Whether ``path`` now holds the ``size`` bytes written (read-after-write check): the
        new object, not an older one of the same size (`retryfs.core.proof.is_new`: S3's ETag
        against the bytes' MD5, or a change since ``before``). The copy data path leaves its
        digest and earlier state in `proofs`."""
        if digest is None and before is UNKNOWN:
            digest, before = self.proofs.take(path)
        if writes_through(self.inner):  # a local write is in place or nowhere: its size
            info = self.inner.get_file_info(path)
            return info.type == pafs.FileType.File and (info.size is None or info.size == size)
        after = arrow_state(self.inner, path)

        def read_back() -> bytes:  # its size at once: through fsspec, read() asks in chunks
            with self.inner.open_input_stream(path, compression=None) as stream:
                return bytes(stream.read(size))

        return is_new(after, size, digest, before, lambda: read_md5(read_back))

    def _state_before(self, path: str) -> Any:
        """``path``'s state before a large write's commit (`retryfs.core.proof.ObjectState`)."""
        return arrow_state(self.inner, path)


class ArrowSideInput(ResumableInputFile):
    """The resumable stream as Arrow's ``PythonFile`` reads it: ``read`` hands over the inner
    file's Buffer as it is. Arrow copies whatever ``read`` returns into its own buffer (the
    chunk of a ``copy_files``); ``bytes`` would be one more copy of every byte read."""

    def read(self, size: int | None = -1) -> Any:
        return self.read_buffer(size)


def _as_bytes(data: Any) -> bytes:
    return data if isinstance(data, bytes) else data.to_pybytes()


class InputFile(pa.PythonFile):  # type: ignore[misc]  # untyped library
    """A retryfs input stream with its metadata.

    Arrow cannot read metadata from a Python-implemented stream (``PythonFile.metadata()`` is
    always empty), so `RetryingFileSystem` hands this object to Python callers directly, and
    ``metadata()`` is the inner stream's (``Content-Type`` and the rest an object store sent).
    """

    def __init__(self, source: ArrowSideInput, mode: str = "r") -> None:
        self.source = source  # PythonFile's own __cinit__ has taken source and mode already

    def metadata(self) -> dict[str, bytes]:
        return self.source.metadata()

    def read(self, nbytes: int | None = None) -> bytes:
        """PythonFile takes every Python file for random access: a whole read would ask a
        sequential stream for its size; it is read to its end instead. A large read of a
        random-access file is read straight into the ``bytes`` returned (PythonFile's own
        would read into a Buffer, then copy it into ``bytes``: a 1 GiB checkpoint twice)."""
        if nbytes is None and not self.source.seekable():
            return _as_bytes(self.source.read_buffer(-1))
        if nbytes is None or nbytes > SUB_READ:
            if self.closed:
                raise ValueError("I/O operation on closed file")
            return self.source.read_bytes(-1 if nbytes is None else nbytes)
        return cast("bytes", super().read(nbytes))

    def read_buffer(self, nbytes: int | None = None) -> pa.Buffer:
        if nbytes is None and not self.source.seekable():
            data = self.source.read_buffer(-1)
            return data if isinstance(data, pa.Buffer) else pa.py_buffer(data)
        return super().read_buffer(nbytes)


class OutputFile(pa.PythonFile):  # type: ignore[misc]  # untyped library
    """A retryfs output stream (`ReplayableOutputStream`) as pyarrow's ``open_output_stream``
    returns it, except that a ``with`` block that raises commits nothing (`abort`): pyarrow's
    own streams close there, and an object store then stores what was written so far as the
    whole object (a checkpoint cut short by an error in ``torch.save``)."""

    def __init__(self, source: ReplayableOutputStream, mode: str = "w") -> None:
        self.source = source  # PythonFile's own __cinit__ has taken source and mode already

    def abort(self) -> None:
        """Close without committing anything (see `ReplayableOutputStream.abort`)."""
        self.source.abort()

    def __exit__(self, exc_type: Any, exc_value: Any, traceback: Any) -> None:
        if exc_type is None:
            self.close()
        else:
            self.abort()


def _rebuild_handler(fs: Any, config: WrapperConfig) -> RetryingHandler:
    return RetryingHandler(fs, config=config)


class RetryingFileSystem(pafs.PyFileSystem):  # type: ignore[misc]  # untyped library
    """A pyarrow filesystem that retries every operation of ``fs`` on transient failures.

    ``fs`` is any pyarrow filesystem or any fsspec filesystem. Hand it to anything that takes a
    ``pyarrow.fs.FileSystem`` (Ray Train's ``RunConfig(storage_filesystem=...)``, datasets,
    ``copy_files``). Attributes the wrapper does not have are looked up on ``fs``.
    """

    def __init__(self, fs: Any, policy: RetryPolicy | None = None, *,
                 config: WrapperConfig | None = None,
                 per_operation: Mapping[str, RetryPolicy | Mapping[str, object]] | None = None,
                 classifier: ErrorClassifier | None = None,
                 retryable_messages: Sequence[str] = default("retryable_messages"),
                 verify_writes: bool = default("verify_writes"),
                 spool_memory: int | str = default("spool_memory"),
                 budget: RetryBudget | bool | None = default("budget"),
                 rate_limit: RateLimit | str | bool = default("rate_limit"),
                 timeout: float | Mapping[str, float] | None = default("timeout"),
                 client_attempts: int | None = default("client_attempts"),
                 client_write_attempts: int | None = default("client_write_attempts"),
                 one_part_client: OnePartClient = default("one_part_client"),
                 file_client: FileClient = default("file_client"),
                 write_timeout: float | None = default("write_timeout"),
                 min_throughput: float = default("min_throughput"),
                 stats: RetryStats | None = None,
                 **deprecated: Any) -> None:
        """Wrap ``fs`` (a pyarrow or fsspec filesystem).

        Each option is a field of `WrapperConfig` (which says what it does) and, where it has
        one, a ``retry_*`` URL parameter and ``RETRYFS_*`` variable. An option left at its
        default takes its value from ``config`` when given. The spellings of 0.1.0
        (``native_attempts``, ``native_write_attempts``) still work, with a
        ``DeprecationWarning``.
        """
        options = renamed({**deprecated, **given(locals())})
        handler = fs if isinstance(fs, RetryingHandler) else RetryingHandler(
            fs, config=config, **options)
        super().__init__(handler)
        self.__dict__["_retry_handler"] = handler

    @property
    def retry_handler(self) -> RetryingHandler:
        return cast("RetryingHandler", self.__dict__["_retry_handler"])

    def unwrap(self) -> Any:
        """The filesystem this one wraps, as it was given."""
        return self.retry_handler.original

    @property
    def retry_config(self) -> WrapperConfig:
        """All the settings of this wrapper (hand it to the other face, `copy`, `from_uri`)."""
        return self.retry_handler.retry_config

    @property
    def policy(self) -> RetryPolicy:
        return self.retry_handler.policy

    @property
    def classifier(self) -> ErrorClassifier:
        return self.retry_handler.classifier

    @property
    def stats(self) -> RetryStats:
        return self.retry_handler.stats

    @property
    def retry_budget(self) -> TokenBucket | None:
        """The live retry budget of the wrapped endpoint in this process (None: no budget)."""
        return self.retry_handler.retrier.budget

    @property
    def rate_limiter(self) -> RateLimiter | None:
        """The live rate limiter of the wrapped endpoint in this process (None: ``"off"``)."""
        return self.retry_handler.retrier.limiter

    # Python callers get the handler's stream itself (not Arrow's copy of it, which has lost
    # the metadata); Arrow's own callers (copy_files, datasets) go through the handler as usual.
    def open_input_stream(self, path: Any, compression: str | None = "detect",
                          buffer_size: int | None = None) -> pa.NativeFile:
        if not isinstance(path, (str, os.PathLike)):
            return super().open_input_stream(path, compression=compression,
                                             buffer_size=buffer_size)
        path = os.fspath(path)
        return self._wrap_input_stream(self.retry_handler.open_input_stream(path), path=path,
                                       compression=compression, buffer_size=buffer_size)

    def open_input_file(self, path: Any) -> pa.NativeFile:
        if not isinstance(path, (str, os.PathLike)):
            return super().open_input_file(path)
        return self.retry_handler.open_input_file(os.fspath(path))

    def open_output_stream(self, path: Any, compression: str | None = "detect",
                           buffer_size: int | None = None,
                           metadata: dict[str, str] | None = None, *,
                           spool_memory: int | str | None = None) -> pa.NativeFile:
        """pyarrow's ``open_output_stream``, except that the stream a Python caller gets is
        the handler's `OutputFile` itself: a ``with`` block that raises commits nothing. With
        compression (a ``.gz`` path...) or a ``buffer_size``, pyarrow's wrapping stream closes
        as pyarrow's do. ``spool_memory``: this stream's, in place of the wrapper's (bytes of
        the replay spool kept in memory before a temporary file)."""
        if not isinstance(path, (str, os.PathLike)):
            if spool_memory is not None:
                raise TypeError("spool_memory: only for a path (str or os.PathLike), got "
                                f"{type(path).__name__}")
            return super().open_output_stream(path, compression=compression,
                                              buffer_size=buffer_size, metadata=metadata)
        path = os.fspath(path)
        spool = None if spool_memory is None else checked_size("spool_memory", spool_memory)
        stream = self.retry_handler.open_replayable(path, metadata, spool)
        return self._wrap_output_stream(stream, path=path, compression=compression,
                                        buffer_size=buffer_size)

    def write_with(self, path: str | os.PathLike[str], write: Callable[[Any], object], *,
                   metadata: dict[str, str] | None = None) -> None:
        """Write the object at ``path`` by calling ``write(file)`` with a fresh output stream,
        and commit it when ``write`` returns; when the upload fails in a way the client's own
        retries did not absorb, call ``write`` again with another fresh stream (retried as the
        operation ``write``). For a caller that can produce its bytes again, such as
        ``torch.save`` of a state_dict it still holds:
        ``fs.write_with("bucket/model.pt", lambda f: torch.save(state, f))``.

        Unlike `open_output_stream`, no replay spool is kept (nothing goes to a temporary file,
        whatever the size), and the bytes are stored as ``write`` writes them (no compression
        by the name's suffix). The commit is checked as any stream's is. On a local disk the
        file is written beside ``path`` and renamed to it once complete: ``path`` shows the last
        good file until then. An error ``write`` raises itself is not retried: nothing is
        committed, and it is raised as it is."""
        if not isinstance(path, (str, os.PathLike)):
            raise TypeError(f"path: a str or os.PathLike, got {type(path).__name__}")
        if not callable(write):
            raise TypeError(f"write: a callable taking the file, got {type(write).__name__}")
        self.retry_handler.write_regenerated(os.fspath(path), write, metadata)

    def failed_commits(self) -> dict[str, BaseException]:
        """``{path: exception}``: objects whose commit finally failed in this process and were
        not redone since, each with the original exception (iterate it for the paths)."""
        return self.retry_handler.failed_commits.snapshot()

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_filesystem, (self.retry_handler.original, self.retry_handler.retry_config))

    def __getattr__(self, name: str) -> Any:
        handler = self.__dict__.get("_retry_handler")
        if handler is None or name.startswith("__"):
            raise AttributeError(name)
        return getattr(handler.original, name)

    def __repr__(self) -> str:
        # the inner filesystem's repr is the backend's: it may show its options
        return redact(f"RetryingFileSystem({self.retry_handler.original!r}, "
                      f"policy={self.policy!r})")


def _rebuild_filesystem(fs: Any, config: WrapperConfig) -> RetryingFileSystem:
    return RetryingFileSystem(fs, config=config)


def _retrying_handler(fs: Any) -> RetryingHandler | None:
    handler = fs.__dict__.get("_retry_handler") if isinstance(fs, RetryingFileSystem) else None
    return handler if isinstance(handler, RetryingHandler) else None


def _direct_copy(copy: Any, download: Any) -> Any:
    """``copy`` (of `retryfs.datapath.upload`) when the destination is a `RetryingFileSystem` over a pyarrow
    filesystem; else ``download`` (of `retryfs.datapath.download`) when the source is a
    `RetryingFileSystem`; else ``NotImplemented`` (pyarrow copies; the guard still watches the
    commits). fsspec destinations keep the stream path: closing a broken fsspec file would
    commit it."""

    def direct(source_fs: Any, source: Any, destination_fs: Any, destination: str,
               chunk_size: int = 1024 * 1024, use_threads: bool = True) -> Any:
        handler = _retrying_handler(destination_fs)
        if handler is not None:
            if not isinstance(handler.original, pafs.FileSystem):
                return NotImplemented
            return copy(handler, source_fs, source, destination, chunk_size, use_threads)
        reader = _retrying_handler(source_fs)
        if reader is not None and isinstance(destination_fs, pafs.FileSystem):
            return download(reader, source, destination_fs, destination, chunk_size,
                            use_threads)
        return NotImplemented

    return direct


#: What the ``copy_files`` patch routes to retryfs's data path (`retryfs.patches.registry`).
_DIRECT = {"_copy_files": _direct_copy(copy_single_file, download_single_file),
           "_copy_files_selector": _direct_copy(copy_file_tree, download_file_tree)}


def ensure_copy_files_guard() -> None:
    """Install the ``copy_files`` patch (`retryfs.patches.registry`) if it applies: called by every
    wrapper's constructor (either face, unpickling included), never by ``import retryfs``."""
    patches.install_copy_files_guard(_DIRECT)

"""``pyarrow.fs.copy_files`` onto a `RetryingFileSystem`: native streams, the source re-read.

A copy's bytes can always be read again from its source, so there is no need to keep them in a
replay spool: each file is one attempt (open the source, open the destination on the wrapped
filesystem, move pyarrow buffers from one native stream to the other, close), retried as a whole
under the operation ``copy_files`` (policy group ``write``) by reading the source again. The
happy path moves the bytes with Arrow's own streams (no Python copy, no spool), at the wrapped
filesystem's speed; part failures inside a native S3 upload are re-sent by its write client
(``native_write_attempts``), as for any output stream.

After each file, the post-commit check runs as its own retried metadata call (``verify``): a
failed check sends nothing again, a proven missing or short object copies the file again. A file
that finally fails is reported to the guard's session like any failed commit: ``copy_files``
raises its original error with the note naming every object that did not land (never a silent
success), and ``fs.failed_commits()`` lists it. A serial copy stops at that file, as Arrow's
does (a threaded one, as Arrow's, runs every file it submitted).
"""

from __future__ import annotations

import posixpath
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.fs as pafs

from .commits import FailedCommits, report_commit, watching
from .engine import Retrier
from .errors import CommitNotVisibleError
from .streams import abandon_stream, discard
from .timeouts import run_with_timeout

__all__ = ["CopyTarget", "copy_file_tree", "copy_single_file"]


class CopyTarget(Protocol):
    """What a copy needs of the destination's handler (`retryfs.arrow.RetryingHandler`)."""

    retrier: Retrier
    writer: pafs.FileSystem  # opens the native output streams
    failed_commits: FailedCommits

    @property
    def verify_writes(self) -> bool: ...
    def create_dir(self, path: str, recursive: bool) -> None: ...
    def _landed(self, path: str, size: int) -> bool: ...
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
    every file copied, in parallel on ``pyarrow.io_thread_count()`` threads with
    ``use_threads``)."""
    infos = source_fs.get_file_info(selector)
    base = selector.base_dir.rstrip("/")
    destination_base = destination_base.rstrip("/")

    def target(path: str) -> str:
        relative = path[len(base):].lstrip("/") if path.startswith(base) else path
        return f"{destination_base}/{relative}" if relative else destination_base

    for info in infos:  # as Arrow does: each source directory, not the base itself
        if info.type == pafs.FileType.Directory:
            handler.create_dir(target(info.path), True)
    files = [(info.path, target(info.path), _buffer_size(chunk_size, info.size), info.size)
             for info in infos if info.type == pafs.FileType.File]
    if not use_threads or len(files) < 2:
        for source, destination, buffer_size, size in files:
            # as Arrow's serial copy: the first file that fails ends it (the guard raises)
            if _copy_file(handler, source_fs, source, destination, buffer_size, size):
                return
        return
    with ThreadPoolExecutor(max_workers=max(1, pa.io_thread_count())) as pool:
        for future in [pool.submit(_copy_file, handler, source_fs, source, destination,
                                   buffer_size, size)
                       for source, destination, buffer_size, size in files]:
            future.result()


def _buffer_size(chunk_size: int, size: int | None) -> int:
    """The read size of one file: ``chunk_size``, or the file's size if smaller (Ray Train
    copies with 64 MiB chunks: a 1 KiB file must not cost a 64 MiB buffer per read)."""
    if size is None or size < 0:
        return max(1, chunk_size)
    return max(1, min(chunk_size, size))


def _copy_file(handler: CopyTarget, source_fs: pafs.FileSystem, source: str,
               destination: str, buffer_size: int, size: int | None) -> BaseException | None:
    """One file, retried; its final error (reported to the guard, which raises it after the
    call) or ``None``."""
    unverified: list[Exception] = []
    error: BaseException | None = None
    seconds = handler.write_attempt_timeout("copy_files", max(0, size or 0))
    try:
        handler.retrier.call("copy_files", destination, _attempt, handler, source_fs, source,
                             destination, buffer_size, seconds, unverified)
        if unverified:  # committed, but the check gave up: nothing proven either way
            error = unverified[0]
    except Exception as exc:  # noqa: BLE001 - reported, then raised by the copy_files guard
        error = exc
    handler.failed_commits.record(destination, error)
    report_commit(watching(), destination, error)
    return error


def _attempt(handler: CopyTarget, source_fs: pafs.FileSystem, source: str,
             destination: str, buffer_size: int, seconds: float | None,
             unverified: list[Exception]) -> None:
    """One whole-file attempt. With a per-attempt write timeout (``write_timeout`` plus the
    file's bytes at ``min_throughput``), the upload runs on a worker, and a stalled one is left
    behind and becomes a retry that reads the source again; the abandoned attempt never
    commits (it stops at its next read or write and drops its stream unclosed), so it cannot
    land a partial or stale object over the retry's. The verification runs after, outside
    that timeout: it is a metadata call with timeouts of its own."""
    abandoned = threading.Event()
    beside = _writes_through(handler.writer)

    def upload() -> int:
        target = _beside(destination) if beside else destination
        with source_fs.open_input_stream(source) as reader:
            metadata = reader.metadata() or None
            writer = handler.writer.open_output_stream(target, metadata=metadata)
            try:
                size = _pump(reader, writer, buffer_size, abandoned)
            except BaseException:
                if beside:
                    _remove_quietly(handler.writer, target)
                raise
        if beside:
            _rename(handler.writer, target, destination, abandoned)
        return size

    if seconds is None:
        size = upload()
    else:
        size = run_with_timeout(upload, seconds, "copy_files", destination,
                                on_abandon=lambda _future: abandoned.set())
    if handler.verify_writes:
        _verify(handler.retrier.call, handler._landed, destination, size, unverified)


class _Abandoned(Exception):
    """Raised inside an attempt that timed out: it stops without committing."""


def _pump(reader: pa.NativeFile, writer: pa.NativeFile, buffer_size: int,
          abandoned: threading.Event) -> int:
    """Bytes from ``reader`` into ``writer``, then the commit (its close).

    Only a whole copy is committed. When the *source* fails (or the attempt was abandoned),
    ``writer`` is healthy and its close would commit the prefix it holds as if it were the
    file (and a copy onto itself would then re-read that prefix as its source): it is dropped
    unclosed instead (:func:`retryfs.streams.abandon_stream`; an S3 multipart upload stays
    incomplete). When the *writer* failed, it is closed: a native stream whose write failed
    does not commit. Each read is a fresh Arrow buffer handed on without a copy: a native S3
    stream may keep it for a background part upload, so a buffer is never reused."""
    size = 0
    while True:
        try:
            if abandoned.is_set():
                raise _Abandoned()
            buffer = reader.read_buffer(buffer_size)
            if abandoned.is_set():
                raise _Abandoned()
        except BaseException:
            abandon_stream(writer)
            raise
        if not buffer.size:
            break
        try:
            writer.write(buffer)
        except BaseException:
            discard(writer)
            raise
        size += buffer.size
    writer.close()  # the commit: raises when it failed (copy_files would ignore it)
    return size


def _writes_through(fs: pafs.FileSystem) -> bool:
    """Whether ``fs``'s output streams write in place as they go (a local disk: the file is
    truncated at open and holds a prefix while written), so that a copy writes beside its
    destination and renames it into place (an object store shows nothing until the commit)."""
    while isinstance(fs, pafs.SubTreeFileSystem):
        fs = fs.base_fs
    return isinstance(fs, pafs.LocalFileSystem)


def _beside(path: str) -> str:
    head, tail = posixpath.split(path)
    return posixpath.join(head, f".{tail}.retryfs-{uuid.uuid4().hex[:8]}.tmp")


def _rename(fs: pafs.FileSystem, target: str, destination: str,
            abandoned: threading.Event) -> None:
    try:
        if abandoned.is_set():
            raise _Abandoned()
        fs.move(target, destination)
    except BaseException:
        _remove_quietly(fs, target)
        raise


def _remove_quietly(fs: pafs.FileSystem, path: str) -> None:
    try:
        fs.delete_file(path)
    except Exception:  # noqa: BLE001 - best effort: the attempt's own error is raised
        pass


def _verify(call: Callable[..., Any], landed: Callable[[str, int], bool], path: str, size: int,
            unverified: list[Exception]) -> None:
    try:
        ok = call("verify", path, landed, path, size)
    except Exception as exc:  # noqa: BLE001 - raised after the copy loop, never re-copied
        unverified.append(exc)
        return
    if not ok:
        raise CommitNotVisibleError(
            f"{path!r} was committed but does not hold the {size} bytes copied")

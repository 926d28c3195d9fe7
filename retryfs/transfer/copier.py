"""Standalone transfers: `copy`, parallel, retried per file, resumable and verified.

::

    result = retryfs.copy("./checkpoint", "s3://bucket/ckpt?retry_max_attempts=8",
                          recursive=True, workers=8, verify="hash")

Each file is one retried unit: open the source, stream it into a fresh destination object,
commit, check. A failure anywhere in the unit (a part upload, the commit, the check) starts the
file again from its first byte, re-read from the source, so nothing is spooled. Reads of the
source resume by themselves (they go through `RetryingFileSystem`), listings and metadata calls
are retried per call; only a failed *write* or *check* costs a new upload of that file.

After each commit the object is checked (its size, and with ``verify="hash"`` its content
re-read and compared by SHA-256 with what was read from the source). A file is reported as
copied only when that check passed: a commit that answered OK but landed nothing (or landed
something else) is retried like any transient failure, and if it never lands the file is
reported failed.

Resumption: a file the destination already holds is skipped when its size matches and, where
both sides give a comparable checksum, the checksum too (see `same_content`). Without a
comparable checksum, ``verify="hash"`` reads both sides and compares their SHA-256 before it
skips (`same_sha256`); otherwise the size alone decides, and the result says so
(`CopyResult.skipped_unverified`, "skipped by size, not verified" in the summary): a
same-size file with different bytes is not detected then.

`copy` raises `CopyError` (with the full `CopyResult` as ``.result``) when a file failed after
its retries; the files that did land stay where they are, and running the same copy again
transfers only what is missing.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import logging
import os
import posixpath
import threading
import time
from collections.abc import Callable
from typing import Any

import pyarrow.fs as pafs

from retryfs.arrow.filesystem import RetryingFileSystem
from retryfs.config import WrapperConfig
from retryfs.core.classify import Decision, ErrorClassifier
from retryfs.core.engine import Retrier
from retryfs.core.locations import check_location, check_path, temporary_beside
from retryfs.core.policy import RetryPolicy
from retryfs.core.proof import UNKNOWN, WriteDigest, arrow_state, fsspec_state, is_new
from retryfs.core.redact import redact, redact_and_truncate
from retryfs.core.stats import RetryEvent
from retryfs.datapath.streams import abandon_stream, discard
from retryfs.datapath.upload import join_abstract
from retryfs.uri import from_uri

from .checksums import (
    _etag_matches,  # noqa: F401 - re-exported for the tests of the ETag layouts
    etag_of,  # noqa: F401 - re-exported
    is_fsspec,
    is_local,
    read_all,
    same_content,
    same_sha256,
)
from .results import (
    CHUNK,
    Checked,
    CopyError,
    CopyProgress,
    CopyResult,
    FileCopy,
    VerificationError,
    Verify,
)

__all__ = [
    "CopyError",
    "CopyProgress",
    "CopyResult",
    "FileCopy",
    "VerificationError",
    "copy",
    "same_content",
    "same_sha256",
]

log = logging.getLogger("retryfs.copy")

# -- endpoints -----------------------------------------------------------------------------------

def _wrap(spec: Any, config: WrapperConfig | None, policy: RetryPolicy | None,
          what: str) -> tuple[RetryingFileSystem, str, str]:
    """``(RetryingFileSystem, path, shown)`` for a URI, a local path or a (filesystem, path).

    A retryfs wrapper of either face keeps all its settings (``policy`` replaces its policy);
    another filesystem is wrapped with ``config`` and ``policy``.
    """
    options: dict[str, Any] = {"policy": policy} if policy is not None else {}
    if isinstance(spec, (str, os.PathLike)):
        uri = os.fspath(spec)
        check_location(uri, what)  # an empty SRC or DST is never the current directory
        fs, path = from_uri(uri, config=config, **options)
        if uri.split("?", 1)[0].endswith(("/", os.sep)) and not path.endswith("/"):
            path += "/"  # "into this directory" (from_uri drops the slash)
        return fs, path, redact(uri)
    if isinstance(spec, tuple) and len(spec) == 2:
        fs, path = spec
        path = check_path(os.fspath(path), f"{what} path")
        if isinstance(fs, RetryingFileSystem):
            if options:
                fs = RetryingFileSystem(fs.unwrap(), config=fs.retry_config.replace(**options))
        elif isinstance(getattr(fs, "retry_config", None), WrapperConfig):
            # the fsspec face of retryfs: the same settings on the pyarrow face (never twice)
            fs = RetryingFileSystem(fs, **options)
        else:
            fs = RetryingFileSystem(fs, config=config, **options)
        if is_local(fs) and not os.path.isabs(path):
            path = os.path.abspath(path)
        return fs, path, _shown_pair(fs, path)
    raise TypeError(f"{what} must be a URI, a local path or a (filesystem, path) pair, "
                    f"got {type(spec).__name__}")


def _shown_pair(fs: RetryingFileSystem, path: str) -> str:
    if is_local(fs):
        return path
    original = fs.unwrap()
    if isinstance(original, pafs.FileSystem):
        return f"{original.type_name}:{path}"
    protocol = getattr(original, "protocol", None)
    protocol = protocol if isinstance(protocol, str) else (protocol or ("fsspec",))[0]
    return f"{protocol}:{path}"


def _join(base: str, rel: str) -> str:
    """``rel`` under ``base`` as Arrow joins abstract paths: ``""`` + ``rel`` is ``rel``, the
    root ``"/"`` + ``rel`` is ``"/rel"``."""
    return join_abstract(base, rel)


# -- the copy --------------------------------------------------------------------------------------

class _Final(Exception):
    """Wraps an error the per-file unit must not retry (already retried where it happened)."""

    def __init__(self, error: BaseException) -> None:
        super().__init__(str(error))
        self.error = error


class _Cancelled(Exception):
    pass


class _UnitClassifier:
    """The destination's classifier, except that `_Final` errors fail at once."""

    def __init__(self, inner: ErrorClassifier) -> None:
        self.inner = inner

    def classify(self, error: BaseException) -> Decision:
        if isinstance(error, (_Final, _Cancelled)):
            return Decision.FAIL
        return self.inner.classify(error)


def _final(fn: Callable[..., Any], *args: Any) -> Any:
    try:
        return fn(*args)
    except Exception as exc:  # noqa: BLE001 - retried where it happened; do not retry the upload
        raise _Final(exc) from exc


def _short(error: BaseException) -> str:
    """One line for a failure's reason: the error redacted whole, then its first line, cut."""
    text = redact(str(error)).strip()
    first = text.splitlines()[0] if text else ""
    return redact_and_truncate(f"{type(error).__name__}: {first}", 300)


class _Copier:
    def __init__(self, src: RetryingFileSystem, dst: RetryingFileSystem, *, verify: Verify,
                 resume: bool, dry_run: bool, workers: int,
                 progress: Callable[[CopyProgress], None] | None) -> None:
        self.src, self.dst = src, dst
        self.verify, self.resume, self.dry_run, self.workers = verify, resume, dry_run, workers
        self.progress = progress
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.retries = 0
        self.bytes_done = 0
        self.counts = {"copied": 0, "skipped": 0, "failed": 0, "planned": 0}
        self.files: list[FileCopy] = []
        self.bytes_total = 0
        handler = dst.retry_handler
        self.unit = Retrier(lambda _op: handler.policy_for("write"),
                            _UnitClassifier(handler.classifier),
                            handler.stats, budget=dst.retry_budget)
        original = dst.unwrap()
        self.dst_local = is_local(dst)
        self.dst_fsspec = is_fsspec(original)
        self.dst_inner = dst.retry_handler.inner
        self.dst_original = original
        # object stores have no directories to create (pyarrow's S3 create_dir writes markers)
        self.make_dirs = self.dst_local or dst.retry_handler.inner.type_name not in (
            "s3", "gcs")
        self.made_dirs: set[str] = set()

    # -- bookkeeping --------------------------------------------------------------------------
    def _count_retry(self, event: RetryEvent) -> None:
        with self.lock:
            self.retries += 1
        self._report()

    def _report(self, file: FileCopy | None = None, advance: int = 0) -> None:
        with self.lock:
            self.bytes_done += advance
            if file is not None:
                self.counts[file.status] += 1
            if self.progress is None:
                return
            snapshot = CopyProgress(
                files_total=len(self.files), files_done=sum(self.counts.values()),
                bytes_total=self.bytes_total, bytes_done=self.bytes_done,
                copied=self.counts["copied"], skipped=self.counts["skipped"],
                failed=self.counts["failed"], retries=self.retries, file=file)
            self.progress(snapshot)

    # -- the run ---------------------------------------------------------------------------------
    def run(self, plan: list[FileCopy], existing: dict[str, pafs.FileInfo]) -> None:
        self.files = plan
        self.bytes_total = sum(f.size for f in plan)
        hooks = {id(fs.stats): fs.stats for fs in (self.src, self.dst)}
        for stats in hooks.values():
            stats.on_retry(self._count_retry)
        try:
            self._report()
            if self.workers <= 1 or len(plan) <= 1:
                for item in plan:
                    self._one(item, existing.get(item.destination))
                return
            pool = concurrent.futures.ThreadPoolExecutor(
                max_workers=min(self.workers, len(plan)), thread_name_prefix="retryfs-copy")
            try:
                futures = [pool.submit(self._one, item, existing.get(item.destination))
                           for item in plan]
                for future in concurrent.futures.as_completed(futures):
                    future.result()
            except BaseException:
                self.stop.set()
                pool.shutdown(wait=True, cancel_futures=True)
                raise
            pool.shutdown(wait=True)
        finally:
            for stats in hooks.values():
                stats.remove_hook(self._count_retry)

    def _one(self, item: FileCopy, there: pafs.FileInfo | None) -> None:
        if self.stop.is_set():
            return
        try:
            if self.resume and there is not None and there.type == pafs.FileType.File \
                    and there.size == item.size:
                same, how = same_content(self.src, item.source, self.dst, item.destination,
                                         item.size)
                checked: Checked = "etag" if "ETag" in how else "size"
                if same and checked == "size" and self.verify == "hash":
                    same, how = same_sha256(self.src, item.source, self.dst, item.destination)
                    checked = "sha256"
                if same:
                    item.status, item.reason, item.checked = "skipped", how, checked
                    self._report(item, advance=item.size)
                    return
                item.reason = how
            if self.dry_run:
                item.status = "planned"
                self._report(item, advance=item.size)
                return
            self._upload(item, there)
            item.status, item.checked = "copied", "sha256" if self.verify == "hash" else "size"
            self._report(item)
        except _Cancelled:
            return
        except Exception as exc:  # noqa: BLE001 - every failure is reported per file
            error = exc.error if isinstance(exc, _Final) else exc
            item.status, item.error, item.reason = "failed", error, _short(error)
            log.error("retryfs: copy of %r failed: %s", item.path, item.reason)
            self._report(item)

    def _upload(self, item: FileCopy, there: pafs.FileInfo | None) -> None:
        sent = 0

        def attempt() -> None:
            nonlocal sent
            if sent:  # a restart: the bytes of the failed attempt are to be sent again
                self._report(advance=-sent)
                sent = 0
            item.attempts += 1
            digest = hashlib.sha256() if self.verify == "hash" else None
            md5 = WriteDigest()
            before: list[Any] = [UNKNOWN]

            def on_chunk(data: Any) -> None:
                nonlocal sent
                if digest is not None:
                    digest.update(data)
                if md5.update(data) and not self.dst_local:  # before its commit
                    before[0] = self._state(item.destination)
                sent += len(data)
                self._report(advance=len(data))

            written = self._stream(item, on_chunk)
            self._check(item, written, digest.hexdigest() if digest is not None else None)
            self._check_new(item, written, md5, there, before[0])

        self.unit.call("copy", item.destination, attempt)

    # -- one attempt ---------------------------------------------------------------------------
    def _ensure_parent(self, path: str) -> None:
        parent = posixpath.dirname(path)
        if not self.make_dirs or not parent or parent in self.made_dirs:
            return
        self.dst.create_dir(parent, recursive=True)
        with self.lock:
            self.made_dirs.add(parent)

    def _stream(self, item: FileCopy, on_chunk: Callable[[Any], None]) -> int:
        """Source → a fresh destination object, committed; returns the bytes written."""
        _final(self._ensure_parent, item.destination)
        target = item.destination
        if self.dst_local:  # write beside, rename on success: never a partial file in place
            target = temporary_beside(item.destination)
        # reads resume by themselves; the bytes as stored (no decompression by the name)
        source = _final(functools.partial(self.src.open_input_stream, compression=None),
                        item.source)
        out = None
        written = 0
        closing = False
        try:
            if self.dst_fsspec:
                out = self.dst_original.open(target, "wb")
            else:
                out = self.dst_inner.open_output_stream(target, compression=None)
            while True:
                if self.stop.is_set():
                    raise _Cancelled()
                data = _final(source.read, CHUNK)
                if not data:
                    break
                out.write(data)
                written += len(data)
                on_chunk(data)
            closing = True
            out.close()  # the commit: a failure here is retried with a fresh upload
        except BaseException:
            if out is not None and not closing:
                self._abandon(out, target, written)
            if self.dst_local and target != item.destination:
                self._remove_quietly(target)
            raise
        finally:
            source.close()
        if target != item.destination:
            self.dst_inner.move(target, item.destination)
        return written

    def _abandon(self, out: Any, target: str, written: int) -> None:
        """Give up an unfinished upload without committing it: nothing is left to clean up.

        fsspec files are discarded (s3fs aborts the multipart upload). A pyarrow output stream
        cannot be aborted from Python, and closing a healthy one (the *source* failed) would
        commit the prefix it holds at the final name, over whatever good object was there: it
        is dropped unclosed instead (`retryfs.datapath.streams.abandon_stream`; the multipart upload
        stays incomplete, as S3 lifecycle rules expect). A local temporary file beside its
        destination is closed; the caller removes it.
        """
        if hasattr(out, "discard"):
            discard(out)
        elif self.dst_local:
            try:
                out.close()
            except Exception:  # noqa: BLE001 - the caller removes the temporary file
                pass
        else:
            log.debug("retryfs: dropping the unfinished upload of %r (%d bytes) uncommitted",
                      target, written)
            abandon_stream(out)

    def _remove_quietly(self, path: str) -> None:
        """Remove a temporary file beside its destination, retried under the policy; one that
        finally stays is reported (a WARNING naming it), never silently left."""
        try:
            self.dst.delete_file(path)
        except FileNotFoundError:
            pass
        except Exception as exc:  # noqa: BLE001 - the copy's own error is the one raised
            log.warning("retryfs: could not remove the temporary file %r: %s", redact(path),
                        redact_and_truncate(f"{type(exc).__name__}: {exc}", 300))

    def _state(self, path: str) -> Any:
        """``path``'s state on the destination (`retryfs.core.proof.ObjectState`, ``None``: no
        object), by one retried metadata call."""
        if self.dst_fsspec:
            def state() -> Any:
                try:
                    return fsspec_state(self.dst_original.info(path))
                except FileNotFoundError:
                    return None
            return _final(state)
        return _final(arrow_state, self.dst_inner, path)

    def _check_new(self, item: FileCopy, written: int, md5: WriteDigest,
                   there: pafs.FileInfo | None, before: Any) -> None:
        """On an object store: the object is the new one (`retryfs.core.proof`), not an older one of
        the same size whose replacement was acknowledged and lost. ``there`` is what the plan
        listed at the destination before the copy (``None``: nothing); ``before``, for a large
        file, its state taken before the commit."""
        if self.dst_local:
            return  # written beside and renamed: in place or nowhere
        info = _final(self.dst.get_file_info, item.destination)
        if there is None or there.type != pafs.FileType.File or (
                there.size, there.mtime_ns) != (info.size, info.mtime_ns):
            return  # a new object: absent before, or listed otherwise now

        def read_back() -> str:
            whole = hashlib.md5(usedforsecurity=False)
            _final(read_all, self.dst, item.destination, whole.update)
            return whole.hexdigest()

        after = self._state(item.destination)
        if not is_new(after, written, md5, before, read_back) or (
                md5.large and before is UNKNOWN):
            raise VerificationError(f"{item.destination!r} still holds the object that was "
                                    "there before (the commit was acknowledged, not stored)")

    def _check(self, item: FileCopy, written: int, sha256: str | None) -> None:
        """The object landed and holds what was read: else a (retried) VerificationError."""
        info = _final(self.dst.get_file_info, item.destination)
        if info.type != pafs.FileType.File:
            raise VerificationError(f"{item.destination!r} was committed but is not there")
        if info.size is not None and info.size != written:
            raise VerificationError(f"{item.destination!r} was committed with {info.size} "
                                    f"bytes, {written} were written")
        if sha256 is None:
            return
        landed = hashlib.sha256()
        _final(read_all, self.dst, item.destination, landed.update)
        if landed.hexdigest() != sha256:
            raise VerificationError(f"{item.destination!r} does not hold the bytes read from "
                                    f"the source (SHA-256 {landed.hexdigest()[:12]}…, source "
                                    f"{sha256[:12]}…)")


def _plan(src: RetryingFileSystem, src_path: str, dst: RetryingFileSystem, dst_path: str,
          recursive: bool, src_shown: str) -> tuple[list[FileCopy], dict[str, pafs.FileInfo]]:
    src_path = src_path.rstrip("/") or src_path
    info = src.get_file_info(src_path)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"source not found: {src_shown}")
    if info.type == pafs.FileType.Directory:
        if not recursive:
            raise IsADirectoryError(f"source is a directory: {src_shown} (copy it with "
                                    "recursive=True, or -r)")
        base = src_path.rstrip("/")
        entries = src.get_file_info(pafs.FileSelector(base, recursive=True))
        plan = []
        for entry in sorted(entries, key=lambda e: e.path):
            if entry.type != pafs.FileType.File:
                continue
            rel = entry.path[len(base):].lstrip("/") if entry.path.startswith(base) \
                else posixpath.basename(entry.path)
            plan.append(FileCopy(rel, entry.path, _join(dst_path, rel),
                                 entry.size or 0))
        dst_base = dst_path.rstrip("/")
        existing: dict[str, pafs.FileInfo] = {}
        if dst_base:
            found = dst.get_file_info(dst_base)
            if found.type == pafs.FileType.File:
                raise NotADirectoryError(f"destination {dst_base!r} is a file; a directory "
                                         "copy needs a directory (or a new name)")
            if found.type == pafs.FileType.Directory:
                listed = dst.get_file_info(pafs.FileSelector(dst_base, recursive=True,
                                                             allow_not_found=True))
                existing = {e.path: e for e in listed}
        return plan, existing
    # a single file: to DST, or into DST when DST is a directory or ends with "/"
    name = posixpath.basename(src_path.rstrip("/"))
    target = dst_path
    there = dst.get_file_info(dst_path.rstrip("/")) if dst_path.rstrip("/") else None
    if dst_path.endswith("/") or (there is not None and there.type == pafs.FileType.Directory):
        target = _join(dst_path, name)
        there = dst.get_file_info(target)
    plan = [FileCopy(name, src_path, target, info.size or 0)]
    return plan, ({target: there} if there is not None else {})


def copy(
    src: Any,
    dst: Any,
    *,
    recursive: bool = False,
    workers: int = 8,
    verify: Verify | bool = "size",
    resume: bool = True,
    dry_run: bool = False,
    policy: RetryPolicy | None = None,
    progress: Callable[[CopyProgress], None] | None = None,
    config: WrapperConfig | None = None,
) -> CopyResult:
    """Copy a file or (``recursive=True``) a directory tree from ``src`` to ``dst``.

    ``src`` and ``dst`` are URIs (``s3://bucket/ckpt?retry_max_attempts=8``, with ``retry_*``
    parameters, see `retryfs.from_uri`), local paths, or ``(filesystem, path)`` pairs where the
    filesystem is a pyarrow or fsspec one (wrapped in `RetryingFileSystem` with ``config`` and
    ``policy`` unless it is a retryfs wrapper already, whose settings are kept).
    Upload, download and remote to remote alike.

    - A directory's files land at ``dst/<path relative to src>`` (the contents of ``src``, not
      ``src`` itself, so the same command run again maps to the same objects). A single file
      lands at ``dst``, or at ``dst/<name>`` when ``dst`` ends with ``/`` or is a directory.
    - ``workers`` files are copied at once (threads).
    - Each file is retried as a whole under the destination's write policy, re-read from the
      source: see the module documentation.
    - ``verify="size"`` (default) checks each committed object's size; ``verify="hash"`` (or
      True) also re-reads it and compares its SHA-256 with what was read from the source.
      A file is reported copied only once that check passed.
    - ``resume`` (default) skips files the destination already holds (same size, and same
      checksum where comparable: `same_content`; with ``verify="hash"`` the same SHA-256 where
      no checksum compares). ``dry_run`` lists what would be copied.
    - ``progress(CopyProgress)`` is called as bytes and files go by.

    Returns a `CopyResult`. Raises `CopyError` (its ``.result`` is the `CopyResult`) when any
    file failed after its retries, ``FileNotFoundError`` when ``src`` does not exist,
    ``IsADirectoryError`` for a directory without ``recursive``, ``ValueError`` for a bad URI or
    an unknown ``retry_*`` parameter.
    """
    if verify is True:
        verify = "hash"
    if verify is False or verify is None:
        verify = "size"
    if verify not in ("size", "hash"):
        raise ValueError(f"verify must be 'size' or 'hash', got {verify!r}")
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}")
    started = time.monotonic()
    if config is not None and not isinstance(config, WrapperConfig):
        raise TypeError(f"config must be a WrapperConfig, got {type(config).__name__}")
    src_fs, src_path, src_shown = _wrap(src, config, policy, "src")
    dst_fs, dst_path, dst_shown = _wrap(dst, config, policy, "dst")
    copier = _Copier(src_fs, dst_fs, verify=verify, resume=resume, dry_run=dry_run,
                     workers=workers, progress=progress)
    hooks = {id(fs.stats): fs.stats for fs in (src_fs, dst_fs)}
    for stats in hooks.values():  # retries while listing count too
        stats.on_retry(copier._count_retry)
    try:
        plan, existing = _plan(src_fs, src_path, dst_fs, dst_path, recursive, src_shown)
    finally:
        for stats in hooks.values():
            stats.remove_hook(copier._count_retry)
    copier.run(plan, existing)
    result = CopyResult(src_shown, dst_shown, plan, retries=copier.retries,
                        elapsed=time.monotonic() - started, verify=verify, dry_run=dry_run)
    if result.failed:
        raise CopyError(result)
    return result

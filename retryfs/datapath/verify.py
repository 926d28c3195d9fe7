"""A tree copy's commits proven by one listing of its destination, not one HEAD per file.

After a ``copy_files`` of a directory onto an object store, every file's read-after-write
check (is the object there, with the bytes copied?) would be a metadata call of its own: a
100-file checkpoint upload to S3 sent 100 HeadObject requests on top of its uploads. One
recursive listing of the destination base answers the same question for every file at once
(S3: one ListObjectsV2 per 1,000 keys). It is a retried metadata call like the HEAD it
replaces (operation ``verify``). A store that refuses to list (no ``s3:ListBucket``: a
permanent error) is answered with `REFUSED`, and the caller checks each file by itself; a
listing that gives up raises its error, which then stands for every file of the tree.
`proof` is the check of one file by itself (a HEAD, or a local stat).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final

import pyarrow.fs as pafs

from retryfs.core.classify import Decision
from retryfs.core.engine import Retrier
from retryfs.core.proof import Verdict
from retryfs.core.redact import redact
from retryfs.errors import CommitNotVisibleError

__all__ = ["REFUSED", "Listed", "listed_files", "note_unproven", "proof"]

#: `listed_files`' answer when the store refused to list: check each file by itself.
REFUSED: Final = None

#: A listed file: its size and modification time (``None`` where the store gives none).
Listed = tuple["int | None", "int | None"]


def listed_files(retrier: Retrier, list_files: Callable[[pafs.FileSelector], Any],
                 base: str) -> dict[str, Listed] | None:
    """``{path: (size, mtime_ns)}`` of every file under ``base``, by one retried recursive
    listing (``list_files`` is the inner filesystem's ``get_file_info``); `REFUSED` when the
    store refused it (a permanent error, after one attempt). A listing that gave up (transient
    errors past the policy) raises its error: nothing is proven then. Taken before a tree copy
    and after it, a file absent before, or listed otherwise after, is a new object."""
    selector = pafs.FileSelector(base, recursive=True, allow_not_found=True)
    try:
        infos = retrier.call("verify", base, list_files, selector)
    except Exception as exc:
        if retrier.classifier.classify(exc) is Decision.FAIL:
            return REFUSED  # refused, not unknown: each file's HEAD still can prove it
        raise
    return {info.path: (info.size, info.mtime_ns) for info in infos
            if info.type == pafs.FileType.File}


def note_unproven(error: BaseException, base: str, paths: Iterable[str]) -> None:
    """Name on ``error`` (the listing's, kept as it is) every file it leaves unproven."""
    names = sorted(paths)
    if hasattr(error, "add_note"):
        shown = ", ".join(repr(redact(path)) for path in names)
        error.add_note(f"retryfs: the listing of {redact(base)!r} that verifies a tree copy "
                       f"gave up: {len(names)} copied file(s) are not proven to have "
                       f"landed: {shown}")


def proof(call: Callable[..., Any], landed: Callable[[str, int], Verdict], path: str, size: int,
          unverified: list[Exception]) -> CommitNotVisibleError | None:
    """The retried check (``call``, operation ``verify``) that ``path`` holds ``size`` bytes:
    the error that proves it does not, or ``None`` (when the check gave up, its error joins
    ``unverified``)."""
    try:
        ok = call("verify", path, landed, path, size)
    except Exception as exc:  # noqa: BLE001 - raised after the copy loop, never re-copied
        unverified.append(exc)
        return None
    return None if ok else CommitNotVisibleError.copied(path, size, ok)

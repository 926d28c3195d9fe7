"""No silent commit: the failed-commit record and the ``pyarrow.fs.copy_files`` guard.

``pyarrow.fs.copy_files`` (pyarrow 19 and later) waits for every destination ``CloseAsync()``
and ignores its status, so an object whose commit failed (a failed CompleteMultipartUpload)
is reported as copied. Ray Train uploads every checkpoint that way.

retryfs records each commit that finally failed, per process (the record is state, never
pickled), and wraps the two functions ``copy_files`` delegates to (``pyarrow.fs._copy_files``
and ``pyarrow.fs._copy_files_selector``, looked up at call time, so callers holding a
reference to ``copy_files`` are covered too). After the copy, if a commit under its destination
failed during the call on a retryfs destination, the guard raises that commit's original
exception with a note listing every object that did not land.
"""

from __future__ import annotations

import functools
import itertools
import threading
from collections.abc import Callable
from typing import Any

import pyarrow.fs as pafs

__all__ = ["FailedCommits", "install_copy_files_guard", "CopyFilesGuardError"]

_sequence = itertools.count(1)


class CopyFilesGuardError(RuntimeError):
    """pyarrow changed in a way the guard cannot follow (raised at install, never silently)."""


class FailedCommits:
    """Per-process record of commits that finally failed: path -> (sequence, exception)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failed: dict[str, tuple[int, BaseException]] = {}

    def mark(self) -> int:
        """A point in time; :meth:`pop_since` returns only failures recorded after it."""
        return next(_sequence)

    def record(self, path: str, error: BaseException | None) -> None:
        """Remember a failed commit of ``path``, or forget it when ``error`` is None."""
        with self._lock:
            if error is None:
                self._failed.pop(path, None)
            else:
                self._failed[path] = (next(_sequence), error)

    def pop_since(self, mark: int, under: str) -> dict[str, BaseException]:
        """Failed commits at ``under`` or below it recorded after ``mark`` (and forget them)."""
        prefix = under.rstrip("/") + "/"
        with self._lock:
            found = {path: err for path, (seq, err) in self._failed.items()
                     if seq > mark and (path == under or path.startswith(prefix))}
            for path in found:
                del self._failed[path]
        return found

    def snapshot(self) -> dict[str, BaseException]:
        with self._lock:
            return {path: err for path, (_, err) in self._failed.items()}

    def __len__(self) -> int:
        return len(self._failed)


def raise_failed(failed: dict[str, BaseException], action: str) -> None:
    """Raise the first failure (its original type) with a note naming every lost object."""
    if not failed:
        return
    paths = sorted(failed)
    error = failed[paths[0]]
    shown = ", ".join(repr(p) for p in paths[:10])
    more = f" and {len(paths) - 10} more" if len(paths) > 10 else ""
    if hasattr(error, "add_note"):
        error.add_note(f"retryfs: {action} reported success but {len(paths)} object(s) were "
                       f"not committed: {shown}{more}")
    raise error


def _guard(original: Callable[..., Any],
           commits_of: Callable[[Any], FailedCommits | None]) -> Callable[..., Any]:
    @functools.wraps(original)
    def guarded(source_fs: Any, source: Any, destination_fs: Any, destination: str,
                *args: Any, **kwargs: Any) -> Any:
        commits = commits_of(destination_fs)
        if commits is None:
            return original(source_fs, source, destination_fs, destination, *args, **kwargs)
        mark = commits.mark()
        result = original(source_fs, source, destination_fs, destination, *args, **kwargs)
        raise_failed(commits.pop_since(mark, destination), "pyarrow.fs.copy_files")
        return result

    guarded.__retryfs_guard__ = True  # type: ignore[attr-defined]
    return guarded


_install_lock = threading.Lock()


def install_copy_files_guard(commits_of: Callable[[Any], FailedCommits | None]) -> None:
    """Wrap ``pyarrow.fs._copy_files`` and ``_copy_files_selector`` once per process."""
    with _install_lock:
        for name in ("_copy_files", "_copy_files_selector"):
            original = getattr(pafs, name, None)
            if original is None:
                raise CopyFilesGuardError(
                    f"pyarrow.fs.{name} is missing (pyarrow {pafs.__name__}); retryfs cannot "
                    "guard copy_files against silently failed commits")
            if getattr(original, "__retryfs_guard__", False):
                continue
            setattr(pafs, name, _guard(original, commits_of))

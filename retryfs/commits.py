"""No silent commit: the failed-commit record and the ``pyarrow.fs.copy_files`` guard.

``pyarrow.fs.copy_files`` (pyarrow 19 and later) waits for every destination ``CloseAsync()``
and ignores its status, so an object whose commit failed (a failed CompleteMultipartUpload)
is reported as copied. Ray Train uploads every checkpoint that way.

retryfs records each commit that finally failed, per process (the record is state, never
pickled), and wraps the two functions ``copy_files`` delegates to (``pyarrow.fs._copy_files``
and ``pyarrow.fs._copy_files_selector``, looked up at call time, so callers holding a
reference to ``copy_files`` are covered too). Each guarded call opens a `CopySession`; every
retryfs output stream remembers the sessions open when it was opened (`watching`) and reports
its failed commit to them. After the copy, the guard raises the first such commit's original
exception with a note listing every object that did not land. The guard keys on the streams,
not on the destination's type: a `RetryingFileSystem` inside a ``SubTreeFileSystem``, under a
``PyFileSystem`` over fsspec, or under another wrapper is covered the same way.

A stream opened while two copies run at once (two threads) reports to both: a failed commit
may then fail the other copy too; it is never reported as success.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pyarrow.fs as pafs

from .errors import CopyFilesGuardError
from .redact import redact

__all__ = ["CopyFilesGuardError", "CopySession", "FailedCommits", "copy_session",
           "install_copy_files_guard", "report_commit", "watching"]

class CopySession:
    """The failed commits of the retryfs streams opened while one guarded call ran."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.failed: dict[str, BaseException] = {}

    def record(self, path: str, error: BaseException | None) -> None:
        with self._lock:
            if error is None:
                self.failed.pop(path, None)  # committed at last (a later stream of the path)
            else:
                self.failed[path] = error


_sessions: set[CopySession] = set()
_sessions_lock = threading.Lock()


@contextmanager
def copy_session() -> Iterator[CopySession]:
    """A session that the streams opened until it ends report their commits to."""
    session = CopySession()
    with _sessions_lock:
        _sessions.add(session)
    try:
        yield session
    finally:
        with _sessions_lock:
            _sessions.discard(session)


def watching() -> tuple[CopySession, ...]:
    """The sessions open now (what a stream being opened reports to); () on the happy path."""
    if not _sessions:  # no copy running: no lock taken
        return ()
    with _sessions_lock:
        return tuple(_sessions)


def report_commit(sessions: tuple[CopySession, ...], path: str,
                  error: BaseException | None) -> None:
    """Tell ``sessions`` how the commit of ``path`` ended (``error`` None: it landed)."""
    for session in sessions:
        session.record(path, error)


class FailedCommits:
    """Per-process record of commits that finally failed: path -> exception."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._failed: dict[str, BaseException] = {}

    def record(self, path: str, error: BaseException | None) -> None:
        """Remember a failed commit of ``path``, or forget it when ``error`` is None."""
        with self._lock:
            if error is None:
                self._failed.pop(path, None)
            else:
                self._failed[path] = error

    def snapshot(self) -> dict[str, BaseException]:
        with self._lock:
            return dict(self._failed)

    def __len__(self) -> int:
        return len(self._failed)


def raise_failed(failed: dict[str, BaseException], action: str) -> None:
    """Raise the first failure (its original type) with a note naming every lost object."""
    if not failed:
        return
    paths = sorted(failed)
    error = failed[paths[0]]
    shown = ", ".join(repr(redact(p)) for p in paths[:10])
    more = f" and {len(paths) - 10} more" if len(paths) > 10 else ""
    if hasattr(error, "add_note"):
        error.add_note(f"retryfs: {action} reported success but {len(paths)} object(s) were "
                       f"not committed: {shown}{more}")
    raise error


def _guard(original: Callable[..., Any],
           direct: Callable[..., Any] | None = None) -> Callable[..., Any]:
    @functools.wraps(original)
    def guarded(*args: Any, **kwargs: Any) -> Any:
        with copy_session() as session:
            # ``direct`` copies onto a retryfs destination itself (NotImplemented: not one)
            result = direct(*args, **kwargs) if direct is not None else NotImplemented
            if result is NotImplemented:
                result = original(*args, **kwargs)
        raise_failed(dict(session.failed), "pyarrow.fs.copy_files")
        return result

    guarded.__retryfs_guard__ = True  # type: ignore[attr-defined]
    return guarded


_install_lock = threading.Lock()


def install_copy_files_guard(direct: dict[str, Callable[..., Any]] | None = None) -> None:
    """Wrap ``pyarrow.fs._copy_files`` and ``_copy_files_selector`` once per process.

    ``direct`` maps those names to a function taking the same arguments that copies onto a
    retryfs destination itself (native streams, the source re-read on a retry) and returns
    ``NotImplemented`` for any other destination, which pyarrow's function then serves."""
    with _install_lock:
        for name in ("_copy_files", "_copy_files_selector"):
            original = getattr(pafs, name, None)
            if original is None:
                raise CopyFilesGuardError(
                    f"pyarrow.fs.{name} is missing (pyarrow {pafs.__name__}); retryfs cannot "
                    "guard copy_files against silently failed commits")
            if getattr(original, "__retryfs_guard__", False):
                continue
            setattr(pafs, name, _guard(original, (direct or {}).get(name)))

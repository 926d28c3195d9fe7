"""No silent commit: the failed-commit record that the ``pyarrow.fs.copy_files`` guard reads.

``pyarrow.fs.copy_files`` (pyarrow 19 and later) waits for every destination ``CloseAsync()``
and ignores its status, so an object whose commit failed (a failed CompleteMultipartUpload)
is reported as copied. Ray Train uploads every checkpoint that way.

retryfs records each commit that finally failed, per process (the record is state, never
pickled). The patch `retryfs.patches.copy_files` wraps the two functions ``copy_files``
delegates to; each guarded call opens a `CopySession`; every
retryfs output stream remembers the sessions open when it was opened (`watching`) and reports
its failed commit to them. After the copy, the guard raises the first such commit's original
exception with a note listing every object that did not land. The guard keys on the streams,
not on the destination's type: a `RetryingFileSystem` inside a ``SubTreeFileSystem``, under a
``PyFileSystem`` over fsspec, or under another wrapper is covered the same way.

A stream opened while two copies run at once (two threads) reports to both: a failed commit
may then fail the other copy too; it is never reported as success.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

from retryfs.core.redact import redact

__all__ = ["CopySession", "FailedCommits", "copy_session", "raise_failed", "report_commit",
           "watching"]

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

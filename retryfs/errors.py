"""Every exception retryfs raises of its own, in one hierarchy.

What retryfs raises when it gives up is the storage client's own last error, its type and
message kept (with a note of the attempts), never one of these. These are the cases retryfs
itself detects; each is a `RetryfsError`, and also the standard class a caller would catch for
its kind (`OSError`, `TimeoutError`, `ConnectionError`), so that code written against plain
pyarrow or fsspec keeps working:

- `CommitNotVisibleError`: a commit answered OK, but the object is missing, short or the older
  one (transient: the write is committed again); `VerificationError`: the same, found by
  `retryfs.copy`;
- `CommitInFlightError`: a commit of an abandoned attempt was still under way at the deadline;
- `AttemptTimeoutError`: one attempt outlived its per-attempt timeout (transient);
- `InnerFileClosedError`, `UnfinishedDeleteError`: a client's way of failing, made transient;
- `CopyError`: files of a `retryfs.copy` did not land; `UsageError`: the ``retryfs`` command
  was asked something it refuses;
- `CopyFilesGuardError`: pyarrow changed in a way the ``copy_files`` guard cannot follow;
- `AttemptAbandoned`: inside an attempt its caller abandoned (never reaches a caller).
"""

from __future__ import annotations

from typing import Any

__all__ = ["AttemptAbandoned", "AttemptTimeoutError", "CommitInFlightError",
           "CommitNotVisibleError", "CopyError", "CopyFilesGuardError", "InnerFileClosedError",
           "RetryfsError", "UnfinishedDeleteError", "UsageError", "VerificationError"]


class RetryfsError(Exception):
    """The root of every exception retryfs raises of its own (not the clients' errors it
    retries and, when it gives up, raises unchanged)."""


class CommitNotVisibleError(RetryfsError, OSError):
    """A write was committed without error, but the object is not there, has another size, or
    is the older object it was to replace (a commit acknowledged and not stored).

    Transient by classification: the stream replays its bytes and commits again, after
    ``retry_after`` seconds at least when it is set (the destination unchanged since before
    the write: `retryfs.core.proof.Unchanged`).
    """

    retry_after: float | None = None

    @classmethod
    def written(cls, path: str, size: int, verdict: object = False) -> CommitNotVisibleError:
        """The error of a write whose destination does not prove the ``size`` bytes written
        (``verdict``: what the check found)."""
        return cls._of(verdict, f"{path!r} was committed but does not hold the {size} bytes "
                       "written (missing, another size, or the object that was there before)")

    @classmethod
    def copied(cls, path: str, size: int, verdict: object = False) -> CommitNotVisibleError:
        """The error of a copy whose destination does not hold the ``size`` bytes copied."""
        return cls._of(verdict, f"{path!r} was committed but does not hold the {size} bytes "
                       "copied")

    @classmethod
    def _of(cls, verdict: object, message: str) -> CommitNotVisibleError:
        error = cls(message)
        error.retry_after = getattr(verdict, "retry_after", None)
        return error


class VerificationError(CommitNotVisibleError):
    """`retryfs.copy`: the object was committed but does not hold what was read from the
    source (retried)."""


class CommitInFlightError(RetryfsError, TimeoutError):
    """An attempt abandoned by its per-attempt timeout in the middle of its commit had not
    ended by the deadline: its commit request may still land after this call, over whatever
    is written next. Raised instead of reporting success (the retry's commit did land)."""

    def __init__(self, path: str) -> None:
        super().__init__(f"{path!r}: a commit of an abandoned attempt was still under way at "
                         "the deadline; the object may change when it lands")
        self.path = path


class AttemptTimeoutError(RetryfsError, TimeoutError):
    """One attempt of an operation did not finish in time; transient, so it is retried."""

    def __init__(self, operation: str, path: str, seconds: float) -> None:
        super().__init__(f"retryfs: {operation} {path!r} did not finish within {seconds:g}s "
                         "(per-attempt timeout)")
        self.operation = operation
        self.path = path
        self.seconds = seconds

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.operation, self.path, self.seconds))


class AttemptAbandoned(RetryfsError):
    """Raised inside an attempt its caller abandoned (it timed out, and the file went on with
    its retries elsewhere): it stops without committing. Never seen by a user: the abandoned
    attempt's outcome is nobody's."""


class InnerFileClosedError(RetryfsError, ConnectionError):
    """An inner file closed itself: a read, seek or size said ``I/O operation on closed file``
    although retryfs never closed it. pyarrow's `GcsFileSystem` input file opens its download
    lazily and, when that request fails, reports itself closed instead of raising the failure.

    Transient by classification (a `ConnectionError`): the file is reopened at the same offset.
    """


class UnfinishedDeleteError(RetryfsError, ConnectionError):
    """A directory delete stopped at an object it found gone ("not found" on one DELETE) and
    left the rest: on a client that re-sends by itself, the 404 of its own re-send of a DELETE
    whose answer was lost (pyarrow's `GcsFileSystem` stops there, before the directory's
    marker). The directory existed when the call began and is still there.

    Transient by classification (a `ConnectionError`): the delete is retried, and the retry
    deletes what is left. ``original`` is the client's own error.
    """

    def __init__(self, path: str, original: BaseException) -> None:
        # the original's text stays out of this one's: its "not found" would classify it
        super().__init__(f"{path!r} is not deleted yet: a {type(original).__name__} on one "
                         "of its objects stopped the delete half-way")
        self.original = original


class CopyError(RetryfsError, OSError):
    """Some files of a `retryfs.copy` did not land after their retries; ``.result`` has every
    file's outcome."""

    def __init__(self, result: Any) -> None:  # a `retryfs.transfer.results.CopyResult`
        failed = result.failed
        shown = "; ".join(f"{f.path}: {f.reason}" for f in failed[:5])
        more = f"; and {len(failed) - 5} more" if len(failed) > 5 else ""
        super().__init__(f"{len(failed)} of {len(result.files)} file(s) failed to copy to "
                         f"{result.destination}: {shown}{more}")
        self.result = result

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.result,))


class UsageError(RetryfsError, ValueError):
    """The ``retryfs`` command was asked something it refuses (exit code 2)."""


class CopyFilesGuardError(RetryfsError, RuntimeError):
    """pyarrow changed in a way the ``copy_files`` guard cannot follow (raised at install,
    never silently)."""

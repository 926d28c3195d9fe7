"""Exceptions of retryfs's own."""

from __future__ import annotations

__all__ = ["CommitInFlightError", "CommitNotVisibleError", "InnerFileClosedError",
           "UnfinishedDeleteError"]


class CommitNotVisibleError(OSError):
    """A write was committed without error, but the object is not there (or has another size).

    Transient by classification: the stream replays its bytes and commits again.
    """

    @classmethod
    def copied(cls, path: str, size: int) -> CommitNotVisibleError:
        """The error of a copy whose destination does not hold the ``size`` bytes copied."""
        return cls(f"{path!r} was committed but does not hold the {size} bytes copied")


class InnerFileClosedError(ConnectionError):
    """An inner file closed itself: a read, seek or size said ``I/O operation on closed file``
    although retryfs never closed it. pyarrow's `GcsFileSystem` input file opens its download
    lazily and, when that request fails, reports itself closed instead of raising the failure.

    Transient by classification (a `ConnectionError`): the file is reopened at the same offset.
    """


class UnfinishedDeleteError(ConnectionError):
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


class CommitInFlightError(TimeoutError):
    """An attempt abandoned by its per-attempt timeout in the middle of its commit had not
    ended by the deadline: its commit request may still land after this call, over whatever
    is written next. Raised instead of reporting success (the retry's commit did land)."""

    def __init__(self, path: str) -> None:
        super().__init__(f"{path!r}: a commit of an abandoned attempt was still under way at "
                         "the deadline; the object may change when it lands")
        self.path = path

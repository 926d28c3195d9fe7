"""Exceptions of retryfs's own."""

from __future__ import annotations

__all__ = ["CommitNotVisibleError", "InnerFileClosedError"]


class CommitNotVisibleError(OSError):
    """A write was committed without error, but the object is not there (or has another size).

    Transient by classification: the stream replays its bytes and commits again.
    """


class InnerFileClosedError(ConnectionError):
    """An inner file closed itself: a read, seek or size said ``I/O operation on closed file``
    although retryfs never closed it. pyarrow's `GcsFileSystem` input file opens its download
    lazily and, when that request fails, reports itself closed instead of raising the failure.

    Transient by classification (a `ConnectionError`): the file is reopened at the same offset.
    """

"""Exceptions of retryfs's own."""

from __future__ import annotations

__all__ = ["CommitNotVisibleError"]


class CommitNotVisibleError(OSError):
    """A write was committed without error, but the object is not there (or has another size).

    Transient by classification: the stream replays its bytes and commits again.
    """

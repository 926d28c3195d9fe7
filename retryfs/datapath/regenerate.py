"""Writes that are made again from their source instead of replayed from a spool.

A caller that can produce an object's bytes again (``torch.save`` of a state_dict still in
memory, a checkpoint plugin) needs no replay spool: each attempt opens a fresh stream that keeps
none (`ReplayableOutputStream` with ``spool_memory=None``) and calls the caller's ``write`` into
it. A failure the client's own retries did not absorb (a part that failed all its attempts, a
lost commit, a commit not proven by the check after it) drops that stream unclosed, so that
nothing is committed, and the whole write is retried under the operation ``write``: ``write``
is called again into a fresh stream. Nothing is kept on disk, and memory holds what the client
holds for its parts (`retryfs.datapath.spool` tells what a spool file costs).

An error that ``write`` raises itself (not the stream's) is never retried: the stream is dropped
uncommitted, and the error raised as it is; nor is an interrupt (``KeyboardInterrupt``,
``SystemExit``), even one raised after the stream had failed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from retryfs.core.engine import Retrier
from retryfs.core.timeouts import AttemptSignal

from .streams import ReplayableOutputStream

__all__ = ["write_regenerated"]

#: ``(in_flight) -> (the file handed to write, its stream)``: a fresh stream without a spool,
#: sharing ``in_flight`` (close attempts abandoned mid-commit) with the attempts before it.
OpenStream = Callable[[list[AttemptSignal]], "tuple[Any, ReplayableOutputStream]"]


def write_regenerated(retrier: Retrier, path: str, open_stream: OpenStream,
                      write: Callable[[Any], object]) -> None:
    """``write(file)`` into a fresh stream at ``path``, committed by closing it; all of it again,
    into another fresh stream, whenever the stream fails (retried as the operation ``write``).
    The error of the last attempt is raised when the retries give up."""
    in_flight: list[AttemptSignal] = []

    def attempt() -> BaseException | None:
        file, stream = open_stream(in_flight)
        try:
            write(file)
            file.close()
        except BaseException as exc:  # noqa: BLE001 - sorted below
            file.abort()  # commits nothing (a no-op once closed)
            failure = stream.failure
            if failure is None or not isinstance(exc, Exception):
                # write's own error, a close that committed, or an interrupt (Ctrl-C, exit)
                # however the stream had fared: not retried
                return exc
            # what the stream met (``exc`` may wrap it), classified and retried; its context is
            # ``exc``, set by Python, which breaks the cycle when ``exc`` came from it
            raise failure  # noqa: B904
        return None

    error = retrier.call("write", path, attempt)
    if error is not None:
        raise error

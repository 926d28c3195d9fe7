"""How a retry on the fsspec faces tells an earlier attempt's work from someone else's.

A retry that meets the changed state (nothing to delete, a directory already there, no source
to move) is success only when the state proves it is this call's work (README: "Ambiguous
outcomes"), as on the pyarrow face. The checks are ``info`` calls of their own, made through
the retry engine by the face (a transient error in a check is retried too). The sync face gets
plain callables; the async face the same decisions with awaited checks.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

__all__ = ["DELETES", "MKDIRS", "MOVES", "async_reconciler", "changed", "holds",
           "sync_reconciler"]

Info = Callable[[str], Mapping[str, Any]]
AsyncInfo = Callable[[str], Awaitable[Mapping[str, Any]]]
Reconcile = Callable[[BaseException], Any]

DELETES = frozenset({"rm_file", "rm", "rmdir", "delete"})
MKDIRS = frozenset({"mkdir", "makedirs", "makedir", "mkdirs"})
MOVES = frozenset({"mv", "move", "rename", "mv_file"})
#: The keys fsspec implementations give a modification time under (local, arrow, s3fs, gcsfs).
_MTIME_KEYS = ("mtime", "LastModified", "last_modified", "updated")


def gone(exc: BaseException) -> bool:
    """A retried delete that finds nothing: the postcondition holds, whoever deleted it."""
    return isinstance(exc, FileNotFoundError)


def holds(dest: Mapping[str, Any], source: Mapping[str, Any]) -> bool:
    """Whether ``dest`` can be what ``source`` became when moved: same kind, same size for a
    file, and not older (a rename keeps the modification time, an object store's copy sets a
    new one)."""
    if dest.get("type") != source.get("type"):
        return False
    if source.get("type") == "file" and dest.get("size") != source.get("size"):
        return False
    for key in _MTIME_KEYS:
        if dest.get(key) is not None and source.get(key) is not None:
            try:
                return not dest[key] < source[key]
            except TypeError:  # not comparable (mixed kinds): no evidence either way
                return True
    return True


def changed(after: Mapping[str, Any], before: Mapping[str, Any] | None) -> bool:
    """Whether ``after`` is not the entry ``before`` was (``None``: there was none): another
    kind, size, modification time or ETag. A destination unchanged since before a move is no
    proof of the move (a third party may have deleted the source beside an older object)."""
    if before is None:
        return True
    keys = ("type", "size", "ETag", "etag", *_MTIME_KEYS)
    return any(after.get(key) != before.get(key) for key in keys)


def _path(args: tuple[Any, ...], kwargs: Mapping[str, Any], index: int, name: str) -> Any:
    return args[index] if len(args) > index else kwargs.get(name)


def _moves(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[str, str] | None:
    """The source and destination of a move of one path (lists, globs expanded by fsspec:
    no proof is attempted)."""
    src, dst = _path(args, kwargs, 0, "path1"), _path(args, kwargs, 1, "path2")
    return (src, dst) if isinstance(src, str) and isinstance(dst, str) else None


def _info_or_none(info: Info, path: str) -> Mapping[str, Any] | None:
    try:
        return info(path)
    except FileNotFoundError:
        return None


async def _ainfo_or_none(info: AsyncInfo, path: str) -> Mapping[str, Any] | None:
    try:
        return await info(path)
    except FileNotFoundError:
        return None


def sync_reconciler(operation: str, args: tuple[Any, ...], kwargs: Mapping[str, Any],
                    info: Info) -> Reconcile | None:
    """How a retry's error of ``operation(*args, **kwargs)`` can show an earlier attempt's
    work, or ``None``. For a move, the source's and the destination's ``info`` are taken now,
    before the first attempt (two metadata calls per move: the price of the proof)."""
    if operation in DELETES:
        return gone
    if operation in MKDIRS:
        path = _path(args, kwargs, 0, "path")
        if not isinstance(path, str):
            return None
        # "exists" is this call's work only if what exists is a directory
        return lambda exc: (isinstance(exc, FileExistsError)
                            and info(path).get("type") == "directory")
    if operation in MOVES and (paths := _moves(args, kwargs)) is not None:
        src, dst = paths
        before = _info_or_none(info, src)
        if before is None:  # nothing to move: a retry that finds no source proves nothing
            return None
        dst_before = _info_or_none(info, dst)

        def moved_already(exc: BaseException) -> bool:
            if not gone(exc) or _info_or_none(info, src) is not None:
                return False
            after = _info_or_none(info, dst)
            return after is not None and holds(after, before) and changed(after, dst_before)

        return moved_already
    return None


async def async_reconciler(operation: str, args: tuple[Any, ...], kwargs: Mapping[str, Any],
                           info: AsyncInfo) -> Reconcile | None:
    """`sync_reconciler` for the async face: the returned check is a coroutine function."""
    if operation in DELETES:
        return gone
    if operation in MKDIRS:
        path = _path(args, kwargs, 0, "path")
        if not isinstance(path, str):
            return None

        async def made_already(exc: BaseException) -> bool:
            return isinstance(exc, FileExistsError) and (
                await info(path)).get("type") == "directory"

        return made_already
    if operation in MOVES and (paths := _moves(args, kwargs)) is not None:
        src, dst = paths
        before = await _ainfo_or_none(info, src)
        if before is None:
            return None
        dst_before = await _ainfo_or_none(info, dst)

        async def moved_already(exc: BaseException) -> bool:
            if not gone(exc) or await _ainfo_or_none(info, src) is not None:
                return False
            after = await _ainfo_or_none(info, dst)
            return after is not None and holds(after, before) and changed(after, dst_before)

        return moved_already
    return None

"""How a retry on the fsspec faces tells an earlier attempt's work from someone else's.

A retry that meets the changed state (nothing to delete, a directory already there, no source
to move) is success only when the state proves it is this call's work (README: "Ambiguous
outcomes"), as on the pyarrow face (the proof of a move is `retryfs.core.proof.moved_here` on
both). The checks are ``info`` calls of their own, made through the retry engine by the face (a
transient error in a check is retried too).

Each decision is written once, as a generator that yields the paths whose ``info`` it needs
(`_plan`, `_moved_already`, `_made_already`); `sync_reconciler` answers them with plain calls,
`async_reconciler` with awaited ones.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator, Mapping
from typing import Any, TypeVar

from retryfs.core.proof import Entry, fsspec_entry, moved_here

__all__ = ["DELETES", "MKDIRS", "MOVES", "async_reconciler", "gone", "sync_reconciler"]

Info = Callable[[str], Mapping[str, Any]]
AsyncInfo = Callable[[str], Awaitable[Mapping[str, Any]]]
Reconcile = Callable[[BaseException], Any]
T = TypeVar("T")
#: A decision that asks for ``info``: it yields ``(path, must_exist)`` and is sent the path's
#: entry (``None``: nothing there; with ``must_exist``, the not-found error is raised instead).
Asks = Generator["tuple[str, bool]", "Mapping[str, Any] | None", T]
Check = Callable[[BaseException], "Asks[bool]"]

DELETES = frozenset({"rm_file", "rm", "rmdir", "delete"})
MKDIRS = frozenset({"mkdir", "makedirs", "makedir", "mkdirs"})
MOVES = frozenset({"mv", "move", "rename", "mv_file"})
#: The operations a retry may prove done; every other call has no check to build.
_CHECKED = DELETES | MKDIRS | MOVES


def gone(exc: BaseException) -> bool:
    """A retried delete that finds nothing: the postcondition holds, whoever deleted it."""
    return isinstance(exc, FileNotFoundError)


def _path(args: tuple[Any, ...], kwargs: Mapping[str, Any], index: int, name: str) -> Any:
    return args[index] if len(args) > index else kwargs.get(name)


def _moves(args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> tuple[str, str] | None:
    """The source and destination of a move of one path (lists, globs expanded by fsspec:
    no proof is attempted)."""
    src, dst = _path(args, kwargs, 0, "path1"), _path(args, kwargs, 1, "path2")
    return (src, dst) if isinstance(src, str) and isinstance(dst, str) else None


def _plan(operation: str, args: tuple[Any, ...],
          kwargs: Mapping[str, Any]) -> Asks[Check | None]:
    """The check of ``operation(*args, **kwargs)``'s retry errors, or ``None``. For a move, the
    source's and the destination's entries are taken now, before the first attempt (two
    metadata calls per move: the price of the proof)."""
    if operation in DELETES:
        return _gone
    if operation in MKDIRS:
        path = _path(args, kwargs, 0, "path")
        return None if not isinstance(path, str) else (lambda exc: _made_already(exc, path))
    if operation in MOVES and (paths := _moves(args, kwargs)) is not None:
        src, dst = paths
        before = fsspec_entry((yield src, False))
        if before is None:  # nothing to move: a retry that finds no source proves nothing
            return None
        dst_before = fsspec_entry((yield dst, False))
        return lambda exc: _moved_already(exc, src, dst, before, dst_before)
    return None


def _gone(exc: BaseException) -> Asks[bool]:
    return gone(exc)
    yield  # a generator that asks nothing


def _made_already(exc: BaseException, path: str) -> Asks[bool]:
    # "exists" is this call's work only if what exists is a directory
    if not isinstance(exc, FileExistsError):
        return False
    found = yield path, True
    return found is not None and found.get("type") == "directory"


def _moved_already(exc: BaseException, src: str, dst: str, before: Entry,
                   dst_before: Entry | None) -> Asks[bool]:
    if not gone(exc) or (yield src, False) is not None:
        return False
    return moved_here(fsspec_entry((yield dst, False)), before, dst_before)


def _answer(info: Info, path: str, must_exist: bool) -> Mapping[str, Any] | None:
    try:
        return info(path)
    except FileNotFoundError:
        if must_exist:
            raise
        return None


async def _aanswer(info: AsyncInfo, path: str, must_exist: bool) -> Mapping[str, Any] | None:
    try:
        return await info(path)
    except FileNotFoundError:
        if must_exist:
            raise
        return None


def _run(asks: Asks[T], info: Info) -> T:
    try:
        path, must_exist = next(asks)
        while True:
            path, must_exist = asks.send(_answer(info, path, must_exist))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


async def _arun(asks: Asks[T], info: AsyncInfo) -> T:
    try:
        path, must_exist = next(asks)
        while True:
            path, must_exist = asks.send(await _aanswer(info, path, must_exist))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def sync_reconciler(operation: str, args: tuple[Any, ...], kwargs: Mapping[str, Any],
                    info: Info) -> Reconcile | None:
    """How a retry's error of ``operation(*args, **kwargs)`` can show an earlier attempt's
    work, or ``None`` (see `_plan`): a plain callable."""
    if operation not in _CHECKED:
        return None
    check = _run(_plan(operation, args, kwargs), info)
    if check is None:
        return None
    return lambda exc: _run(check(exc), info)


async def async_reconciler(operation: str, args: tuple[Any, ...], kwargs: Mapping[str, Any],
                           info: AsyncInfo) -> Reconcile | None:
    """`sync_reconciler` for the async face: the check is a coroutine function."""
    if operation not in _CHECKED:
        return None
    check = await _arun(_plan(operation, args, kwargs), info)
    if check is None:
        return None

    async def reconcile(exc: BaseException) -> bool:
        return await _arun(check(exc), info)

    return reconcile

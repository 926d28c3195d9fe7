"""The ``copy_files`` patch: ``pyarrow.fs._copy_files`` and ``_copy_files_selector`` guarded.

``pyarrow.fs.copy_files`` delegates to those two functions, looked up at call time, so wrapping
them covers callers that hold a reference to ``copy_files`` (Ray Train). Each guarded call
opens a `retryfs.datapath.commits.CopySession`, lets ``direct`` copy onto or from a retryfs
wrapper through retryfs's data path, and after the copy raises the first commit that finally
failed (``pyarrow.fs.copy_files`` ignores a failed ``CloseAsync()``). Installed by
`retryfs.patches.install_copy_files_guard` when it applies (see `retryfs.patches`).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import Any

import pyarrow.fs as pafs

from retryfs.datapath.commits import copy_session, raise_failed
from retryfs.errors import CopyFilesGuardError

__all__ = ["install_copy_files_guard"]


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

"""What the fsspec face wraps, and how its calls are named.

`resolve_inner` turns ``fs=`` / ``target_protocol=`` into the fsspec filesystem to wrap: a
retryfs wrapper of either face is unwrapped (one layer of retries) and its `WrapperConfig`
handed on, a pyarrow filesystem adapted with ``ArrowFSWrapper``. `call_label` is the path(s)
a call is about, for log lines and notes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import fsspec
import pyarrow.fs as pafs
from fsspec.implementations.arrow import ArrowFSWrapper
from fsspec.spec import AbstractFileSystem

from .config import WrapperConfig

__all__ = ["call_label", "inner_is_async", "resolve_inner"]

_TWO_PATHS = frozenset({"cp_file", "copy", "cp", "mv", "move", "rename", "put_file", "put",
                        "upload", "get_file", "get", "download", "mv_file"})
_MISSING = object()


def call_label(operation: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """The path(s) a call is about, for log lines and notes (redacted when logged)."""
    def one(value: Any) -> str:
        if isinstance(value, str):
            return value
        if isinstance(value, Mapping):
            value = list(value)
        if isinstance(value, (list, tuple)):
            if not value:
                return "[]"
            head = str(value[0])
            return head if len(value) == 1 else f"{head} (+{len(value) - 1} more)"
        return str(value)

    first = args[0] if args else next(
        (kwargs[k] for k in ("path", "path1", "lpath", "rpath", "url", "fn") if k in kwargs), "")
    if operation in _TWO_PATHS:
        second = args[1] if len(args) > 1 else next(
            (kwargs[k] for k in ("path2", "rpath", "lpath") if k in kwargs), _MISSING)
        if second is not _MISSING:
            return f"{one(first)} -> {one(second)}"
    return one(first)


def inner_is_async(fs: Any, target_protocol: str | None) -> bool:
    if fs is not None:
        if isinstance(fs, pafs.FileSystem):
            return False
        return bool(getattr(fs, "async_impl", False))
    if target_protocol is not None:
        try:
            cls = fsspec.get_filesystem_class(target_protocol)
        except (ImportError, ValueError):
            return False  # __init__ raises the real error
        return bool(getattr(cls, "async_impl", False))
    return False


def resolve_inner(fs: Any, target_protocol: str | None,
                   target_options: Mapping[str, Any] | None,
                   own: Mapping[str, Any]) -> tuple[Any, WrapperConfig | None]:
    """The fsspec filesystem to wrap, and the configuration it brings (from a pyarrow face)."""
    if fs is None and target_protocol is None:
        raise ValueError("RetryFileSystem needs the filesystem to wrap: fs=<instance> or "
                         "target_protocol=<protocol> (with target_options)")
    if fs is not None and target_protocol is not None:
        raise ValueError("give either fs or target_protocol, not both")
    inherited: WrapperConfig | None = None
    if fs is None:
        options = dict(target_options or {})
        for name in ("asynchronous", "loop"):
            if name in own:
                options.setdefault(name, own[name])
        fs = fsspec.filesystem(target_protocol, **options)
    elif target_options:
        raise ValueError("target_options apply with target_protocol only")
    config = getattr(fs, "retry_config", None)
    if isinstance(config, WrapperConfig):  # a retryfs wrapper of either face: one layer
        inherited = config
        fs = fs.unwrap()
    if isinstance(fs, pafs.FileSystem):
        fs = ArrowFSWrapper(fs)
    if not isinstance(fs, AbstractFileSystem):
        raise TypeError("RetryFileSystem wraps an fsspec filesystem (or a pyarrow one), got "
                        f"{type(fs).__module__}.{type(fs).__qualname__}")
    return fs, inherited

"""What the fsspec face wraps, and how its calls are named.

`resolve_inner` turns ``fs=`` / ``target_protocol=`` into the fsspec filesystem to wrap: a
retryfs wrapper of either face is unwrapped (one layer of retries) and its `WrapperConfig`
handed on, a pyarrow filesystem adapted with ``ArrowFSWrapper``. `call_label` is the path(s)
a call is about, for log lines and notes. `inner_path` and `inner_arguments` turn the paths a
caller gives (``retry::s3://b/k``, ``s3://b/k`` or ``b/k``) into the wrapped filesystem's own, as
fsspec's chained filesystems (``simplecache::``) do: a caller such as torch DCP or Lightning
passes the whole chained URL it opened the filesystem with to every method.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import fsspec
import pyarrow.fs as pafs
from fsspec.implementations.arrow import ArrowFSWrapper
from fsspec.spec import AbstractFileSystem

from retryfs.config import WrapperConfig

__all__ = ["call_label", "inner_arguments", "inner_is_async", "inner_path", "inner_protocols",
           "resolve_inner"]

_TWO_PATHS = frozenset({"cp_file", "copy", "cp", "mv", "move", "rename", "put_file", "put",
                        "upload", "get_file", "get", "download", "mv_file"})
_MISSING = object()

#: The operations whose first two positional arguments are both paths of the wrapped filesystem.
_TWO_REMOTE = frozenset({"cp_file", "copy", "cp", "mv", "move", "rename", "mv_file"})
#: Uploads: the second argument is the remote path, the first a local one (never rewritten).
_UPLOADS = frozenset({"put_file", "put", "upload"})
#: Keyword names that hold a remote path (``lpath`` is local: never rewritten).
_PATH_KEYWORDS = ("path", "path1", "path2", "rpath", "paths", "fn", "url")
#: ``<protocol>://`` or ``<protocol>::`` at the start of a path (fsspec's protocols: letters,
#: digits, ``+-.``).
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.\-]*)(://|::)")
#: pyarrow filesystems (adapted with ``ArrowFSWrapper``) by ``type_name``: the URL schemes
#: that name them (pyarrow's own ``FileSystem.from_uri`` spellings).
_ARROW_SCHEMES = {"s3": ("s3", "s3a"), "gcs": ("gs", "gcs"), "local": ("file", "local"),
                  "abfs": ("abfs", "abfss", "az"), "hdfs": ("hdfs", "viewfs")}


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


def inner_protocols(fs: Any) -> tuple[str, ...]:
    """The URL schemes the fsspec filesystem ``fs`` serves (``("s3", "s3a")``...)."""
    if isinstance(fs, ArrowFSWrapper):
        name = fs.fs.type_name
        return _ARROW_SCHEMES.get(name, (name,))
    protocol = getattr(fs, "protocol", ())
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def inner_path(fs: Any, path: Any) -> Any:
    """``path`` as the wrapped filesystem ``fs`` takes it: ``retry::`` dropped, then a URL of one
    of ``fs``'s protocols stripped to its path (``s3://b/k`` -> ``b/k``); a bare path as given;
    lists, tuples and the keys of a mapping one by one. A URL of a protocol ``fs`` does not serve
    is a ``ValueError`` (never a file named after the URL)."""
    if isinstance(path, str):
        return _one_inner_path(fs, path)
    if isinstance(path, Mapping):
        return {inner_path(fs, key): value for key, value in path.items()}
    if isinstance(path, (list, tuple)):
        return type(path)(inner_path(fs, item) for item in path)
    return path


def _one_inner_path(fs: Any, path: str) -> str:
    rest = path
    for prefix in ("retry::", "retry://"):
        if rest.startswith(prefix):
            rest = rest[len(prefix):]
            break
    match = _URL.match(rest)
    if match is None or (match.group(2) == "::" and rest is path):
        return rest  # a bare path (a local name may hold "::")
    protocols = inner_protocols(fs)
    if match.group(1).lower() not in protocols:
        raise ValueError(f"path {path!r}: protocol {match.group(1)!r} is not served by the "
                         f"wrapped {type(fs).__name__} (its protocols: {', '.join(protocols)})")
    if isinstance(fs, ArrowFSWrapper):
        bare = rest[match.end():]
        return "/" + bare.lstrip("/") if fs.fs.type_name == "local" else bare
    stripped: str = fs._strip_protocol(rest)
    return stripped


def inner_arguments(operation: str, fs: Any, args: tuple[Any, ...],
                    kwargs: Mapping[str, Any]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of a call of ``operation`` with its remote paths made `inner_path`'s (the
    local side of a ``put``/``get`` is left as given)."""
    name = operation.lstrip("_")
    remote: tuple[int, ...]
    if name in _UPLOADS:
        remote = (1,)
    elif name in _TWO_REMOTE:
        remote = (0, 1)
    else:
        remote = (0,)
    new_args = tuple(inner_path(fs, arg) if i in remote else arg for i, arg in enumerate(args))
    new_kwargs = {key: inner_path(fs, value) if key in _PATH_KEYWORDS else value
                  for key, value in kwargs.items()}
    return new_args, new_kwargs


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

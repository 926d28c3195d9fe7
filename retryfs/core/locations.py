"""Degenerate locations: what is never "the current directory", and what ``rm -r`` refuses.

An empty or blank location (an unset shell variable, a URL that is only ``retry::`` or only a
query string) would otherwise resolve to the working directory, and a NUL byte would be cut by
the operating system: both are a ``ValueError`` before any filesystem is made. Destructive
commands also refuse the root of a filesystem, the root of a bucket and the working directory
or any of its parents (`dangerous_target`), unless the user says so explicitly.
"""

from __future__ import annotations

import hashlib
import os
import posixpath
from typing import Any

import pyarrow.fs as pafs

__all__ = ["NAME_MAX", "check_location", "check_object_path", "check_path", "dangerous_target",
           "is_local", "subtree_base", "temporary_beside"]

#: The longest file name, in bytes, of the local filesystems retryfs writes temporary files on
#: (ext4, xfs, btrfs, tmpfs, NFS): a temporary name never passes it.
NAME_MAX = 255


def subtree_base(fs: pafs.FileSystem) -> pafs.FileSystem:
    """The filesystem under ``fs``'s ``SubTreeFileSystem`` layers (``fs`` itself if none):
    the one whose kind decides how its files are read and written."""
    while isinstance(fs, pafs.SubTreeFileSystem):
        fs = fs.base_fs
    return fs


def temporary_beside(path: str, tag: str | None = None) -> str:
    """A hidden temporary name in ``path``'s directory for a file renamed into place after:
    ``.<name>.retryfs-<tag>.tmp``; without a ``tag``, a random one (32 bits, as
    ``uuid4().hex[:8]`` at a tenth of its cost), so that writers of one name (on other nodes
    of a shared disk) pick other temporaries. A name that would pass `NAME_MAX` bytes with
    those 16 bytes plus the tag around it is shortened to a prefix of itself (whole characters)
    and 8 hex digits of its hash, so that a legal 255-byte name still has a legal temporary
    twin."""
    if tag is None:
        tag = os.urandom(4).hex()
    head, tail = posixpath.split(path)
    room = NAME_MAX - len(f"..retryfs-{tag}.tmp".encode())
    return posixpath.join(head, f".{_fit(tail, room)}.retryfs-{tag}.tmp")


def _fit(name: str, room: int) -> str:
    raw = name.encode("utf-8", "surrogateescape")
    if len(raw) <= room:
        return name
    digest = hashlib.sha256(raw).hexdigest()[:8]
    keep = raw[:max(0, room - 9)].decode("utf-8", "ignore")  # never half a character
    return f"{keep}~{digest}"


#: Stores whose first path component is a bucket (or container): its root is a whole store.
BUCKET_TYPES = frozenset({"s3", "gcs", "abfs"})
BUCKET_PROTOCOLS = frozenset({"s3", "s3a", "gs", "gcs", "abfs", "abfss", "az", "adl", "wasb",
                              "wasbs", "oss", "r2"})


def _shown(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")


def check_path(path: str, what: str = "location") -> str:
    """``path`` unchanged, or a ``ValueError`` naming ``what`` if it is blank or holds a NUL."""
    if not isinstance(path, str):
        raise TypeError(f"{what} must be a string or a path, got {type(path).__name__}")
    if not path.strip():
        raise ValueError(f"{what} is empty ({path!r}): give a URI (s3://bucket/key) or a "
                         "path; an empty location never means the current directory")
    if "\x00" in path:
        raise ValueError(f"{what} {_shown(path)} contains a NUL character")
    return path


def check_location(uri: str, what: str = "location") -> str:
    """``uri`` without leading ``retry::`` prefixes, refused if nothing names a place.

    ``""``, ``"   "``, ``"retry::"`` and ``"?retry_max_attempts=3"`` (parameters only) are a
    ``ValueError`` naming ``what``.
    """
    check_path(uri, what)
    rest = uri
    while rest.startswith("retry::"):
        rest = rest[len("retry::"):]
    place = rest.partition("#")[0].partition("?")[0]
    if not place.strip():
        raise ValueError(f"{what} {_shown(uri)} names no place (only "
                         f"{'a retry:: prefix' if uri.startswith('retry::') else 'parameters'}"
                         "): give a URI (s3://bucket/key) or a path")
    return rest


def check_object_path(fs: Any, path: str) -> str:
    """``path`` unchanged, or a ``ValueError`` if it has ``.``/``..`` segments on an object store.

    A key has no parent directory: the HTTP client normalizes ``bucket/ckpt/..`` to ``bucket``,
    so a HEAD or DELETE meant for a key would reach the bucket itself.
    """
    if _has_buckets(fs) and any(part in (".", "..") for part in path.split("/")):
        raise ValueError(f"location {_shown(path)} has a '.' or '..' segment: object stores "
                         "have no relative paths (the client would send it to another key or "
                         "to the bucket itself)")
    return path


def is_local(fs: Any) -> bool:
    """Whether ``fs`` (an unwrapped pyarrow or fsspec filesystem) is this machine's disk:
    pyarrow's ``LocalFileSystem``, or an fsspec filesystem of the ``file``/``local``
    protocol. A ``SubTreeFileSystem`` is not (its paths are relative): pass `subtree_base`'s."""
    if isinstance(fs, pafs.LocalFileSystem):
        return True
    protocol = getattr(fs, "protocol", None)
    protocols = (protocol,) if isinstance(protocol, str) else tuple(protocol or ())
    return "file" in protocols or "local" in protocols


def _has_buckets(fs: Any) -> bool:
    if isinstance(fs, pafs.FileSystem):
        return fs.type_name in BUCKET_TYPES
    protocol = getattr(fs, "protocol", None)
    protocols = (protocol,) if isinstance(protocol, str) else tuple(protocol or ())
    return any(p in BUCKET_PROTOCOLS for p in protocols)


def dangerous_target(fs: Any, path: str, cwd: str | None = None) -> str | None:
    """Why deleting the tree at ``path`` of ``fs`` (the unwrapped filesystem) is refused, or None.

    Refused: a filesystem's root, a bucket's root (s3, gcs, abfs and their fsspec kin), and on
    a local filesystem the working directory and every directory above it.
    """
    if is_local(fs):
        real = os.path.realpath(path)
        here = os.path.realpath(cwd if cwd is not None else os.getcwd())
        if os.path.dirname(real) == real:
            return f"{real!r} is the root of the filesystem"
        if real == here:
            return f"{real!r} is the working directory"
        if here.startswith(real.rstrip(os.sep) + os.sep):
            return f"{real!r} holds the working directory"
        return None
    bare = posixpath.normpath("/" + path).strip("/") if path.strip("/") else ""
    if not bare:
        return "it is the root of the filesystem"
    if _has_buckets(fs) and "/" not in bare:
        return f"{bare!r} is a whole bucket"
    return None

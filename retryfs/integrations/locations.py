"""Where a checkpoint location goes: one `RetryingFileSystem` per store, made once per process.

The integrations take locations as users write them (``retry::s3://bucket/exp``,
``s3://bucket/exp?retry_max_attempts=8``, ``/local/dir``, ``file:///local/dir``) and resolve
each to a filesystem and the path on it. Given a filesystem, every location is a path on it;
otherwise each store (scheme, bucket and query) gets its own, made by `retryfs.from_uri` from the
location (credentials, region and the ``RETRYFS_*`` policy from the environment) or, for a local
path, a `RetryingFileSystem` over ``pyarrow.fs.LocalFileSystem``.
"""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import urlsplit

import pyarrow.fs as pafs

from retryfs.arrow.filesystem import RetryingFileSystem
from retryfs.core.locations import is_local, subtree_base

__all__ = ["Locations", "on_local_disk", "split_location"]


def on_local_disk(fs: RetryingFileSystem) -> bool:
    """Whether ``fs`` writes to this machine's disk (in a subtree too): there a checkpoint's
    directories are made and a rename is atomic; an object store has neither."""
    return is_local(subtree_base(fs.unwrap()))


def split_location(path: Any) -> tuple[str, str, str]:
    """``(scheme, authority, path)`` of a checkpoint location: ``retry::`` dropped,
    ``("", "", "/abs/path")`` for a local path (``file://`` included). The path starts with the
    bucket (``s3://key:secret@bucket/k`` -> ``bucket/k``) or the container
    (``abfs://container@account.dfs.core.windows.net/k`` -> ``container/k``)."""
    scheme, authority, inner, _ = _parts(path)
    return scheme, authority, inner


def _parts(path: Any) -> tuple[str, str, str, str]:
    """`split_location`, and the location's query."""
    text = str(path)
    if text.startswith("retry::"):
        text = text[len("retry::"):]
    if not text.strip():
        raise ValueError("path: an empty checkpoint location")
    if "://" not in text:
        return "", "", text, ""
    parts = urlsplit(text)
    if parts.scheme in ("file", "local"):
        return "", "", parts.path, ""
    return parts.scheme, parts.netloc, f"{_store(parts.scheme, parts.netloc)}{parts.path}", \
        parts.query


def _store(scheme: str, netloc: str) -> str:
    """The bucket or container of a URL's authority: Azure's ``container@account`` names the
    container first; elsewhere what precedes an ``@`` is credentials."""
    if "@" not in netloc:
        return netloc
    user, _, host = netloc.rpartition("@")
    return user if scheme in ("abfs", "abfss", "az") else host


class Locations:
    """Resolve checkpoint locations to ``(RetryingFileSystem, path)``.

    Args:
        filesystem: the filesystem every location goes to: a `RetryingFileSystem`, or any
            pyarrow or fsspec filesystem, which is wrapped. ``None``: one per store.
        options: options of `RetryingFileSystem` for the filesystems made or wrapped here.
    """

    def __init__(self, filesystem: Any = None, options: dict[str, Any] | None = None) -> None:
        options = dict(options or {})
        if filesystem is not None and isinstance(filesystem, RetryingFileSystem) and options:
            raise TypeError("options apply to a filesystem that is wrapped or made here; "
                            "configure the RetryingFileSystem you pass instead")
        if filesystem is not None and not isinstance(filesystem, RetryingFileSystem):
            filesystem = RetryingFileSystem(filesystem, **options)
        self.filesystem: RetryingFileSystem | None = filesystem
        self.options = options
        self._made: dict[tuple[str, str, str], tuple[RetryingFileSystem, str]] = {}
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:  # configuration travels, the cache does not
        return {"filesystem": self.filesystem, "options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.filesystem = state["filesystem"]
        self.options = state["options"]
        self._made = {}
        self._lock = threading.Lock()

    def resolve(self, location: Any) -> tuple[RetryingFileSystem, str]:
        """The filesystem a location goes to, and the path on it."""
        scheme, authority, inner, query = _parts(location)
        if self.filesystem is not None:
            return self.filesystem, inner
        if not scheme:
            return self._local(), inner
        key = (scheme, authority, query)
        suffix = urlsplit(str(location).removeprefix("retry::")).path.lstrip("/")
        with self._lock:
            made = self._made.get(key)
        if made is not None and "%" not in suffix:  # an escape: from_uri decodes it
            return made[0], made[1] + suffix if suffix else made[1].rstrip("/")
        from retryfs.uri import from_uri

        fs, path = from_uri(str(location).removeprefix("retry::"), **self.options)
        if made is not None:  # the store's filesystem, the location's own path
            return made[0], path
        if "%" not in suffix and path.endswith(suffix):  # the store's part: bucket, container
            store = path[:len(path) - len(suffix)] if suffix else path
            with self._lock:
                made = self._made.setdefault(key, (fs, store.rstrip("/") + "/"))
            return made[0], path
        return fs, path

    def _local(self) -> RetryingFileSystem:
        key = ("", "", "")
        with self._lock:
            made = self._made.get(key)
            if made is None:
                made = self._made[key] = (RetryingFileSystem(pafs.LocalFileSystem(),
                                                             **self.options), "")
        return made[0]

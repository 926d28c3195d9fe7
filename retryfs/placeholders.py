"""The empty object a client creates when an output stream opens, removed when the write fails.

pyarrow's ``AzureFileSystem`` opens an output stream with a PutBlob of 0 bytes (replacing what
was at the path: the old content is gone from that moment), stages the blocks as they come and
commits them at close. A write refused at a later request leaves that empty blob behind, as if
an empty file had been written. So retryfs notes the empty blob each open created (its ETag:
one metadata call per open, on such clients only) and, when the stream gives up, deletes the
blob if it is still that very one: a newer blob anybody wrote since has another ETag.
"""

from __future__ import annotations

from typing import Any

import pyarrow.fs as pafs

from .engine import Retrier
from .stats import logger

__all__ = ["EmptyAtOpen", "creates_empty_at_open"]


def creates_empty_at_open(fs: Any) -> bool:
    """Whether ``fs`` puts an empty object at the path when an output stream opens (pyarrow's
    Azure client; S3 and GCS uploads show nothing before their commit, fsspec files neither)."""
    return isinstance(fs, pafs.AzureFileSystem)


def _empty_blob_tag(fs: pafs.FileSystem, path: str) -> bytes | None:
    """The ETag of the object at ``path`` if it is empty, else ``None`` (a metadata call)."""
    with fs.open_input_file(path) as file:  # pyarrow Azure: one GetBlobProperties
        metadata: dict[str, Any] = file.metadata()
    if metadata.get("Content-Length") != b"0":
        return None
    tag = metadata.get("ETag")
    return tag if isinstance(tag, bytes) and tag else None


class EmptyAtOpen:
    """The empty object the latest open of ``path`` created, and its removal."""

    def __init__(self, fs: pafs.FileSystem, path: str, retrier: Retrier) -> None:
        self.fs = fs
        self.path = path
        self.retrier = retrier
        self.tag: bytes | None = None  # the ETag of the empty object the latest open created

    def opened(self) -> None:
        """After each (re)open: note the empty object it created. A note that cannot be taken
        (the check gave up) means no removal later, never a failed open."""
        try:
            self.tag = self.retrier.call("open_input_file", self.path, _empty_blob_tag,
                                         self.fs, self.path)
        except Exception:  # noqa: BLE001 - logged by the engine; nothing to remove later
            self.tag = None

    def remove(self) -> bool:
        """The stream gave up: delete the object if it is still the empty one noted (a
        metadata call and a delete, on the failure path only). True when it was deleted."""
        tag, self.tag = self.tag, None
        if tag is None:
            return False
        try:
            if self.retrier.call("open_input_file", self.path, _empty_blob_tag, self.fs,
                                 self.path) != tag:
                return False  # written since, or not empty: not ours to remove
            self.retrier.call("delete_file", self.path, self.fs.delete_file, self.path)
        except FileNotFoundError:
            return False  # gone already
        except Exception as exc:  # noqa: BLE001 - the write's own error is what the caller sees
            logger.warning("retryfs: the empty object %r created at open was not removed: %s",
                           self.path, type(exc).__name__)
            return False
        return True

"""The empty object a client creates when an output stream opens, removed when the write fails.

pyarrow's ``AzureFileSystem`` opens an output stream with a PutBlob of 0 bytes (replacing what
was at the path: the old content is gone from that moment), stages the blocks as they come and
commits them at close. A write refused at a later request leaves that empty blob behind, as if
an empty file had been written. So retryfs notes the empty blob each open created (its ETag:
one metadata call per open, on such clients only) and, when the stream gives up, deletes the
blob if it is still that very one: a newer blob anybody wrote since has another ETag.

An open can also fail *after* its PutBlob was applied (the answer lost, the SDK's own re-send
refused): no ETag was noted, and the empty blob is there all the same. When pyarrow's error
says the open's PutBlob failed, the blob at the path is removed if it is empty, whatever its
ETag. That cannot tell this open's empty blob from an empty blob that was there before a
PutBlob that was never applied (only a look before every open could, one more request per
stream): that one is removed too, and a failed write leaves nothing at the path, which is
what a failed write over an old blob leaves anyway (the open replaced it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

import pyarrow.fs as pafs

from retryfs.core.classify import exception_chain
from retryfs.core.engine import Retrier
from retryfs.core.stats import logger

__all__ = ["EmptyAtOpen", "creates_empty_at_open"]

T = TypeVar("T")


def creates_empty_at_open(fs: Any) -> bool:
    """Whether ``fs`` puts an empty object at the path when an output stream opens (pyarrow's
    Azure client; S3 and GCS uploads show nothing before their commit, fsspec files neither)."""
    return isinstance(fs, pafs.AzureFileSystem)


#: pyarrow AzureFileSystem's words when the PutBlob of an output stream's open failed (after
#: the Azure SDK's own re-sends, one of which may have been applied).
CREATE_FAILED = "ObjectAppendStream must create a new empty block blob"


def _failed_creating(error: BaseException) -> bool:
    return any(CREATE_FAILED in str(link) for link in exception_chain(error))


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
        #: the latest open failed in its PutBlob: an empty object there may be its own
        self.maybe_created = False

    def attempts(self, open_stream: Callable[..., T]) -> Callable[..., T]:
        """``open_stream`` (one attempt of an open), noting when pyarrow says its PutBlob
        failed: one of the SDK's own sends of it may have been applied, and an empty object
        at the path may be this open's although no ETag was noted (`opened` forgets it)."""

        def attempt(*args: Any, **kwargs: Any) -> T:
            try:
                return open_stream(*args, **kwargs)
            except BaseException as exc:
                if _failed_creating(exc):
                    self.maybe_created = True
                raise

        return attempt

    def first_open(self, open_stream: Callable[[], T]) -> T:
        """``open_stream()``, the stream's first open; when it fails, what it may have
        created is removed before its error is raised."""
        try:
            return open_stream()
        except Exception as exc:  # noqa: BLE001 - raised below, once the check is done
            error = exc
        self.remove()  # outside the except block: the check's errors are its own
        raise error

    def opened(self) -> None:
        """After each (re)open: note the empty object it created. A note that cannot be taken
        (the check gave up) means no removal later, never a failed open."""
        self.maybe_created = False
        try:
            self.tag = self.retrier.call("open_input_file", self.path, _empty_blob_tag,
                                         self.fs, self.path)
        except Exception:  # noqa: BLE001 - logged by the engine; nothing to remove later
            self.tag = None

    def remove(self) -> bool:
        """The stream gave up: delete the object if it is still the empty one noted, or if it
        is empty after an open that failed in its PutBlob (a metadata call and a delete, on
        the failure path only). True when it was deleted."""
        tag, self.tag = self.tag, None
        maybe_created, self.maybe_created = self.maybe_created, False
        if tag is None and not maybe_created:
            return False
        try:
            now = self.retrier.call("open_input_file", self.path, _empty_blob_tag, self.fs,
                                    self.path)
            if now is None or (now != tag and not maybe_created):
                return False  # written since, or not empty: not ours to remove
            self.retrier.call("delete_file", self.path, self.fs.delete_file, self.path)
        except FileNotFoundError:
            return False  # gone already
        except Exception as exc:  # noqa: BLE001 - the write's own error is what the caller sees
            logger.warning("retryfs: the empty object %r created at open was not removed: %s",
                           self.path, type(exc).__name__)
            return False
        return True

"""What proves that a write landed: the object there after the commit is the one this call wrote.

A size check alone passes over a stale object: a commit answered ``200 OK`` that stored nothing,
over an older object of the same size (a checkpoint re-uploaded over the previous one: model
shapes do not change), leaves the older bytes in place, and a same-size check calls that a
success. The proof used here, cheapest first:

1. **The object changed since before the write.** When the destination's state before the write
   is known (nothing there; or its size, modification time and ETag), an object whose state
   differs is the new one. It is taken where it costs little: once per tree copy (one listing
   before, one after), and for an object larger than `HASHED` (one metadata call while it is
   being uploaded, before its commit can replace anything).
2. **Its content is the bytes written.** For a write of at most `HASHED` bytes, retryfs keeps
   their MD5 as they go (`WriteDigest`). An S3 ETag that is that MD5 (a single-part upload) or
   its one-part multipart form (``md5(md5)-1``), or a GCS ``md5Hash``, proves the content; any
   other S3 ETag (an older object; or SSE-KMS, several parts) is settled by reading the object
   back (at most `HASHED` bytes) and hashing it.
3. Where neither is known (a store with neither an S3 ETag nor an MD5, such as Azure or a
   local disk; a large object whose earlier state could not be read): the size, as before.

A state unchanged since before the write, or content that is not the bytes written, is a
`retryfs.errors.CommitNotVisibleError` (transient: the write is committed again).
"""

from __future__ import annotations

import base64
import hashlib
import re
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Final

import pyarrow.fs as pafs

from .locations import subtree_base

__all__ = ["HASHED", "UNCHANGED", "UNKNOWN", "Entry", "ObjectState", "Proofs", "WriteDigest", "arrow_entry",
           "arrow_state", "etag_hex", "fsspec_entry", "fsspec_state", "is_new", "moved_here",
           "multipart_etag", "read_md5", "state_before", "verdict", "Unchanged", "Verdict"]

#: The bytes of a write hashed (MD5) to prove its content; beyond, the proof is the change of
#: the destination since before the write.
HASHED: Final = 8 * 1024 * 1024  # below pyarrow's part size: one part, an ETag to compare


#: An S3 ETag: an MD5 in hex, with ``-<parts>`` for a multipart upload (Azure's, GCS's differ).
_S3_ETAG = re.compile(r"[0-9a-f]{32}(-[0-9]+)?")
_MD5 = re.compile(r"[0-9a-f]{32}")


class _Unknown:
    def __repr__(self) -> str:
        return "UNKNOWN"


#: The destination's state before the write was not taken.
UNKNOWN: Final = _Unknown()


class Unchanged:
    """The verdict on a write whose destination is just as it was before it (size, ETag and
    the second of its Last-Modified): falsy, not proven. Either its commit was lost, or it
    stored the same bytes as the object it replaced within that object's second, which an
    object past `HASHED` (not hashed) cannot tell apart. The commit made again one second
    later lands in another second and proves itself: `retry_after`, honoured by the retry
    engine, where backoff alone sent the whole object two to four more times."""

    #: Seconds before the write is made again (Last-Modified has a resolution of one second).
    retry_after: Final = 1.0

    def __bool__(self) -> bool:
        return False

    def __repr__(self) -> str:
        return "UNCHANGED"


#: See `Unchanged`.
UNCHANGED: Final = Unchanged()

#: What a check after a commit finds: proven (True), not (False), or `UNCHANGED`.
Verdict = bool | Unchanged


@dataclass(frozen=True)
class ObjectState:
    """An object as a metadata call shows it (``None`` for "no object there")."""

    size: int | None
    modified: Any = None  # as the store gives it (compared only with its own kind)
    etag: str | None = None  # without quotes, lower case
    md5: str | None = None  # the store's own MD5 of the content (hex), where it gives one


class WriteDigest:
    """The MD5 of a write's bytes while they stay within `HASHED` bytes."""

    __slots__ = ("_md5", "size")

    def __init__(self) -> None:
        self._md5: Any = hashlib.md5(usedforsecurity=False)
        self.size = 0

    def update(self, data: Any) -> bool:
        """Take ``data``; whether it is the write that passed `HASHED` (the moment to take the
        destination's state before the commit, `state_before`)."""
        size = len(data) if not hasattr(data, "nbytes") else data.nbytes
        passed = False
        if self._md5 is not None:
            if self.size + size > HASHED:
                self._md5, passed = None, True
            else:
                self._md5.update(data)
        self.size += size
        return passed

    @property
    def large(self) -> bool:
        """Past `HASHED`: its content is not hashed."""
        return self._md5 is None

    @property
    def hexdigest(self) -> str | None:
        return None if self._md5 is None else str(self._md5.hexdigest())

    def etags(self) -> frozenset[str]:
        """The S3 ETags of these bytes uploaded whole: one PUT, or a multipart upload of one
        part."""
        whole = self.hexdigest
        if whole is None:
            return frozenset()
        one_part = hashlib.md5(bytes.fromhex(whole), usedforsecurity=False).hexdigest()
        return frozenset({whole, f"{one_part}-1"})


def multipart_etag(part_etags: list[Any]) -> str | None:
    """The S3 ETag of a multipart upload of parts with these ETags (in part order): the MD5 of
    their MD5s, ``-`` and the count; ``None`` when a part's ETag is no MD5 (SSE-KMS, SSE-C)."""
    found = [etag_hex(etag) for etag in part_etags]
    if not found or not all(_MD5.fullmatch(etag or "") for etag in found):
        return None
    whole = b"".join(bytes.fromhex(etag) for etag in found if etag is not None)
    return f"{hashlib.md5(whole, usedforsecurity=False).hexdigest()}-{len(found)}"


def changed(after: ObjectState, before: ObjectState) -> bool:
    return (after.size != before.size or after.modified != before.modified
            or after.etag != before.etag)


def verdict(after: ObjectState | None, size: int, digest: WriteDigest | None,
            before: Any) -> Verdict | None:
    """Whether ``after`` (the destination now) proves a write of ``size`` bytes landed
    (`UNCHANGED` when it is just as ``before``), or ``None`` when only its content can tell
    (read it back and compare its MD5 with ``digest``'s: `is_new`).

    ``before``: the destination's state before the write (`ObjectState`, ``None`` for nothing
    there, or `UNKNOWN`); ``digest``: the write's `WriteDigest` (``None``: not hashed).
    """
    if after is None or (after.size is not None and after.size != size):
        return False
    if before is None:
        return True  # nothing was there: what is there now came after the write began
    if isinstance(before, ObjectState):
        if before.modified is None and before.etag is None:
            before = UNKNOWN  # a store that shows neither: nothing to compare
        elif changed(after, before):
            return True
    whole = None if digest is None else digest.hexdigest
    if whole is not None:
        if after.md5 is not None:
            return after.md5 == whole
        if _S3_ETAG.fullmatch(after.etag or ""):
            if after.etag in digest.etags():  # type: ignore[union-attr]
                return True
            # another S3 ETag: another object, or these bytes as several parts or encrypted
            # with KMS (an ETag that is no MD5): the content decides
            return None
        if before is UNKNOWN:
            return None  # no ETag, no MD5, no earlier state: the content decides
    if before is UNKNOWN:
        return True  # nothing to compare with, nothing hashed: the size alone
    return UNCHANGED  # the object that was there, or the same bytes within its second


def is_new(after: ObjectState | None, size: int, digest: WriteDigest | None, before: Any,
           read_back: Callable[[], str]) -> Verdict:
    """`verdict`, the content read back (``read_back``: its MD5; its error is raised) where
    only the content can tell."""
    found = verdict(after, size, digest, before)
    if found is None:
        assert digest is not None  # verdict reads content only against a digest
        return read_back() == digest.hexdigest
    return found


def state_before(call: Callable[..., Any], path: str, state: Callable[[str], Any]) -> Any:
    """``state(path)`` through ``call`` (a retrier's, operation ``verify``): the destination
    before a large write's commit; `UNKNOWN` if it gives up (the size and the store prove
    the write then)."""
    try:
        return call("verify", path, state, path)
    except Exception:  # noqa: BLE001 - unknown before: proven by what is known after
        return UNKNOWN


def etag_hex(value: Any) -> str | None:
    """An ETag as stores and clients give it (quoted, bytes or str, any case) as bare lower-case
    text; ``None`` for none."""
    if value is None:
        return None
    text = value.decode() if isinstance(value, bytes) else str(value)
    return text.strip().strip('"').lower() or None


def _s3_of(fs: pafs.FileSystem) -> bool:
    return isinstance(subtree_base(fs), pafs.S3FileSystem)


def arrow_state(fs: pafs.FileSystem, path: str) -> ObjectState | None:
    """``path`` on a pyarrow filesystem: S3 by one HeadObject (size, Last-Modified, ETag), any
    other by ``get_file_info``; ``None`` when there is no file there."""
    if _s3_of(fs):
        try:
            stream = fs.open_input_stream(path, compression=None)
        except FileNotFoundError:
            return None
        with stream:
            meta = stream.metadata()
        info = fs.get_file_info(path) if b"Content-Length" not in meta and \
            "Content-Length" not in meta else None
        length = meta.get(b"Content-Length") or meta.get("Content-Length")
        modified = meta.get(b"Last-Modified") or meta.get("Last-Modified")
        size = int(length) if length is not None else (info.size if info else None)
        return ObjectState(size, modified, etag_hex(meta.get(b"ETag") or meta.get("ETag")))
    fsspec_fs = _fsspec_of(fs)
    if fsspec_fs is not None:  # its own info(): gcsfs's MD5 proves the content without reading it
        try:
            return fsspec_state(fsspec_fs.info(path))
        except FileNotFoundError:
            return None
    info = fs.get_file_info(path)
    if info.type != pafs.FileType.File:
        return None
    return ObjectState(info.size, info.mtime_ns)


def _fsspec_of(fs: pafs.FileSystem) -> Any:
    """The fsspec filesystem a ``PyFileSystem(FSSpecHandler(...))`` adapts, else ``None``."""
    handler = getattr(fs, "handler", None) if isinstance(fs, pafs.PyFileSystem) else None
    return handler.fs if isinstance(handler, pafs.FSSpecHandler) else None


def fsspec_state(info: Mapping[str, Any]) -> ObjectState | None:
    """An fsspec ``info()`` entry as an `ObjectState` (s3fs: ETag and LastModified; gcsfs and
    adlfs: the content's MD5 too; local: size and modification time)."""
    if info.get("type") not in (None, "file"):
        return None
    size = info.get("size")
    modified = next((info[k] for k in ("LastModified", "mtime", "last_modified", "updated")
                     if info.get(k) is not None), None)
    return ObjectState(None if size is None else int(size), modified,
                       etag_hex(info.get("ETag") or info.get("etag")), _md5_of(info))


def _md5_of(info: Mapping[str, Any]) -> str | None:
    """The content MD5 an fsspec ``info()`` entry carries, as hex: gcsfs's ``md5Hash`` (base64),
    adlfs's ``content_settings.content_md5`` (16 bytes; a blob committed from blocks has none)."""
    md5 = info.get("md5Hash")
    if isinstance(md5, str):
        try:
            return base64.b64decode(md5, validate=True).hex()
        except ValueError:
            return None
    get = getattr(info.get("content_settings"), "get", None)  # a dict, or Azure's DictMixin
    raw = get("content_md5") if callable(get) else None
    return bytes(raw).hex() if isinstance(raw, (bytes, bytearray)) and len(raw) == 16 else None


# -- what proves a move -------------------------------------------------------------------------
#: The keys fsspec implementations give a modification time under (local, arrow, s3fs, gcsfs).
_MTIME_KEYS = ("mtime", "LastModified", "last_modified", "updated")


@dataclass(frozen=True)
class Entry:
    """A path as either face's metadata call shows it: what the proof of a move compares."""

    kind: str  # "file", "directory" or "other"
    size: int | None = None
    modified: Any = None  # as the store gives it (compared only with its own kind)
    etag: str | None = None


def arrow_entry(info: pafs.FileInfo) -> Entry | None:
    """A pyarrow ``FileInfo`` as an `Entry` (``None``: nothing there)."""
    if info.type == pafs.FileType.NotFound:
        return None
    kind = {pafs.FileType.File: "file", pafs.FileType.Directory: "directory"}.get(
        info.type, "other")
    return Entry(kind, info.size, info.mtime_ns)


def fsspec_entry(info: Mapping[str, Any] | None) -> Entry | None:
    """An fsspec ``info()`` entry as an `Entry` (``None``: nothing there)."""
    if info is None:
        return None
    modified = next((info[key] for key in _MTIME_KEYS if info.get(key) is not None), None)
    return Entry(str(info.get("type")), info.get("size"), modified,
                 info.get("ETag") or info.get("etag"))


def holds(dest: Entry, source: Entry) -> bool:
    """Whether ``dest`` can be what ``source`` became when moved: same kind, same size for a
    file, and not older (a rename keeps the modification time, an object store's copy sets a
    new one; times that do not compare are no evidence either way)."""
    if dest.kind != source.kind or (source.kind == "file" and dest.size != source.size):
        return False
    if dest.modified is None or source.modified is None:
        return True
    try:
        return not dest.modified < source.modified
    except TypeError:
        return True


def moved_here(dest: Entry | None, source_before: Entry, dest_before: Entry | None) -> bool:
    """The proof of a move whose retry found no source: the destination holds what the source
    was, and is not what it was before the move (else a third party may have deleted the
    source beside an older object)."""
    return dest is not None and holds(dest, source_before) and dest != dest_before


def read_md5(read: Callable[[], Any]) -> str:
    """The MD5 of what ``read()`` returns (a whole object of at most `HASHED` bytes). A read
    that fails raises: the check it is part of is retried, and proves nothing if it gives up."""
    return hashlib.md5(read(), usedforsecurity=False).hexdigest()


class Proofs:
    """What a handler knows of its recent writes, by path, until their check takes it: the
    write's `WriteDigest` and the destination's state before it (the copy data path records
    them where it writes; the check after the commit reads them)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._known: dict[str, tuple[WriteDigest | None, Any]] = {}

    def record(self, path: str, digest: WriteDigest | None, before: Any = UNKNOWN) -> None:
        with self._lock:
            self._known[path] = (digest, before)

    def take(self, path: str) -> tuple[WriteDigest | None, Any]:
        with self._lock:
            return self._known.pop(path, (None, UNKNOWN))

"""Whether two files hold the same bytes, cheaply: ETags (S3's MD5 or multipart layout), SHA-256.

Used by `retryfs.copy` to skip what the destination already holds and to check what it wrote.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any

import pyarrow.fs as pafs

from retryfs.arrow.filesystem import RetryingFileSystem
from retryfs.core.locations import is_local as local_disk

from .results import CHUNK, PART_SIZES, MiB

__all__ = ["etag_of", "is_fsspec", "is_local", "read_all", "same_content", "same_sha256"]


def is_local(fs: RetryingFileSystem) -> bool:
    """Whether the filesystem ``fs`` wraps is this machine's disk (`retryfs.core.locations`)."""
    return local_disk(fs.unwrap())


def is_fsspec(original: Any) -> bool:
    return not isinstance(original, pafs.FileSystem) and hasattr(original, "open")


def etag_of(fs: RetryingFileSystem, path: str) -> str | None:
    """The object's ETag (without quotes) where the backend gives one (S3), else None.

    pyarrow's S3 filesystem: one HeadObject (the metadata of an input stream); fsspec
    filesystems: ``info(path)["ETag"]`` (s3fs). Retried like any metadata call.
    """
    original = fs.unwrap()
    handler = fs.retry_handler

    def head() -> Any:
        if isinstance(original, pafs.S3FileSystem):
            with original.open_input_stream(path, compression=None) as stream:
                value = stream.metadata().get(b"ETag") or stream.metadata().get("ETag")
            return value.decode() if isinstance(value, bytes) else value
        if is_fsspec(original) and "s3" in str(getattr(original, "protocol", "")):
            info = original.info(path)
            return info.get("ETag") or info.get("etag")
        return None

    if not isinstance(original, pafs.S3FileSystem) and not (
            is_fsspec(original) and "s3" in str(getattr(original, "protocol", ""))):
        return None
    value = handler.call("get_file_info", path, head)
    return str(value).strip('"') if value else None


def _etag_matches(etag: str, fs: RetryingFileSystem, path: str, size: int) -> bool | None:
    """Whether the content at ``path`` has this S3 ETag: True, False, or None (not comparable:
    a multipart ETag whose part count fits none of `PART_SIZES`, or not an MD5 at all)."""
    digest, _, count = etag.partition("-")
    if len(digest) != 32 or any(c not in "0123456789abcdef" for c in digest.lower()):
        return None  # not an MD5 (e.g. SSE-KMS objects): cannot compare
    if not count:
        whole = hashlib.md5(usedforsecurity=False)
        read_all(fs, path, whole.update)
        return whole.hexdigest() == digest.lower()
    try:
        parts = int(count)
    except ValueError:
        return None
    sizes = [ps for ps in PART_SIZES if max(1, -(-size // ps)) == parts]
    if not sizes:
        return None
    # one pass over the file, the part MD5s of every candidate layout at once
    digests: dict[int, list[bytes]] = {ps: [] for ps in sizes}
    current = {ps: hashlib.md5(usedforsecurity=False) for ps in sizes}
    offset = 0

    def block(data: bytes) -> None:
        nonlocal offset
        view = memoryview(data).cast("B")
        for ps in sizes:
            pos, i = offset, 0
            while i < len(view):
                piece = view[i:i + ps - pos % ps]
                current[ps].update(piece)
                pos, i = pos + len(piece), i + len(piece)
                if pos % ps == 0 and pos < size:
                    digests[ps].append(current[ps].digest())
                    current[ps] = hashlib.md5(usedforsecurity=False)
        offset += len(view)

    read_all(fs, path, block, chunk=MiB)
    for ps in sizes:
        joined = b"".join(digests[ps] + [current[ps].digest()])
        if hashlib.md5(joined, usedforsecurity=False).hexdigest() == digest.lower():
            return True
    return False


def same_content(src: RetryingFileSystem, src_path: str, dst: RetryingFileSystem,
                 dst_path: str, size: int) -> tuple[bool, str]:
    """Whether two files of the same ``size`` hold the same bytes, as far as can be told
    cheaply: ``(same, how)``.

    - Both sides give an ETag (S3 to S3): equal ETags are the same content; two single-part
      ETags (MD5s) that differ are different content; two multipart ETags of different part
      layouts cannot be compared, and the size decides.
    - One side gives an ETag and the other is local: the local file's MD5 (single-part) or
      multipart ETag for each part size in `PART_SIZES` that gives the ETag's part count is
      computed (one read of the local file): a match is the same content, no match is
      different; a part count no common part size gives cannot be compared.
    - Otherwise (local to local, other backends) the size decides.
    """
    src_tag, dst_tag = etag_of(src, src_path), etag_of(dst, dst_path)
    if src_tag and dst_tag:
        if src_tag == dst_tag:
            return True, "same size and ETag"
        if "-" not in src_tag and "-" not in dst_tag:
            return False, "ETag differs"
    for tag, fs, path in ((dst_tag, src, src_path), (src_tag, dst, dst_path)):
        if tag and is_local(fs):
            match = _etag_matches(tag, fs, path, size)
            if match is True:
                return True, "same size and ETag"
            if match is False:
                return False, "content differs (ETag)"
    return True, "same size"


def same_sha256(src: RetryingFileSystem, src_path: str, dst: RetryingFileSystem,
                dst_path: str) -> tuple[bool, str]:
    """Both files read whole and compared by SHA-256: ``(same, how)`` (what ``verify="hash"``
    does for a file already there when no checksum could decide)."""
    digests = []
    for fs, path in ((src, src_path), (dst, dst_path)):
        digest = hashlib.sha256()
        read_all(fs, path, digest.update)
        digests.append(digest.hexdigest())
    if digests[0] == digests[1]:
        return True, "same size and SHA-256"
    return False, "content differs (SHA-256)"


def read_all(fs: RetryingFileSystem, path: str, sink: Callable[[bytes], None],
              chunk: int = CHUNK) -> None:
    with fs.open_input_stream(path, compression=None) as stream:
        while True:
            data = stream.read(chunk)
            if not data:
                return
            sink(data)

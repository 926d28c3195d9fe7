"""Part uploads and commits retried in place: a failed request costs that request, not a
replay of the stream.

fsspec's buffered files upload in parts as the buffer fills (``_upload_chunk``). s3fs sends each
part with one ``upload_part`` request through the file's ``_call_s3``; the request carries its
bytes and its part number, so sending it again is safe and re-sends only that part. Retrying the
whole ``_upload_chunk`` would not be: it numbers parts by how many succeeded and commits at the
end, so a retry after a failed commit would upload the data again as new parts.

The commit is one request too, retried in place under the operation ``commit``: the one-shot
``put_object`` of a small file (the same bytes again), or the ``complete_multipart_upload`` of a
large one (the same upload and parts again). A commit that was applied and whose answer was lost
leaves nothing to complete: S3 answers the next attempt ``NoSuchUpload``. The object there then
decides (`settle_lost_complete`): its ETag is the one these parts make (`multipart_etag`), and
the commit is done; or it is not, and the commit fails with a
`retryfs.errors.CommitNotVisibleError`, which replays the stream from its spool (the last
resort, as before). A write in ``"xb"`` mode (``If-None-Match``) keeps s3fs's own commit: a
retry after an applied commit would find its own object there and fail.

Files without such requests (gcsfs, adlfs, which retry their own requests) are left as they
are: a failure there is recovered by the replay spool, the last resort.
"""

from __future__ import annotations

from typing import Any

from retryfs.core.engine import Retrier
from retryfs.core.proof import multipart_etag
from retryfs.errors import CommitNotVisibleError

from . import registry

__all__ = ["COMMIT_REQUESTS", "PART_REQUESTS", "retry_parts_in_place", "settle_lost_complete"]

#: The per-part requests of s3fs files that are retried in place (operation ``upload_part``).
PART_REQUESTS = frozenset({"upload_part"})

#: The commit requests of s3fs files that are retried in place (operation ``commit``).
COMMIT_REQUESTS = frozenset({"put_object", "complete_multipart_upload"})


def retry_parts_in_place(file: Any, retrier: Retrier, path: str) -> Any:
    """``file`` with its part uploads retried under ``retrier`` (operation ``upload_part``)."""
    call_s3 = getattr(file, "_call_s3", None)
    if not callable(call_s3) or not hasattr(file, "_upload_chunk"):
        return file
    if not registry.applies("s3fs_parts"):  # off, or an s3fs it was not written for
        return file
    registry.note_applied("s3fs_parts", "the _call_s3 of s3fs files retryfs opens for writing: "
                         "upload_part, put_object and complete_multipart_upload retried in place")

    def retried(method: str, *args: Any, **kwargs: Any) -> Any:
        if method in PART_REQUESTS:
            return retrier.call("upload_part", path, call_s3, method, *args, **kwargs)
        if method not in COMMIT_REQUESTS or "IfNoneMatch" in kwargs:
            return call_s3(method, *args, **kwargs)
        if method == "put_object":
            return retrier.call("commit", path, call_s3, method, *args, **kwargs)
        return _complete(call_s3, retrier, path, kwargs)

    file._call_s3 = retried
    return file


def _complete(call_s3: Any, retrier: Retrier, path: str, kwargs: dict[str, Any]) -> Any:
    """``complete_multipart_upload`` retried in place; a retry that finds the upload gone is
    settled by the object there (`settle_lost_complete`)."""
    settled: list[dict[str, Any] | None] = []

    def reconcile(error: BaseException) -> bool:
        if not _no_such_upload(error):
            return False
        settled.append(settle_lost_complete(call_s3, retrier, path, kwargs))
        return True  # the call ends here; what was found decides below

    result = retrier.call("commit", path, call_s3, "complete_multipart_upload",
                          reconcile=reconcile, **kwargs)
    if not settled:
        return result
    if settled[0] is None:
        parts = len(kwargs.get("MultipartUpload", {}).get("Parts", []))
        raise CommitNotVisibleError(
            f"{path!r}: its multipart upload was gone when its commit was retried, and the "
            f"object there is not the one its {parts} part(s) make")
    return settled[0]


def settle_lost_complete(call_s3: Any, retrier: Retrier, path: str,
                         kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """After a retried ``complete_multipart_upload`` found its upload gone: what the commit
    returns (the object's ETag and version) if the object there is the one its parts make;
    ``None`` if it is not, or no part ETag is an MD5 to tell (the caller replays the stream)."""
    parts = kwargs.get("MultipartUpload", {}).get("Parts", [])
    expected = multipart_etag([part.get("ETag") for part in parts])
    if expected is None:
        return None
    try:
        head = retrier.call("verify", path, call_s3, "head_object", Bucket=kwargs["Bucket"],
                            Key=kwargs["Key"])
    except FileNotFoundError:
        return None
    if str(head.get("ETag", "")).strip('"').lower() != expected:
        return None
    return {"ETag": head.get("ETag"), "VersionId": head.get("VersionId")}


def _no_such_upload(error: BaseException) -> bool:
    """Whether ``error`` (s3fs's ``FileNotFoundError``, botocore's ``ClientError`` as its cause)
    is S3's ``NoSuchUpload``."""
    seen: BaseException | None = error
    while seen is not None:
        response = getattr(seen, "response", None)
        if isinstance(response, dict) and response.get("Error", {}).get("Code") == "NoSuchUpload":
            return True
        seen = seen.__cause__
    return False

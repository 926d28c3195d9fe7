"""Part uploads retried in place: a failed part costs that part, not a replay of the stream.

fsspec's buffered files upload in parts as the buffer fills (``_upload_chunk``). s3fs sends each
part with one ``upload_part`` request through the file's ``_call_s3``; the request carries its
bytes and its part number, so sending it again is safe and re-sends only that part. Retrying the
whole ``_upload_chunk`` would not be: it numbers parts by how many succeeded and commits at the
end, so a retry after a failed commit would upload the data again as new parts.

Files without such a per-part request (gcsfs, adlfs, which retry their own requests) are left as
they are: a failure there is recovered by the replay spool, the last resort.
"""

from __future__ import annotations

from typing import Any

from retryfs.core.engine import Retrier

from . import registry

__all__ = ["PART_REQUESTS", "retry_parts_in_place"]

#: The per-part requests of s3fs files that are retried in place (operation ``upload_part``).
PART_REQUESTS = frozenset({"upload_part"})


def retry_parts_in_place(file: Any, retrier: Retrier, path: str) -> Any:
    """``file`` with its part uploads retried under ``retrier`` (operation ``upload_part``)."""
    call_s3 = getattr(file, "_call_s3", None)
    if not callable(call_s3) or not hasattr(file, "_upload_chunk"):
        return file
    if not registry.applies("s3fs_parts"):  # off, or an s3fs it was not written for
        return file
    registry.note_applied("s3fs_parts", "the _call_s3 of s3fs files retryfs opens for writing: "
                         "upload_part retried in place")

    def retried(method: str, *args: Any, **kwargs: Any) -> Any:
        if method not in PART_REQUESTS:
            return call_s3(method, *args, **kwargs)
        return retrier.call("upload_part", path, call_s3, method, *args, **kwargs)

    file._call_s3 = retried
    return file

"""Part uploads and commits retried in place: a failed request costs that request, not a
replay of the stream.

fsspec's buffered files upload in parts as the buffer fills (``_upload_chunk``). s3fs sends each
part with one ``upload_part`` request through the file's ``_call_s3``; the request carries its
bytes and its part number, so sending it again is safe and re-sends only that part. Retrying the
whole ``_upload_chunk`` would not be: it numbers parts by how many succeeded and commits at the
end, so a retry after a failed commit would upload the data again as new parts.

The ``create_multipart_upload`` that starts the upload is retried in place too (operation
``start_upload``): one applied whose answer was lost leaves an upload that is never completed,
as a replay would (an S3 lifecycle rule reaps those).

A write larger than the file's block is handed to s3fs a block at a time, so that it goes as
parts of a block (s3fs would send it as one part of its whole size).

The commit is one request too, retried in place under the operation ``commit``: the one-shot
``put_object`` of a small file (the same bytes again), or the ``complete_multipart_upload`` of a
large one (the same upload and parts again). After a commit that was applied and whose answer
was lost, S3 answers the next attempt as it did the first while it still knows the upload, and
``NoSuchUpload`` once it does not. The object there then decides (`settle_lost_complete`): its
ETag is the one these parts make (`multipart_etag`), and the commit is done; or it is not
(another writer came between), and the commit fails with a
`retryfs.errors.CommitNotVisibleError`, which replays the stream from its spool (the last
resort, as before). A write in ``"xb"`` mode (``If-None-Match``) keeps s3fs's own commit: a
retry after an applied commit would find its own object there and fail.

One retry layer: a request retried in place that gives up fails the write
(`retryfs.core.engine.gave_up_inside`); the stream is not replayed to try it ``max_attempts``
times more. Parts go out in the background (`PartsInFlight`), each attempt of a part timed on
its own when writes are timed.

Files without such requests (gcsfs, adlfs, which retry their own requests) are left as they
are: a failure there is recovered by the replay spool, the last resort.
"""

from __future__ import annotations

import contextvars
import os
import threading
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any

from retryfs.core.engine import Retrier, gave_up_inside
from retryfs.core.proof import etag_hex, multipart_etag
from retryfs.core.timeouts import timed
from retryfs.errors import CommitNotVisibleError

from . import registry

__all__ = ["COMMIT_REQUESTS", "PARTS_IN_FLIGHT", "PART_BYTES_IN_FLIGHT", "PART_REQUESTS",
           "PartsInFlight", "retry_parts_in_place", "settle_lost_complete", "with_parts_in_flight"]

#: The per-part requests of s3fs files that are retried in place (operation ``upload_part``).
PART_REQUESTS = frozenset({"upload_part"})

#: The commit requests of s3fs files that are retried in place (operation ``commit``).
COMMIT_REQUESTS = frozenset({"put_object", "complete_multipart_upload"})

#: The parts of one file uploading at once, at most, and the bytes they may hold: a part is
#: sent while the next one fills (at least one part, whatever its size, is in flight). The
#: bytes are those a pyarrow upload may hold unsent (`retryfs.datapath.iopool.UNSENT_MAX`): two
#: parts of s3fs's default 50 MiB block, four of 8 to 32 MiB.
PARTS_IN_FLIGHT = 4
PART_BYTES_IN_FLIGHT = 128 * 2**20

_pool_lock = threading.Lock()
_pool: tuple[int, ThreadPoolExecutor] | None = None  # (pid, pool): a forked child makes its own


def _part_pool() -> ThreadPoolExecutor:
    """The process's threads that send s3fs parts (each waits on s3fs's event loop)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[0] != os.getpid():
            _pool = (os.getpid(), ThreadPoolExecutor(thread_name_prefix="retryfs-part"))
        return _pool[1]


class _PendingETag:
    """The ETag of a part still uploading, in s3fs's list of parts until the commit."""

    __slots__ = ("future",)

    def __init__(self, future: Future[Any]) -> None:
        self.future = future

    def __repr__(self) -> str:
        return f"_PendingETag({self.future!r})"


class PartsInFlight:
    """The parts of one s3fs upload sent in the background, each retried in place.

    s3fs sends a part when its buffer fills and waits for it before the caller's write
    returns: one part at a time, the caller idle meanwhile. Here a part is handed to a thread
    and s3fs goes on with a pending ETag; at most `PARTS_IN_FLIGHT` parts and
    `PART_BYTES_IN_FLIGHT` bytes are in flight (a write waits for the oldest beyond that).
    A part that finally failed raises its error at the next part or at the commit, and the
    write fails with it (`_in_place`: the part was tried as often as the policy allows); the
    commit waits for every part and puts their ETags in s3fs's list; an abort waits for the
    parts in flight first.
    """

    def __init__(self, call_s3: Any, retrier: Retrier, path: str,
                 attempt_timeout: Any = None) -> None:
        self._call_s3 = call_s3
        self._retrier = retrier
        self._path = path
        self._attempt_timeout = attempt_timeout  # (operation, bytes) -> seconds, or None
        self._in_flight: list[tuple[Future[Any], int]] = []

    def send(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """Hand a part over (``upload_part``'s keywords); what s3fs reads of the answer."""
        size = len(kwargs.get("Body") or b"")
        self._reap(block=False)
        while self._in_flight and (len(self._in_flight) >= PARTS_IN_FLIGHT or
                                   sum(n for _, n in self._in_flight) + size
                                   > PART_BYTES_IN_FLIGHT):
            self._reap(block=True)
        request = self._call_s3
        seconds = (None if self._attempt_timeout is None
                   else self._attempt_timeout("upload_part", size))
        if seconds is not None:  # a stalled part is abandoned and sent again, in place
            request = timed(self._call_s3, seconds, "upload_part", self._path)

        def upload() -> Any:
            return _in_place(self._retrier, "upload_part", self._path, request, "upload_part",
                             **kwargs)

        context = contextvars.copy_context()  # the operation's deadline goes with it
        try:
            future = _part_pool().submit(context.run, upload)
        except RuntimeError:  # the interpreter is exiting: no new threads, the part here
            return upload()  # type: ignore[no-any-return]
        self._in_flight.append((future, size))
        return {"ETag": _PendingETag(future)}

    def settle(self, parts: list[dict[str, Any]]) -> None:
        """Wait for every part; their ETags (and checksums) into ``parts`` (s3fs's list)."""
        for part in parts:
            pending = part.get("ETag")
            if isinstance(pending, _PendingETag):
                answer = pending.future.result()
                part["ETag"] = answer["ETag"]
                if "ChecksumSHA256" in answer:
                    part["ChecksumSHA256"] = answer["ChecksumSHA256"]
        self._in_flight.clear()

    def drain(self) -> None:
        """Before an abort: wait for the parts in flight, whatever they end with."""
        wait([future for future, _ in self._in_flight])
        self._in_flight.clear()

    def _reap(self, *, block: bool) -> None:
        """Drop the parts that are done (waiting for the oldest first when ``block``); the
        error of one that failed is raised."""
        if block:
            wait([self._in_flight[0][0]], return_when=FIRST_COMPLETED)
        still = []
        for future, size in self._in_flight:
            if future.done():
                future.result()  # raises a failed part's error
            else:
                still.append((future, size))
        self._in_flight = still


def retry_parts_in_place(file: Any, retrier: Retrier, path: str,
                         attempt_timeout: Any = None) -> Any:
    """``file`` with its requests retried under ``retrier``, its parts sent in the background.

    ``attempt_timeout`` (``(operation, bytes) -> seconds``, or ``None``: untimed) bounds each
    attempt of a part: one that stalls is abandoned and the part sent again (the abandoned
    request, if it lands, stores the same bytes under the same part number)."""
    call_s3 = getattr(file, "_call_s3", None)
    if not callable(call_s3) or not hasattr(file, "_upload_chunk"):
        return file
    if not registry.applies("s3fs_parts"):  # off, or an s3fs it was not written for
        return file
    registry.note_applied("s3fs_parts", "the _call_s3 and _abort_mpu of s3fs files retryfs "
                         "opens for writing: parts sent in the background; parts, "
                         "create_multipart_upload, put_object and complete_multipart_upload "
                         "retried in place")

    parts = PartsInFlight(call_s3, retrier, path, attempt_timeout)

    def retried(method: str, *args: Any, **kwargs: Any) -> Any:
        if method in PART_REQUESTS:
            if args:  # not how s3fs sends a part: in place, on this thread
                return _in_place(retrier, "upload_part", path, call_s3, method, *args, **kwargs)
            return parts.send(kwargs)
        if method == "create_multipart_upload":  # a lost one leaves an upload never completed
            return _in_place(retrier, "start_upload", path, call_s3, method, *args, **kwargs)
        if method == "complete_multipart_upload":
            parts.settle(kwargs.get("MultipartUpload", {}).get("Parts", []))
        elif method == "abort_multipart_upload":
            parts.drain()
        if method not in COMMIT_REQUESTS or "IfNoneMatch" in kwargs:
            return call_s3(method, *args, **kwargs)
        if method == "put_object":
            return _in_place(retrier, "commit", path, call_s3, method, *args, **kwargs)
        return _complete(call_s3, retrier, path, kwargs)

    file._call_s3 = retried
    file._retryfs_parts = parts
    if callable(getattr(file, "write", None)):
        file.write = _sliced(file.write, file)
    abort = getattr(file, "_abort_mpu", None)  # what discard() calls: not through _call_s3
    if callable(abort):
        def drained_abort() -> Any:
            parts.drain()  # a part still on its way could land after the abort
            return abort()

        file._abort_mpu = drained_abort
    return file


def _sliced(write: Any, file: Any) -> Any:
    """``file.write`` handing a write larger than the file's block over a block at a time.

    s3fs uploads what its buffer holds once it reaches a block, as one part however large: a
    200 MiB write (``torch.save`` of a tensor, Lightning's whole checkpoint) would be one part
    of 200 MiB, sent alone and sent again whole if it fails. Handed over a block at a time, it
    is parts of a block, several in flight. (s3fs never sends a part under its block but the
    last, so this keeps its limit of 10,000 parts as it was.)"""
    def sliced(data: Any) -> int:
        block = getattr(file, "blocksize", 0) or 0
        view = memoryview(data).cast("B")
        if block <= 0 or len(view) <= block:
            return int(write(data))
        for start in range(0, len(view), block):
            write(view[start:start + block])
        return len(view)

    return sliced


def with_parts_in_flight(attempt_timeout: Any, file: Any) -> Any:
    """A write stream's per-attempt timeout (``(operation, bytes) -> seconds``) for ``file``:
    a write or flush of a file that sends its parts in the background may wait for the parts
    before it (up to `PART_BYTES_IN_FLIGHT`), so its attempt is given their time too. (A close
    is given its whole size's time already; a stalled part has its own timer.)"""
    if attempt_timeout is None or getattr(file, "_retryfs_parts", None) is None:
        return attempt_timeout

    def timeout(operation: str, in_flight: int) -> Any:
        waits = PART_BYTES_IN_FLIGHT if operation in ("write", "flush") else 0
        return attempt_timeout(operation, in_flight + waits)

    return timeout


def _in_place(retrier: Retrier, operation: str, path: str, fn: Any, *args: Any,
              **kwargs: Any) -> Any:
    """``retrier.call(operation, path, fn, ...)``; the error it gives up on is final for the
    stream (`retryfs.core.engine.gave_up_inside`): the write fails, no replay tries the
    request's attempts over again."""
    try:
        return retrier.call(operation, path, fn, *args, **kwargs)
    except Exception as error:
        gave_up_inside(error)
        raise


def _complete(call_s3: Any, retrier: Retrier, path: str, kwargs: dict[str, Any]) -> Any:
    """``complete_multipart_upload`` retried in place; a retry that finds the upload gone is
    settled by the object there (`settle_lost_complete`)."""
    settled: list[dict[str, Any] | None] = []

    def reconcile(error: BaseException) -> bool:
        if not _no_such_upload(error):
            return False
        settled.append(settle_lost_complete(call_s3, retrier, path, kwargs))
        return True  # the call ends here; what was found decides below

    result = _in_place(retrier, "commit", path, call_s3, "complete_multipart_upload",
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
    if etag_hex(head.get("ETag")) != expected:
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

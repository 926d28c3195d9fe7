"""A real S3 endpoint with faults injected in the HTTP exchange, for chaos-testing pipelines.

`S3FaultEndpoint` serves moto's S3 in-process on a loopback port, behind a small WSGI layer that
consults a plan of `S3Fault` rules before each request reaches moto. Faults happen where they
happen in production, between the client's socket and the store, so the client under test
(pyarrow's native `S3FileSystem`, s3fs/botocore, boto3, anything speaking S3) raises exactly the
error it would raise against AWS.

    with S3FaultEndpoint() as ep:
        ep.create_bucket("bucket")
        ep.add_fault(S3Fault.slow_down(op="PutObject", times=2))
        fs = ep.pyarrow_fs()                      # its own retries are off: faults stay visible
        ...
        assert ep.counts()["PutObject"] == 3

Plans are deterministic: a rule fires on the n-th matching request, on the first N, or with a
seeded probability. Rules are consulted in the order they were added; the first that fires wins
and the rules after it do not see that request. Every request is recorded (`requests`, `counts`,
`injected`) before its response is sent, so a test that has its answer also has the record.

Each endpoint keeps its buckets in a moto account of its own, dropped by `stop` and `reset`.
Bucket names are one namespace per process, as on AWS, and moto lets any live endpoint reach
another's bucket by name: give concurrent endpoints distinct bucket names. (``MOTO_ACCOUNT_ID``,
which moto obeys first, makes all endpoints share one account.)

What the real clients raise for each fault is in the README section "Chaos-testing your own
pipeline" (measured, and asserted by ``tests/testing/test_s3_endpoint.py``). Two client habits to plan
for: aiohttp (under s3fs) replays an idempotent request (GET, HEAD, PUT, DELETE) once when the
connection drops before a response, so one `reset` there is invisible (use ``times=2``); and
neither client's read timeout reliably bounds a stalled upload (pyarrow's never does: it waits
until the stall ends with a reset); retryfs's ``write_timeout`` does, and `release_stalls` ends
the stalls a test left behind once it has its answer.

How pyarrow 26's `S3FileSystem` writes (measured with this endpoint's record): with the default
``allow_delayed_open=False`` every output stream is a multipart upload, even an empty one
(CreateMultipartUpload at open, UploadPart per `PYARROW_PART_SIZE` of data, and the last part
at close, then CompleteMultipartUpload at close; parts go out in the background unless
``background_writes=False``). With ``allow_delayed_open=True`` a stream closed with less than
`PYARROW_PART_SIZE` is one PutObject; larger ones are multipart as above. Reads are a HeadObject
at open, then ranged GetObject calls (``Range: bytes=...``).

A ranged GetObject reads only its range from the store (``read_ranges_only=True``, the default),
as S3 does: moto 5's own GetObject reads and copies the whole object (``FakeKey.value``) and
then slices the range out of it, so the 8 ranged GETs of 8 MiB that read a 64 MiB object cost
512 MiB of reads and copies in the server. For a GET whose ``Range`` is one ``bytes=A-`` or
``bytes=A-B`` (B >= A) and that has no ``partNumber``, `FakeKey.value` is a `_RangeView` on
the serving thread while moto handles the request: the object's length and that range, read
from the key's buffer under the key's lock when moto reads the value, which are all moto asks of
it; anything else asked of it (or a range moto treats as the whole object) reads the whole
object as moto does. Every answer is moto's own,
byte for byte (``tests/arrow/test_s3_ranges.py``); ``read_ranges_only=False`` is moto as it comes.

A CompleteMultipartUpload of an upload that is no longer there (aborted, or completed into an
object that has since been replaced) is answered ``404 NoSuchUpload``, as S3 does (moto's own
answer is a 500). One sent again while the object is still that upload's is answered as the
first was (moto's own "idempotent" answer).

A body sent ``aws-chunked`` (what the AWS SDKs send with a trailing checksum: pyarrow's S3
uploads do) is decoded in one pass: moto's own decoder concatenates the chunks one to the next,
which copies the body once per chunk (quadratic in its size). The decoded bytes are the same.
"""

from __future__ import annotations

import io
import itertools
import logging
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import parse_qsl, unquote, urlencode, urlsplit
from xml.sax.saxutils import escape

import pyarrow.fs
from moto.moto_server.werkzeug_app import MotoRequestHandler, create_backend_app
from moto.s3.exceptions import NoSuchUpload
from moto.s3.models import FakeKey, FakeMultipart, S3Backend, s3_backends
from moto.s3.responses import S3Response

from ._plan import PlanAndRecord
from ._wire import Drop as _Drop
from ._wire import FaultServer, Listening
from ._wire import request_id as _request_id
from ._wire import status_line as _status_line
from ._wire import then_drop as _then_drop
from .s3_faults import (  # noqa: F401 - the plan's names are this module's too
    _KINDS,
    OPERATIONS,
    FaultKind,
    RequestRecord,
    S3Fault,
    S3Request,
    operation_name,
)

if TYPE_CHECKING:
    import s3fs as _s3fs

__all__ = [
    "OPERATIONS",
    "PYARROW_PART_SIZE",
    "S3Fault",
    "FaultKind",
    "RequestRecord",
    "S3FaultEndpoint",
    "S3Request",
    "operation_name",
]

log = logging.getLogger(__name__)

#: The part size of pyarrow 26's S3 output streams (measured): UploadPart carries this much, and
#: with ``allow_delayed_open=True`` a stream closed with less is a single PutObject.
PYARROW_PART_SIZE = 10 * 1024 * 1024

ACCESS_KEY = "testing"
SECRET_KEY = "testing"


# -- a GetObject of one range in O(range) ------------------------------------------------------

#: ``range``: the range (first byte, last byte or None) of the GetObject this thread is serving
#: in `S3FaultEndpoint._call_moto`, None if it is not serving one.
_serving = threading.local()

#: A Range header served by `_RangeView`: one range from a first byte, to a last byte or the end.
_ONE_RANGE = re.compile(r"bytes=([0-9]+)-([0-9]*)")


def _one_range(request: S3Request) -> tuple[int, int | None] | None:
    """The range moto will slice out of `FakeKey.value` for `request`, if it is a GET of one
    ``bytes=A-`` or ``bytes=A-B`` with B >= A, not of a part (``partNumber``): (A, B or None)."""
    found = _ONE_RANGE.fullmatch(request.headers.get("range", ""))
    if request.method != "GET" or found is None or "partNumber" in request.query:
        return None
    first, last = int(found[1]), int(found[2]) if found[2] else None
    return None if last is not None and last < first else (first, last)


class _RangeView:
    """`FakeKey.value` while a GetObject of one range is served: its ``len()``, and the slice
    of that range, read when moto reads the value (under the key's lock, as moto reads it:
    an overwrite disposes of the old key, so a read any later could find it closed), which is
    all moto's ``_handle_range_header`` asks for. Any other slice is read then; any other use,
    and a range moto treats as the whole object, reads the whole object as moto does
    (`materialise`). No buffer protocol on purpose: moto's ``_enrich_response`` tries a regex on
    every body and ignores the TypeError."""

    __slots__ = ("_key", "_length", "_start", "_stop", "_data")
    __hash__ = None  # type: ignore[assignment]

    def __init__(self, key: FakeKey, first: int, last: int | None) -> None:
        self._key = key
        with key.lock:
            buffer = key._value_buffer
            self._length = buffer.seek(0, os.SEEK_END)
            self._start = min(first, self._length)
            self._stop = self._length if last is None else min(last + 1, self._length)
            buffer.seek(self._start)
            self._data = buffer.read(max(self._stop - self._start, 0))

    def __len__(self) -> int:
        return int(self._length)

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._length)
            stop = max(stop, start)
            if step == 1 and (start, stop) == (self._start, self._stop):
                return self._data
            if step == 1:
                with self._key.lock:
                    self._key._value_buffer.seek(start)
                    return self._key._value_buffer.read(stop - start)
        return self.materialise()[index]

    def materialise(self) -> bytes:
        """The whole object, read as moto reads it."""
        return bytes(_moto_value(self._key))

    def __bytes__(self) -> bytes:
        return self.materialise()

    def __iter__(self) -> Any:
        return iter(self.materialise())

    def __contains__(self, item: Any) -> bool:
        return item in self.materialise()

    def __eq__(self, other: object) -> bool:
        return self.materialise() == other

    def __add__(self, other: Any) -> bytes:
        return cast("bytes", self.materialise() + other)

    def __radd__(self, other: Any) -> bytes:
        return cast("bytes", other + self.materialise())

    def __getattr__(self, name: str) -> Any:  # .decode, .startswith, ...: those of the bytes
        if name.startswith("_"):  # a slot not set yet (copy, pickle), or a protocol's probe
            raise AttributeError(name)
        return getattr(self.materialise(), name)

    def __repr__(self) -> str:
        return f"_RangeView({self._key.name!r}, {self._length} bytes)"


def _value(key: FakeKey) -> Any:
    """`FakeKey.value`: a `_RangeView` on a thread serving one range, else moto's own."""
    served = getattr(_serving, "range", None)
    if served is not None:
        return _RangeView(key, *served)
    return _moto_value(key)


def _key_response(self: S3Response, *args: Any, **kwargs: Any) -> Any:
    """moto's ``S3Response.key_response``, with a `_RangeView` it answers with (a range moto
    treats as the whole object) made bytes: werkzeug would iterate anything else."""
    result = _moto_key_response(self, *args, **kwargs)
    if isinstance(result, tuple) and len(result) == 3 and isinstance(result[2], _RangeView):
        result = (result[0], result[1], result[2].materialise())
    return result


def _complete_multipart_upload(self: S3Backend, bucket_name: str, multipart_id: str,
                               body: Any) -> Any:
    """moto's ``complete_multipart_upload``, answering an upload that is not there (aborted, or
    completed and replaced since) with S3's ``404 NoSuchUpload``: moto's own raises a
    ``KeyError`` (a 500)."""
    if multipart_id not in self.get_bucket(bucket_name).multiparts:
        raise NoSuchUpload(upload_id=multipart_id)
    return _moto_complete(self, bucket_name, multipart_id, body)


def _handle_encoded_body(self: S3Response, body: Any) -> bytes:
    """moto's ``S3Response._handle_encoded_body`` (an ``aws-chunked`` body, its trailer
    ignored), in one pass: the chunks joined once, not concatenated one to the next."""
    if not body:
        return b""
    stream = io.BytesIO(body) if isinstance(body, bytes) else body
    chunks = []
    size = int(stream.readline().strip(), 16)  # each chunk: "{size in hex}\r\n{data}\r\n"
    while size > 0:
        chunks.append(stream.read(size))
        stream.readline()
        size = int(stream.readline().strip(), 16)
    return b"".join(chunks)


# Installed once per process (a reload of this module keeps moto's originals).
_moto_value: Callable[[FakeKey], bytes] = getattr(FakeKey.value.fget, "moto_original",
                                                  FakeKey.value.fget)
_moto_key_response: Callable[..., Any] = getattr(S3Response.key_response, "moto_original",
                                                 S3Response.key_response)
_moto_complete: Callable[..., Any] = getattr(S3Backend.complete_multipart_upload, "moto_original",
                                             S3Backend.complete_multipart_upload)
_complete_multipart_upload.moto_original = _moto_complete  # type: ignore[attr-defined]
_value.moto_original = _moto_value  # type: ignore[attr-defined]
_key_response.moto_original = _moto_key_response  # type: ignore[attr-defined]
setattr(FakeKey, "value", property(_value, FakeKey.value.fset))  # noqa: B010 - mypy: a property
setattr(S3Response, "key_response", _key_response)  # noqa: B010
setattr(S3Backend, "complete_multipart_upload", _complete_multipart_upload)  # noqa: B010
_handle_encoded_body.moto_original = getattr(  # type: ignore[attr-defined]
    S3Response._handle_encoded_body, "moto_original", S3Response._handle_encoded_body)
setattr(S3Response, "_handle_encoded_body", _handle_encoded_body)  # noqa: B010


class _CountingInput:
    """``wsgi.input`` that counts the request body bytes read from it."""

    def __init__(self, stream: Any) -> None:
        self._stream = stream
        self.count = 0

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self.count += len(data)
        return cast("bytes", data)

    def readline(self, size: int = -1) -> bytes:
        data = self._stream.readline(size)
        self.count += len(data)
        return cast("bytes", data)

    def readinto(self, buffer: Any) -> int:
        n = self._stream.readinto(buffer) or 0
        self.count += n
        return n


class _Handler(MotoRequestHandler):  # type: ignore[misc]  # untyped library
    """moto's request handler, quiet, and closing the connection when the app drops it."""

    def connection_dropped(self, error: BaseException, environ: Any = None) -> None:
        self.close_connection = True

    def log(self, type: str, message: str, *args: Any) -> None:
        log.debug("%s " + message, self.address_string(), *args)


_accounts = itertools.count(1)


def _new_account_id() -> str:
    """A 12-digit moto account of this endpoint's own (moto obeys MOTO_ACCOUNT_ID first)."""
    return os.environ.get("MOTO_ACCOUNT_ID") or str(900_000_000_000 + next(_accounts))


class S3FaultEndpoint(PlanAndRecord[S3Fault, RequestRecord], Listening):
    """moto's S3 on ``127.0.0.1:<free port>`` behind a deterministic fault plan.

    Start it with ``with S3FaultEndpoint() as ep:`` (or `start`/`stop`). Setup helpers
    (`create_bucket`, `put_object`, `get_object`, `keys`) go to the store directly: no faults,
    no record. Clients built by `pyarrow_fs`, `s3fs`, `boto3_client` have their own retries
    off and dummy credentials set explicitly, so the environment's ``AWS_*`` do not leak in.

    `read_ranges_only` (an attribute too): a GetObject of one range reads that range from the
    store, not the whole object as moto does (the module's docstring); False is moto's own.
    """

    def __init__(self, *, host: str = "127.0.0.1", port: int = 0, region: str = "us-east-1",
                 max_stall: float = 30.0, read_ranges_only: bool = True) -> None:
        self.region = region
        self.max_stall = max_stall
        self.read_ranges_only = read_ranges_only
        self.account_id = _new_account_id()
        self._address = (host, port)
        super().__init__()
        self._seq = itertools.count(1)
        self._stopping = threading.Event()
        self._server: FaultServer | None = None
        self._moto = create_backend_app("s3")

    # -- lifecycle -----------------------------------------------------------------------------

    def start(self) -> S3FaultEndpoint:
        if self._server is not None:
            raise RuntimeError("S3FaultEndpoint already started")
        self._stopping.clear()
        self._server = FaultServer(*self._address, self._app, handler=_Handler,
                                   name="s3-fault-endpoint")
        self._server.serve_in_thread()
        return self

    def stop(self) -> None:
        """Stop serving, end stalls and open connections, join every thread, drop the store."""
        if self._server is None:
            return
        self._stopping.set()
        self._server.stop()
        self._server = None
        self.reset_storage()

    def __enter__(self) -> S3FaultEndpoint:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("S3FaultEndpoint is not started")
        return int(self._server.server_address[1])

    @property
    def host(self) -> str:
        return self._address[0]

    def __repr__(self) -> str:
        state = self.url if self._server is not None else "stopped"
        return f"S3FaultEndpoint({state}, {len(self._plan)} faults)"

    # -- the plan and the record ---------------------------------------------------------------

    def release_stalls(self) -> None:
        """End every stall under way now: each one's connection is reset, as when its time is
        up (a test that has its answer need not wait out the stall it abandoned)."""
        with self._lock:
            ending, self._stopping = self._stopping, threading.Event()
        ending.set()

    def reset(self) -> None:
        """Faults cleared, record emptied, store emptied: a fresh endpoint on the same port."""
        self.clear_faults()
        self.reset_record()
        self.reset_storage()

    # -- the store, without faults ---------------------------------------------------------------

    @property
    def _backend(self) -> Any:
        return s3_backends[self.account_id]["aws"]

    def create_bucket(self, name: str) -> None:
        self._backend.create_bucket(name, self.region)

    def put_object(self, bucket: str, key: str, data: bytes) -> None:
        self._backend.put_object(bucket, key, data)

    def get_object(self, bucket: str, key: str) -> bytes:
        """The stored bytes; KeyError if there is no such object."""
        found = self._backend.get_object(bucket, key)
        if found is None:
            raise KeyError(f"{bucket}/{key}")
        return bytes(found.value)

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """The keys stored in `bucket` under `prefix`, sorted."""
        return sorted(k for k in self._backend.get_bucket(bucket).keys if k.startswith(prefix))

    def reset_storage(self) -> None:
        """Delete every bucket and object of this endpoint (other endpoints keep theirs)."""
        if self.account_id not in s3_backends:
            return
        backend = self._backend
        for name in list(backend.buckets):
            s3_backends.bucket_accounts.pop(name, None)
        backend.buckets.clear()
        for tracked in (getattr(FakeKey, "instances_tracked", ()),
                        getattr(FakeMultipart, "instances_tracked", ())):
            for obj in list(tracked):
                if getattr(obj, "account_id", None) == self.account_id:
                    obj.dispose()
        s3_backends.pop(self.account_id, None)

    # -- clients ---------------------------------------------------------------------------------

    def uri(self, path: str, **params: Any) -> str:
        """An ``s3://`` URI of ``path`` (``bucket/key``) on this endpoint, for ``from_uri``, the
        ``retryfs`` command or anything that takes a URL: credentials in the userinfo,
        ``endpoint_override``/``scheme``/``region`` in the query, then ``params`` as given
        (``retry_max_attempts=8``...)."""
        query = urlencode({"endpoint_override": self.endpoint, "scheme": "http",
                           "region": self.region, **params})
        return f"s3://{ACCESS_KEY}:{SECRET_KEY}@{path.lstrip('/')}?{query}"

    def pyarrow_fs(self, *, max_attempts: int = 1, **kwargs: Any) -> pyarrow.fs.S3FileSystem:
        """A native pyarrow `S3FileSystem` on this endpoint, its own retries reduced to
        `max_attempts` so that faults reach the caller. `kwargs` override (e.g.
        ``request_timeout=1, connect_timeout=1`` for stalls)."""
        options: dict[str, Any] = dict(
            access_key=ACCESS_KEY, secret_key=SECRET_KEY, region=self.region, scheme="http",
            endpoint_override=self.endpoint,
            retry_strategy=pyarrow.fs.AwsStandardS3RetryStrategy(max_attempts=max_attempts))
        options.update(kwargs)
        return pyarrow.fs.S3FileSystem(**options)

    def s3fs(self, *, max_attempts: int = 1, **kwargs: Any) -> _s3fs.S3FileSystem:
        """An `s3fs.S3FileSystem` on this endpoint: botocore's retries and s3fs's own
        reduced to `max_attempts`, a fresh instance (not fsspec's cached one). `config_kwargs`
        are merged into botocore's (e.g. ``{"read_timeout": 1}``), other `kwargs` override."""
        import s3fs

        config = {"retries": {"total_max_attempts": max_attempts, "mode": "standard"},
                  **kwargs.pop("config_kwargs", {})}
        options: dict[str, Any] = dict(
            key=ACCESS_KEY, secret=SECRET_KEY, token=None, endpoint_url=self.url,
            client_kwargs={"region_name": self.region}, config_kwargs=config,
            session=_isolated_session(aio=True), skip_instance_cache=True)
        options.update(kwargs)
        fs = s3fs.S3FileSystem(**options)
        fs.retries = max_attempts  # s3fs's own retry loop: a class attribute, not an argument
        return fs

    def boto3_client(self, *, max_attempts: int = 1, **kwargs: Any) -> Any:
        """A boto3 S3 client on this endpoint, retries reduced to `max_attempts`; a `config`
        is merged over that, other `kwargs` override."""
        import boto3
        from botocore.config import Config

        session = boto3.session.Session(botocore_session=_isolated_session(aio=False))
        config = Config(retries={"total_max_attempts": max_attempts, "mode": "standard"})
        if kwargs.get("config") is not None:
            config = config.merge(kwargs.pop("config"))
        options: dict[str, Any] = dict(
            endpoint_url=self.url, region_name=self.region, aws_access_key_id=ACCESS_KEY,
            aws_secret_access_key=SECRET_KEY, aws_session_token=None, config=config)
        options.update(kwargs)
        return session.client("s3", **options)

    # -- the WSGI layer --------------------------------------------------------------------------

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        request = _parse(environ)
        environ["HTTP_X_MOTO_ACCOUNT_ID"] = self.account_id  # this endpoint's own store
        body = environ["wsgi.input"] = _CountingInput(environ["wsgi.input"])
        fault = self._choose(request)
        kind = fault.kind if fault is not None else None

        if fault is not None and kind == "lost":
            return self._lose(request, fault, body, environ, start_response)
        if fault is None or fault.applied or kind in ("truncate", "delay"):
            if kind == "delay":
                self._stopping.wait(min(fault.seconds, self.max_stall))  # type: ignore[union-attr]
            status, headers, payload = self._call_moto(
                environ, ranged=_one_range(request) if self.read_ranges_only else None)
            if fault is None or kind == "delay":
                self._log(request, fault, body, status, len(payload))
                start_response(_status_line(status), headers)
                return [payload]
        else:
            _drain(environ)
        assert fault is not None

        if kind in ("error", "error_in_200"):
            payload = b"" if request.method == "HEAD" else _error_xml(fault, request)
            headers = [("Content-Type", "application/xml"), ("x-amz-request-id", _request_id()),
                       ("Content-Length", str(len(payload)))]
            if fault.retry_after is not None:
                headers.append(("Retry-After", f"{fault.retry_after:g}"))
            self._log(request, fault, body, fault.status, len(payload))
            start_response(_status_line(fault.status), headers)
            return [payload]
        if kind == "truncate":
            keep = len(payload) // 2 if fault.keep_bytes is None else fault.keep_bytes
            keep = min(keep, max(len(payload) - 1, 0))
            self._log(request, fault, body, status, keep)
            start_response(_status_line(status), _with_length(headers, len(payload)))
            return _then_drop(payload[:keep])

        # reset, stall: the request was read; answer nothing, then reset the connection
        self._log(request, fault, body, None, 0)
        if kind == "stall":
            self._stopping.wait(min(fault.seconds, self.max_stall))
        assert self._server is not None
        self._server.abort(environ["werkzeug.socket"])
        raise _Drop(f"fault: {fault!r}")

    def _lose(self, request: S3Request, fault: S3Fault, body: _CountingInput,
              environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        """Serve the request, answer moto's real response, then put the key back as it was."""
        store = self._backend.get_bucket(request.bucket).keys
        old = store.get(request.key) if request.key in store else None
        # moto disposes of an overwritten key's buffer: keep its bytes and metadata now
        before = None if old is None else (bytes(old.value), old.etag.strip('"'),
                                           old.last_modified)
        status, headers, payload = self._call_moto(environ)
        if before is None:
            if request.key in store:
                del store[request.key]
        else:
            value, etag, modified = before
            restored = self._backend.put_object(request.bucket, request.key, value)
            restored._etag, restored.last_modified = etag, modified  # the older object
        self._log(request, fault, body, status, len(payload))
        start_response(_status_line(status), headers)
        return [payload]

    def _choose(self, request: S3Request) -> S3Fault | None:
        with self._lock:
            for armed in self._plan:
                if armed.fires(request):
                    return cast("S3Fault | None", armed.fault)
        return None

    def _call_moto(self, environ: dict[str, Any], *, ranged: tuple[int, int | None] | None = None,
                   ) -> tuple[int, list[tuple[str, str]], bytes]:
        """moto's answer to `environ`; `ranged`: the range of a GetObject of one (`_one_range`)."""
        captured: list[Any] = []

        def start_response(status: str, headers: list[tuple[str, str]],
                           exc_info: Any = None) -> Callable[[bytes], None]:
            captured[:] = [status, headers]
            return captured.append

        _serving.range = ranged
        try:
            result = self._moto(environ, start_response)
        finally:
            _serving.range = None
        try:
            payload = b"".join(result)
        finally:
            getattr(result, "close", lambda: None)()
        return int(captured[0].split(None, 1)[0]), list(captured[1]), payload

    def _log(self, request: S3Request, fault: S3Fault | None, body: _CountingInput,
             status: int | None, sent: int) -> None:
        with self._lock:
            self._record.append(RequestRecord(
                **vars(request), seq=next(self._seq), status=status, fault=fault,
                request_bytes=body.count, response_bytes=sent))
        if fault is not None:
            log.info("S3 fault endpoint: %s %s (%s) -> %r", request.method, request.path,
                     request.op, fault)


def _parse(environ: Mapping[str, Any]) -> S3Request:
    uri = urlsplit(environ.get("REQUEST_URI") or environ.get("RAW_URI") or "/")
    bucket, _, key = unquote(uri.path).lstrip("/").partition("/")
    query = dict(parse_qsl(uri.query, keep_blank_values=True))
    headers = {name[5:].replace("_", "-").lower(): value for name, value in environ.items()
               if name.startswith("HTTP_") and name != "HTTP_AUTHORIZATION"}
    for name in ("CONTENT_LENGTH", "CONTENT_TYPE"):  # WSGI keeps these two without HTTP_
        if environ.get(name):
            headers[name.replace("_", "-").lower()] = environ[name]
    method = str(environ["REQUEST_METHOD"]).upper()
    return S3Request(method=method, bucket=bucket, key=key, query=query, headers=headers,
                     op=operation_name(method, bucket, key, query, headers))


def _drain(environ: Mapping[str, Any]) -> None:
    """Read the request body we are not going to hand to moto, so the client is done sending."""
    from werkzeug.wsgi import get_input_stream

    stream = get_input_stream(dict(environ), safe_fallback=True)
    while stream.read(1 << 20):
        pass


def _error_xml(fault: S3Fault, request: S3Request) -> bytes:
    extra = f"<BucketName>{escape(request.bucket)}</BucketName>" if "Bucket" in fault.code \
        else f"<Key>{escape(request.key)}</Key>" if fault.code == "NoSuchKey" else ""
    return ('<?xml version="1.0" encoding="UTF-8"?>\n'
            f"<Error><Code>{escape(fault.code)}</Code><Message>{escape(fault.message)}</Message>"
            f"{extra}<Resource>/{escape(request.path)}</Resource>"
            f"<RequestId>{_request_id()}</RequestId><HostId>retryfs-fault</HostId></Error>"
            ).encode()


def _with_length(headers: list[tuple[str, str]], length: int) -> list[tuple[str, str]]:
    return [(k, v) for k, v in headers if k.lower() != "content-length"] + [
        ("Content-Length", str(length))]


#: botocore's data loader (service models, endpoints) by data path, shared by the sessions
#: below: a fresh session parses the JSON models again, about 0.3 s of CPU for each new client.
_LOADERS: dict[Any, Any] = {}
_LOADERS_LOCK = threading.Lock()


def _isolated_session(*, aio: bool) -> Any:
    """A botocore (or aiobotocore) session that reads no ``AWS_*`` profile or config file,
    with the process's one data loader (models are read-only: one session shares its loader
    between all its clients the same way)."""
    from botocore.loaders import create_loader

    if aio:
        from aiobotocore.session import AioSession as Session
    else:
        from botocore.session import Session
    # (config name, env vars, default, conversion): no env var, no file
    session = Session(session_vars={"profile": (None, None, None, None),
                                    "config_file": (None, None, os.devnull, None),
                                    "credentials_file": (None, None, os.devnull, None)})
    data_path = session.get_config_variable("data_path")
    with _LOADERS_LOCK:
        loader = _LOADERS.get(data_path) or _LOADERS.setdefault(data_path,
                                                                 create_loader(data_path))
    session.register_component("data_loader", loader)
    return session


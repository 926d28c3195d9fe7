"""A fault proxy for any HTTP object store: faults between the client and a real server.

`HttpFaultProxy` listens on a loopback port and forwards every request to an upstream server (a
GCS emulator, Azurite, a MinIO, anything speaking HTTP), after consulting a plan of `HttpFault`
rules: the same plan language as `S3FaultEndpoint` (match by operation, method, path glob, query,
predicate; fire on the n-th match, the first N, or with a seeded probability; ``applied`` for an
outcome the store executed before the answer was lost). A `Dialect` names each request's
operation and shapes error bodies the way the provider does — GCS JSON errors
(``{"error": {"code": 503, ..., "errors": [{"reason": "backendError"}]}}``), Azure XML
(``<Error><Code>ServerBusy</Code>`` with ``x-ms-error-code``) — so the real client raises the
very error it would raise against the cloud.

    with HttpFaultProxy("http://127.0.0.1:4443", GCS) as proxy:
        proxy.add_fault(HttpFault.unavailable(op="objects.insert", times=2))
        ...  # point the client at proxy.url
        assert proxy.counts()["objects.insert"] == 3

Every request is recorded (`requests`, `counts`, `injected`, request and response bytes) before
its response is sent. Bodies are buffered whole: this is for tests, not for terabytes.
"""

from __future__ import annotations

import http.client
import itertools
import json
import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal, cast
from urllib.parse import parse_qsl, unquote, urlsplit
from xml.sax.saxutils import escape

from ._match import FaultRule
from ._plan import PlanAndRecord
from ._wire import (
    RAW_HEADERS,
    Drop,
    FaultServer,
    Listening,
    read_body,
    request_id,
    status_line,
    then_drop,
)

__all__ = ["AZURE", "GCS", "Dialect", "HttpFault", "HttpFaultProxy", "HttpRecord", "HttpRequest"]

log = logging.getLogger(__name__)

FaultKind = Literal["error", "reset", "truncate", "stall", "delay"]
_KINDS = frozenset(FaultKind.__args__)  # type: ignore[attr-defined]
_HOP_BY_HOP = frozenset("connection keep-alive proxy-authenticate proxy-authorization te trailers "
                        "transfer-encoding upgrade content-length".split())


@dataclass(frozen=True)
class HttpRequest:
    """What arrived: the fields a rule can match on."""

    method: str
    path: str  # the store's object path, e.g. ``bucket/key`` or ``container/blob``
    query: Mapping[str, str]
    headers: Mapping[str, str]  # lower-case names, Authorization left out
    op: str
    url_path: str = ""  # the request's own path, unquoted


@dataclass(frozen=True)
class HttpRecord(HttpRequest):
    """One request and what the proxy did with it."""

    seq: int = 0
    status: int | None = None  # None: no status line was sent (reset, stall)
    fault: HttpFault | None = None
    request_bytes: int = 0
    response_bytes: int = 0  # body bytes sent (a truncated body counts what was sent)


class Dialect:
    """How one provider names operations and writes errors. Subclass for another store."""

    name = "http"
    #: Operation names `operation` can return; a fault naming another one is a typo.
    operations: frozenset[str] = frozenset()
    #: status -> (code, message) of the provider's usual error for that status.
    codes: Mapping[int, tuple[str, str]] = {}
    #: Answer ``Expect: 100-continue`` with an interim 100 (curl waits for one, 1 s at most).
    send_continue = True
    #: Say "Connection: close" on the response after which the proxy closes the connection.
    announce_close = True

    def parse(self, method: str, url_path: str, query: Mapping[str, str],
              headers: Mapping[str, str]) -> tuple[str, str]:
        """``(store path, operation name)`` of a request."""
        return url_path.lstrip("/"), f"{method} {url_path}"

    def default(self, status: int) -> tuple[str, str]:
        return self.codes.get(status, (str(status), status_line(status).split(" ", 1)[1]))

    def error(self, status: int, code: str, message: str,
              request: HttpRequest) -> tuple[list[tuple[str, str]], bytes]:
        """The headers and body of an error response."""
        body = json.dumps({"error": {"code": status, "message": message}}).encode()
        return [("Content-Type", "application/json")], body

    def __repr__(self) -> str:
        return f"<{self.name} dialect>"


class GcsDialect(Dialect):
    """Google Cloud Storage's JSON API (what gcsfs and google-cloud-cpp speak)."""

    name = "gcs"
    operations = frozenset("""buckets.list buckets.insert buckets.get buckets.delete
        buckets.patch objects.list objects.get objects.download objects.insert objects.delete
        objects.patch objects.rewrite objects.copy objects.move objects.compose uploads.start uploads.put
        uploads.cancel""".split())
    codes = {
        400: ("invalid", "Invalid request"),
        401: ("required", "Login Required"),
        403: ("forbidden", "Forbidden: the caller does not have storage.objects.get access"),
        404: ("notFound", "No such object"),
        408: ("requestTimeout", "Request Timeout"),
        409: ("conflict", "Conflict"),
        412: ("conditionNotMet", "Precondition Failed"),
        429: ("rateLimitExceeded", "The rate of change requests to the object is too high"),
        500: ("backendError", "Backend Error"),
        502: ("badGateway", "Bad Gateway"),
        503: ("backendError", "Backend Error"),
        504: ("gatewayTimeout", "Gateway Timeout"),
    }
    _OBJECT = re.compile(r"/(?:(upload|download)/)?storage/v1/b/([^/]+)/o(?:/(.+?))?"
                         r"(?:/(rewriteTo|copyTo)/b/[^/]+/o/.+|/(moveTo)/o/.+|/(compose))?$")
    _BUCKET = re.compile(r"/storage/v1/b(?:/([^/]+))?$")

    def parse(self, method: str, url_path: str, query: Mapping[str, str],
              headers: Mapping[str, str]) -> tuple[str, str]:
        found = self._OBJECT.match(url_path)
        if found:
            kind, bucket, name, action, move, compose = found.groups()
            name = name or query.get("name")  # an upload names its object in the query
            path = f"{bucket}/{name}" if name else bucket
            if move:
                return path, "objects.move"
            if compose or action:
                return path, "objects.compose" if compose else (
                    "objects.rewrite" if action == "rewriteTo" else "objects.copy")
            if kind == "upload":
                if method == "POST" and query.get("uploadType") == "resumable" \
                        and "upload_id" not in query:
                    return path, "uploads.start"
                if "upload_id" in query:
                    return path, "uploads.cancel" if method == "DELETE" else "uploads.put"
                return path, "objects.insert"
            if kind == "download" or query.get("alt") == "media":
                return path, "objects.download"
            if name is None:
                return path, "objects.list"
            return path, {"GET": "objects.get", "DELETE": "objects.delete",
                          "PATCH": "objects.patch", "PUT": "objects.patch"}.get(method, method)
        found = self._BUCKET.match(url_path)
        if found:
            (bucket,) = found.groups()
            if bucket is None:
                return "", "buckets.insert" if method == "POST" else "buckets.list"
            return bucket, {"GET": "buckets.get", "DELETE": "buckets.delete",
                            "PATCH": "buckets.patch"}.get(method, method)
        bucket, _, name = url_path.lstrip("/").partition("/")  # the XML API
        return url_path.lstrip("/"), "objects.download" if method == "GET" and name else \
            f"{method} {url_path}"

    def error(self, status: int, code: str, message: str,
              request: HttpRequest) -> tuple[list[tuple[str, str]], bytes]:
        body = json.dumps({"error": {"code": status, "message": message, "errors": [
            {"message": message, "domain": "global", "reason": code}]}}).encode()
        return [("Content-Type", "application/json; charset=UTF-8")], body


class AzureDialect(Dialect):
    """Azure Blob Storage's REST API, path-style (``/account/container/blob``, as on Azurite)."""

    name = "azure"
    send_continue = False  # the Azure C++ SDK sends its body at once and reads no interim 100
    announce_close = False  # the Azure C++ SDK drops the body of a "Connection: close" answer
    operations = frozenset("""ListContainers GetServiceProperties GetAccountInfo CreateContainer
        DeleteContainer GetContainerProperties GetAccessControl ListBlobs SubmitBatch PutBlob
        PutBlock PutBlockList GetBlockList LeaseBlob CopyBlob GetBlob GetBlobProperties
        DeleteBlob SetBlobMetadata SetBlobProperties AppendBlock""".split())
    codes = {
        400: ("InvalidInput", "One of the request inputs is not valid."),
        403: ("AuthorizationPermissionMismatch",
              "This request is not authorized to perform this operation using this permission."),
        404: ("BlobNotFound", "The specified blob does not exist."),
        409: ("LeaseIdMissing", "There is currently a lease on the blob and no lease ID was "
              "specified in the request."),
        412: ("ConditionNotMet", "The condition specified using HTTP conditional header(s) is "
              "not met."),
        429: ("ServerBusy", "The server is busy."),
        500: ("InternalError", "The server encountered an internal error. Please retry the "
              "request."),
        503: ("ServerBusy", "The server is currently unable to receive requests. Please retry "
              "your request."),
    }

    def parse(self, method: str, url_path: str, query: Mapping[str, str],
              headers: Mapping[str, str]) -> tuple[str, str]:
        parts = url_path.lstrip("/").split("/", 2)
        container = parts[1] if len(parts) > 1 else ""
        blob = parts[2] if len(parts) > 2 else ""
        path = f"{container}/{blob}" if blob else container
        comp = query.get("comp")
        if not container:
            return path, {"list": "ListContainers"}.get(comp or "", "GetServiceProperties"
                                                        if query.get("restype") == "service"
                                                        else "GetAccountInfo")
        if not blob:
            if comp == "list":
                return path, "ListBlobs"
            if comp == "batch":  # a POST of many requests in one body (pyarrow's deletes)
                return path, "SubmitBatch"
            if query.get("action") == "getAccessControl":  # the hierarchical-namespace probe
                return path, "GetAccessControl"
            return path, {"PUT": "CreateContainer", "DELETE": "DeleteContainer"}.get(
                method, "GetContainerProperties")
        if method == "PUT":
            if comp == "block":
                return path, "PutBlock"
            if comp == "blocklist":
                return path, "PutBlockList"
            if comp == "appendblock":
                return path, "AppendBlock"
            if comp == "lease":  # pyarrow's delete_file takes one on the blob it deletes
                return path, "LeaseBlob"
            if comp in ("metadata", "properties"):
                return path, "SetBlobMetadata" if comp == "metadata" else "SetBlobProperties"
            return path, "CopyBlob" if "x-ms-copy-source" in headers else "PutBlob"
        if method == "GET" and comp == "blocklist":
            return path, "GetBlockList"
        return path, {"GET": "GetBlob", "HEAD": "GetBlobProperties",
                      "DELETE": "DeleteBlob"}.get(method, method)

    def error(self, status: int, code: str, message: str,
              request: HttpRequest) -> tuple[list[tuple[str, str]], bytes]:
        rid = request_id()
        body = b"" if request.method == "HEAD" else (
            '<?xml version="1.0" encoding="utf-8"?>'
            f"<Error><Code>{escape(code)}</Code><Message>{escape(message)}\n"
            f"RequestId:{rid}\nTime:2026-01-01T00:00:00.0000000Z</Message></Error>").encode()
        headers = [("x-ms-error-code", code), ("x-ms-request-id", rid),
                   ("x-ms-version", "2025-01-05")]
        if body:  # a HEAD error has headers only, as Azure sends it
            headers.append(("Content-Type", "application/xml"))
        return headers, body


GCS = GcsDialect()
AZURE = AzureDialect()


@dataclass(frozen=True, eq=False, repr=False)  # FaultRule's repr
class HttpFault(FaultRule):
    """One rule of a fault plan (the fields of `S3Fault`; `code`/`message` default to the
    dialect's usual ones for `status`). Build one with the constructors, which take the matching
    fields (`op`, `method`, `path`, `query`, `when`) and the firing ones (`nth`, `times`,
    `probability`, `seed`) as keywords."""

    KINDS: ClassVar[frozenset[str]] = _KINDS
    kind: FaultKind
    when: Callable[[HttpRequest], bool] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 100 <= self.status <= 599:
            raise ValueError(f"status: must be an HTTP status (100..599), got {self.status}")

    # -- constructors ----------------------------------------------------------------------------

    @classmethod
    def error(cls, status: int, code: str | None = None, message: str | None = None, *,
              retry_after: float | None = None, **match: Any) -> HttpFault:
        """An error response shaped by the proxy's dialect (GCS JSON, Azure XML)."""
        return cls("error", status=status, code=code, message=message, retry_after=retry_after,
                   **match)

    @classmethod
    def internal_error(cls, **match: Any) -> HttpFault:
        """500 (GCS ``backendError``, Azure ``InternalError``): transient."""
        return cls.error(500, **match)

    @classmethod
    def unavailable(cls, *, retry_after: float | None = None, **match: Any) -> HttpFault:
        """503 (GCS ``backendError``, Azure ``ServerBusy``): transient."""
        return cls.error(503, retry_after=retry_after, **match)

    @classmethod
    def server_busy(cls, **match: Any) -> HttpFault:
        """503 ``ServerBusy``: Azure's throttle."""
        return cls.error(503, "ServerBusy", **match)

    @classmethod
    def too_many_requests(cls, *, retry_after: float | None = None, **match: Any) -> HttpFault:
        """429 (GCS ``rateLimitExceeded``): throttling."""
        return cls.error(429, retry_after=retry_after, **match)

    @classmethod
    def forbidden(cls, **match: Any) -> HttpFault:
        """403 (GCS ``forbidden``, Azure ``AuthorizationPermissionMismatch``): permanent."""
        return cls.error(403, **match)

    @classmethod
    def not_found(cls, **match: Any) -> HttpFault:
        """404: permanent."""
        return cls.error(404, **match)

    @classmethod
    def precondition_failed(cls, **match: Any) -> HttpFault:
        """412 (GCS ``conditionNotMet``, Azure ``ConditionNotMet``): permanent."""
        return cls.error(412, **match)

    @classmethod
    def conflict(cls, code: str | None = None, **match: Any) -> HttpFault:
        """409: permanent."""
        return cls.error(409, code, **match)


class HttpFaultProxy(PlanAndRecord[HttpFault, HttpRecord], Listening):
    """A loopback reverse proxy to `upstream` (``http://host:port``) with a fault plan.

    `dialect` (`GCS`, `AZURE`, or a `Dialect` of your own) names operations and shapes error
    bodies; a fault naming an operation the dialect does not know is refused. Start it with
    ``with HttpFaultProxy(...) as proxy:`` (or `start`/`stop`); its `url` is what the client
    takes. Start the proxy before a server that must know its public address (an emulator's
    upload ``Location`` URLs): `port` is known once it is started.
    """

    def __init__(self, upstream: str | None = None, dialect: Dialect = GCS, *,
                 host: str = "127.0.0.1", port: int = 0, max_stall: float = 30.0,
                 timeout: float = 60.0) -> None:
        self.dialect = dialect
        self.max_stall = max_stall
        self.timeout = timeout
        self.upstream = upstream
        self._address = (host, port)
        super().__init__()
        self._seq = itertools.count(1)
        self._stopping = threading.Event()
        self._server: FaultServer | None = None
        self._local = threading.local()

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> HttpFaultProxy:
        if self._server is not None:
            raise RuntimeError("HttpFaultProxy already started")
        self._stopping.clear()
        self._server = FaultServer(*self._address, self._app, name=f"{self.dialect.name}-proxy")
        self._server.send_continue = self.dialect.send_continue
        self._server.announce_close = self.dialect.announce_close
        self._server.serve_in_thread()
        return self

    def stop(self) -> None:
        """Stop serving, end stalls and open connections, join every thread."""
        if self._server is None:
            return
        self._stopping.set()
        self._server.stop()
        self._server = None

    def __enter__(self) -> HttpFaultProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._server is None:
            raise RuntimeError("HttpFaultProxy is not started")
        return int(self._server.server_address[1])

    @property
    def host(self) -> str:
        return self._address[0]

    def __repr__(self) -> str:
        state = f"{self.url} -> {self.upstream}" if self._server is not None else "stopped"
        return f"HttpFaultProxy({self.dialect.name}, {state}, {len(self._plan)} faults)"

    # -- the plan and the record -------------------------------------------------------------------

    def add_fault(self, fault: HttpFault) -> HttpFault:
        """Append `fault` to the plan (after the rules already there); returns it."""
        known = self.dialect.operations
        unknown = sorted(fault.ops - known) if known else []
        if unknown:
            raise ValueError(f"op: unknown {self.dialect.name} operation(s) {unknown}; "
                             f"known: {sorted(known)}")
        return super().add_fault(fault)

    def reset(self) -> None:
        """Faults cleared, record emptied (the upstream store keeps its data)."""
        self.clear_faults()
        self.reset_record()

    # -- the WSGI layer ----------------------------------------------------------------------------

    def _app(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        request = self._parse(environ)
        body = read_body(environ)
        fault = self._choose(request)
        kind = fault.kind if fault is not None else None

        if fault is None or fault.applied or kind in ("truncate", "delay"):
            if kind == "delay":
                self._stopping.wait(min(fault.seconds, self.max_stall))  # type: ignore[union-attr]
            status, headers, payload = self._forward(environ, body)
            if fault is None or kind == "delay":
                self._log(request, fault, len(body), status, len(payload))
                start_response(status_line(status), _with_length(headers, payload, request))
                return [payload]
        assert fault is not None

        if kind == "error":
            code, message = self.dialect.default(fault.status)
            headers, payload = self.dialect.error(fault.status, fault.code or code,
                                                  fault.message or message, request)
            if request.method == "HEAD":
                payload = b""
            headers.append(("Content-Length", str(len(payload))))
            if fault.retry_after is not None:
                headers.append(("Retry-After", f"{fault.retry_after:g}"))
            self._log(request, fault, len(body), fault.status, len(payload))
            start_response(status_line(fault.status), headers)
            return [payload]
        if kind == "truncate":
            keep = len(payload) // 2 if fault.keep_bytes is None else fault.keep_bytes
            keep = min(keep, max(len(payload) - 1, 0))
            self._log(request, fault, len(body), status, keep)
            start_response(status_line(status), _with_length(headers, payload, request))
            return then_drop(payload[:keep])

        # reset, stall: the request was read; answer nothing, then reset the connection
        self._log(request, fault, len(body), None, 0)
        if kind == "stall":
            self._stopping.wait(min(fault.seconds, self.max_stall))
        assert self._server is not None
        self._server.abort(environ["werkzeug.socket"])
        raise Drop(f"fault: {fault!r}")

    def _parse(self, environ: Mapping[str, Any]) -> HttpRequest:
        uri = urlsplit(environ.get("REQUEST_URI") or environ.get("RAW_URI") or "/")
        url_path = unquote(uri.path)
        query = dict(parse_qsl(uri.query, keep_blank_values=True))
        headers = {name.lower(): value for name, value in environ[RAW_HEADERS]
                   if name.lower() != "authorization"}
        method = str(environ["REQUEST_METHOD"]).upper()
        path, op = self.dialect.parse(method, url_path, query, headers)
        return HttpRequest(method=method, path=path, query=query, headers=headers, op=op,
                           url_path=url_path)

    def _choose(self, request: HttpRequest) -> HttpFault | None:
        with self._lock:
            for armed in self._plan:
                if armed.fires(request):
                    return cast("HttpFault | None", armed.fault)
        return None

    def _connection(self) -> http.client.HTTPConnection:
        if self.upstream is None:
            raise RuntimeError("HttpFaultProxy has no upstream: set proxy.upstream")
        split = urlsplit(self.upstream)
        key = (split.hostname, split.port)
        conn = getattr(self._local, "conn", None)
        if conn is None or getattr(self._local, "key", None) != key:
            conn = http.client.HTTPConnection(split.hostname or "127.0.0.1", split.port,
                                              timeout=self.timeout)
            self._local.conn, self._local.key = conn, key
        return conn

    def _forward(self, environ: Mapping[str, Any],
                 body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
        uri = environ.get("REQUEST_URI") or environ.get("RAW_URI") or "/"
        # as the client sent them: a signed request (Azure SharedKey) covers most headers
        raw = environ[RAW_HEADERS]
        headers = {name: value for name, value in raw
                   if name.lower() not in _HOP_BY_HOP and name.lower() != "expect"}
        chunked = any(name.lower() == "transfer-encoding" and "chunked" in value.lower()
                      for name, value in raw)
        if chunked:
            headers["Transfer-Encoding"] = "chunked"
        elif any(name.lower() == "content-length" for name, _ in raw) or body:
            headers["Content-Length"] = str(len(body))
        method = str(environ["REQUEST_METHOD"])
        for attempt in (1, 2):  # a kept-alive upstream connection may have been closed
            conn = self._connection()
            try:
                conn.request(method, uri, body=[body] if chunked else body, headers=headers,
                             encode_chunked=chunked)
                response = conn.getresponse()
                payload = response.read()
                break
            except (ConnectionError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise
        out = [(k, v) for k, v in response.getheaders() if k.lower() not in _HOP_BY_HOP]
        if method.upper() == "HEAD":
            length = response.getheader("Content-Length")
            if length is not None:
                out.append(("Content-Length", length))
        upstream, public = self.upstream or "", self.url
        out = [(k, v.replace(upstream, public) if k.lower() == "location" else v)
               for k, v in out]
        return response.status, out, payload

    def _log(self, request: HttpRequest, fault: HttpFault | None, received: int,
             status: int | None, sent: int) -> None:
        with self._lock:
            self._record.append(HttpRecord(
                **vars(request), seq=next(self._seq), status=status, fault=fault,
                request_bytes=received, response_bytes=sent))
        if fault is not None:
            log.info("%s fault proxy: %s %s (%s) -> %r", self.dialect.name, request.method,
                     request.path, request.op, fault)


def _with_length(headers: list[tuple[str, str]], payload: bytes,
                 request: HttpRequest) -> list[tuple[str, str]]:
    if request.method == "HEAD":
        return headers  # a HEAD keeps the upstream's Content-Length (the object's size)
    return [(k, v) for k, v in headers if k.lower() != "content-length"] + [
        ("Content-Length", str(len(payload)))]

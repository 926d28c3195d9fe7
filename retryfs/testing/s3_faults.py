"""The fault plan of `retryfs.testing.S3FaultEndpoint`: S3 requests, their operation names, the
`S3Fault` rules (what fails, when, how). Plain data: no moto needed to build a plan.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, Literal

from ._match import FaultRule

__all__ = ["OPERATIONS", "FaultKind", "RequestRecord", "S3Fault", "S3Request", "operation_name"]

FaultKind = Literal["error", "error_in_200", "reset", "truncate", "stall", "delay", "lost"]
_KINDS = frozenset(FaultKind.__args__)  # type: ignore[attr-defined]

#: Operations `operation_name` derives; an `S3Fault(op=...)` outside this set (and outside the
#: generic ``{Get,Put,Delete}{Bucket,Object}<Subresource>`` names) is a typo and is refused.
OPERATIONS = frozenset(
    """ListBuckets CreateBucket DeleteBucket HeadBucket ListObjects ListObjectsV2
    ListObjectVersions ListMultipartUploads GetBucketLocation DeleteObjects PutObject GetObject
    HeadObject DeleteObject CopyObject CreateMultipartUpload UploadPart UploadPartCopy
    CompleteMultipartUpload AbortMultipartUpload ListParts RestoreObject""".split()
)
_GENERIC_OP = re.compile(r"(Get|Put|Delete)(Bucket|Object)[A-Z][A-Za-z]*")
# the query parameters that select an S3 subresource (the generic operation names above)
_SUBRESOURCES = frozenset("""accelerate acl analytics attributes cors encryption
    intelligent-tiering inventory legal-hold lifecycle logging metrics notification object-lock
    ownershipControls policy policyStatus publicAccessBlock replication requestPayment retention
    tagging torrent versioning website""".split())


@dataclass(frozen=True)
class S3Request:
    """What arrived: the fields a rule can match on (path-style addressing)."""

    method: str
    bucket: str
    key: str
    query: Mapping[str, str]
    headers: Mapping[str, str]  # lower-case names, Authorization left out
    op: str

    @property
    def path(self) -> str:
        """``bucket/key`` (``bucket`` alone for bucket operations), the string globs match."""
        return f"{self.bucket}/{self.key}" if self.key else self.bucket


@dataclass(frozen=True)
class RequestRecord(S3Request):
    """One request and what the endpoint did with it."""

    seq: int = 0
    status: int | None = None  # None: no status line was sent (reset, stall)
    fault: S3Fault | None = None
    request_bytes: int = 0
    response_bytes: int = 0  # body bytes sent (a truncated body counts what was sent)


def operation_name(method: str, bucket: str, key: str, query: Mapping[str, str],
                   headers: Mapping[str, str]) -> str:
    """The S3 API operation a path-style request calls, e.g. ``UploadPart``."""
    method = method.upper()
    if not bucket:
        return "ListBuckets" if method == "GET" else f"{method} /"
    copy = "x-amz-copy-source" in headers
    if key:
        if "uploadId" in query:
            return {
                "PUT": "UploadPartCopy" if copy else "UploadPart",
                "POST": "CompleteMultipartUpload",
                "DELETE": "AbortMultipartUpload",
                "GET": "ListParts",
            }.get(method, f"{method} uploadId")
        if method == "POST" and "uploads" in query:
            return "CreateMultipartUpload"
        if method == "POST" and "restore" in query:
            return "RestoreObject"
        if method == "PUT" and copy and not _subresource(query):
            return "CopyObject"
        simple = {"PUT": "PutObject", "GET": "GetObject", "HEAD": "HeadObject",
                  "DELETE": "DeleteObject"}
        return _with_subresource(method, "Object", query) or simple.get(method, method)
    if method == "GET":
        if query.get("list-type") == "2":
            return "ListObjectsV2"
        for name, op in (("uploads", "ListMultipartUploads"), ("versions", "ListObjectVersions"),
                         ("location", "GetBucketLocation")):
            if name in query:
                return op
        return _with_subresource(method, "Bucket", query) or "ListObjects"
    if method == "POST" and "delete" in query:
        return "DeleteObjects"
    simple = {"PUT": "CreateBucket", "DELETE": "DeleteBucket", "HEAD": "HeadBucket"}
    return _with_subresource(method, "Bucket", query) or simple.get(method, method)


def _subresource(query: Mapping[str, str]) -> str | None:
    """The first S3 subresource named in the query (``?tagging``, ``?acl``...)."""
    return next((name for name in query if name in _SUBRESOURCES), None)


def _with_subresource(method: str, what: str, query: Mapping[str, str]) -> str | None:
    sub = _subresource(query)
    verb = {"GET": "Get", "PUT": "Put", "DELETE": "Delete"}.get(method)
    if sub is None or verb is None:
        return None
    camel = "".join(part[:1].upper() + part[1:] for part in sub.split("-"))
    return f"{verb}{what}{camel}"


_ERROR_MESSAGES = {
    "InternalError": "We encountered an internal error. Please try again.",
    "SlowDown": "Please reduce your request rate.",
    "ServiceUnavailable": "Service is unable to handle request.",
    "TooManyRequests": "Please reduce your request rate.",
    "AccessDenied": "Access Denied",
    "NoSuchBucket": "The specified bucket does not exist",
    "NoSuchKey": "The specified key does not exist.",
}


@dataclass(frozen=True, eq=False, repr=False)  # FaultRule's repr
class S3Fault(FaultRule):
    """One rule of a fault plan: which requests it matches, when it fires, what it does.

    Matching (all given conditions must hold): `op` (one name or several, see
    `operation_name`), `method`, `path` (a glob on ``bucket/key``, or a compiled regex searched
    in it), `query` (name -> value; ``True``: present, ``False``: absent), `when` (a predicate).
    Firing: from the `nth` matching request on (1-based), at most `times` times (default: once
    when `nth` is given, else unlimited), each eligible match drawn with `probability` from a
    ``random.Random(seed)``: the same requests in the same order get the same faults.
    `applied`: moto executes the request first and the fault replaces its answer (the change
    happened, the client cannot tell), the ambiguous outcome a retry has to reconcile.

    Build one with the constructors (`slow_down`, `reset`, `truncate`, ...), which take the
    matching and firing fields as keywords.
    """

    KINDS: ClassVar[frozenset[str]] = _KINDS
    kind: FaultKind
    code: str = "InternalError"
    message: str = ""
    when: Callable[[S3Request], bool] | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        for op in self.ops:
            if op not in OPERATIONS and not _GENERIC_OP.fullmatch(op):
                raise ValueError(f"op: unknown S3 operation {op!r}; known: {sorted(OPERATIONS)}")
        if not self.message and self.kind in ("error", "error_in_200"):
            object.__setattr__(self, "message", _ERROR_MESSAGES.get(self.code, self.code))

    def _effect(self) -> str:
        if self.kind == "error_in_200":
            return f"200 <Error>{self.code}"
        return super()._effect()

    # -- constructors: `match` takes the matching and firing fields above -------------------

    @classmethod
    def error(cls, status: int, code: str, message: str = "", *,
              retry_after: float | None = None, **match: Any) -> S3Fault:
        """An S3 XML error response, ``<Error><Code>code</Code>...``."""
        return cls("error", status=status, code=code, message=message, retry_after=retry_after,
                   **match)

    @classmethod
    def internal_error(cls, **match: Any) -> S3Fault:
        """500 InternalError: transient."""
        return cls.error(500, "InternalError", **match)

    @classmethod
    def slow_down(cls, *, retry_after: float | None = None, **match: Any) -> S3Fault:
        """503 SlowDown: S3's throttle."""
        return cls.error(503, "SlowDown", retry_after=retry_after, **match)

    @classmethod
    def service_unavailable(cls, *, retry_after: float | None = None, **match: Any) -> S3Fault:
        """503 ServiceUnavailable: transient."""
        return cls.error(503, "ServiceUnavailable", retry_after=retry_after, **match)

    @classmethod
    def too_many_requests(cls, code: str = "TooManyRequests", *,
                          retry_after: float | None = None, **match: Any) -> S3Fault:
        """429 throttle (S3-compatible stores send it; ``code="SlowDown"`` for some)."""
        return cls.error(429, code, retry_after=retry_after, **match)

    @classmethod
    def access_denied(cls, **match: Any) -> S3Fault:
        """403 AccessDenied: permanent."""
        return cls.error(403, "AccessDenied", **match)

    @classmethod
    def no_such_bucket(cls, **match: Any) -> S3Fault:
        """404 NoSuchBucket: permanent."""
        return cls.error(404, "NoSuchBucket", **match)

    @classmethod
    def no_such_key(cls, **match: Any) -> S3Fault:
        """404 NoSuchKey: permanent."""
        return cls.error(404, "NoSuchKey", **match)

    @classmethod
    def lost(cls, **match: Any) -> S3Fault:
        """A write acknowledged and never stored: moto serves the request (the client gets its
        real ``200 OK``, ETag included), then the key is put back as it was, the older object
        with its own size, ETag and modification time, or nothing. What a store that loses an
        acknowledged write looks like; "success" over it is the stale-object case."""
        return cls("lost", status=200, **match)

    @classmethod
    def error_in_200(cls, code: str = "InternalError", message: str = "", **match: Any) -> S3Fault:
        """200 OK whose body is an ``<Error>``: what S3 does when CompleteMultipartUpload (or
        a copy) fails after it started answering. Matches CompleteMultipartUpload by default."""
        match.setdefault("op", "CompleteMultipartUpload")
        return cls("error_in_200", status=200, code=code, message=message, **match)

"""Is this failure worth another try? `ErrorClassifier` and its small rules.

Each rule looks at one exception and answers PERMANENT, THROTTLE, TRANSIENT or ``None`` (no
opinion). The classifier asks every rule about every exception of the ``__cause__`` /
``__context__`` chain and combines: permanent beats throttle beats transient, and an error
nobody recognises is not retried. Rules match exception classes by their qualified names, so
classifying never imports botocore, aiohttp, google or azure.
"""

from __future__ import annotations

import enum
import errno
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, Protocol

__all__ = ["Decision", "ErrorClassifier", "Rule", "exception_chain", "http_status_of"]


class Decision(enum.Enum):
    """What to do about a failure."""

    RETRY = "retry"
    THROTTLE = "throttle"  # retry, on the longer schedule
    FAIL = "fail"


class Verdict(enum.IntEnum):
    """One rule's opinion of one exception; a larger value wins."""

    TRANSIENT = 1
    THROTTLE = 2
    PERMANENT = 3


Rule = Callable[[BaseException], "Verdict | None"]

# -- exception classes, by qualified name -------------------------------------------------

TRANSIENT_TYPES = frozenset({
    "builtins.ConnectionError",
    "builtins.TimeoutError",
    "builtins.BrokenPipeError",
    "http.client.IncompleteRead",
    "http.client.RemoteDisconnected",
    "ssl.SSLError",
    "botocore.exceptions.ConnectionError",
    "botocore.exceptions.HTTPClientError",
    "botocore.exceptions.ConnectionClosedError",
    "botocore.exceptions.ReadTimeoutError",
    "botocore.exceptions.ConnectTimeoutError",
    "botocore.exceptions.EndpointConnectionError",
    "botocore.exceptions.IncompleteReadError",
    "botocore.exceptions.ResponseStreamingError",
    "urllib3.exceptions.ProtocolError",
    "urllib3.exceptions.TimeoutError",
    "urllib3.exceptions.NewConnectionError",
    "urllib3.exceptions.IncompleteRead",
    "requests.exceptions.ConnectionError",
    "requests.exceptions.Timeout",
    "requests.exceptions.ChunkedEncodingError",
    "aiohttp.client_exceptions.ClientConnectionError",
    "aiohttp.client_exceptions.ClientPayloadError",
    "aiohttp.client_exceptions.ServerTimeoutError",
    "google.api_core.exceptions.ServiceUnavailable",
    "google.api_core.exceptions.InternalServerError",
    "google.api_core.exceptions.BadGateway",
    "google.api_core.exceptions.GatewayTimeout",
    "google.api_core.exceptions.DeadlineExceeded",
    "google.auth.exceptions.TransportError",
    "azure.core.exceptions.ServiceRequestError",
    "azure.core.exceptions.ServiceResponseError",
    "azure.core.exceptions.IncompleteReadError",
    "gcsfs.retry.ChecksumError",
    "retryfs.errors.CommitNotVisibleError",
})
THROTTLE_TYPES = frozenset({
    "google.api_core.exceptions.TooManyRequests",
})
PERMANENT_TYPES = frozenset({
    "builtins.FileNotFoundError",
    "builtins.FileExistsError",
    "builtins.PermissionError",
    "builtins.IsADirectoryError",
    "builtins.NotADirectoryError",
    "builtins.ValueError",
    "builtins.TypeError",
    "builtins.KeyError",
    "builtins.NotImplementedError",
    "builtins.AttributeError",
    "botocore.exceptions.NoCredentialsError",
    "botocore.exceptions.ParamValidationError",
    "google.auth.exceptions.RefreshError",
    "azure.core.exceptions.ClientAuthenticationError",
    "azure.core.exceptions.ResourceNotFoundError",
    "azure.core.exceptions.ResourceExistsError",
})

TRANSIENT_ERRNOS = frozenset({
    errno.ECONNRESET, errno.ECONNABORTED, errno.ECONNREFUSED, errno.ETIMEDOUT, errno.EPIPE,
    errno.EHOSTUNREACH, errno.ENETUNREACH, errno.ENETDOWN, errno.ENETRESET, errno.EAGAIN,
    errno.EBUSY, errno.EINTR,
})
PERMANENT_ERRNOS = frozenset({
    errno.ENOENT, errno.EACCES, errno.EPERM, errno.EEXIST, errno.ENOTDIR, errno.EISDIR,
    errno.EINVAL, errno.ENOTEMPTY, errno.EROFS, errno.ENAMETOOLONG, errno.ENOSPC,
})

# -- provider error codes (S3, GCS, Azure) ------------------------------------------------

THROTTLE_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "ThrottledException",
    "RequestThrottled", "RequestThrottledException", "TooManyRequests",
    "TooManyRequestsException", "RequestLimitExceeded", "ProvisionedThroughputExceededException",
    "BandwidthLimitExceeded", "ServerBusy", "rateLimitExceeded", "userRateLimitExceeded",
})
TRANSIENT_CODES = frozenset({
    "InternalError", "InternalFailure", "InternalServerError", "ServiceUnavailable",
    "RequestTimeout", "RequestTimeoutException", "PriorRequestNotComplete", "OperationTimedOut",
    "ServerError", "backendError", "IncompleteBody", "RequestTimeTooSkewed",
})
PERMANENT_CODES = frozenset({
    "AccessDenied", "NoSuchBucket", "NoSuchKey", "NoSuchUpload", "InvalidAccessKeyId",
    "SignatureDoesNotMatch", "InvalidBucketName", "InvalidArgument", "InvalidRequest",
    "AuthorizationHeaderMalformed", "ExpiredToken", "InvalidToken", "AccountProblem",
    "AuthenticationFailed", "AuthorizationFailure", "BlobNotFound", "ContainerNotFound",
    "ResourceNotFound", "PreconditionFailed", "InvalidRange", "MethodNotAllowed",
    # Azure Blob (what adlfs's HttpResponseError.error_code and pyarrow's "Azure Error: [...]"
    # carry) and GCS JSON reasons
    "AuthorizationPermissionMismatch", "AuthorizationSourceIPMismatch", "ConditionNotMet",
    "LeaseIdMissing", "LeaseNotPresentWithBlobOperation", "BlobAlreadyExists",
    "ContainerAlreadyExists", "ContainerBeingDeleted", "InvalidBlobOrBlock", "conditionNotMet",
    "forbidden", "notFound",
})

# -- message text (pyarrow's native S3 errors are plain OSError: the text is the signal) --

THROTTLE_TEXT = (
    "AWS Error SLOW_DOWN", "AWS Error THROTTLING", "AWS Error REQUEST_LIMIT_EXCEEDED",
    "SlowDown", "Please reduce your request rate", "TooManyRequests", "ServerBusy",
    "HTTP status 429", "Too Many Requests", "rateLimitExceeded",
)
TRANSIENT_TEXT = (
    "AWS Error NETWORK_CONNECTION", "AWS Error INTERNAL_FAILURE", "AWS Error SERVICE_UNAVAILABLE",
    "AWS Error REQUEST_TIMEOUT", "AWS Error REQUEST_TIME_TOO_SKEWED",
    "Connection reset", "connection reset", "Connection aborted", "Broken pipe",
    "timed out", "Timeout was reached", "Server disconnected", "Connection refused",
    "IncompleteRead", "Read timeout", "ServiceUnavailable", "InternalError",
    "Service Unavailable", "Internal Server Error", "Bad Gateway", "Gateway Timeout",
    # the Azure C++ SDK on a body cut short: "Azure Error: [] Connection closed before getting
    # full response or response is less than expected"
    "Connection closed before getting full response",
    # object_store (obstore, Rust's reqwest and hyper) when its error reaches retryfs as text
    # (through pyarrow's PythonFile, an fsspec adapter's OSError): the connection failed or the
    # body was cut, "Error performing PUT ... - HTTP error: error sending request"
    "error sending request", "error decoding response body",
    "connection closed before message completed",
    # ... and a GET whose body was cut short ("HTTP error: request or response body error")
    "request or response body error",
)
PERMANENT_TEXT = (
    "AWS Error ACCESS_DENIED", "AWS Error NO_SUCH_BUCKET", "AWS Error NO_SUCH_KEY",
    "AWS Error NO_SUCH_UPLOAD", "AWS Error RESOURCE_NOT_FOUND", "AWS Error INVALID_ACCESS_KEY_ID",
    "AWS Error SIGNATURE_DOES_NOT_MATCH", "AWS Error MISSING_AUTHENTICATION_TOKEN",
    "AWS Error INVALID_PARAMETER", "AccessDenied", "NoSuchBucket", "NoSuchKey",
    "InvalidAccessKeyId", "SignatureDoesNotMatch", "Path does not exist",
)
_HTTP_STATUS_TEXT = re.compile(r"HTTP status (\d{3})|HTTP (\d{3})\b|status code:? (\d{3})")
# curl errors that mean the connection, not the request, failed (AWS SDK: curlCode, Azure SDK:
# CURLE code).
_CURL_CODE = re.compile(r"(?:curlCode|CURLE code): (\d+)")
# google-cloud-cpp (pyarrow's GcsFileSystem): "google::cloud::Status(UNAVAILABLE: Retry policy
# exhausted, with a last message of Backend Error ...)" -- its own loop gave up on a transient one.
# ABORTED is how it maps HTTP 409 (a conflict, e.g. a generation precondition on a write), which
# it does not retry itself ("Permanent error, with a last message of Conflict"): permanent.
_CLOUD_STATUS = re.compile(r"google::cloud::Status\((\w+):")
CLOUD_STATUS_VERDICTS = {
    "UNAVAILABLE": Verdict.TRANSIENT, "DEADLINE_EXCEEDED": Verdict.TRANSIENT,
    "INTERNAL": Verdict.TRANSIENT, "UNKNOWN": Verdict.TRANSIENT, "ABORTED": Verdict.PERMANENT,
    "RESOURCE_EXHAUSTED": Verdict.THROTTLE,
    "PERMISSION_DENIED": Verdict.PERMANENT, "NOT_FOUND": Verdict.PERMANENT,
    "ALREADY_EXISTS": Verdict.PERMANENT, "FAILED_PRECONDITION": Verdict.PERMANENT,
    "INVALID_ARGUMENT": Verdict.PERMANENT, "UNAUTHENTICATED": Verdict.PERMANENT,
    "OUT_OF_RANGE": Verdict.PERMANENT, "UNIMPLEMENTED": Verdict.PERMANENT,
    "CANCELLED": Verdict.PERMANENT,
}
# the Azure C++ SDK (pyarrow's AzureFileSystem): "Azure Error: [ServerBusy] 503 Service ..."
_AZURE_ERROR = re.compile(r"Azure Error: \[(\w*)\] (?:(\d{3}) )?")
TRANSIENT_CURL_CODES = frozenset({5, 6, 7, 18, 23, 26, 28, 35, 47, 52, 55, 56, 92})


def _qualified_names(exc: BaseException) -> Iterator[str]:
    for cls in type(exc).__mro__:
        yield f"{cls.__module__}.{cls.__qualname__}"


def _status_verdict(status: int) -> Verdict | None:
    if status == 429:
        return Verdict.THROTTLE
    if status in (408, 500, 502, 503, 504) or 520 <= status <= 599:
        return Verdict.TRANSIENT
    if 400 <= status < 500:
        return Verdict.PERMANENT
    return None


def http_status_of(exc: BaseException) -> int | None:
    """The HTTP status an exception carries, whichever library raised it."""
    # azure-core's status_code, aiohttp's status, gcsfs's and google-api-core's code (bools are
    # ints, but never in range)
    for attr in ("status_code", "status", "code"):
        value = getattr(exc, attr, None)
        if isinstance(value, int) and 100 <= value <= 599:
            return value
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping):  # botocore ClientError
        status = response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if isinstance(status, int):
            return status
    elif response is not None:  # requests' HTTPError, google-resumable-media: a requests.Response
        value = getattr(response, "status_code", None)
        if isinstance(value, int) and 100 <= value <= 599:
            return value
    return None


def provider_code_of(exc: BaseException) -> str | None:
    """A provider's error code (``SlowDown``, ``AccessDenied``...) carried by an exception."""
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping):
        code = response.get("Error", {}).get("Code")
        if isinstance(code, str):
            return code
    code = getattr(exc, "error_code", None)  # azure-core
    if isinstance(code, str):
        return code
    return None


# -- the rules -------------------------------------------------------------------------------

def type_rule(exc: BaseException) -> Verdict | None:
    for name in _qualified_names(exc):
        if name in PERMANENT_TYPES:
            if isinstance(exc, FileNotFoundError) and exc.__cause__ is not None and (
                    (http_status_of(exc.__cause__) or 0) >= 500
                    or http_status_of(exc.__cause__) == 429):
                return None  # fsspec's HTTP info raises FileNotFoundError from any error: a 5xx
            return Verdict.PERMANENT
        if name in THROTTLE_TYPES:
            return Verdict.THROTTLE
        if name in TRANSIENT_TYPES:
            return Verdict.TRANSIENT
    return None


def errno_rule(exc: BaseException) -> Verdict | None:
    code = getattr(exc, "errno", None)
    if not isinstance(code, int):
        return None
    if code in PERMANENT_ERRNOS:
        return Verdict.PERMANENT
    if code in TRANSIENT_ERRNOS:
        return Verdict.TRANSIENT
    return None


def status_rule(exc: BaseException) -> Verdict | None:
    if type(exc).__module__ == "aiohttp.http_exceptions":
        # aiohttp's parser errors carry the status aiohttp would *send* (400), not one received:
        # a truncated body (ContentLengthError) under a ClientPayloadError is transient.
        return None
    status = http_status_of(exc)
    return None if status is None else _status_verdict(status)


def provider_code_rule(exc: BaseException) -> Verdict | None:
    return _code_verdict(provider_code_of(exc))


def _code_verdict(code: str | None) -> Verdict | None:
    if code in PERMANENT_CODES:
        return Verdict.PERMANENT
    if code in THROTTLE_CODES:
        return Verdict.THROTTLE
    if code in TRANSIENT_CODES:
        return Verdict.TRANSIENT
    return None


def cloud_sdk_rule(exc: BaseException) -> Verdict | None:
    """The status texts of the C++ SDKs under pyarrow's GCS and Azure filesystems."""
    text = str(exc)
    found = _CLOUD_STATUS.search(text)
    if found:
        return CLOUD_STATUS_VERDICTS.get(found.group(1))
    found = _AZURE_ERROR.search(text)
    if found:
        code, status = found.groups()
        verdict = _code_verdict(code) if code else None
        if verdict is None and status:
            verdict = _status_verdict(int(status))
        return verdict
    return None


def message_rule(exc: BaseException) -> Verdict | None:
    text = str(exc)
    if any(marker in text for marker in PERMANENT_TEXT):
        return Verdict.PERMANENT
    if any(marker in text for marker in THROTTLE_TEXT):
        return Verdict.THROTTLE
    for match in _HTTP_STATUS_TEXT.finditer(text):
        status = int(next(group for group in match.groups() if group))
        verdict = _status_verdict(status)
        if verdict is not None:
            return verdict
    if any(marker in text for marker in TRANSIENT_TEXT):
        return Verdict.TRANSIENT
    curl = _CURL_CODE.search(text)
    if curl and int(curl.group(1)) in TRANSIENT_CURL_CODES:
        return Verdict.TRANSIENT
    return None


DEFAULT_RULES: tuple[Rule, ...] = (
    type_rule, errno_rule, status_rule, provider_code_rule, cloud_sdk_rule, message_rule,
)


def exception_chain(exc: BaseException, limit: int = 16) -> Iterator[BaseException]:
    """``exc`` and the exceptions behind it (``__cause__``, then ``__context__``), once each."""
    seen: set[int] = set()
    stack = [exc]
    while stack and len(seen) < limit:
        current = stack.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        for nxt in (current.__cause__, current.__context__):
            if nxt is not None:
                stack.append(nxt)


class Classifier(Protocol):
    """What the retry engine asks of a classifier (`ErrorClassifier` is the one retryfs has)."""

    def classify(self, exc: BaseException) -> Decision: ...


class ErrorClassifier:
    """Decides RETRY / THROTTLE / FAIL for an exception from small composable rules.

    ``retryable_messages`` adds substrings that make an error transient: pass Ray Data's
    ``DataContext.get_current().retried_io_errors`` as is. ``permanent_messages`` does the
    opposite. ``extra_rules`` are tried before the built-in ones. Immutable and picklable.
    """

    def __init__(
        self,
        *,
        retryable_messages: Iterable[str] = (),
        permanent_messages: Iterable[str] = (),
        throttle_messages: Iterable[str] = (),
        extra_rules: Iterable[Rule] = (),
    ) -> None:
        for name, values in (("retryable_messages", retryable_messages),
                             ("permanent_messages", permanent_messages),
                             ("throttle_messages", throttle_messages)):
            if isinstance(values, (str, bytes)):
                raise TypeError(f"{name} must be a sequence of strings, not a single string")
        self.retryable_messages = tuple(str(m) for m in retryable_messages)
        self.permanent_messages = tuple(str(m) for m in permanent_messages)
        self.throttle_messages = tuple(str(m) for m in throttle_messages)
        self.extra_rules = tuple(extra_rules)

    def _user_text_rule(self, exc: BaseException) -> Verdict | None:
        if not (self.permanent_messages or self.throttle_messages or self.retryable_messages):
            return None
        text = str(exc)
        if any(m in text for m in self.permanent_messages):
            return Verdict.PERMANENT
        if any(m in text for m in self.throttle_messages):
            return Verdict.THROTTLE
        if any(m in text for m in self.retryable_messages):
            return Verdict.TRANSIENT
        return None

    def verdict(self, exc: BaseException) -> Verdict | None:
        """The strongest opinion about ``exc`` alone (its chain not included)."""
        best: Verdict | None = None
        user = self._user_text_rule(exc)
        if user is not None:
            return user  # the user's explicit words win over the built-in rules
        for rule in (*self.extra_rules, *DEFAULT_RULES):
            found = rule(exc)
            if found is Verdict.PERMANENT:
                return found
            if found is not None and (best is None or found > best):
                best = found
        return best

    def classify(self, exc: BaseException) -> Decision:
        """RETRY, THROTTLE or FAIL for ``exc``, looking through its cause chain."""
        best: Verdict | None = None
        for link in exception_chain(exc):
            found = self.verdict(link)
            if found is Verdict.PERMANENT:
                return Decision.FAIL
            if found is not None and (best is None or found > best):
                best = found
        if best is Verdict.THROTTLE:
            return Decision.THROTTLE
        if best is Verdict.TRANSIENT:
            return Decision.RETRY
        return Decision.FAIL

    def with_messages(self, retryable_messages: Iterable[str]) -> ErrorClassifier:
        """A copy that also retries errors whose text contains one of ``retryable_messages``."""
        return ErrorClassifier(
            retryable_messages=(*self.retryable_messages, *retryable_messages),
            permanent_messages=self.permanent_messages,
            throttle_messages=self.throttle_messages,
            extra_rules=self.extra_rules,
        )

    def _key(self) -> tuple[Any, ...]:
        return (type(self), self.retryable_messages, self.permanent_messages,
                self.throttle_messages, self.extra_rules)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ErrorClassifier) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        parts = [f"{name}={value!r}" for name, value in (
            ("retryable_messages", self.retryable_messages),
            ("permanent_messages", self.permanent_messages),
            ("throttle_messages", self.throttle_messages),
        ) if value]
        return f"ErrorClassifier({', '.join(parts)})"

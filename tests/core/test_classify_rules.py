"""Each classification rule, alone, on the exceptions the real clients raise.

`ErrorClassifier` combines six rules over an exception's chain, so one rule's mistake is
often hidden by another's right answer (a 503 is transient by its status *and* its text). These
tests ask each rule on its own, with exception objects built by the clients' own classes and
code paths, in the shapes the S3 and cloud fault matrices observed (pyarrow's texts verbatim,
as the C++ SDKs under it wrote them against the fault proxy); then the classifier's combination
of them. Fast: no endpoint, no emulator.
"""

from __future__ import annotations

import errno
import io
import warnings
from functools import partial

import aiohttp
import pytest
import requests
import urllib3
from aiohttp import ClientOSError, ClientPayloadError, ClientResponseError
from aiohttp.http_exceptions import ContentLengthError
from azure.core.exceptions import HttpResponseError, ServiceRequestError
from azure.core.rest import HttpRequest
from azure.core.rest._requests_basic import RestRequestsTransportResponse
from azure.storage.blob._shared.response_handlers import process_storage_error
from botocore.exceptions import ClientError
from google.resumable_media.common import InvalidResponse
from multidict import CIMultiDict, CIMultiDictProxy
from oauthlib.oauth2.rfc6749.errors import InvalidGrantError
from yarl import URL

from retryfs import Decision, ErrorClassifier
from retryfs.core.classify import (
    Verdict,
    cloud_sdk_rule,
    errno_rule,
    exception_chain,
    http_status_of,
    message_rule,
    provider_code_of,
    provider_code_rule,
    status_rule,
    type_rule,
)

C = ErrorClassifier()
T, TH, P = Verdict.TRANSIENT, Verdict.THROTTLE, Verdict.PERMANENT


# -- the clients' own exceptions, raised the way they raise them ---------------------------------

def raised(make, cause: BaseException | None = None) -> BaseException:
    """``make()`` raised and caught; with a ``cause``, raised from it while handling it, as the
    clients do (``except E as e: raise X from e``), so that it is both cause and context."""
    try:
        if cause is None:
            raise make()
        try:
            raise cause
        except BaseException as handled:  # noqa: BLE001 - re-raised below, as its cause
            raise make() from handled
    except BaseException as exc:  # noqa: BLE001 - handed back to the test
        return exc


# gcsfs and google-api-core import grpc, which must not be loaded before mutmut forks its
# workers (a segfault in the next test's threads): the tests build them when they run (`later`).

def gcsfs_error(status: int, message: str) -> BaseException:
    """What gcsfs's `validate_response` raises for a JSON error body."""
    from gcsfs.retry import HttpError

    return HttpError({"code": status, "message": message})


def google_error(status: int, message: str) -> BaseException:
    """google-api-core's exception for an HTTP status (google-cloud-storage raises these)."""
    from google.api_core.exceptions import from_http_status

    return from_http_status(status, message)


def later(make, *args) -> partial:
    return partial(make, *args)


def built(exc_or_make) -> BaseException:
    return exc_or_make() if isinstance(exc_or_make, partial) else exc_or_make


def aiohttp_status_error(status: int, message: str) -> ClientResponseError:
    """What aiohttp's `raise_for_status` raises (under fsspec's HTTPFileSystem)."""
    url = URL("http://127.0.0.1:9000/bucket/key")
    info = aiohttp.RequestInfo(url, "HEAD", CIMultiDictProxy(CIMultiDict()), url)
    return ClientResponseError(info, (), status=status, message=message)


def fsspec_http_not_found(status: int) -> BaseException:
    """fsspec's `HTTPFileSystem._info`: ``raise FileNotFoundError(url) from exc``, any error."""
    return raised(lambda: FileNotFoundError("http://127.0.0.1:9000/bucket/key"),
                  aiohttp_status_error(status, "boom"))


def requests_error(status: int, reason: str) -> requests.HTTPError:
    """requests' own `raise_for_status` on a response of that status."""
    response = requests.Response()
    response.status_code, response.reason, response.url = status, reason, "http://h/k"
    try:
        response.raise_for_status()
    except requests.HTTPError as exc:
        return exc
    raise AssertionError("raise_for_status did not raise")


def azure_storage_error(status: int, reason: str, code: str, message: str) -> BaseException:
    """azure-storage-blob's `process_storage_error` on an error response of Azure's shape (what
    adlfs raises: HttpResponseError or a subclass, ``error_code`` set, ``status_code``)."""
    body = (f'<?xml version="1.0" encoding="utf-8"?><Error><Code>{code}</Code>'
            f"<Message>{message}</Message></Error>").encode()
    raw = requests.Response()
    raw.status_code, raw.reason = status, reason
    raw.headers.update({"x-ms-error-code": code, "Content-Type": "application/xml"})
    raw.raw = urllib3.HTTPResponse(body=io.BytesIO(body), status=status, preload_content=False)
    response = RestRequestsTransportResponse(
        request=HttpRequest("GET", "http://127.0.0.1:10000/devstoreaccount1/c/blob"),
        internal_response=raw)
    response.read()
    try:
        try:
            raise HttpResponseError(response=response)
        except HttpResponseError as error:
            process_storage_error(error)
    except HttpResponseError as exc:
        return exc
    raise AssertionError("process_storage_error did not raise")


def botocore_error(code: str | None, status: int | None, op: str = "PutObject") -> ClientError:
    response: dict = {}
    if code is not None:
        response["Error"] = {"Code": code, "Message": "from the cell"}
    if status is not None:
        response["ResponseMetadata"] = {"HTTPStatusCode": status, "RetryAttempts": 0}
    return ClientError(response, op)


def connection_reset() -> BaseException:
    """aiohttp's connector: ``raise ClientOSError(*exc.args) from exc`` (gcsfs's reset)."""
    return raised(lambda: ClientOSError(errno.ECONNRESET, "Connection reset by peer"),
                  ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"))


def adlfs_upload_reset() -> BaseException:
    """adlfs's reset block upload: RuntimeError <- ServiceRequestError <- ClientOSError <-
    ConnectionResetError, each ``raise ... from`` the one below (so also its context)."""
    reset = connection_reset()
    request_error = raised(lambda: ServiceRequestError(reset, error=reset), reset)
    return raised(lambda: RuntimeError(f"Failed to upload block: {request_error}!"),
                  request_error)


def truncated_body(received: int = 50000, expected: int = 100000) -> BaseException:
    """aiohttp on a body cut short: ClientPayloadError caused by its parser's ContentLengthError
    (which carries the 400 aiohttp would *send*)."""
    parser_error = ContentLengthError(
        f"Not enough data to satisfy content length header (received {received} of "
        f"{expected} bytes).")
    return raised(lambda: ClientPayloadError(f"Response payload is not completed: "
                                             f"{parser_error!r}"), parser_error)


# pyarrow's GcsFileSystem (google-cloud-cpp) and AzureFileSystem (Azure C++ SDK), verbatim
def gcs_status(status: str, last: str, reason: str, http: int | None,
               function: str = "ReadObject", exhausted: bool = True) -> str:
    how = ("Retry policy exhausted" if exhausted else "Permanent error")
    meta = (("gcloud-cpp.retry.on-entry=false, " if exhausted else "")
            + f"gcloud-cpp.retry.function={function}, gcloud-cpp.retry.reason="
            + ("retry-policy-exhausted" if exhausted else "permanent-error")
            + f", gcloud-cpp.retry.original-message={last}"
            + (f", http_status_code={http}" if http else ""))
    domain = "global" if reason else ""
    return (f"google::cloud::Status({status}: {how}, with a last message of {last} "
            f"error_info={{reason={reason}, domain={domain}, metadata={{{meta}}}}})")


GCS_500 = gcs_status("UNAVAILABLE", "Backend Error", "backendError", 500)
GCS_429 = gcs_status("UNAVAILABLE", "The rate of change requests to the object is too high",
                     "rateLimitExceeded", 429, function="CreateResumableUpload")
GCS_403 = gcs_status("PERMISSION_DENIED",
                     "Forbidden: the caller does not have storage.objects.get access",
                     "forbidden", 403) + ". Detail: [errno 13] Permission denied"
GCS_404 = gcs_status("NOT_FOUND", "No such object", "notFound", 404,
                     function="ListObjects") + ". Detail: [errno 2] No such file or directory"
GCS_409 = gcs_status("ABORTED", "Conflict", "conflict", 409, exhausted=False)
GCS_RESET = gcs_status("UNAVAILABLE", "PerformWork() - CURL error [56]=Failure when receiving "
                       "data from the peer", "", None)
GCS_CUT_READ = ("google::cloud::Status(UNAVAILABLE: Retry policy exhausted in Read(): "
                "PerformWork() - CURL error [18]=Transferred a partial file)")

AZ_READ = ("DownloadTo from 'http://127.0.0.1:37673/devstoreaccount1/capture-bucket/obj' at "
           "position 0 for 100000 bytes failed. ReadAt failed to read the required byte range. ")
AZ_TAIL = "\nRequestId:AB14\nTime:2026-01-01T00:00:00.0000000Z\nRequest ID: AB14"
AZ_500 = (AZ_READ + "Azure Error: [InternalError] 500 Internal Server Error\nThe server "
          "encountered an internal error. Please retry the request." + AZ_TAIL)
AZ_503 = (AZ_READ + "Azure Error: [ServerBusy] 503 Service Unavailable\nThe server is currently "
          "unable to receive requests. Please retry your request." + AZ_TAIL)
AZ_403 = (AZ_READ + "Azure Error: [AuthorizationPermissionMismatch] 403 Forbidden\nThis request "
          "is not authorized to perform this operation using this permission." + AZ_TAIL)
AZ_409 = (AZ_READ + "Azure Error: [LeaseIdMissing] 409 Conflict\nThere is currently a lease on "
          "the blob and no lease ID was specified in the request." + AZ_TAIL)
AZ_400_UNLISTED = (AZ_READ + "Azure Error: [InvalidHeaderValue] 400 Bad Request\nThe value for "
                   "one of the HTTP headers is not in the correct format." + AZ_TAIL)
AZ_RESET = (AZ_READ + "Azure Error: [] Error while reading from network socket. CURLE code: 56. "
            "Failure when receiving data from the peer")

# pyarrow's S3FileSystem (AWS SDK for C++)
S3_RESET = ("When uploading part for key 'k' in bucket 'b': AWS Error NETWORK_CONNECTION during "
            "UploadPart operation: curlCode: 56, Failure when receiving data from the peer")
S3_SLOW = "AWS Error SLOW_DOWN during PutObject operation: Please reduce your request rate."
S3_503 = "AWS Error UNKNOWN (HTTP status 503) during HeadObject operation: No response body."
S3_400 = "AWS Error UNKNOWN (HTTP status 400) during HeadObject operation: No response body."
S3_DENIED = "AWS Error ACCESS_DENIED during PutObject operation: Access Denied"


# -- http_status_of ------------------------------------------------------------------------------

@pytest.mark.parametrize(("exc", "status"), [
    (later(gcsfs_error, 503, "Backend Error"), 503),  # .code
    (aiohttp_status_error(429, "Too Many Requests"), 429),  # .status
    (azure_storage_error(503, "Service Unavailable", "ServerBusy", "busy"), 503),  # .status_code
    (later(google_error, 504, "deadline"), 504),  # google-api-core: .code
    # oauthlib (gcsfs's browser login, through google-auth-oauthlib): .status_code, no response
    (InvalidGrantError(description="Bad Request"), 400),
    (botocore_error("SlowDown", 503), 503),  # the response dict
    (botocore_error(None, 500), 500),
    (requests_error(502, "Bad Gateway"), 502),  # a requests.Response as .response
    (InvalidResponse(requests_error(500, "x").response, "upload failed"), 500),
    (botocore_error("SlowDown", None), None),  # no ResponseMetadata (botocore reads .get)
    (ConnectionResetError(errno.ECONNRESET, "reset"), None),
    (RuntimeError("who knows"), None),
    # the edges of the range, on gcsfs's own class: anything else is not an HTTP status
    (later(gcsfs_error, 100, "continue"), 100), (later(gcsfs_error, 599, "edge"), 599),
    (later(gcsfs_error, 99, "x"), None), (later(gcsfs_error, 600, "x"), None),
    (requests_error(599, "edge"), 599),
], ids=lambda v: (v.func.__name__ if isinstance(v, partial) else type(v).__name__
                  if isinstance(v, BaseException) else str(v)))
def test_http_status_of_reads_each_clients_own_attribute(exc, status):
    assert http_status_of(built(exc)) == status


def test_http_status_of_a_response_outside_the_range_is_none():
    response = requests_error(500, "x").response
    response.status_code = 600
    assert http_status_of(InvalidResponse(response, "bad")) is None
    response.status_code = 100
    assert http_status_of(InvalidResponse(response, "informational")) == 100


def test_aiohttp_status_is_read_without_its_deprecated_code_property():
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        assert http_status_of(aiohttp_status_error(503, "Service Unavailable")) == 503


# -- provider_code_of ----------------------------------------------------------------------------

def test_provider_code_of_botocore_and_azure():
    assert provider_code_of(botocore_error("SlowDown", 503)) == "SlowDown"
    assert provider_code_of(botocore_error(None, 503)) is None
    busy = azure_storage_error(503, "Service Unavailable", "ServerBusy", "busy")
    assert provider_code_of(busy) == "ServerBusy"  # a StorageErrorCode, a str
    assert provider_code_of(gcsfs_error(503, "Backend Error")) is None
    assert provider_code_of(requests_error(503, "x")) is None


# -- type_rule -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("exc", "verdict"), [
    (ConnectionResetError(errno.ECONNRESET, "Connection reset by peer"), T),
    (connection_reset(), T),  # ClientOSError, an aiohttp ClientConnectionError
    (ServiceRequestError("Server disconnected"), T),
    (later(google_error, 429, "slow down"), TH),  # google.api_core TooManyRequests
    (later(google_error, 503, "unavailable"), T),
    (FileNotFoundError("gs://bucket/key"), P),
    (PermissionError(errno.EACCES, GCS_403), P),
    (azure_storage_error(404, "Not Found", "BlobNotFound", "The specified blob does not exist."),
     P),  # ResourceNotFoundError
    (RuntimeError("who knows"), None),
    # fsspec's HTTP info raises FileNotFoundError from *any* error: a 5xx or 429 is not absence
    (fsspec_http_not_found(503), None), (fsspec_http_not_found(500), None),
    (fsspec_http_not_found(429), None),
    (fsspec_http_not_found(404), P), (fsspec_http_not_found(499), P),
    (fsspec_http_not_found(430), P),
    # ...and only FileNotFoundError is let off: a refusal stays one, whatever came before it
    (raised(lambda: PermissionError(errno.EACCES, "denied"), aiohttp_status_error(503, "x")), P),
])
def test_type_rule(exc, verdict):
    assert type_rule(built(exc)) is verdict


# -- errno_rule ----------------------------------------------------------------------------------

@pytest.mark.parametrize(("exc", "verdict"), [
    (connection_reset(), T),  # ClientOSError, errno 104
    (ConnectionResetError(errno.ECONNRESET, "reset"), T),
    (OSError(errno.ETIMEDOUT, "timed out"), T),
    (PermissionError(errno.EACCES, GCS_403), P),  # pyarrow's [Errno 13]
    (FileNotFoundError(errno.ENOENT, GCS_404), P),
    (OSError(errno.EIO, "Input/output error"), None),  # neither list
    (OSError(AZ_500), None),  # pyarrow's Azure errors carry no errno
    (RuntimeError("who knows"), None),
])
def test_errno_rule(exc, verdict):
    assert errno_rule(exc) is verdict


# -- status_rule and _status_verdict ------------------------------------------------------------

@pytest.mark.parametrize(("status", "verdict"), [
    (400, P), (403, P), (404, P), (408, T), (409, P), (412, P), (429, TH), (499, P),
    (500, T), (501, None), (502, T), (503, T), (504, T), (505, None), (519, None), (520, T),
    (599, T), (304, None), (100, None),
])
def test_status_rule_on_gcsfs_errors(status, verdict):
    assert status_rule(gcsfs_error(status, "the message")) is verdict


def test_status_rule_reads_every_clients_status():
    assert status_rule(azure_storage_error(500, "Internal Server Error", "InternalError",
                                           "internal")) is T
    assert status_rule(botocore_error("Whatever", 429)) is TH
    assert status_rule(requests_error(404, "Not Found")) is P
    assert status_rule(RuntimeError("no status")) is None


def test_status_rule_ignores_aiohttps_parser_status():
    cut = truncated_body()
    assert isinstance(cut.__cause__, ContentLengthError) and cut.__cause__.code == 400
    assert status_rule(cut.__cause__) is None  # the 400 aiohttp would send, not one it got
    assert C.classify(cut) is Decision.RETRY


# -- provider_code_rule --------------------------------------------------------------------------

@pytest.mark.parametrize(("exc", "verdict"), [
    (botocore_error("SlowDown", 503), TH),
    (botocore_error("InternalError", 500), T),
    (botocore_error("RequestTimeTooSkewed", 403), T),
    (botocore_error("AccessDenied", 403), P),
    (botocore_error("Whatever", 500), None),
    (botocore_error(None, 500), None),
    (azure_storage_error(503, "Service Unavailable", "ServerBusy", "busy"), TH),
    (azure_storage_error(500, "Internal Server Error", "OperationTimedOut", "timed out"), T),
    (azure_storage_error(403, "Forbidden", "AuthorizationPermissionMismatch", "no"), P),
    (later(gcsfs_error, 503, "Backend Error"), None),
])
def test_provider_code_rule(exc, verdict):
    assert provider_code_rule(built(exc)) is verdict


# -- cloud_sdk_rule ------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "verdict"), [
    (GCS_500, T), (GCS_429, T), (GCS_RESET, T), (GCS_CUT_READ, T),
    (GCS_403, P), (GCS_404, P), (GCS_409, P),
    ("google::cloud::Status(RESOURCE_EXHAUSTED: quota)", TH),
    ("google::cloud::Status(SOME_NEW_CODE: ...)", None),
    (AZ_500, T), (AZ_503, TH), (AZ_403, P), (AZ_409, P),
    (AZ_400_UNLISTED, P),  # a code retryfs does not list: its status decides
    (AZ_RESET, None),  # no code, no status: the curl code is message_rule's
    (S3_503, None), ("Backend Error, 500", None),
])
def test_cloud_sdk_rule_on_pyarrows_texts(text, verdict):
    assert cloud_sdk_rule(OSError(text)) is verdict


# -- message_rule --------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "verdict"), [
    (S3_RESET, T), (S3_SLOW, TH), (S3_503, T), (S3_400, P), (S3_DENIED, P),
    (AZ_RESET, T),  # CURLE code 56 and nothing else
    ("some error curlCode: 60, SSL peer certificate or SSH remote key was not OK", None),
    ("Backend Error, 500", None), ("Conflict, 409", None),  # gcsfs: its .code decides
    (GCS_429, TH),  # rateLimitExceeded
    ("Failed to upload block: Server disconnected!", T),
    ("[Errno 104] Connection reset by peer", T),
    ("", None), ("who knows", None),
])
def test_message_rule_on_real_texts(text, verdict):
    assert message_rule(OSError(text)) is verdict


# -- exception_chain -----------------------------------------------------------------------------

def test_the_chain_visits_each_link_once_in_order():
    top = adlfs_upload_reset()
    assert top.__cause__ is top.__context__ is not None  # each link reached twice
    links = list(exception_chain(top))
    assert [type(e).__name__ for e in links] == [
        "RuntimeError", "ServiceRequestError", "ClientOSError", "ConnectionResetError"]
    assert C.classify(top) is Decision.RETRY


def test_the_chain_follows_the_context_after_the_cause():
    try:
        try:
            raise ConnectionResetError(errno.ECONNRESET, "reset")
        except ConnectionResetError:
            raise OSError("write failed") from ValueError("bad value")  # noqa: B904
    except OSError as exc:
        links = list(exception_chain(exc))
    assert [type(e).__name__ for e in links] == ["OSError", "ValueError", "ConnectionResetError"]


def test_a_long_chain_is_read_to_its_sixteenth_link():
    exc: BaseException = ConnectionResetError(errno.ECONNRESET, "reset at the bottom")
    for depth in range(20):
        exc = raised(lambda d=depth: OSError(f"layer {d}"), exc)
    assert len(list(exception_chain(exc))) == 16
    assert len(list(exception_chain(exc, limit=3))) == 3
    assert C.classify(exc) is Decision.FAIL  # the reset is the 21st link: never seen


# -- the classifier: rules combined, the user's words, the chain ---------------------------------

@pytest.mark.parametrize(("exc", "decision"), [
    # what each client raised in the cloud matrix's cells
    (OSError(GCS_500), Decision.RETRY), (OSError(GCS_429), Decision.THROTTLE),
    (PermissionError(errno.EACCES, GCS_403), Decision.FAIL), (OSError(GCS_409), Decision.FAIL),
    (OSError(GCS_RESET), Decision.RETRY),
    (later(gcsfs_error, 500, "Backend Error"), Decision.RETRY),
    (later(gcsfs_error, 429, "The rate of change requests to the object is too high"),
     Decision.THROTTLE),
    (later(gcsfs_error, 409, "Conflict"), Decision.FAIL), (connection_reset(), Decision.RETRY),
    (truncated_body(), Decision.RETRY),
    (OSError(AZ_500), Decision.RETRY), (OSError(AZ_503), Decision.THROTTLE),
    (OSError(AZ_403), Decision.FAIL), (OSError(AZ_RESET), Decision.RETRY),
    (azure_storage_error(503, "Service Unavailable", "ServerBusy", "busy"), Decision.THROTTLE),
    (azure_storage_error(500, "Internal Server Error", "InternalError", "internal"),
     Decision.RETRY),
    (adlfs_upload_reset(), Decision.RETRY),
    (fsspec_http_not_found(503), Decision.RETRY), (fsspec_http_not_found(429), Decision.THROTTLE),
    (fsspec_http_not_found(404), Decision.FAIL),
])
def test_what_the_clients_raised_is_decided_as_the_matrices_need(exc, decision):
    assert C.classify(built(exc)) is decision


def test_verdict_takes_the_strongest_rule_of_one_link():
    busy = azure_storage_error(503, "Service Unavailable", "ServerBusy", "busy")
    assert (status_rule(busy), provider_code_rule(busy)) == (T, TH)
    assert C.verdict(busy) is TH
    assert C.verdict(gcsfs_error(500, "Backend Error")) is T
    assert C.verdict(RuntimeError("who knows")) is None
    assert C.verdict(FileNotFoundError(errno.ENOENT, "gone")) is P


def test_permanent_anywhere_in_the_chain_fails_and_throttle_beats_transient():
    busy_under_reset = raised(lambda: OSError(S3_RESET), OSError(S3_SLOW))
    assert C.classify(busy_under_reset) is Decision.THROTTLE
    reset_under_busy = raised(lambda: OSError(S3_SLOW), OSError(S3_RESET))
    assert C.classify(reset_under_busy) is Decision.THROTTLE
    denied_under_reset = raised(lambda: OSError(S3_RESET), OSError(S3_DENIED))
    assert C.classify(denied_under_reset) is Decision.FAIL


def test_user_messages_win_over_the_built_in_rules():
    backend_error = gcsfs_error(500, "Backend Error")  # RETRY by its status
    assert C.classify(backend_error) is Decision.RETRY
    assert ErrorClassifier(throttle_messages=["Backend Error"]).classify(
        backend_error) is Decision.THROTTLE
    assert ErrorClassifier(permanent_messages=["Backend Error"]).classify(
        backend_error) is Decision.FAIL
    flaky = ErrorClassifier(retryable_messages=["ReadAt failed"])
    assert flaky.classify(OSError(AZ_403)) is Decision.RETRY  # the user's word over the 403
    # ...and only for the texts they name
    for only in (ErrorClassifier(throttle_messages=["Backend Error"]),
                 ErrorClassifier(permanent_messages=["Backend Error"]), flaky):
        assert only.classify(connection_reset()) is Decision.RETRY
        assert only.classify(OSError(S3_SLOW)) is Decision.THROTTLE
        assert only.classify(PermissionError(errno.EACCES, "denied")) is Decision.FAIL
    both = ErrorClassifier(permanent_messages=["Backend"], throttle_messages=["Backend Error"],
                           retryable_messages=["Error"])
    assert both.classify(backend_error) is Decision.FAIL  # permanent, then throttle, then retry
    assert ErrorClassifier(throttle_messages=["Backend"], retryable_messages=["Error"]).classify(
        backend_error) is Decision.THROTTLE


def test_extra_rules_come_first():
    def no_gcs_retries(exc: BaseException) -> Verdict | None:
        return P if "google::cloud" in str(exc) else None

    custom = ErrorClassifier(extra_rules=[no_gcs_retries])
    assert custom.classify(OSError(GCS_500)) is Decision.FAIL
    assert custom.classify(OSError(AZ_500)) is Decision.RETRY


@pytest.mark.parametrize("name", ["retryable_messages", "permanent_messages",
                                  "throttle_messages"])
def test_a_single_string_for_messages_is_refused_by_name(name):
    with pytest.raises(TypeError, match=f"^{name} must be a sequence of strings, not a single "
                       "string$"):
        ErrorClassifier(**{name: "SlowDown"})


def test_with_messages_keeps_everything_else():
    def rule(exc: BaseException) -> Verdict | None:
        return None

    base = ErrorClassifier(retryable_messages=["a"], permanent_messages=["p"],
                           throttle_messages=["t"], extra_rules=[rule])
    more = base.with_messages(["b"])
    assert more == ErrorClassifier(retryable_messages=["a", "b"], permanent_messages=["p"],
                                   throttle_messages=["t"], extra_rules=[rule])
    assert more.extra_rules == (rule,)


def test_repr_names_what_was_given():
    assert repr(ErrorClassifier()) == "ErrorClassifier()"
    assert repr(ErrorClassifier(retryable_messages=["a"], permanent_messages=["p", 7],
                                throttle_messages=["t"])) == (
        "ErrorClassifier(retryable_messages=('a',), permanent_messages=('p', '7'), "
        "throttle_messages=('t',))")
    assert repr(ErrorClassifier(throttle_messages=["t"])) == (
        "ErrorClassifier(throttle_messages=('t',))")


@pytest.mark.parametrize("text", [
    # what obstore's FsspecStore raised through retryfs's pyarrow face (its error as text):
    # an UploadPart whose connection was reset, a GET whose body was cut
    "Generic S3 error: Error performing PUT http://127.0.0.1:38661/bench-faults/ckpt/model_0.pt"
    "?partNumber=1&uploadId=NOJu in 15.015949ms - HTTP error: error sending request",
    "Generic S3 error: Error performing GET http://127.0.0.1:1/b/k in 1ms - HTTP error: error "
    "decoding response body",
    "Generic S3 error: hyper::Error(IncompleteMessage): connection closed before message "
    "completed",
])
def test_object_stores_connection_errors_are_transient_as_text(text):
    assert ErrorClassifier().classify(OSError(text)) is Decision.RETRY

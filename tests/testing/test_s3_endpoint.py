"""The S3 fault endpoint against the real clients: each fault kind makes pyarrow's native
`S3FileSystem` and s3fs/botocore raise what they raise against AWS (texts asserted below, and
tabled in the README), plans are deterministic, the record counts, the endpoint stops cleanly.

Client retries are off (`S3FaultEndpoint.pyarrow_fs` / `.s3fs` / `.boto3_client` defaults), so
one fault is one error; the exception is aiohttp's own replay of an idempotent request after a
dropped connection, asserted where it shows.
"""

from __future__ import annotations

import io
import random
import re
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

import aiohttp
import botocore.exceptions
import pyarrow.fs as pafs
import pytest

from retryfs.testing.s3 import PYARROW_PART_SIZE, S3Fault, S3FaultEndpoint, operation_name

DATA = bytes(range(256)) * 400  # 100 KiB


@pytest.fixture
def ep(s3_fault_endpoint: S3FaultEndpoint, s3_fault_bucket: str) -> S3FaultEndpoint:
    s3_fault_endpoint.put_object(s3_fault_bucket, "obj", DATA)
    return s3_fault_endpoint


# The clients' own timeouts are short (1 s) only where a stall is to end at them: elsewhere a
# 1 s connect or read timeout is a fault the load of the machine injects (a ConnectTimeout
# instead of the 403 a test waits for).

@pytest.fixture
def pa(ep: S3FaultEndpoint) -> pafs.S3FileSystem:
    return ep.pyarrow_fs()


def pa_timing_out(ep: S3FaultEndpoint) -> pafs.S3FileSystem:
    return ep.pyarrow_fs(request_timeout=1, connect_timeout=1)


@pytest.fixture
def s3(ep: S3FaultEndpoint) -> Any:
    return ep.s3fs()


def s3_timing_out(ep: S3FaultEndpoint) -> Any:
    return ep.s3fs(config_kwargs={"read_timeout": 1})


# -- pyarrow: one action per operation -------------------------------------------------------

def pa_write(fs: pafs.S3FileSystem, path: str = "retryfs-test/new", data: bytes = b"abc") -> None:
    with fs.open_output_stream(path) as f:
        f.write(data)


PA_ACTIONS: dict[str, Callable[[Any, S3FaultEndpoint], Any]] = {
    "HeadObject": lambda fs, ep: fs.get_file_info("retryfs-test/obj"),
    "GetObject": lambda fs, ep: fs.open_input_stream("retryfs-test/obj").read(),
    "ListObjectsV2": lambda fs, ep: fs.get_file_info(
        pafs.FileSelector("retryfs-test/", recursive=True)),
    "PutObject": lambda fs, ep: pa_write(ep.pyarrow_fs(allow_delayed_open=True)),
    "UploadPart": lambda fs, ep: pa_write(fs),
    "CompleteMultipartUpload": lambda fs, ep: pa_write(fs),
}

# fault, operation, what pyarrow 26.0.1 raises (always a plain OSError: the text is the signal).
# A GetObject error's message is not reliable: the AWS SDK parses it into the read buffer,
# and it comes out empty once the process has read a larger object, or "Failed to flush
# response stream (eof: 0, bad: 1)" when the range read is smaller than the error body.
PYARROW_RAISES = [
    (S3Fault.internal_error(), "GetObject",
     "AWS Error INTERNAL_FAILURE during GetObject operation: "),
    (S3Fault.internal_error(), "HeadObject",
     "AWS Error UNKNOWN (HTTP status 500) during HeadObject operation: No response body."),
    (S3Fault.slow_down(), "PutObject",
     "AWS Error SLOW_DOWN during PutObject operation: Please reduce your request rate."),
    (S3Fault.slow_down(), "HeadObject",
     "AWS Error UNKNOWN (HTTP status 503) during HeadObject operation: No response body."),
    (S3Fault.service_unavailable(), "UploadPart",
     "AWS Error SERVICE_UNAVAILABLE during UploadPart operation"),
    (S3Fault.too_many_requests(), "ListObjectsV2",
     "AWS Error UNKNOWN (HTTP status 429) during ListObjectsV2 operation: Unable to parse "
     "ExceptionName: TooManyRequests"),
    (S3Fault.too_many_requests("SlowDown"), "GetObject",
     "AWS Error SLOW_DOWN during GetObject operation"),
    (S3Fault.access_denied(), "GetObject", "AWS Error ACCESS_DENIED during GetObject operation: "),
    (S3Fault.access_denied(), "HeadObject",
     "AWS Error ACCESS_DENIED during HeadObject operation: No response body."),
    (S3Fault.no_such_bucket(), "ListObjectsV2",
     "AWS Error NO_SUCH_BUCKET during ListObjectsV2 operation: The specified bucket does not"),
    (S3Fault.reset(), "CompleteMultipartUpload",
     "AWS Error NETWORK_CONNECTION during CompleteMultipartUpload operation: curlCode: 56, "
     "Failure when receiving data from the peer; Details: Recv failure: Connection reset by peer"),
    (S3Fault.reset(), "HeadObject",
     "AWS Error NETWORK_CONNECTION during HeadObject operation: curlCode: 56"),
    (S3Fault.truncate(), "GetObject",
     "AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 18, Transferred a "
     "partial file; Details: end of response with 51200 bytes missing"),
    (S3Fault.truncate(), "PutObject",  # no body to cut: the connection closes before any byte
     "AWS Error NETWORK_CONNECTION during PutObject operation: curlCode: 52, Server returned "
     "nothing (no headers, no data); Details: Empty reply from server"),
    (S3Fault.stall(5), "GetObject",
     "AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 28, Timeout was "
     "reached; Details: Operation too slow. Less than 1 bytes/sec transferred the last 1 seconds"),
    (S3Fault.error_in_200(), "CompleteMultipartUpload",
     "AWS Error INTERNAL_FAILURE during CompleteMultipartUpload operation: We encountered an "
     "internal error. Please try again."),
]


@pytest.mark.parametrize(("fault", "op", "text"), PYARROW_RAISES,
                         ids=[f"{f.kind}-{f.status}-{op}" for f, op, _ in PYARROW_RAISES])
def test_pyarrow_raises_its_real_error(ep: S3FaultEndpoint, pa: pafs.S3FileSystem,
                                       fault: S3Fault, op: str, text: str) -> None:
    fault = ep.add_fault(S3Fault(**{**vars(fault), "op": op}))
    started = time.monotonic()
    with pytest.raises(OSError) as raised:
        PA_ACTIONS[op](pa_timing_out(ep) if fault.kind == "stall" else pa, ep)
    assert type(raised.value) is OSError
    assert text in str(raised.value)
    assert ep.fired(fault) == 1
    assert ep.counts()[op] == 1  # pyarrow's retries are off: one fault, one request
    assert time.monotonic() - started < 4  # a stall ends at the client's 1 s timeout


def test_pyarrow_stalled_upload_is_not_bounded_by_its_request_timeout(
        ep: S3FaultEndpoint) -> None:
    """curl's low-speed timeout does not cover a request whose body was sent: pyarrow waits
    for the stall to end (here with a reset), whatever its request_timeout. One such wait proves
    the timeout no bound; on a loaded machine curl's timer can fire while the request is still
    being sent (curlCode 28), so the experiment is repeated, up to three times, until it shows."""
    seen = []
    for _ in range(3):
        fault = ep.add_fault(S3Fault.stall(2, op="UploadPart"))
        started = time.monotonic()
        with pytest.raises(OSError) as raised:
            pa_write(pa_timing_out(ep))
        assert ep.fired(fault) == 1
        seen.append((str(raised.value), time.monotonic() - started))
        if re.search("curlCode: 56.*Connection reset by peer", seen[-1][0]):
            break
        assert "curlCode: 28" in seen[-1][0], seen  # the only other outcome: the send timed out
    text, waited = seen[-1]
    assert re.search("curlCode: 56.*Connection reset by peer", text), seen
    assert waited >= 2


# -- s3fs / botocore ---------------------------------------------------------------------------

def s3fs_multipart(fs: Any) -> None:
    with fs.open("retryfs-test/new", "wb", block_size=5 * 2**20) as f:
        f.write(b"m" * (5 * 2**20 + 1))


S3FS_ACTIONS: dict[str, Callable[[Any], Any]] = {
    "HeadObject": lambda fs: fs.info("retryfs-test/obj"),
    "GetObject": lambda fs: fs.cat_file("retryfs-test/obj"),
    "ListObjectsV2": lambda fs: fs.ls("retryfs-test/", refresh=True),
    "PutObject": lambda fs: fs.pipe_file("retryfs-test/new", b"abc"),
    "UploadPart": s3fs_multipart,
    "CompleteMultipartUpload": s3fs_multipart,
}

ClientError = botocore.exceptions.ClientError

# fault, operation, requests of that op, raised type, text, type of __cause__ (None: no cause)
S3FS_RAISES: list[tuple[S3Fault, str, int, type[BaseException], str, type | None]] = [
    (S3Fault.internal_error(), "GetObject", 1, OSError,
     "[Errno 121] We encountered an internal error. Please try again.", ClientError),
    (S3Fault.internal_error(), "HeadObject", 1, OSError,
     "[Errno 121] Internal Server Error", ClientError),
    (S3Fault.slow_down(), "PutObject", 1, OSError,
     "[Errno 16] Please reduce your request rate.", ClientError),
    # the failed write raises; leaving `with` closes the file, which sends the part again
    (S3Fault.service_unavailable(), "UploadPart", 2, OSError,
     "[Errno 16] Service is unable to handle request.", ClientError),
    (S3Fault.too_many_requests(), "ListObjectsV2", 1, OSError,
     "[Errno 5] An error occurred (TooManyRequests) when calling the ListObjectsV2 operation "
     "(reached max retries: 0): Please reduce your request rate.", ClientError),
    (S3Fault.access_denied(), "GetObject", 1, PermissionError, "Access Denied", ClientError),
    (S3Fault.access_denied(), "HeadObject", 1, PermissionError, "Forbidden", ClientError),
    (S3Fault.no_such_bucket(), "ListObjectsV2", 1, FileNotFoundError,
     "The specified bucket does not exist", ClientError),
    (S3Fault.reset(), "CompleteMultipartUpload", 1, botocore.exceptions.EndpointConnectionError,
     "Could not connect to the endpoint URL", None),
    # aiohttp replays an idempotent request once when the connection drops: 2 resets to fail
    (S3Fault.reset(times=2), "GetObject", 2, botocore.exceptions.EndpointConnectionError,
     "Could not connect to the endpoint URL", None),
    (S3Fault.truncate(), "GetObject", 1, aiohttp.ClientPayloadError,  # raw: s3fs does not wrap it
     "Response payload is not completed", None),
    (S3Fault.truncate(), "ListObjectsV2", 1, botocore.exceptions.ConnectionClosedError,
     "Connection was closed before we received a valid response", None),
    (S3Fault.stall(5), "HeadObject", 1, botocore.exceptions.ReadTimeoutError,
     "Read timeout on endpoint URL", None),
    (S3Fault.error_in_200(), "CompleteMultipartUpload", 1, OSError,
     "[Errno 121] We encountered an internal error. Please try again.", ClientError),
]


@pytest.mark.parametrize(("fault", "op", "requests", "kind", "text", "cause"), S3FS_RAISES,
                         ids=[f"{f.kind}-{f.status}-{op}" for f, op, *_ in S3FS_RAISES])
def test_s3fs_raises_its_real_error(ep: S3FaultEndpoint, s3: Any, fault: S3Fault, op: str,
                                    requests: int, kind: type[BaseException], text: str,
                                    cause: type | None) -> None:
    ep.add_fault(S3Fault(**{**vars(fault), "op": op}))
    with pytest.raises(kind) as raised:
        S3FS_ACTIONS[op](s3_timing_out(ep) if fault.kind == "stall" else s3)
    assert text in str(raised.value)
    if cause is not None:
        assert isinstance(raised.value.__cause__ or raised.value.__context__, cause)
    assert ep.counts()[op] == requests
    # every request of that operation met the fault (it fired), and nothing else did
    assert [r.op for r in ep.injected] == [op] * requests


def test_s3fs_replays_a_single_reset_of_an_idempotent_request(ep: S3FaultEndpoint,
                                                               s3: Any) -> None:
    ep.add_fault(S3Fault.reset(op="GetObject", times=1))
    assert s3.cat_file("retryfs-test/obj") == DATA
    assert [(r.op, r.status) for r in ep.requests(op="GetObject")] == [
        ("GetObject", None), ("GetObject", 200)]


def test_boto3_sees_resets_truncations_and_retry_after(ep: S3FaultEndpoint) -> None:
    client = ep.boto3_client()
    ep.add_fault(S3Fault.reset(op="GetObject", times=1))
    with pytest.raises(botocore.exceptions.ConnectionClosedError) as raised:
        client.get_object(Bucket="retryfs-test", Key="obj")
    assert "Connection reset by peer" in str(raised.value.__context__)

    ep.add_fault(S3Fault.truncate(op="GetObject", keep_bytes=1000, times=1))
    body = client.get_object(Bucket="retryfs-test", Key="obj")["Body"]
    with pytest.raises(botocore.exceptions.ResponseStreamingError,
                       match=r"IncompleteRead\(1000 bytes read, 101400 more expected\)"):
        body.read()

    ep.add_fault(S3Fault.slow_down(op="HeadObject", retry_after=3))
    with pytest.raises(ClientError) as raised:
        client.head_object(Bucket="retryfs-test", Key="obj")
    meta = raised.value.response["ResponseMetadata"]
    assert (meta["HTTPStatusCode"], meta["HTTPHeaders"]["retry-after"]) == (503, "3")


# -- plans -------------------------------------------------------------------------------------

def outcomes(fs: pafs.S3FileSystem, n: int) -> list[bool]:
    """For n HeadObject calls, whether each one failed."""
    failed = []
    for _ in range(n):
        try:
            fs.get_file_info("retryfs-test/obj")
            failed.append(False)
        except OSError:
            failed.append(True)
    return failed


@pytest.mark.parametrize(("when", "failing"), [
    ({"nth": 3}, [3]),
    ({"times": 2}, [1, 2]),
    ({"nth": 2, "times": 2}, [2, 3]),
    ({"times": 0}, []),
    ({}, [1, 2, 3, 4, 5, 6]),
])
def test_nth_and_times(ep: S3FaultEndpoint, pa: pafs.S3FileSystem, when: dict[str, int],
                       failing: list[int]) -> None:
    ep.add_fault(S3Fault.internal_error(op="HeadObject", **when))
    assert [i for i, bad in enumerate(outcomes(pa, 6), 1) if bad] == failing
    assert [r.seq for r in ep.injected] == [r.seq for r in ep.requests()
                                            if r.status == 500]


def test_seeded_probability_is_deterministic(ep: S3FaultEndpoint,
                                             pa: pafs.S3FileSystem) -> None:
    rng = random.Random(7)
    expected = [rng.random() < 0.3 for _ in range(40)]
    runs = []
    for _ in range(2):
        ep.clear_faults()
        ep.add_fault(S3Fault.service_unavailable(op="HeadObject", probability=0.3, seed=7))
        runs.append(outcomes(pa, 40))
    assert runs == [expected, expected]
    assert 0 < sum(expected) < 40


def test_match_by_query_method_path_and_predicate(ep: S3FaultEndpoint) -> None:
    client = ep.boto3_client()
    part2 = ep.add_fault(S3Fault.internal_error(query={"partNumber": 2, "uploadId": True}))
    create = ep.add_fault(S3Fault.slow_down(query={"uploads": True}, method="post", times=1))
    with pytest.raises(ClientError, match="SlowDown"):
        client.create_multipart_upload(Bucket="retryfs-test", Key="mp")
    upload = client.create_multipart_upload(Bucket="retryfs-test", Key="mp")["UploadId"]
    for number in (1, 2, 3):
        call = lambda n=number: client.upload_part(  # noqa: E731
            Bucket="retryfs-test", Key="mp", UploadId=upload, PartNumber=n, Body=b"p")
        if number == 2:
            with pytest.raises(ClientError, match="InternalError"):
                call()
        else:
            call()
    assert (ep.fired(part2), ep.fired(create)) == (1, 1)

    ep.clear_faults()
    denied = ep.add_fault(S3Fault.access_denied(path="retryfs-test/secret/*"))
    missing = ep.add_fault(S3Fault.no_such_key(path=re.compile(r"\.tmp$")))
    flaky = ep.add_fault(S3Fault.internal_error(when=lambda r: r.headers.get("x-flaky") == "1"))
    ep.put_object("retryfs-test", "secret/a", b"s")
    ep.put_object("retryfs-test", "a.tmp", b"t")
    with pytest.raises(ClientError, match="AccessDenied"):
        client.get_object(Bucket="retryfs-test", Key="secret/a")
    with pytest.raises(ClientError, match="NoSuchKey"):
        client.get_object(Bucket="retryfs-test", Key="a.tmp")
    assert client.get_object(Bucket="retryfs-test", Key="obj")["Body"].read() == DATA
    assert ep.fired(flaky) == 0  # no x-flaky header yet: the predicate let it through
    flagged = urllib.request.Request(f"{ep.url}/retryfs-test/obj", headers={"x-flaky": "1"})
    with pytest.raises(urllib.error.HTTPError) as answered:
        urllib.request.urlopen(flagged, timeout=10)
    assert answered.value.code == 500
    assert (ep.fired(denied), ep.fired(missing), ep.fired(flaky)) == (1, 1, 1)


def test_first_rule_that_fires_wins_and_hides_the_request_from_later_ones(
        ep: S3FaultEndpoint, pa: pafs.S3FileSystem) -> None:
    first = ep.add_fault(S3Fault.slow_down(op="HeadObject", times=1))
    second = ep.add_fault(S3Fault.internal_error(op="HeadObject", nth=2))
    outcomes(pa, 3)
    assert [(r.status, r.fault) for r in ep.requests()] == [
        (503, first), (200, None), (500, second)]


def test_faults_are_validated_at_construction() -> None:
    with pytest.raises(ValueError, match="op: unknown S3 operation 'ListObjectV2'"):
        S3Fault.reset(op="ListObjectV2")
    with pytest.raises(ValueError, match="nth"):
        S3Fault.reset(nth=0)
    with pytest.raises(ValueError, match="probability"):
        S3Fault.reset(probability=1.5)
    with pytest.raises(TypeError):
        S3Fault.reset(opp="GetObject")


@pytest.mark.parametrize(("method", "path", "query", "headers", "op"), [
    ("GET", "", {}, {}, "ListBuckets"),
    ("PUT", "b", {}, {}, "CreateBucket"),
    ("HEAD", "b", {}, {}, "HeadBucket"),
    ("GET", "b", {"list-type": "2", "prefix": ""}, {}, "ListObjectsV2"),
    ("GET", "b", {"prefix": "", "delimiter": "/"}, {}, "ListObjects"),
    ("GET", "b", {"list-type": "2", "prefix": "x"}, {}, "ListObjectsV2"),
    ("GET", "b", {"publicAccessBlock": ""}, {}, "GetBucketPublicAccessBlock"),
    ("PUT", "b/k", {"legal-hold": ""}, {}, "PutObjectLegalHold"),
    ("GET", "b", {"uploads": ""}, {}, "ListMultipartUploads"),
    ("GET", "b", {"versioning": ""}, {}, "GetBucketVersioning"),
    ("POST", "b", {"delete": ""}, {}, "DeleteObjects"),
    ("PUT", "b/k", {}, {}, "PutObject"),
    ("PUT", "b/k", {}, {"x-amz-copy-source": "b/j"}, "CopyObject"),
    ("PUT", "b/k", {"partNumber": "1", "uploadId": "u"}, {}, "UploadPart"),
    ("PUT", "b/k", {"partNumber": "1", "uploadId": "u"}, {"x-amz-copy-source": "b/j"},
     "UploadPartCopy"),
    ("POST", "b/k", {"uploads": ""}, {}, "CreateMultipartUpload"),
    ("POST", "b/k", {"uploadId": "u"}, {}, "CompleteMultipartUpload"),
    ("DELETE", "b/k", {"uploadId": "u"}, {}, "AbortMultipartUpload"),
    ("GET", "b/k", {"uploadId": "u"}, {}, "ListParts"),
    ("GET", "b/k", {}, {}, "GetObject"),
    ("GET", "b/k", {"tagging": ""}, {}, "GetObjectTagging"),
    ("HEAD", "b/k", {}, {}, "HeadObject"),
    ("DELETE", "b/k", {}, {}, "DeleteObject"),
])
def test_operation_names(method: str, path: str, query: dict[str, str],
                         headers: dict[str, str], op: str) -> None:
    bucket, _, key = path.partition("/")
    assert operation_name(method, bucket, key, query, headers) == op


# -- the record --------------------------------------------------------------------------------

def test_record_names_every_pyarrow_request(ep: S3FaultEndpoint,
                                            pa: pafs.S3FileSystem) -> None:
    pa_write(pa, "retryfs-test/w", DATA)
    assert pa.open_input_file("retryfs-test/w").read() == DATA
    pa.copy_file("retryfs-test/w", "retryfs-test/c")
    pa.move("retryfs-test/c", "retryfs-test/m")
    pa.delete_file("retryfs-test/m")
    counts = ep.counts()
    assert {op: counts[op] for op in ("CreateMultipartUpload", "UploadPart",
                                      "CompleteMultipartUpload", "CopyObject",
                                      "DeleteObject")} == {
        "CreateMultipartUpload": 1, "UploadPart": 1, "CompleteMultipartUpload": 1,
        "CopyObject": 2, "DeleteObject": 2}
    part = ep.requests(op="UploadPart")[0]
    assert part.request_bytes >= len(DATA) and part.query["partNumber"] == "1"
    gets = ep.requests(op="GetObject")
    assert sum(r.response_bytes for r in gets) == len(DATA)
    assert all(r.headers["range"].startswith("bytes=") for r in gets)
    assert ep.injected == []
    ep.reset_record()
    assert ep.requests() == [] and ep.counts() == {}


def test_pyarrow_multipart_threshold(ep: S3FaultEndpoint) -> None:
    def ops_for(size: int, **options: Any) -> list[str]:
        ep.reset_record()
        pa_write(ep.pyarrow_fs(**options), "retryfs-test/t", b"t" * size)
        assert ep.get_object("retryfs-test", "t") == b"t" * size
        return [r.op for r in ep.requests()]

    multipart = ["CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload"]
    assert ops_for(0) == multipart  # default: every stream is a multipart upload
    assert ops_for(PYARROW_PART_SIZE - 1, allow_delayed_open=True) == ["PutObject"]
    assert ops_for(PYARROW_PART_SIZE, allow_delayed_open=True) == multipart
    assert ops_for(PYARROW_PART_SIZE + 1, background_writes=False) == [
        "CreateMultipartUpload", "UploadPart", "UploadPart", "CompleteMultipartUpload"]


def test_applied_fault_changes_the_store_but_not_the_answer(ep: S3FaultEndpoint,
                                                            pa: pafs.S3FileSystem) -> None:
    ep.add_fault(S3Fault.reset(op="DeleteObject", applied=True))
    with pytest.raises(OSError, match="curlCode: 56"):
        pa.delete_file("retryfs-test/obj")
    with pytest.raises(KeyError):
        ep.get_object("retryfs-test", "obj")


def test_clients_ignore_the_aws_environment(ep: S3FaultEndpoint,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"AWS_PROFILE": "no-such-profile", "AWS_ACCESS_KEY_ID": "wrong",
                        "AWS_SECRET_ACCESS_KEY": "wrong", "AWS_SESSION_TOKEN": "wrong",
                        "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_MAX_ATTEMPTS": "7",
                        "AWS_DEFAULT_REGION": "eu-west-3", "AWS_CONFIG_FILE": "/nonexistent"
                        }.items():
        monkeypatch.setenv(name, value)
    ep.add_fault(S3Fault.internal_error(op="HeadObject", path="*/fail"))
    client = ep.boto3_client()
    assert client.get_object(Bucket="retryfs-test", Key="obj")["Body"].read() == DATA
    assert ep.s3fs().cat_file("retryfs-test/obj") == DATA
    assert ep.pyarrow_fs().open_input_stream("retryfs-test/obj").read() == DATA
    with pytest.raises(ClientError):
        client.head_object(Bucket="retryfs-test", Key="fail")
    assert len(ep.requests(path="*/fail")) == 1  # AWS_MAX_ATTEMPTS did not bring retries back


# -- lifecycle -----------------------------------------------------------------------------------

def test_endpoints_keep_their_own_store() -> None:
    with S3FaultEndpoint() as one, S3FaultEndpoint() as two:
        one.create_bucket("bucket-one")
        one.put_object("bucket-one", "k", b"1")
        two.create_bucket("bucket-two")
        two.reset()
        assert one.keys("bucket-one") == ["k"]
        one.create_bucket("bucket-two")  # the name was released: no BucketAlreadyExists
        assert [b["Name"] for b in one.boto3_client().list_buckets()["Buckets"]] == [
            "bucket-one", "bucket-two"]
    with S3FaultEndpoint() as three:  # a stopped endpoint released its bucket names
        three.create_bucket("bucket-one")
        assert three.keys("bucket-one") == []


def test_stop_ends_a_stall_and_every_thread() -> None:
    before = set(threading.enumerate())
    endpoint = S3FaultEndpoint(max_stall=60).start()
    endpoint.create_bucket("stall")
    endpoint.put_object("stall", "k", b"x")
    arrived = threading.Event()
    stall = endpoint.add_fault(S3Fault.stall(60, op="GetObject",
                                             when=lambda request: arrived.set() is None))
    fs = endpoint.pyarrow_fs(request_timeout=30)
    errors: list[BaseException] = []

    def read() -> None:
        try:
            fs.open_input_stream("stall/k").read()
        except BaseException as e:  # noqa: BLE001 - handed to the test thread
            errors.append(e)

    reader = threading.Thread(target=read)
    reader.start()
    assert arrived.wait(10)
    started = time.perf_counter()
    endpoint.stop()
    # stop() ended the 60 s stall instead of waiting it out (any bound far below 60 s shows it)
    assert time.perf_counter() - started < 30
    reader.join(10)
    assert not reader.is_alive()
    assert endpoint.fired(stall) == 1
    assert len(errors) == 1 and "AWS Error NETWORK_CONNECTION" in str(errors[0])
    assert set(threading.enumerate()) - before == set()
    endpoint.stop()  # idempotent
    with pytest.raises(RuntimeError, match="not started"):
        endpoint.url  # noqa: B018


def test_delay_serves_late_and_max_stall_bounds_every_wait() -> None:
    with S3FaultEndpoint(max_stall=0.5) as endpoint:
        endpoint.create_bucket("waits")
        endpoint.put_object("waits", "k", b"late")
        fs = endpoint.pyarrow_fs(request_timeout=5)
        endpoint.add_fault(S3Fault.delay(60, op="GetObject"))
        started = time.monotonic()
        assert fs.open_input_stream("waits/k").read() == b"late"
        assert 0.5 <= time.monotonic() - started < 3
        endpoint.add_fault(S3Fault.stall(60, op="CompleteMultipartUpload"))
        started = time.monotonic()
        with pytest.raises(OSError, match="curlCode: 56"):
            pa_write(fs, "waits/new")
        assert 0.5 <= time.monotonic() - started < 3


def test_fixture_gives_a_clean_endpoint(s3_fault_endpoint: S3FaultEndpoint,
                                        s3_fault_bucket: str) -> None:
    assert s3_fault_endpoint.faults == ()
    assert s3_fault_endpoint.requests() == []
    assert s3_fault_endpoint.keys(s3_fault_bucket) == []
    s3_fault_endpoint.add_fault(S3Fault.reset())  # left behind on purpose: reset at teardown


def test_a_commit_of_an_upload_no_longer_there_is_no_such_upload(ep: S3FaultEndpoint,
                                                                  s3_fault_bucket: str) -> None:
    """As S3: a CompleteMultipartUpload sent again while the object is that upload's is answered
    as the first was (moto: "idempotent"); once the object is another's, the upload is gone:
    404 NoSuchUpload (moto alone answers a 500 from a KeyError)."""
    import botocore.exceptions

    client = ep.boto3_client()
    upload = client.create_multipart_upload(Bucket=s3_fault_bucket, Key="mpu")["UploadId"]
    etag = client.upload_part(Bucket=s3_fault_bucket, Key="mpu", UploadId=upload, PartNumber=1,
                              Body=b"x" * 100)["ETag"]
    parts = {"Parts": [{"PartNumber": 1, "ETag": etag}]}

    def complete() -> Any:
        return client.complete_multipart_upload(Bucket=s3_fault_bucket, Key="mpu",
                                                UploadId=upload, MultipartUpload=parts)

    first = complete()
    assert complete()["ETag"] == first["ETag"]  # again: the same answer
    ep.put_object(s3_fault_bucket, "mpu", b"another writer")
    with pytest.raises(botocore.exceptions.ClientError) as raised:
        complete()
    assert raised.value.response["Error"]["Code"] == "NoSuchUpload"
    assert raised.value.response["ResponseMetadata"]["HTTPStatusCode"] == 404
    assert ep.get_object(s3_fault_bucket, "mpu") == b"another writer"


@pytest.mark.parametrize("sizes", [[], [1], [5, 65536, 3], [65536] * 40 + [17]])
def test_an_aws_chunked_body_decodes_as_moto_decodes_it(sizes):
    """The endpoint decodes aws-chunked bodies in one pass; the bytes are moto's own."""
    from moto.s3.responses import S3Response

    from retryfs.testing import s3

    chunks = [bytes([n % 251]) * size for n, size in enumerate(sizes)]
    body = b"".join(b"%x\r\n%s\r\n" % (len(c), c) for c in chunks)
    body += b"0\r\nx-amz-checksum-crc64nvme:AAAAAAAAAAA=\r\n\r\n"
    assert S3Response._handle_encoded_body is s3._handle_encoded_body
    original = s3._handle_encoded_body.moto_original
    decoded = s3._handle_encoded_body(None, body)
    assert decoded == b"".join(chunks) == original(None, body)
    assert decoded == original(None, io.BytesIO(body)) == s3._handle_encoded_body(
        None, io.BytesIO(body))

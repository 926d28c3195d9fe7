"""HttpFaultProxy (faults for any HTTP store) and the GCS / Azure emulator endpoints behind it;
client_attempts over gcsfs, adlfs and pyarrow's GcsFileSystem, pickled too."""

from __future__ import annotations

import http.client
import json
import pickle

import cloudpickle
import pytest

from retryfs import RetryingFileSystem, RetryPolicy
from retryfs.core.classify import Decision, ErrorClassifier
from retryfs.testing.emulators import AzureFaultEndpoint, EmulatorError
from retryfs.testing.http import AZURE, GCS, HttpFault

POLICY = RetryPolicy(max_attempts=3, initial_delay=0.001, max_delay=0.002, jitter=False)


@pytest.mark.parametrize(("method", "path", "query", "want"), [
    ("GET", "/storage/v1/b/bkt/o/a%2Fb", {}, ("bkt/a/b", "objects.get")),
    ("GET", "/storage/v1/b/bkt/o/a", {"alt": "media"}, ("bkt/a", "objects.download")),
    ("GET", "/download/storage/v1/b/bkt/o/a", {}, ("bkt/a", "objects.download")),
    ("GET", "/storage/v1/b/bkt/o", {"prefix": "x/"}, ("bkt", "objects.list")),
    ("POST", "/upload/storage/v1/b/bkt/o", {"uploadType": "resumable", "name": "k"},
     ("bkt/k", "uploads.start")),
    ("PUT", "/upload/storage/v1/b/bkt/o", {"upload_id": "u"}, ("bkt", "uploads.put")),
    ("POST", "/upload/storage/v1/b/bkt/o", {"uploadType": "multipart"},
     ("bkt", "objects.insert")),
    ("POST", "/storage/v1/b/bkt/o/a/rewriteTo/b/bkt/o/b", {}, ("bkt/a", "objects.rewrite")),
    ("DELETE", "/storage/v1/b/bkt/o/a", {}, ("bkt/a", "objects.delete")),
    ("POST", "/storage/v1/b", {}, ("", "buckets.insert")),
])
def test_gcs_operation_names(method, path, query, want):
    from urllib.parse import unquote

    assert GCS.parse(method, unquote(path), query, {}) == want


@pytest.mark.parametrize(("method", "path", "query", "headers", "want"), [
    ("PUT", "/acct/c/b", {}, {}, ("c/b", "PutBlob")),
    ("PUT", "/acct/c/b", {"comp": "block", "blockid": "x"}, {}, ("c/b", "PutBlock")),
    ("PUT", "/acct/c/b", {"comp": "blocklist"}, {}, ("c/b", "PutBlockList")),
    ("PUT", "/acct/c/b", {}, {"x-ms-copy-source": "u"}, ("c/b", "CopyBlob")),
    ("HEAD", "/acct/c/b", {}, {}, ("c/b", "GetBlobProperties")),
    ("GET", "/acct/c/b", {}, {}, ("c/b", "GetBlob")),
    ("GET", "/acct/c", {"restype": "container", "comp": "list"}, {}, ("c", "ListBlobs")),
    ("PUT", "/acct/c", {"restype": "container"}, {}, ("c", "CreateContainer")),
])
def test_azure_operation_names(method, path, query, headers, want):
    assert AZURE.parse(method, path, query, headers) == want


def test_a_fault_naming_an_unknown_operation_is_refused(gcs_fault_endpoint):
    with pytest.raises(ValueError, match="unknown gcs operation"):
        gcs_fault_endpoint.add_fault(HttpFault.unavailable(op="objects.gett"))
    with pytest.raises(ValueError, match="status"):
        HttpFault.error(42)


def _raw(endpoint, method, path, headers=None):
    conn = http.client.HTTPConnection(endpoint.proxy.host, endpoint.proxy.port, timeout=10)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return response.status, dict(response.getheaders()), response.read()
    finally:
        conn.close()


def test_gcs_errors_are_json_as_google_sends_them(gcs_fault_endpoint, gcs_fault_bucket):
    ep = gcs_fault_endpoint
    fault = ep.add_fault(HttpFault.unavailable(op="objects.get", times=1))
    status, headers, body = _raw(ep, "GET", f"/storage/v1/b/{gcs_fault_bucket}/o/missing")
    assert status == 503 and headers["Content-Type"].startswith("application/json")
    error = json.loads(body)["error"]
    assert error["code"] == 503 and error["errors"][0]["reason"] == "backendError"
    status, _, _ = _raw(ep, "GET", f"/storage/v1/b/{gcs_fault_bucket}/o/missing")
    assert status == 404  # forwarded: the emulator's own answer
    assert ep.fired(fault) == 1 and [r.status for r in ep.requests("objects.get")] == [503, 404]


def test_azure_errors_are_xml_with_the_error_code_header(azure_fault_endpoint):
    ep = azure_fault_endpoint
    ep.add_fault(HttpFault.server_busy(op="GetBlob", times=1))
    ep.add_fault(HttpFault.forbidden(op="GetBlobProperties", times=1))
    status, headers, body = _raw(ep, "GET", "/devstoreaccount1/c/b")
    assert status == 503 and headers["x-ms-error-code"] == "ServerBusy"
    assert b"<Error><Code>ServerBusy</Code>" in body
    status, headers, body = _raw(ep, "HEAD", "/devstoreaccount1/c/b")
    assert status == 403 and headers["x-ms-error-code"] == "AuthorizationPermissionMismatch"
    assert body == b"" and "Content-Type" not in headers  # a HEAD error is headers only
    assert len(ep.injected) == 2


def test_reset_and_truncate_reach_the_client(gcs_fault_endpoint, gcs_fault_bucket):
    ep = gcs_fault_endpoint
    ep.put_object(gcs_fault_bucket, "obj", b"x" * 10_000)
    path = f"/storage/v1/b/{gcs_fault_bucket}/o/obj?alt=media"
    ep.add_fault(HttpFault.reset(op="objects.download", times=1))
    with pytest.raises((ConnectionError, http.client.RemoteDisconnected)):
        _raw(ep, "GET", path)
    ep.add_fault(HttpFault.truncate(keep_bytes=100, op="objects.download", times=1))
    with pytest.raises(http.client.IncompleteRead):
        _raw(ep, "GET", path)
    assert _raw(ep, "GET", path)[2] == b"x" * 10_000
    assert [r.response_bytes for r in ep.requests("objects.download")] == [0, 100, 10_000]


def test_an_emulator_that_cannot_start_says_why():
    with pytest.raises(EmulatorError, match="cannot run '/nonexistent/azurite-blob'"):
        with AzureFaultEndpoint(command=["/nonexistent/azurite-blob"]):
            pass


@pytest.mark.parametrize("text", [
    "google::cloud::Status(UNAVAILABLE: Retry policy exhausted, with a last message of Backend "
    "Error error_info={reason=backendError})",
    "google::cloud::Status(DEADLINE_EXCEEDED: Retry policy exhausted before first request "
    "attempt)",
    "Azure Error: [InternalError] 500 Internal Server Error",
    "Azure Error: [] Error while reading from network socket. CURLE code: 56. Failure when "
    "receiving data from the peer",
    "Failed to list blobs in a directory: c/ckpt: http://127.0.0.1:1/devstoreaccount1/c Azure "
    "Error: [] Connection closed before getting full response or response is less than "
    "expected. Expected response length = 1629. Read until now = 814",
])
def test_cloud_sdk_texts_are_transient(text):
    assert ErrorClassifier().classify(OSError(text)) is Decision.RETRY


@pytest.mark.parametrize(("text", "decision"), [
    ("google::cloud::Status(RESOURCE_EXHAUSTED: rate)", Decision.THROTTLE),
    ("Azure Error: [ServerBusy] 503 Service Unavailable", Decision.THROTTLE),
    ("google::cloud::Status(PERMISSION_DENIED: Permanent error)", Decision.FAIL),
    ("Azure Error: [AuthorizationPermissionMismatch] 403 Forbidden", Decision.FAIL),
    ("Azure Error: [ConditionNotMet] 412 Precondition Failed", Decision.FAIL),
    # google-cloud-cpp's name for HTTP 409, which it does not retry itself either
    ("google::cloud::Status(ABORTED: Permanent error, with a last message of Conflict "
     "error_info={reason=conflict, domain=global})", Decision.FAIL),
])
def test_cloud_sdk_texts_throttle_or_fail(text, decision):
    assert ErrorClassifier().classify(OSError(text)) is decision


# -- client_attempts: one retry layer, pickled too ---------------------------------------------

def _client(name, gcs, azure):
    if name == "pyarrow_gcs":
        return gcs, gcs.pyarrow_fs(retry_time_limit=60.0)  # its own loop: 60 s of retries
    if name == "gcsfs":
        return gcs, gcs.gcsfs(attempts=6)  # gcsfs's default
    return azure, azure.adlfs(attempts=4)  # azure-storage's default: 3 retries


@pytest.mark.timeout(60)
@pytest.mark.parametrize("dumps", [None, pickle.dumps, cloudpickle.dumps],
                         ids=["local", "pickle", "cloudpickle"])
@pytest.mark.parametrize("name", ["pyarrow_gcs", "gcsfs", "adlfs"])
def test_client_attempts_leave_retryfs_the_only_retry_layer(
        name, dumps, gcs_fault_endpoint, gcs_fault_bucket, azure_fault_endpoint,
        azure_fault_container):
    ep, inner = _client(name, gcs_fault_endpoint, azure_fault_endpoint)
    bucket = gcs_fault_bucket if ep is gcs_fault_endpoint else azure_fault_container
    fs = RetryingFileSystem(inner, POLICY, budget=False, client_attempts=1)
    if dumps is not None:
        fs = pickle.loads(dumps(fs))
        assert fs.retry_handler.client_attempts == 1
    ep.put_object(bucket, "obj", b"data")
    ops = ("objects.download",) if ep is gcs_fault_endpoint else ("GetBlob",)
    ep.add_fault(HttpFault.unavailable(op=ops))  # every download fails
    with pytest.raises(Exception):  # noqa: B017 - the client's own type, whatever it is
        fs.open_input_stream(f"{bucket}/obj").read()
    assert len(ep.requests(ops)) == POLICY.max_attempts, ep.counts()

    ep.reset()
    ep.add_fault(HttpFault.forbidden(op=ops))
    with pytest.raises(Exception):  # noqa: B017
        fs.open_input_stream(f"{bucket}/obj").read()
    assert len(ep.requests(ops)) == 1, ep.counts()  # a permanent error: sent once


# -- from_uri: gs:// and abfs:// on an endpoint of the user's choosing ---------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("store", ["gcs", "azure"])
def test_from_uri_reaches_the_emulators_with_retryfs_the_only_retry_layer(
        store, gcs_fault_endpoint, gcs_fault_bucket, azure_fault_endpoint, azure_fault_container,
        caplog, monkeypatch):
    from retryfs import from_uri

    ep, bucket = ((gcs_fault_endpoint, gcs_fault_bucket) if store == "gcs"
                  else (azure_fault_endpoint, azure_fault_container))
    if store == "azure":  # adlfs's own convention for credentials
        monkeypatch.setenv("AZURE_STORAGE_CONNECTION_STRING", ep.connection_string())
    fs, path = from_uri(ep.uri(f"{bucket}/ckpt", retry_max_attempts=3,
                               retry_initial_delay=0.001, retry_jitter="false",
                               retry_budget="false"))
    assert path == f"{bucket}/ckpt" and fs.retry_handler.client_attempts == 1
    with fs.open_output_stream(f"{path}/model.pt") as f:
        f.write(b"weights" * 1000)
    assert ep.get_object(bucket, "ckpt/model.pt") == b"weights" * 1000

    download = "objects.download" if store == "gcs" else "GetBlob"
    clone = cloudpickle.loads(cloudpickle.dumps(fs))  # as Ray ships it to a worker
    for wrapper in (fs, clone):
        ep.reset()
        ep.add_fault(HttpFault.internal_error(op=download, times=2))
        assert wrapper.open_input_stream(f"{path}/model.pt").read() == b"weights" * 1000
        faulted = len(ep.requests(download, faulted=True))
        assert faulted == 2, ep.counts()
        assert wrapper.stats.snapshot()["retries"] >= 2  # retryfs's, not the client's
    if store == "azure":
        assert ep.key not in caplog.text and ep.key not in repr(fs)


# -- the proxy in a process of its own ---------------------------------------------------------

def test_a_proxy_in_its_own_process_keeps_the_plan_and_the_record(gcs_process_fault_endpoint):
    ep = gcs_process_fault_endpoint
    ep.create_bucket("retryfs-process-record")
    ep.put_object("retryfs-process-record", "obj", b"x" * 1000)
    fault = ep.add_fault(HttpFault.unavailable(op="objects.download", times=1))
    with pytest.raises(ValueError, match="unknown gcs operation"):
        ep.add_fault(HttpFault.reset(op="objects.typo"))
    conn = http.client.HTTPConnection(ep.proxy.host, ep.proxy.port, timeout=10)
    answers = []
    for _ in range(2):
        conn.request("GET", "/storage/v1/b/retryfs-process-record/o/obj?alt=media")
        response = conn.getresponse()
        answers.append((response.status, response.read()))
    conn.close()
    assert answers[0][0] == 503
    assert json.loads(answers[0][1])["error"]["errors"][0]["reason"] == "backendError"
    assert answers[1] == (200, b"x" * 1000)
    records = ep.requests("objects.download")
    assert [r.status for r in records] == [503, 200]
    assert records[0].fault is fault and records[1].fault is None  # the caller's own object
    assert ep.fired(fault) == 1 and ep.counts()["objects.download"] == 2
    assert ep.proxy.faults == (fault,)
    ep.reset()
    assert ep.requests() == [] and ep.proxy.faults == ()


def test_a_proxy_process_ends_with_stop(gcs_process_fault_server):
    from retryfs.testing.http_process import ProcessFaultProxy

    proxy = ProcessFaultProxy(gcs_process_fault_server.upstream, GCS).start()
    child = proxy._process
    assert child is not None and child.poll() is None
    assert "ProcessFaultProxy(gcs, http://127.0.0.1:" in repr(proxy)
    proxy.stop()
    assert child.poll() is not None  # exited, not left behind
    with pytest.raises(RuntimeError, match="not started"):
        proxy.add_fault(HttpFault.reset())


# -- from_uri: an abfs:// account key in the URL is used, and never shown ----------------------

def _texts_out(fs, *more):
    return [repr(fs), str(fs), repr(fs.unwrap()), *more]


def test_from_uri_abfs_takes_the_account_key_of_the_url():
    from urllib.parse import quote

    from retryfs import from_uri
    from retryfs.core.redact import registered_secrets, reset_secrets

    saved = registered_secrets()
    key = "c2VjcmV0+a2V5/Zm9yLXRlc3Rz=="  # '+' and '/' as base64 keys have them
    try:
        fs, path = from_uri(f"abfs://acct:{quote(key, safe='+')}@container/ckpt/run1"
                            "?retry_max_attempts=3")
        options = fs.unwrap().__reduce__()[1][0]
        assert (options["account_name"], options["account_key"]) == ("acct", key)
        assert path == "container/ckpt/run1" and fs.policy.max_attempts == 3
        for text in _texts_out(fs, repr(pickle.loads(pickle.dumps(fs)))):
            assert key not in text and quote(key, safe="") not in text, text
        with pytest.raises(ValueError, match="account name and its key"):
            from_uri("abfs://acct:@container/x")
        with pytest.raises(Exception) as refused:  # pyarrow's own error quotes the URI
            from_uri(f"abfs://acct:{quote(key, safe='+')}@container/x?bogus=1")
        assert "bogus" in str(refused.value) and key not in str(refused.value)
    finally:
        reset_secrets(saved)


@pytest.mark.timeout(60)
def test_from_uri_abfs_with_a_key_reaches_azurite_and_keeps_it_secret(
        azure_fault_endpoint, azure_fault_container, caplog):
    from urllib.parse import quote

    from retryfs import from_uri

    ep, container = azure_fault_endpoint, azure_fault_container
    fs, path = from_uri(f"abfs://{ep.account}:{quote(ep.key, safe='')}@{ep.endpoint}/"
                        f"{container}/ckpt?enable_tls=false&retry_max_attempts=3"
                        "&retry_initial_delay=0.001&retry_jitter=false&retry_budget=false")
    with fs.open_output_stream(f"{path}/model.pt") as f:  # signed with the URL's key
        f.write(b"weights" * 1000)
    assert ep.get_object(container, "ckpt/model.pt") == b"weights" * 1000
    clone = pickle.loads(pickle.dumps(fs))  # the key travels as configuration
    fault = ep.add_fault(HttpFault.too_many_requests(op="GetBlob", times=1))  # not SDK-retried
    assert clone.open_input_stream(f"{path}/model.pt").read() == b"weights" * 1000
    assert ep.fired(fault) == 1 and clone.stats.snapshot()["retries"] == 1
    with pytest.raises(FileNotFoundError) as missing:
        fs.open_input_stream(f"{path}/absent")
    assert "retryfs" in caplog.text  # the retry was logged, with its error text
    for text in _texts_out(fs, repr(clone), caplog.text, str(missing.value)):
        assert ep.key not in text and quote(ep.key, safe="") not in text

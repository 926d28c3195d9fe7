"""Secrets never reach a repr, a log line, an exception note or a metric.

The real tests drive real retries (an HTTP server on loopback that answers 503, the S3 fault
endpoint under s3fs) with secrets in URL userinfo, query strings and storage options, capture
every log record, and look for the secrets everywhere retryfs writes.
"""

from __future__ import annotations

import http.server
import json
import logging
import re
import threading
from collections.abc import Iterator

import aiohttp
import fsspec
import pytest
from _helpers import require

import retryfs
from retryfs import RetryPolicy
from retryfs.core.budget import reset_budgets
from retryfs.testing.s3 import S3Fault
from retryfs.uri import redact, register_secret

FAST = RetryPolicy(max_attempts=3, initial_delay=0.0, max_delay=0.0, jitter=False)
SIG = "sV3ryS3cretSignatur3xyz"
PASSWORD = "pa55w0rd-dont-leak"
TOKEN = "tok3n-that-must-not-leak"


@pytest.fixture(autouse=True)
def _fresh():
    reset_budgets()


# -- the redactor ---------------------------------------------------------------------------------

@pytest.mark.parametrize("text, secret", [
    ("s3://AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI/K7MDENG@bucket/key", "wJalrXUtnFEMI"),
    ("s3://AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI@bucket/key", "AKIAIOSFODNN7EXAMPLE"),
    ("https://ghp_abcdefghijklmnop@github.com/x.git", "ghp_abcdefghijklmnop"),
    ("https://acct.blob.core.windows.net/c/b?sv=2021-08-06&se=2030&sp=r&sig=abc%2Bdef%3D",
     "abc%2Bdef%3D"),
    ("https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIAX%2F2024&X-Amz-Signature=deadbeef",
     "deadbeef"),
    ("https://b.s3.amazonaws.com/k?X-Amz-Security-Token=FwoGZXIvYXdzE", "FwoGZXIvYXdzE"),
    ("DefaultEndpointsProtocol=https;AccountName=a;AccountKey=bXlrZXk=;EndpointSuffix=x",
     "bXlrZXk="),
    ("BlobEndpoint=https://a;SharedAccessSignature=sv=2021&sig=c2lnbmF0dXJl", "c2lnbmF0dXJl"),
    ("{'key': 'AKIDX', 'secret': 'hunter2hunter2', 'token': None}", "hunter2hunter2"),
    ('{"password": "correct horse"}', "correct"),
    ("Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.payload.sig", "eyJhbGciOiJIUzI1NiJ9"),
    ("aws_secret_access_key=wJalrXUtnFEMI token=abc123456", "wJalrXUtnFEMI"),
    ("connect with access_key_id=AKIAIOSFODNN7EXAMPLE", "AKIAIOSFODNN7EXAMPLE"),
    ("?client_secret=s3cr3t&code=1", "s3cr3t"),
])
def test_redact_hides_secrets(text, secret):
    shown = redact(text)
    assert secret not in shown
    assert "***" in shown


@pytest.mark.parametrize("text", [
    "bucket/experiments/run-1/checkpoint_000003/model.pt",
    "s3://bucket/table/date=2024-01-01/key=7/part-0.parquet",  # hive partitions stay
    "abfs://container@account.dfs.core.windows.net/data",  # a container is no secret
    "retryfs: get_file_info 'bucket/ckpt' failed (attempt 1 of 10): OSError[SLOW_DOWN]",
    "RetryPolicy(max_attempts=10, initial_delay=1.0, multiplier=2.0, max_delay=32.0)",
])
def test_redact_leaves_ordinary_text_alone(text):
    assert redact(text) == text


def test_registered_secrets_are_hidden_everywhere():
    register_secret("an-opaque/credential+42")
    assert redact("boom: an-opaque/credential+42 was refused") == "boom: *** was refused"
    assert redact("GET /x?c=an-opaque%2Fcredential%2B42") == "GET /x?c=***"  # URL-encoded too
    register_secret("ab")  # too short to mask safely: ignored
    assert redact("ab cd") == "ab cd"


# -- a real HTTP endpoint that fails ----------------------------------------------------------------

class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    failures = 0
    seen: list[str]
    body = b"0123456789" * 100


class _Handler(http.server.BaseHTTPRequestHandler):
    def log_message(self, *args):  # quiet
        pass

    def _answer(self, with_body: bool):
        server: _Server = self.server  # type: ignore[assignment]
        server.seen.append(self.path)
        if server.failures:
            server.failures -= 1
            self.send_response(503, "Service Unavailable")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = server.body
        status = 200
        ranged = re.match(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
        if ranged:
            start = int(ranged.group(1))
            end = int(ranged.group(2)) + 1 if ranged.group(2) else len(body)
            body, status = body[start:end], 206
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Accept-Ranges", "bytes")
        self.end_headers()
        if with_body:
            self.wfile.write(body)

    def do_GET(self):  # noqa: N802
        self._answer(True)

    def do_HEAD(self):  # noqa: N802
        self._answer(False)


@pytest.fixture
def http_server() -> Iterator[_Server]:
    server = _Server(("127.0.0.1", 0), _Handler)
    server.seen = []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _everything_written(caplog, *objects) -> str:
    """Every text retryfs produced: its log records (message and args), the notes it added to
    exceptions (an exception's own message is the backend's, raised unchanged), reprs, metrics."""
    records = [record for record in caplog.records if record.name.startswith("retryfs")]
    parts = [record.getMessage() for record in records]
    parts += [repr(record.args) for record in records]
    for obj in objects:
        if isinstance(obj, BaseException):
            parts.extend(getattr(obj, "__notes__", []))
            continue
        parts.append(repr(obj))
        if isinstance(obj, retryfs.RetryStats):
            parts.append(json.dumps(obj.snapshot(), default=str))
    return "\n".join(parts)


def _prometheus_text(stats) -> str:
    prometheus_client = require("prometheus_client")
    from retryfs.core.exporters import PrometheusCollector

    registry = prometheus_client.CollectorRegistry()
    PrometheusCollector(stats, registry=registry)
    return prometheus_client.generate_latest(registry).decode()


def test_http_url_secrets_stay_out_of_logs_notes_reprs_and_metrics(http_server, caplog):
    caplog.set_level(logging.WARNING, logger="retryfs")
    port = http_server.server_address[1]
    uri = (f"http://reader:{PASSWORD}@127.0.0.1:{port}/data.bin?sig={SIG}&token={TOKEN}"
           "&retry_max_attempts=4&retry_initial_delay=0&retry_max_delay=0")
    fs, path = retryfs.from_uri(uri)
    http_server.failures = 2
    with fs.open_input_stream(path) as stream:
        assert stream.read() == http_server.body
    assert any("retrying" in r.getMessage() for r in caplog.records)  # it really retried
    assert any(SIG in seen for seen in http_server.seen)  # the secret did reach the server

    http_server.failures = 100  # now it gives up
    # fsspec's http info() words a 503 as FileNotFoundError (the 503 is its context): raised
    # as it came, after the attempts
    with pytest.raises(FileNotFoundError) as info:
        fs.get_file_info(path)
    assert isinstance(info.value.__context__, aiohttp.ClientResponseError)
    assert info.value.__context__.status == 503
    assert any("gave up" in r.getMessage() for r in caplog.records)
    written = _everything_written(caplog, fs, info.value, fs.stats) + _prometheus_text(fs.stats)
    for secret in (SIG, PASSWORD, TOKEN):
        assert secret not in written
    assert "127.0.0.1" in written  # the rest of the URL is still there to debug with


def test_fsspec_chained_http_url_secrets_stay_out_of_logs(http_server, caplog):
    caplog.set_level(logging.WARNING, logger="retryfs")
    port = http_server.server_address[1]
    url = f"retry::http://127.0.0.1:{port}/data.bin?sig={SIG}"
    http_server.failures = 2  # fsspec's HEAD, then its GET fallback: its info raises
    with fsspec.open(url, "rb", retry={"policy": FAST}, http={"skip_instance_cache": True}
                     ) as f:
        assert f.read() == http_server.body
    assert any("retrying" in r.getMessage() for r in caplog.records)
    assert SIG not in _everything_written(caplog, f)


def test_s3fs_keys_stay_out_of_logs_notes_and_reprs(s3_fault_endpoint, s3_fault_bucket, caplog):
    caplog.set_level(logging.WARNING, logger="retryfs")
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    key_id, secret = "retryfs-key-id-0042", "s3cr3t/Value+That=Must-Not-Leak"
    fs = fsspec.filesystem(
        "retry", target_protocol="s3", policy=FAST, skip_instance_cache=True,
        target_options={"key": key_id, "secret": secret, "endpoint_url": ep.url,
                        "client_kwargs": {"region_name": ep.region}, "skip_instance_cache": True,
                        "config_kwargs": {"retries": {"total_max_attempts": 1,
                                                      "mode": "standard"}}})
    ep.add_fault(S3Fault.internal_error(op="PutObject", times=1))
    fs.pipe_file(f"{bucket}/k", b"v")
    ep.add_fault(S3Fault.internal_error(op="HeadObject"))  # every time: a give-up
    with pytest.raises(OSError) as info:
        fs.info(f"{bucket}/k")
    text = _everything_written(caplog, fs, info.value, fs.stats, fs.to_arrow())
    assert "retrying" in text and "gave up" in text
    for value in (key_id, secret):
        assert value not in text
    # a message that quotes a key (some SDKs do) is masked too: the value was registered
    assert key_id not in redact(f"InvalidAccessKeyId: {key_id} is unknown")


def test_from_uri_errors_do_not_quote_userinfo():
    with pytest.raises(ValueError) as info:
        retryfs.from_uri(f"s3://AKIAIOSFODNN7EXAMPLE:{PASSWORD}@bucket/key?bogus=1")
    assert PASSWORD not in str(info.value)
    with pytest.raises(ValueError) as info:
        retryfs.from_uri(f"http://u:{PASSWORD}@host/x?retry_nonsense=1")
    assert PASSWORD not in str(info.value)

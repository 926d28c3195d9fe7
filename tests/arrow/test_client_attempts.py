"""client_attempts: retryfs as the only retry layer over pyarrow's S3FileSystem, pickled too."""

import pickle

import pytest

try:
    from ray import cloudpickle  # what Ray uses to ship the filesystem to workers
except ImportError:  # make test-fast installs no Ray: the same library, not vendored
    import cloudpickle

from retryfs import RetryingFileSystem, RetryPolicy
from retryfs.testing import S3Fault

POLICY = RetryPolicy(max_attempts=2, initial_delay=0.001, max_delay=0.002, jitter=False)


def _head_requests(endpoint, fs, bucket):
    endpoint.reset_record()
    endpoint.add_fault(S3Fault.internal_error(op="HeadObject"))  # every HeadObject fails
    with pytest.raises(OSError, match="HTTP status 500"):
        fs.get_file_info(f"{bucket}/key")
    endpoint.clear_faults()
    return len(endpoint.requests(op="HeadObject"))


@pytest.mark.slow  # the AWS SDK's own backoff between its 3 attempts (up to 1 s each)
def test_without_client_attempts_the_sdk_multiplies_every_attempt(s3_fault_endpoint,
                                                                  s3_fault_bucket):
    fs = RetryingFileSystem(s3_fault_endpoint.pyarrow_fs(max_attempts=3), POLICY, budget=False)
    assert _head_requests(s3_fault_endpoint, fs, s3_fault_bucket) == 2 * 3


@pytest.mark.parametrize("dumps", [None, pickle.dumps, cloudpickle.dumps],
                         ids=["local", "pickle", "cloudpickle"])
def test_client_attempts_make_the_policy_exact(s3_fault_endpoint, s3_fault_bucket, dumps):
    fs = RetryingFileSystem(s3_fault_endpoint.pyarrow_fs(max_attempts=3), POLICY, budget=False,
                            client_attempts=1)
    if dumps is not None:
        fs = pickle.loads(dumps(fs))
        assert fs.retry_handler.client_attempts == 1
    assert _head_requests(s3_fault_endpoint, fs, s3_fault_bucket) == 2


@pytest.mark.slow  # the AWS SDK's own backoff between its 3 attempts (up to 1 s each)
def test_a_pickled_wrapper_without_client_attempts_falls_back_to_the_sdk_default(
        s3_fault_endpoint, s3_fault_bucket):
    # pyarrow's S3FileSystem drops retry_strategy on pickle: 1 attempt becomes the default 3
    fs = RetryingFileSystem(s3_fault_endpoint.pyarrow_fs(max_attempts=1), POLICY, budget=False)
    assert _head_requests(s3_fault_endpoint, fs, s3_fault_bucket) == 2
    clone = pickle.loads(pickle.dumps(fs))
    assert _head_requests(s3_fault_endpoint, clone, s3_fault_bucket) == 2 * 3


def test_client_attempts_leave_other_filesystems_alone_and_validate():
    import pyarrow.fs as pafs

    local = pafs.LocalFileSystem()
    assert RetryingFileSystem(local, client_attempts=1).unwrap() is local
    with pytest.raises(ValueError, match="client_attempts"):
        RetryingFileSystem(local, client_attempts=0)


def test_from_uri_makes_retryfs_the_only_retry_layer_on_s3(s3_fault_endpoint, s3_fault_bucket):
    from retryfs import from_uri

    uri = s3_fault_endpoint.uri(s3_fault_bucket, retry_max_attempts=2, retry_initial_delay=0.001,
                                retry_jitter="false", retry_budget="false")
    fs, path = from_uri(uri)
    assert fs.retry_handler.client_attempts == 1
    assert _head_requests(s3_fault_endpoint, fs, path) == 2
    clone = cloudpickle.loads(cloudpickle.dumps(fs))  # as Ray ships it to a worker
    assert _head_requests(s3_fault_endpoint, clone, path) == 2


def _s3fs_head_requests(endpoint, fs, url):
    endpoint.reset_record()
    endpoint.add_fault(S3Fault.internal_error(op="HeadObject"))  # every HeadObject fails
    with pytest.raises(OSError):
        fs.info(url)
    endpoint.clear_faults()
    return len(endpoint.requests(op="HeadObject"))


def _s3fs_options(endpoint):
    return {"key": "testing", "secret": "testing", "endpoint_url": endpoint.url,
            "client_kwargs": {"region_name": endpoint.region}, "skip_instance_cache": True}


@pytest.mark.parametrize("dumps", [None, pickle.dumps, cloudpickle.dumps],
                         ids=["local", "pickle", "cloudpickle"])
def test_retry_s3_urls_make_retryfs_the_only_retry_layer_on_s3fs(s3_fault_endpoint,
                                                                 s3_fault_bucket, dumps):
    # s3fs retries 5 times around botocore's own attempts: without one layer, 2 retryfs
    # attempts would be 10 or more HeadObject requests
    import fsspec

    url = f"retry::s3://{s3_fault_bucket}/key"
    fs, _ = fsspec.core.url_to_fs(url, s3=_s3fs_options(s3_fault_endpoint),
                                  retry={"max_attempts": 2, "initial_delay": 0.001,
                                         "jitter": False, "budget": False})
    assert fs.client_attempts == 1 and fs.fs.retries == 1
    if dumps is not None:
        fs = pickle.loads(dumps(fs))
    assert _s3fs_head_requests(s3_fault_endpoint, fs, url) == 2


def test_client_attempts_reach_an_s3fs_instance_handed_in(s3_fault_endpoint, s3_fault_bucket):
    import s3fs

    from retryfs.fsspec.filesystem import RetryFileSystem

    inner = s3fs.S3FileSystem(**_s3fs_options(s3_fault_endpoint))
    fs = RetryFileSystem(fs=inner, policy=POLICY, budget=False, client_attempts=1)
    assert fs.fs is not inner and inner.retries == 5  # a fresh client; the given one untouched
    assert _s3fs_head_requests(s3_fault_endpoint, fs, f"{s3_fault_bucket}/key") == 2
    # handed in without client_attempts, the client keeps its own retries
    assert RetryFileSystem(fs=inner, policy=POLICY).fs is inner


def test_the_write_client_re_sends_a_failed_part_on_the_sdk_s_quick_schedule(
        s3_fault_endpoint, s3_fault_bucket):
    """The write client's SDK attempts (3 with ``client_attempts`` set) use the SDK's default
    strategy, whose retries wait 0 and 50 ms, not its standard one (a draw under 1 s, then
    under 2 s): two failed sends of a part are re-sent by the SDK, unseen by retryfs, and the
    stream commits once."""
    import pyarrow.fs as pafs

    from retryfs.clients import _sdk_strategy

    quick, one = _sdk_strategy(3), _sdk_strategy(1)
    assert isinstance(quick, pafs.AwsDefaultS3RetryStrategy) and quick.max_attempts == 2
    assert isinstance(one, pafs.AwsStandardS3RetryStrategy) and one.max_attempts == 1
    ep = s3_fault_endpoint
    fs = RetryingFileSystem(ep.pyarrow_fs(), POLICY, budget=False, client_attempts=1)
    failed = ep.add_fault(S3Fault.internal_error(op="UploadPart", times=2))
    data = b"x" * (6 << 20)
    with fs.open_output_stream(f"{s3_fault_bucket}/parts.bin") as out:
        out.write(data)
    assert ep.get_object(s3_fault_bucket, "parts.bin") == data
    parts = ep.requests(op="UploadPart")
    assert ep.fired(failed) == 2 and len(parts) == 3
    assert fs.stats.snapshot()["retries"] == 0
    # what the two faults cost: the one part sent twice more, no more (plus the SDK's chunked
    # framing of each body)
    sent = sum(r.request_bytes for r in parts)
    assert 3 * len(data) <= sent <= 3 * len(data) * 1.001, sent


def _sent_body_signatures(endpoint, bucket, monkeypatch, checksums=None, **s3_options):
    import fsspec

    if checksums is not None:
        monkeypatch.setenv("AWS_REQUEST_CHECKSUM_CALCULATION", checksums)
    from retryfs.fsspec.filesystem import RetryFileSystem

    RetryFileSystem.clear_instance_cache()  # a wrapper of the same options is built afresh
    endpoint.reset_record()
    fs, _ = fsspec.core.url_to_fs(f"retry::s3://{bucket}/k",
                                  s3={**_s3fs_options(endpoint), **s3_options})
    fs.pipe(f"retry::s3://{bucket}/k", b"x" * 1000)
    assert endpoint.get_object(bucket, "k") == b"x" * 1000
    (put,) = endpoint.requests(op="PutObject")
    return put.headers


def test_the_s3fs_client_retryfs_configures_does_not_hash_bodies_over_http(
        s3_fault_endpoint, s3_fault_bucket, monkeypatch):
    """Over plain HTTP botocore signs each body's SHA-256 unless told not to; pyarrow's SDK
    does not. The s3fs client that retryfs configures sends the body unsigned with its CRC32
    checksum, unless the options say how to sign or checksums are sent only where required
    (the body would then go with neither)."""
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    headers = _sent_body_signatures(ep, bucket, monkeypatch)
    assert headers["x-amz-content-sha256"] == "UNSIGNED-PAYLOAD"
    assert "x-amz-checksum-crc32" in headers
    signed = _sent_body_signatures(ep, bucket, monkeypatch, checksums="when_required")
    assert len(signed["x-amz-content-sha256"]) == 64 and "x-amz-checksum-crc32" not in signed
    chosen = _sent_body_signatures(
        ep, bucket, monkeypatch, config_kwargs={"s3": {"payload_signing_enabled": True}})
    assert len(chosen["x-amz-content-sha256"]) == 64
    # plain s3fs (no retryfs) signs every body over HTTP
    import s3fs

    ep.reset_record()
    s3fs.S3FileSystem(**_s3fs_options(ep)).pipe(f"{bucket}/plain", b"y" * 1000)
    (plain,) = ep.requests(op="PutObject")
    assert len(plain.headers["x-amz-content-sha256"]) == 64

"""Configuration by URL: `retryfs.from_uri`, every ``retry_*`` parameter, ``RETRYFS_*`` defaults."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from urllib.parse import quote

import pyarrow.fs as pafs
import pytest
from fsspec.implementations.http import HTTPFileSystem
from fsspec.implementations.local import LocalFileSystem as FsspecLocal
from fsspec.implementations.memory import MemoryFileSystem

import retryfs
from retryfs import RetryingFileSystem, RetryPolicy
from retryfs.core.policy import GROUPS
from retryfs.testing.s3 import ACCESS_KEY, SECRET_KEY, S3Fault
from retryfs.uri import PARAMETERS, from_uri, split_retry_params

README = Path(__file__).resolve().parents[2] / "README.md"


pytestmark = pytest.mark.usefixtures("clean_retryfs_env")


def _observed(fs: RetryingFileSystem, name: str):
    """What parameter ``name`` set on a wrapper."""
    handler = fs.retry_handler
    group, _, field = name.partition("_")
    if name in RetryPolicy.field_names():
        policy, field = handler.policy, name
    elif group in GROUPS and field in RetryPolicy.field_names():
        policy = handler.policy_for(group)
    else:
        policy = None
    if policy is not None and field == "throttle_factor":  # deprecated: sets throttle_delay
        return round(policy.throttle_delay / policy.initial_delay, 9)
    if policy is not None:
        return getattr(policy, field)
    if name == "backend":
        return "fsspec" if isinstance(fs.unwrap(), FsspecLocal) else "arrow"
    if name == "retryable_messages":
        return handler.classifier.retryable_messages
    if name == "budget":
        return handler.budget is not None
    if name == "timeout":
        return handler.timeouts.get("get_file_info"), handler.timeouts.get("open_input_file")
    if name == "read_timeout":
        return handler.timeouts.get("open_input_file")
    if name == "metadata_timeout":
        return handler.timeouts.get("get_file_info")
    if name in ("write_timeout", "min_throughput"):
        return getattr(handler.retry_config, name)
    if name == "rate_limit":
        return handler.retry_config.rate_limit.mode
    return getattr(handler, name)  # verify_writes, spool_memory


_EXPECTED = {
    "max_attempts": 8, "initial_delay": 0.05, "multiplier": 3.0, "max_delay": 30.0,
    "jitter": False, "deadline": 120.0, "throttle_delay": 2.0, "throttle_factor": 4.0,
    "fast_throttle_retries": 0, "backend": "fsspec",
    "verify_writes": False, "spool_memory": 128 * 1024 * 1024,
    "retryable_messages": ("Connection closed", "AWS Error UNKNOWN"), "budget": False,
    "timeout": (30.0, 30.0), "read_timeout": 10.0, "metadata_timeout": 10.0,
    "client_attempts": 3, "client_write_attempts": 1, "one_part_client": "arrow",
    "file_client": "fsspec",
    "write_timeout": 120.0,
    "min_throughput": 262144.0, "rate_limit": "on",
}


def _expected(name: str):
    group, _, field = name.partition("_")
    if name not in _EXPECTED and group in GROUPS and field in _EXPECTED:
        return _EXPECTED[field]
    return _EXPECTED[name]


@pytest.mark.parametrize("name", sorted(PARAMETERS))
def test_every_parameter_with_its_readme_example(name, tmp_path):
    param = PARAMETERS[name]
    uri = f"{tmp_path.as_uri()}?{param.url_name}={param.example}"
    fs, path = from_uri(uri)
    assert isinstance(fs, RetryingFileSystem)
    assert path == str(tmp_path)
    assert _observed(fs, name) == _expected(name)
    default_fs, _ = from_uri(tmp_path.as_uri())
    assert _observed(default_fs, name) != _expected(name)  # the parameter made the difference


@pytest.mark.parametrize("name", sorted(PARAMETERS))
def test_every_parameter_as_an_environment_default(name, tmp_path, monkeypatch):
    param = PARAMETERS[name]
    from urllib.parse import unquote_plus

    monkeypatch.setenv(param.env_name, unquote_plus(param.example))
    fs, _ = from_uri(tmp_path.as_uri())
    assert _observed(fs, name) == _expected(name)


def test_every_parameter_is_in_the_configuration_reference():
    # the table of docs/configuration.md, generated from PARAMETERS by the site's build hook
    sys.path.insert(0, str(README.parent / "docs" / "hooks"))
    try:
        from options import options_table
    finally:
        sys.path.pop(0)
    section = options_table()
    for param in PARAMETERS.values():
        assert f"`{param.url_name}`" in section, param.url_name
        assert f"`{param.env_name}`" in section or param.env_name.startswith(
            tuple(f"RETRYFS_{g.upper()}_" for g in GROUPS)), param.env_name
    for group in GROUPS:
        assert f"`RETRYFS_{group.upper()}_<FIELD>`" in section


def test_an_unknown_retry_parameter_is_named_with_the_valid_ones(tmp_path):
    with pytest.raises(ValueError) as info:
        from_uri(f"{tmp_path.as_uri()}?retry_max_atempts=3")
    message = str(info.value)
    assert "'retry_max_atempts'" in message
    for name in ("retry_max_attempts", "retry_write_max_attempts", "retry_backend",
                 "retry_timeout"):
        assert name in message


@pytest.mark.parametrize("query, named", [
    ("retry_max_attempts=0", "retry_max_attempts"),
    ("retry_max_attempts=many", "retry_max_attempts"),
    ("retry_initial_delay=-1", "retry_initial_delay"),
    ("retry_jitter=maybe", "retry_jitter"),
    ("retry_deadline=0", "retry_deadline"),
    ("retry_multiplier=0.5", "retry_multiplier"),
    ("retry_max_delay=nan", "retry_max_delay"),
    ("retry_spool_memory=lots", "retry_spool_memory"),
    ("retry_backend=s3fs", "retry_backend"),
    ("retry_write_max_attempts=x", "retry_write_max_attempts"),
    ("retry_initial_delay=10&retry_max_delay=1", "retry_max_delay"),
    ("retry_max_attempts=2&retry_max_attempts=3", "retry_max_attempts"),
    ("retry_timeout=0", "retry_timeout"),
])
def test_a_bad_value_is_a_value_error_naming_the_parameter(query, named, tmp_path):
    with pytest.raises(ValueError, match=re.escape(named)):
        from_uri(f"{tmp_path.as_uri()}?{query}")


def test_other_parameters_go_to_pyarrow_unchanged():
    fs, path = from_uri("s3://bucket/some/key?region=eu-west-3&retry_max_attempts=3"
                        "&endpoint_override=127.0.0.1%3A9&scheme=http")
    inner = fs.unwrap()
    assert isinstance(inner, pafs.S3FileSystem)
    assert inner.region == "eu-west-3" and path == "bucket/some/key"
    assert fs.policy.max_attempts == 3
    with pytest.raises(ValueError, match="bogus"):  # pyarrow's own check, not ours
        from_uri("s3://bucket/key?bogus=1&retry_max_attempts=3")
    gcs, _ = from_uri("gs://bucket/p?retry_limit_seconds=5&scheme=http&endpoint_override=x:1")
    assert type(gcs.unwrap()).__name__ == "GcsFileSystem"  # pyarrow GCS's own retry_ option


def test_split_keeps_the_other_parameters_byte_for_byte():
    rest, pairs = split_retry_params(
        "http://h/p?a=1%2B2&retry_max_attempts=4&b=x+y&retry_retryable_messages=A%7CB#frag")
    assert rest == "http://h/p?a=1%2B2&b=x+y#frag"
    assert pairs == [("retry_max_attempts", "4"), ("retry_retryable_messages", "A|B")]


@pytest.mark.parametrize("uri, kind, path", [
    ("mock:///a/b", "_MockFileSystem", "a/b"),
    ("file:///tmp/x", "LocalFileSystem", "/tmp/x"),
    ("/tmp/x", "LocalFileSystem", "/tmp/x"),
    ("abfs://container@account.dfs.core.windows.net/p", "AzureFileSystem", "container/p"),
    ("gcs://bucket/p", "GcsFileSystem", "bucket/p"),
    ("memory://mem/p", "MemoryFileSystem", "/mem/p"),
    ("retry::memory://mem/p", "MemoryFileSystem", "/mem/p"),
    ("file:///tmp/x?retry_backend=fsspec", "LocalFileSystem", "/tmp/x"),
])
def test_schemes_go_to_the_right_backend(uri, kind, path):
    fs, found = from_uri(uri)
    assert type(fs.unwrap()).__name__ == kind
    assert found == path


def test_relative_local_paths_become_absolute(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fs, path = from_uri("data/run1?retry_max_attempts=2")
    assert path == str(tmp_path / "data" / "run1")
    assert fs.policy.max_attempts == 2
    with pytest.raises(ValueError, match="local path"):
        from_uri("data/run1?region=x")


def test_fsspec_schemes_and_the_switch():
    fs, path = from_uri("http://127.0.0.1:1/file.bin?version=3&retry_max_attempts=2")
    assert isinstance(fs.unwrap(), HTTPFileSystem)
    assert path == "http://127.0.0.1:1/file.bin?version=3"  # http keeps its own query
    s3fs, key = from_uri("s3://bucket/key?retry_backend=fsspec",
                         storage_options={"anon": True, "skip_instance_cache": True})
    assert type(s3fs.unwrap()).__module__ == "s3fs.core" and key == "bucket/key"
    gcs, key = from_uri("gcs://bucket/p?retry_backend=fsspec",
                        storage_options={"token": "anon", "skip_instance_cache": True})
    assert type(gcs.unwrap()).__module__.startswith("gcsfs") and key == "bucket/p"
    az, key = from_uri("az://container/p", storage_options={
        "account_name": "acct", "anon": True, "skip_instance_cache": True})
    assert type(az.unwrap()).__module__.startswith("adlfs") and key == "container/p"
    with pytest.raises(ValueError, match="storage_options"):
        from_uri("s3://bucket/key", storage_options={"anon": True})


def test_precedence_defaults_environment_code_url(monkeypatch, tmp_path):
    monkeypatch.setenv("RETRYFS_MAX_ATTEMPTS", "5")
    monkeypatch.setenv("RETRYFS_INITIAL_DELAY", "0.25")
    monkeypatch.setenv("RETRYFS_WRITE_MAX_ATTEMPTS", "20")
    monkeypatch.setenv("RETRYFS_NO_SLEEP", "0")  # not a parameter: ignored
    fs, _ = from_uri(tmp_path.as_uri())
    assert (fs.policy.max_attempts, fs.policy.initial_delay) == (5, 0.25)
    assert fs.retry_handler.per_operation["write"].max_attempts == 20
    code = RetryPolicy(max_attempts=7)
    fs, _ = from_uri(tmp_path.as_uri(), policy=code)
    assert fs.policy == code  # code beats the environment
    fs, _ = from_uri(f"{tmp_path.as_uri()}?retry_max_attempts=9", policy=code)
    assert fs.policy == code.replace(max_attempts=9)  # the URL beats code
    fs, _ = from_uri(f"{tmp_path.as_uri()}?retry_write_max_attempts=30",
                     per_operation={"write": {"max_attempts": 3, "max_delay": 4}})
    assert fs.retry_handler.per_operation["write"].max_attempts == 30
    assert fs.retry_handler.per_operation["write"].max_delay == 4
    monkeypatch.setenv("RETRYFS_MAX_ATTEMPTS", "five")
    with pytest.raises(ValueError, match="RETRYFS_MAX_ATTEMPTS"):
        from_uri(tmp_path.as_uri())


def test_retryable_messages_add_up(monkeypatch, tmp_path):
    monkeypatch.setenv("RETRYFS_RETRYABLE_MESSAGES", "from env")
    fs, _ = from_uri(f"{tmp_path.as_uri()}?retry_retryable_messages=one&"
                     f"retry_retryable_messages={quote('two|three')}",
                     retryable_messages=["from code"])
    assert fs.retry_handler.classifier.retryable_messages == (
        "from env", "from code", "one", "two", "three")


def test_memory_backend_works_end_to_end():
    MemoryFileSystem.store.pop("/uri/obj", None)
    fs, path = from_uri("memory://uri/obj?retry_max_attempts=2")
    with fs.open_output_stream(path) as out:
        out.write(b"hello")
    with fs.open_input_stream(path) as stream:
        assert stream.read() == b"hello"


def test_pyarrow_s3_from_a_url_on_a_real_endpoint(s3_fault_endpoint, s3_fault_bucket):
    # endpoint_override, scheme, region and the userinfo keys all have to reach pyarrow
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    uri = (f"s3://{ACCESS_KEY}:{SECRET_KEY}@{bucket}/ckpt/model.pt"
           f"?endpoint_override={quote(ep.endpoint)}&scheme=http&region={ep.region}"
           "&retry_max_attempts=8&retry_initial_delay=0&retry_max_delay=0")
    fs, path = from_uri(uri)
    assert path == f"{bucket}/ckpt/model.pt" and fs.policy.max_attempts == 8
    with fs.open_output_stream(path) as out:
        out.write(b"weights")
    assert ep.get_object(bucket, "ckpt/model.pt") == b"weights"
    ep.add_fault(S3Fault.access_denied(op="CreateMultipartUpload"))
    with pytest.raises(OSError, match="ACCESS_DENIED"):
        fs.open_output_stream(f"{bucket}/denied")
    assert ep.counts()["CreateMultipartUpload"] == 2  # the first write, then one attempt


def test_fsspec_s3_from_a_url_retries_real_faults(s3_fault_endpoint, s3_fault_bucket):
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    options = {"key": ACCESS_KEY, "secret": SECRET_KEY, "endpoint_url": ep.url,
               "client_kwargs": {"region_name": ep.region}, "skip_instance_cache": True,
               "config_kwargs": {"retries": {"total_max_attempts": 1, "mode": "standard"}}}
    fs, path = from_uri(f"s3://{bucket}/k?retry_backend=fsspec&retry_initial_delay=0"
                        "&retry_max_delay=0", storage_options=options)
    ep.add_fault(S3Fault.internal_error(op="PutObject", times=2))
    with fs.open_output_stream(path) as out:
        out.write(b"via s3fs")
    assert ep.get_object(bucket, "k") == b"via s3fs"
    assert ep.counts()["PutObject"] == 3


def test_public_export():
    assert retryfs.from_uri is from_uri

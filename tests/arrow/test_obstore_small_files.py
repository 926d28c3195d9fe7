"""one_part_client: the small files of a copy_files to and from S3 go through obstore.

Faults are injected in the HTTP answers the S3 endpoint gives, so obstore raises its own
errors; each test counts the requests and bytes the faults cost.
"""

import hashlib
import os
import pickle
from datetime import timedelta

import pyarrow.fs as pafs
import pytest

import retryfs
from retryfs import RetryingFileSystem
from retryfs.arrow.filesystem import _one_part_client
from retryfs.arrow.obstore_small import (
    ObstoreSmallFiles,
    obstore_options,
    obstore_small_client,
)
from retryfs.testing import S3Fault

obstore = pytest.importorskip("obstore")
from obstore.exceptions import PermissionDeniedError  # noqa: E402

FAST = {"retry_initial_delay": "0.001", "retry_max_delay": "0.002", "retry_jitter": "false",
        "retry_budget": "false"}
SIZES = {"a.bin": 70_000, "b.bin": 140_000, "c.bin": 210_000, "d.bin": 280_000}


def _tree(tmp_path, sizes=SIZES):
    src = tmp_path / "src"
    src.mkdir()
    for name, size in sizes.items():
        (src / name).write_bytes(os.urandom(size))
    return src


def _intact(ep, bucket, prefix, src):
    for path in src.iterdir():
        stored = ep.get_object(bucket, f"{prefix}/{path.name}")
        assert hashlib.sha256(stored).digest() == hashlib.sha256(path.read_bytes()).digest()


def _copy(ep, bucket, src, prefix="t", **params):
    fs, path = retryfs.from_uri(ep.uri(f"{bucket}/{prefix}", **{**FAST, **params}))
    pafs.copy_files(str(src), path, destination_filesystem=fs)
    return fs


def _chunked(record):
    return record.headers.get("content-encoding") == "aws-chunked"


def test_from_uri_sends_each_small_file_of_a_tree_copy_as_one_obstore_put(
        s3_fault_endpoint, s3_fault_bucket, tmp_path):
    ep = s3_fault_endpoint
    src = _tree(tmp_path, {**SIZES, "big.bin": 6 << 20})
    _copy(ep, s3_fault_bucket, src)
    _intact(ep, s3_fault_bucket, "t", src)
    puts = ep.requests(op="PutObject")
    # obstore's: a plain signed body (no aws-chunked framing, no CRC trailer), the bytes alone
    assert sorted(r.key for r in puts) == [f"t/{n}" for n in sorted(SIZES)]
    assert not any(_chunked(r) for r in puts)
    assert {r.key: r.request_bytes for r in puts} == {f"t/{n}": s for n, s in SIZES.items()}
    # the 6 MiB file is pyarrow's multipart upload, as before
    assert len(ep.requests(op="CreateMultipartUpload")) == 1
    # the parameter makes the difference: with arrow, the AWS SDK sends them
    ep.reset_record()
    _copy(ep, s3_fault_bucket, src, prefix="arrow", retry_one_part_client="arrow")
    _intact(ep, s3_fault_bucket, "arrow", src)
    puts = ep.requests(op="PutObject")
    assert len(puts) == len(SIZES) and all(_chunked(r) for r in puts)


@pytest.mark.parametrize("fault, throttled, kind", [
    (S3Fault.slow_down, 1, "GenericError[SlowDown]"),
    (S3Fault.internal_error, 0, "GenericError[InternalError]"),
    (S3Fault.reset, 0, "GenericError")])
def test_a_failed_put_is_retried_by_retryfs_and_costs_its_own_bytes(
        s3_fault_endpoint, s3_fault_bucket, tmp_path, fault, throttled, kind):
    ep = s3_fault_endpoint
    src = _tree(tmp_path)
    failed = ep.add_fault(fault(op="PutObject", path=f"{s3_fault_bucket}/t/c.bin", nth=1))
    fs = _copy(ep, s3_fault_bucket, src)
    _intact(ep, s3_fault_bucket, "t", src)
    assert ep.fired(failed) == 1
    puts = ep.requests(op="PutObject")
    # obstore's own retries are off: one request per attempt, retryfs's one retry
    assert sorted(r.key for r in puts) == sorted(
        [f"t/{n}" for n in SIZES] + ["t/c.bin"])
    assert sum(r.request_bytes for r in puts) == sum(SIZES.values()) + SIZES["c.bin"]
    snapshot = fs.stats.snapshot()["by_operation"]["copy_files"]
    assert snapshot["retries"] == 1 and snapshot["throttled"] == throttled
    assert set(snapshot["errors"]) == {kind}  # obstore's exception, kept, and its S3 code


def test_a_denied_put_raises_obstore_s_error_and_is_sent_once(
        s3_fault_endpoint, s3_fault_bucket, tmp_path):
    ep = s3_fault_endpoint
    src = _tree(tmp_path)
    denied = ep.add_fault(S3Fault.access_denied(op="PutObject", path=f"{s3_fault_bucket}/t/b.bin"))
    with pytest.raises(PermissionDeniedError, match="AccessDenied"):
        _copy(ep, s3_fault_bucket, src)
    assert ep.fired(denied) == 1
    sent = [r.request_bytes for r in ep.requests(op="PutObject") if r.key == "t/b.bin"]
    assert sent == [SIZES["b.bin"]]  # its bytes once, never again


def test_an_acknowledged_put_that_was_lost_is_found_by_the_check_and_sent_again(
        s3_fault_endpoint, s3_fault_bucket, tmp_path):
    ep = s3_fault_endpoint
    src = _tree(tmp_path)
    lost = ep.add_fault(S3Fault.lost(op="PutObject", path=f"{s3_fault_bucket}/t/d.bin", nth=1))
    _copy(ep, s3_fault_bucket, src)
    _intact(ep, s3_fault_bucket, "t", src)
    assert ep.fired(lost) == 1
    sent = [r.request_bytes for r in ep.requests(op="PutObject") if r.key == "t/d.bin"]
    assert sent == [SIZES["d.bin"]] * 2  # the lost put cost one more whole file, no more
    others = [r for r in ep.requests(op="PutObject") if r.key != "t/d.bin"]
    assert sorted(r.key for r in others) == sorted(f"t/{n}" for n in SIZES if n != "d.bin")


def _writer(ep):
    s3 = ep.pyarrow_fs()
    built = obstore_small_client(s3, _one_part_client(s3))
    assert isinstance(built, pafs.PyFileSystem)
    return built


def test_a_stream_that_grows_past_one_part_goes_on_as_a_pyarrow_upload(
        s3_fault_endpoint, s3_fault_bucket):
    ep = s3_fault_endpoint
    first, second = os.urandom(3 << 20), os.urandom(3 << 20)
    with _writer(ep).open_output_stream(f"{s3_fault_bucket}/grown.bin") as out:
        out.write(first)
        assert ep.requests() == []  # held, nothing sent yet
        out.write(second)
    assert ep.get_object(s3_fault_bucket, "grown.bin") == first + second
    # sent by pyarrow's one-part client (one PutObject below its part threshold), framed as
    # the AWS SDK frames a body: the held bytes and the rest, once
    (put,) = ep.requests()
    assert put.op == "PutObject" and _chunked(put)
    assert len(first + second) < put.request_bytes <= len(first + second) * 1.001


def test_a_stream_with_metadata_is_pyarrow_s(s3_fault_endpoint, s3_fault_bucket):
    ep = s3_fault_endpoint
    with _writer(ep).open_output_stream(f"{s3_fault_bucket}/typed.txt",
                                        metadata={"Content-Type": "text/plain"}) as out:
        out.write(b"hello")
    assert ep.get_object(s3_fault_bucket, "typed.txt") == b"hello"
    (put,) = ep.requests(op="PutObject")
    assert _chunked(put) and put.headers["content-type"] == "text/plain"


def test_a_stream_dropped_unclosed_sends_nothing_and_closing_twice_sends_once(
        s3_fault_endpoint, s3_fault_bucket):
    ep = s3_fault_endpoint
    writer = _writer(ep)
    out = writer.open_output_stream(f"{s3_fault_bucket}/dropped.bin")
    out.write(b"x" * 1000)
    del out
    assert ep.requests() == [] and ep.keys(s3_fault_bucket) == []
    out = writer.open_output_stream(f"{s3_fault_bucket}/once.bin")
    out.write(b"y" * 1000)
    out.close()
    out.close()
    assert len(ep.requests(op="PutObject")) == 1
    with pytest.raises(ValueError, match="bucket/key"):
        writer.open_output_stream(s3_fault_bucket)


def test_a_forked_child_of_a_process_that_put_through_obstore_puts_through_pyarrow(
        s3_fault_endpoint, s3_fault_bucket):
    """obstore's runtime threads do not cross a fork: a put from the child would never return
    (it hung here before the fallback)."""
    ep = s3_fault_endpoint
    writer = _writer(ep)
    with writer.open_output_stream(f"{s3_fault_bucket}/parent.bin") as out:
        out.write(b"p" * 100)
    pid = os.fork()
    if pid == 0:  # the child
        code = 1
        try:
            with writer.open_output_stream(f"{s3_fault_bucket}/child.bin") as out:
                out.write(b"c" * 100)
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert ep.get_object(s3_fault_bucket, "child.bin") == b"c" * 100
    parent, child = ep.requests(op="PutObject")
    assert not _chunked(parent) and _chunked(child)  # obstore's, then pyarrow's


def test_the_choice_travels_by_pickle_and_auto_falls_back_where_obstore_cannot_go(
        s3_fault_endpoint, s3_fault_bucket, tmp_path):
    ep = s3_fault_endpoint
    fs, _ = retryfs.from_uri(ep.uri(f"{s3_fault_bucket}/t"))
    assert fs.retry_config.one_part_client == "auto"
    again = pickle.loads(pickle.dumps(fs))
    assert again.retry_config.one_part_client == "auto"
    assert again._retry_handler.writer_for(10).type_name == "py::retryfs-obstore-small-files"
    # no explicit credentials: the AWS SDK's chain is not obstore's, pyarrow keeps the files
    chain = pafs.S3FileSystem(region=ep.region, scheme="http", endpoint_override=ep.endpoint)
    auto = RetryingFileSystem(chain, client_attempts=1, one_part_client="auto")
    assert auto._retry_handler.writer_for(10).type_name == "s3"
    with pytest.raises(ValueError, match="one_part_client='obstore'.*credentials"):
        RetryingFileSystem(chain, client_attempts=1, one_part_client="obstore")


def test_one_part_client_is_checked_when_the_wrapper_is_built(s3_fault_endpoint, monkeypatch):
    with pytest.raises(ValueError, match="one_part_client"):
        RetryingFileSystem(pafs.LocalFileSystem(), one_part_client="fast")
    with pytest.raises(ValueError, match="one_part_client='obstore' needs"):
        RetryingFileSystem(pafs.LocalFileSystem(), one_part_client="obstore")
    with pytest.raises(ValueError, match="one_part_client='obstore' needs"):  # its own client
        RetryingFileSystem(s3_fault_endpoint.pyarrow_fs(), one_part_client="obstore")
    built = RetryingFileSystem(s3_fault_endpoint.pyarrow_fs(), client_attempts=1,
                               one_part_client="obstore")
    assert built._retry_handler.writer_for(10).type_name == "py::retryfs-obstore-small-files"
    assert built._retry_handler.writer_for(6 << 20).type_name == "s3"  # not one part
    monkeypatch.setitem(__import__("sys").modules, "obstore.store", None)
    with pytest.raises(ValueError, match="obstore is not installed"):
        RetryingFileSystem(s3_fault_endpoint.pyarrow_fs(), client_attempts=1,
                           one_part_client="obstore")


@pytest.mark.parametrize("options, missing", [
    ({"role_arn": "arn:aws:iam::1:role/r", "access_key": None, "secret_key": None}, "role_arn"),
    ({"proxy_options": {"scheme": "http", "host": "proxy", "port": 3128}}, "proxy_options"),
    ({"default_metadata": {"x": "y"}}, "default_metadata"),
    ({"access_key": None, "secret_key": None}, "credentials")])
def test_settings_obstore_cannot_take_are_named(options, missing):
    base = {"access_key": "k", "secret_key": "s", "region": "eu-west-1"}
    s3 = pafs.S3FileSystem(**{k: v for k, v in {**base, **options}.items() if v is not None})
    assert missing in obstore_options(s3)


def test_the_client_s_settings_carry_over():
    mapped = obstore_options(pafs.S3FileSystem(
        access_key="k", secret_key="s", session_token="t", region="eu-west-1",
        endpoint_override="store.example:9000", scheme="http", request_timeout=7,
        connect_timeout=2))
    assert mapped["config"] == {
        "region": "eu-west-1", "access_key_id": "k", "secret_access_key": "s",
        "session_token": "t", "endpoint": "http://store.example:9000",
        "virtual_hosted_style_request": False}
    assert mapped["client_options"] == {
        "allow_http": True, "timeout": timedelta(hours=1), "read_timeout": timedelta(seconds=7),
        "connect_timeout": timedelta(seconds=2)}
    assert mapped["retry_config"]["max_retries"] == 0  # retryfs retries
    aws = obstore_options(pafs.S3FileSystem(anonymous=True, region="us-east-2"))
    assert aws["config"] == {"region": "us-east-2", "skip_signature": True,
                             "virtual_hosted_style_request": True}
    assert aws["client_options"] == {"timeout": timedelta(hours=1)}
    # a bucket with a dot is addressed by path (its virtual host fails the TLS certificate)
    handler = ObstoreSmallFiles(aws, pafs.LocalFileSystem())
    assert handler.store("my.bucket").config["virtual_hosted_style_request"] == "false"
    assert handler.store("plain").config["virtual_hosted_style_request"] == "true"


# -- downloads -----------------------------------------------------------------------------

def _stored_tree(ep, bucket, sizes):
    data = {name: os.urandom(size) for name, size in sizes.items()}
    for name, body in data.items():
        ep.put_object(bucket, f"t/{name}", body)
    return data


def _download(ep, bucket, tmp_path, **params):
    fs, path = retryfs.from_uri(ep.uri(f"{bucket}/t", **{**FAST, **params}))
    out = tmp_path / "out"
    ep.reset_record()
    pafs.copy_files(path, str(out), source_filesystem=fs)
    return fs, out


def test_a_small_file_downloads_in_one_get_and_a_large_one_resumably(
        s3_fault_endpoint, s3_fault_bucket, tmp_path):
    ep = s3_fault_endpoint
    data = _stored_tree(ep, s3_fault_bucket, {**SIZES, "big.bin": 3 << 20})
    _, out = _download(ep, s3_fault_bucket, tmp_path)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == data
    gets = ep.requests(op="GetObject")
    small = [r for r in gets if r.key != "t/big.bin"]
    # one GetObject of each small file, whole (no Range), and no HeadObject for it
    assert sorted(r.key for r in small) == [f"t/{n}" for n in sorted(SIZES)]
    assert not any("range" in r.headers for r in small)
    heads = [r.key for r in ep.requests(op="HeadObject")]
    assert heads == ["t", "t/big.bin"]  # copy_files asks what "t" is; pyarrow's open
    # with arrow, Arrow's one-file copy opens each with a HeadObject
    _, out = _download(ep, s3_fault_bucket, tmp_path / "arrow", retry_one_part_client="arrow")
    assert {p.name: p.read_bytes() for p in out.iterdir()} == data
    assert len(ep.requests(op="HeadObject")) == len(heads) + len(SIZES)


@pytest.mark.parametrize("fault, kind", [
    (lambda **m: S3Fault.slow_down(**m), "GenericError[SlowDown]"),
    (lambda **m: S3Fault.reset(**m), "GenericError"),
    (lambda **m: S3Fault.truncate(keep_bytes=1000, **m), "GenericError")])
def test_a_failed_get_is_retried_and_costs_one_more_get(
        s3_fault_endpoint, s3_fault_bucket, tmp_path, fault, kind):
    ep = s3_fault_endpoint
    data = _stored_tree(ep, s3_fault_bucket, SIZES)
    failed = ep.add_fault(fault(op="GetObject", path=f"{s3_fault_bucket}/t/c.bin", nth=1))
    fs, out = _download(ep, s3_fault_bucket, tmp_path)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == data
    assert sorted(p.name for p in out.iterdir()) == sorted(SIZES)  # no temporary file left
    assert ep.fired(failed) == 1
    gets = ep.requests(op="GetObject")
    assert sorted(r.key for r in gets) == sorted([f"t/{n}" for n in SIZES] + ["t/c.bin"])
    # the bytes the server sent: each file once, and what the failed GET sent before it broke
    sent = sum(r.response_bytes for r in gets)
    assert sum(SIZES.values()) <= sent <= sum(SIZES.values()) + SIZES["c.bin"]
    read = fs.stats.snapshot()["by_operation"]["read"]
    assert read["retries"] == 1 and set(read["errors"]) == {kind}


def test_a_missing_object_is_file_not_found_and_asked_once(
        s3_fault_endpoint, s3_fault_bucket, tmp_path):
    ep = s3_fault_endpoint
    _stored_tree(ep, s3_fault_bucket, SIZES)
    gone = ep.add_fault(S3Fault.no_such_key(op="GetObject", path=f"{s3_fault_bucket}/t/a.bin"))
    with pytest.raises(FileNotFoundError):
        _download(ep, s3_fault_bucket, tmp_path)
    assert ep.fired(gone) == 1
    assert [r.key for r in ep.requests(op="GetObject")].count("t/a.bin") == 1
    assert not (tmp_path / "out" / "a.bin").exists()


def test_hostile_names_keep_their_keys_both_ways(s3_fault_endpoint, s3_fault_bucket, tmp_path):
    """obstore's paths are its own type: each name below must still be its exact S3 key, up
    and down, and go through obstore (no aws-chunked body)."""
    ep = s3_fault_endpoint
    names = ["a b.bin", "ü-ß.bin", "pct%41.bin", "plus+x.bin", "semi;colon.bin", "q?x.bin",
             "hash#x.bin", "star*.bin", "back\\slash.bin", ".hidden", "x" * 250,
             "sub/.. /x"]
    src = tmp_path / "src"
    for name in names:
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        (src / name).write_bytes(name.encode())
    _copy(ep, s3_fault_bucket, src)
    assert {f"t/{n}" for n in names} <= set(ep.keys(s3_fault_bucket))
    puts = ep.requests(op="PutObject")
    assert sorted(r.key for r in puts if not r.key.endswith("/")) == sorted(
        f"t/{n}" for n in names)
    assert not any(_chunked(r) for r in puts if not r.key.endswith("/"))
    _, out = _download(ep, s3_fault_bucket, tmp_path)
    for name in names:
        assert (out / name).read_bytes() == name.encode()
    assert not any(r.key.removeprefix("t/") in names for r in ep.requests(op="HeadObject"))

"""``file_client``: the fsspec face reads and writes the files it opens on s3fs through
pyarrow's S3 client.

What is checked: which s3fs settings carry over (and the sentence naming the one that does
not), that a ``retry::s3://`` URL reads through pyarrow by default and a handed s3fs does not
unless asked, that the bytes read are the object's, what a read costs in GETs and bytes (each
byte once for torch's pattern of reads), and what a fault in the middle of a read costs.
"""

import hashlib
import os
import pickle

import fsspec
import pyarrow as pa
import pyarrow.fs as pafs
import pytest
import s3fs
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retryfs.fsspec import files as face_files
from retryfs.fsspec.files import SMALL_BLOCK, InnerFile, PartsInBackground, RetryReadFile
from retryfs.fsspec.filesystem import RetryFileSystem
from retryfs.fsspec.native import arrow_twin
from retryfs.testing import S3Fault
from retryfs.testing.s3 import PYARROW_PART_SIZE

pytestmark = pytest.mark.usefixtures("clean_retryfs_env")

RETRY = {"max_attempts": 4, "initial_delay": 0.001, "max_delay": 0.01, "budget": False}


def _s3fs(**options):
    base = {"key": "k", "secret": "s", "endpoint_url": "http://127.0.0.1:9000",
            "client_kwargs": {"region_name": "eu-west-3"}, "skip_instance_cache": True}
    base.update(options)
    return s3fs.S3FileSystem(**{k: v for k, v in base.items() if v is not None})


def _arrow_options(fs):
    return fs.__reduce__()[1][0]


# -- which settings carry over ------------------------------------------------------------------

def test_the_endpoint_keys_region_and_timeouts_carry_over():
    twin = arrow_twin(_s3fs(token="t", config_kwargs={
        "connect_timeout": 3, "read_timeout": 7, "s3": {"addressing_style": "path"}}))
    assert isinstance(twin, pafs.S3FileSystem)
    options = _arrow_options(twin)
    assert options["endpoint_override"] == "127.0.0.1:9000" and options["scheme"] == "http"
    assert options["region"] == "eu-west-3"
    assert (options["access_key"], options["secret_key"], options["session_token"]) == (
        "k", "s", "t")
    assert options["connect_timeout"] == 3 and options["request_timeout"] == 7
    assert options["force_virtual_addressing"] is False


def test_anonymous_access_and_an_aws_region_without_an_endpoint_carry_over():
    options = _arrow_options(arrow_twin(_s3fs(anon=True, key=None, secret=None,
                                              endpoint_url=None, use_ssl=False)))
    assert options["anonymous"] is True and options["region"] == "eu-west-3"
    assert options["scheme"] == "http" and not options.get("endpoint_override")


@pytest.mark.parametrize(("options", "named"), [
    ({"key": None, "secret": None}, "no key and secret"),
    ({"requester_pays": True}, "requester_pays"),
    ({"version_aware": True}, "version_aware"),
    ({"s3_additional_kwargs": {"SSECustomerKey": "x"}}, "s3_additional_kwargs"),
    ({"cache_regions": True}, "cache_regions"),
    ({"profile": "dev"}, "profile"),
    ({"client_kwargs": {"region_name": "eu-west-3", "verify": False}}, "client_kwargs ['verify']"),
    ({"config_kwargs": {"signature_version": "s3"}}, "config_kwargs ['signature_version']"),
    ({"config_kwargs": {"s3": {"use_accelerate_endpoint": True}}}, "use_accelerate_endpoint"),
    ({"endpoint_url": None, "client_kwargs": {}}, "no region_name"),
    ({"endpoint_url": "http://127.0.0.1:9000/base"}, "endpoint_url"),
])
def test_a_setting_that_does_not_carry_over_is_named(options, named):
    reason = arrow_twin(_s3fs(**options))
    assert isinstance(reason, str) and named in reason


def test_a_filesystem_that_is_not_s3fs_has_no_twin():
    assert "not s3fs" in arrow_twin(fsspec.filesystem("memory"))


def test_asking_for_arrow_where_the_settings_do_not_carry_over_names_the_option_and_why():
    with pytest.raises(ValueError, match="file_client='arrow'.*requester_pays"):
        RetryFileSystem(fs=_s3fs(requester_pays=True), file_client="arrow")
    with pytest.raises(ValueError, match="file_client='arrow'.*not s3fs"):
        RetryFileSystem(fs=fsspec.filesystem("memory"), file_client="arrow")
    with pytest.raises(ValueError, match="file_client"):
        RetryFileSystem(fs=_s3fs(), file_client="boto")


def test_the_default_reads_through_arrow_for_urls_and_through_s3fs_for_a_handed_client(
        s3_fault_endpoint, s3_fault_bucket):
    options = _options(s3_fault_endpoint)
    s3_fault_endpoint.put_object(s3_fault_bucket, "k", b"x" * 100)
    url = f"retry::s3://{s3_fault_bucket}/k"
    fs, _ = fsspec.core.url_to_fs(url, **options)
    with fs.open(url, "rb") as f:
        assert f._native and f.read() == b"x" * 100
    assert isinstance(pickle.loads(pickle.dumps(fs))._arrow_files, pafs.S3FileSystem)
    handed = RetryFileSystem(fs=s3fs.S3FileSystem(**options["s3"]), **RETRY)
    with handed.open(f"{s3_fault_bucket}/k", "rb") as f:
        assert not f._native and f.read() == b"x" * 100
    fs, _ = fsspec.core.url_to_fs(url, s3=options["s3"], retry={**RETRY, "file_client": "fsspec"})
    with fs.open(url, "rb") as f:
        assert not f._native


def test_open_options_s3fs_alone_knows_keep_its_files(s3_fault_endpoint, s3_fault_bucket):
    s3_fault_endpoint.put_object(s3_fault_bucket, "k", b"v")
    fs, path = fsspec.core.url_to_fs(f"retry::s3://{s3_fault_bucket}/k",
                                     **_options(s3_fault_endpoint))
    with fs.open(path, "rb", version_id=None) as f:
        assert not f._native and f.read() == b"v"


# -- what a read costs --------------------------------------------------------------------------

def _options(endpoint):
    return {"s3": {"key": "testing", "secret": "testing", "endpoint_url": endpoint.url,
                   "client_kwargs": {"region_name": endpoint.region},
                   "skip_instance_cache": True},
            "retry": dict(RETRY, skip_instance_cache=True)}


def _object(endpoint, bucket, size):
    data = os.urandom(size)
    endpoint.put_object(bucket, "obj", data)
    fs, _ = fsspec.core.url_to_fs(f"retry::s3://{bucket}/obj", **_options(endpoint))
    endpoint.reset_record()
    return fs, f"{bucket}/obj", data


def _gets(endpoint):
    gets = endpoint.requests(op="GetObject")
    return len(gets), sum(record.response_bytes for record in gets)


def test_torch_s_pattern_of_reads_fetches_each_byte_once(s3_fault_endpoint, s3_fault_bucket):
    """An item read as ``torch.load`` reads it: a few bytes at its end, a few at its start, then
    its data between them in one ``readinto``: the headers' blocks are fetched once each and
    the data read takes the bytes they hold, so the object's bytes are fetched once."""
    size = 3 * SMALL_BLOCK + 12_345
    fs, path, data = _object(s3_fault_endpoint, s3_fault_bucket, size)
    with fs.open(path, "rb") as f:
        f.seek(size - 22)
        assert f.read(22) == data[-22:]
        f.seek(size - 300)
        assert f.read(100) == data[-300:-200]
        f.seek(0)
        assert f.read(30) == data[:30]
        assert f.read(64) == data[30:94]
        buffer = bytearray(size - 94 - 300)
        assert f.readinto(buffer) == len(buffer) and bytes(buffer) == data[94:-300]
        assert f.tell() == size - 300
    count, served = _gets(s3_fault_endpoint)
    assert served == size and count == 3  # two blocks, then the bytes between them


def test_a_large_read_is_ranged_gets_in_flight_and_a_fault_costs_its_range_again(
        s3_fault_endpoint, s3_fault_bucket):
    size = 20 * 2**20 + 7
    fs, path, data = _object(s3_fault_endpoint, s3_fault_bucket, size)
    with fs.open(path, "rb") as f:
        buffer = bytearray(size)
        assert f.readinto(buffer) == size
    assert hashlib.md5(buffer).digest() == hashlib.md5(data).digest()
    clean_count, clean_bytes = _gets(s3_fault_endpoint)
    assert clean_bytes == size and clean_count == 3  # 8 + 8 + 4 MiB ranges
    s3_fault_endpoint.reset_record()
    s3_fault_endpoint.add_fault(S3Fault.truncate(keep_bytes=2**20, op="GetObject", times=1))
    with fs.open(path, "rb") as f:
        assert f.read() == data
    count, served = _gets(s3_fault_endpoint)
    assert len(s3_fault_endpoint.injected) == 1
    assert count == clean_count + 1 and served <= size + 2**20  # the cut range, once more
    assert fs.stats.snapshot()["by_operation"]["read"]["retries"] == 1


def test_a_read_that_meets_a_503_on_every_attempt_raises_after_the_policy_s_attempts(
        s3_fault_endpoint, s3_fault_bucket):
    fs, path, _ = _object(s3_fault_endpoint, s3_fault_bucket, 1000)
    with fs.open(path, "rb") as f:
        s3_fault_endpoint.add_fault(S3Fault.slow_down(op="GetObject", times=None))
        with pytest.raises(OSError, match="SLOW_DOWN|SERVICE_UNAVAILABLE"):
            f.read(10)
    assert len(s3_fault_endpoint.injected) == RETRY["max_attempts"]


def test_a_large_read_that_gives_up_leaves_the_position_where_it_was(
        s3_fault_endpoint, s3_fault_bucket):
    size = 2 * SMALL_BLOCK + 3 * 2**20
    fs, path, data = _object(s3_fault_endpoint, s3_fault_bucket, size)
    with fs.open(path, "rb") as f:
        assert f.read(10) == data[:10]  # the first block is kept
        s3_fault_endpoint.add_fault(S3Fault.slow_down(op="GetObject", times=None))
        with pytest.raises(OSError):
            f.readinto(bytearray(size))
        assert f.tell() == 10
        # the bytes between the kept block and the end, one read tried max_attempts times
        assert len(s3_fault_endpoint.injected) == RETRY["max_attempts"]
        assert fs.stats.snapshot()["by_operation"]["read"]["retries"] == RETRY["max_attempts"] - 1
        s3_fault_endpoint.clear_faults()
        buffer = bytearray(size)
        assert f.readinto(buffer) == size - 10 and bytes(buffer[:size - 10]) == data[10:]


def test_a_missing_object_is_file_not_found_at_once(s3_fault_endpoint, s3_fault_bucket):
    fs, _ = fsspec.core.url_to_fs(f"retry::s3://{s3_fault_bucket}/none",
                                  **_options(s3_fault_endpoint))
    with pytest.raises(FileNotFoundError):
        fs.open(f"{s3_fault_bucket}/none", "rb")
    assert fs.stats.snapshot()["retries"] == 0


def test_lines_text_and_the_ends_of_a_file_read_as_on_s3fs(s3_fault_endpoint, s3_fault_bucket):
    """pyarrow's files have no ``readline``: lines come from the blocks kept (pandas reads a
    CSV that way); reads at and past the end give nothing, an empty object is empty."""
    text = b"".join(b"row %d\n" % i for i in range(50_000))
    fs, path, _ = _object(s3_fault_endpoint, s3_fault_bucket, 0)
    s3_fault_endpoint.put_object(s3_fault_bucket, "rows.txt", text + b"last")
    s3_fault_endpoint.reset_record()
    rows = f"{s3_fault_bucket}/rows.txt"
    with fs.open(rows, "rb") as f:
        assert f._native and f.readline() == b"row 0\n" and f.readline(3) == b"row"
        assert list(f)[-2:] == [b"row 49999\n", b"last"]
        assert f.readline() == b"" and f.read(5) == b""
        f.seek(10**9)
        assert f.read(10) == b"" and f.readinto(bytearray(2**20)) == 0
    count, served = _gets(s3_fault_endpoint)
    assert served == len(text) + 4 and count == -(-served // SMALL_BLOCK)
    with fs.open(rows, "r") as f:
        assert f.readline() == "row 0\n" and f.read().endswith("row 49999\nlast")
    with fs.open(path, "rb") as f:
        assert f.size == 0 and f.read() == b"" and f.readline() == b""


@pytest.mark.parametrize("name", ["a b", "ü/é", "x?y", "x#y", "p%20q", "n" * 255,
                                  "sp ace/+plus", "dot./..x", "tab\tx"])
def test_hostile_names_read_their_own_object(name, s3_fault_endpoint, s3_fault_bucket):
    fs, _, _ = _object(s3_fault_endpoint, s3_fault_bucket, 0)
    path = f"{s3_fault_bucket}/{name}"
    fs.pipe_file(path, name.encode())
    with fs.open(f"retry::s3://{path}", "rb") as f:
        assert f._native and f.read() == name.encode()


# -- what a write costs -------------------------------------------------------------------------

def _writes(endpoint, path="*"):
    return [(r.op, r.request_bytes) for r in endpoint.requests(path=path)
            if r.op in ("PutObject", "CreateMultipartUpload", "UploadPart",
                        "CompleteMultipartUpload", "AbortMultipartUpload")]


def test_a_file_written_on_a_retry_url_goes_out_in_pyarrow_s_parts(s3_fault_endpoint,
                                                                  s3_fault_bucket):
    """12 MiB: through pyarrow's client two parts (10 MiB and the rest), where s3fs's file
    would send one PutObject at its close (its block is 50 MiB); a small file one PutObject
    (the upload is opened lazily), not three requests."""
    ep = s3_fault_endpoint
    data = os.urandom(12 * 2**20)
    fs, _ = fsspec.core.url_to_fs(f"retry::s3://{s3_fault_bucket}/x", **_options(ep))
    ep.reset_record()
    with fs.open(f"{s3_fault_bucket}/big", "wb") as f:
        assert isinstance(f._last_inner, PartsInBackground)
        f.write(data)
    writes = _writes(ep)
    assert [op for op, _ in writes] == ["CreateMultipartUpload", "UploadPart", "UploadPart",
                                        "CompleteMultipartUpload"], writes
    parts = sorted(size for op, size in writes if op == "UploadPart")
    assert PYARROW_PART_SIZE <= parts[1] < 1.01 * PYARROW_PART_SIZE
    assert ep.get_object(s3_fault_bucket, "big") == data
    ep.reset_record()
    with fs.open(f"{s3_fault_bucket}/small", "wb") as f:
        f.write(b"metadata")
    assert [op for op, _ in _writes(ep)] == ["PutObject"]
    assert ep.get_object(s3_fault_bucket, "small") == b"metadata"
    plain, _ = fsspec.core.url_to_fs(f"retry::s3://{s3_fault_bucket}/x", s3=_options(ep)["s3"],
                                     retry={**RETRY, "file_client": "fsspec"})
    ep.reset_record()
    with plain.open(f"{s3_fault_bucket}/big", "wb") as f:
        assert isinstance(f._last_inner, InnerFile)
        f.write(data)
    assert [op for op, _ in _writes(ep)] == ["PutObject"]


def test_a_policy_for_a_method_s3fs_alone_has_does_not_stop_the_writes(s3_fault_endpoint,
                                                                       s3_fault_bucket):
    options = _options(s3_fault_endpoint)
    options["retry"]["per_operation"] = {"get_tags": {"max_attempts": 2}}
    fs, _ = fsspec.core.url_to_fs(f"retry::s3://{s3_fault_bucket}/x", **options)
    with fs.open(f"{s3_fault_bucket}/tagged", "wb") as f:
        assert isinstance(f._last_inner, PartsInBackground)
        f.write(b"written")
    assert s3_fault_endpoint.get_object(s3_fault_bucket, "tagged") == b"written"


@pytest.mark.parametrize("how", ["xb", "autocommit", "block_size"])
def test_exclusive_creation_transactions_and_s3fs_options_keep_s3fs_s_files(
        how, s3_fault_endpoint, s3_fault_bucket):
    fs, _ = fsspec.core.url_to_fs(f"retry::s3://{s3_fault_bucket}/x",
                                  **_options(s3_fault_endpoint))
    path = f"{s3_fault_bucket}/{how}"
    opened = {"xb": lambda: fs.open(path, "xb"),
              "autocommit": lambda: fs.open(path, "wb", autocommit=False),
              "block_size": lambda: fs.open(path, "wb", block_size=5 * 2**20)}[how]()
    with opened as f:
        assert isinstance(f._last_inner, InnerFile)
        f.write(b"s3fs")
    if how == "autocommit":
        f.commit()
    assert s3_fault_endpoint.get_object(s3_fault_bucket, how) == b"s3fs"


def test_a_flush_does_not_wait_for_the_parts_under_way(s3_fault_endpoint, s3_fault_bucket):
    """pyarrow's own flush waits for every part queued (torch DCP flushes after each item);
    the file's does not: the server holds the first part, and ``flush`` returns before it is
    answered (the endpoint records a request once answered)."""
    ep = s3_fault_endpoint
    data = os.urandom(12 * 2**20)
    fs, _ = fsspec.core.url_to_fs(f"retry::s3://{s3_fault_bucket}/x", **_options(ep))
    held = ep.add_fault(S3Fault.delay(5, op="UploadPart", times=1))
    with fs.open(f"{s3_fault_bucket}/flushed", "wb") as f:
        f.write(data)
        f.flush()
        assert ep.requests("UploadPart") == []
    assert ep.fired(held) == 1
    assert [r.fault for r in ep.requests("UploadPart")].count(held) == 1
    assert ep.get_object(s3_fault_bucket, "flushed") == data


def test_the_listings_cache_sees_a_file_written_through_pyarrow(s3_fault_endpoint,
                                                                 s3_fault_bucket):
    options = _options(s3_fault_endpoint)
    # the check after the commit (a HEAD) would forget the path too: without it, the file's
    # close is what does
    options["retry"]["verify_writes"] = False
    fs, _ = fsspec.core.url_to_fs(f"retry::s3://{s3_fault_bucket}/x", **options)
    fs.pipe_file(f"{s3_fault_bucket}/dir/a", b"a")
    assert fs.ls(f"{s3_fault_bucket}/dir", detail=False) == [f"{s3_fault_bucket}/dir/a"]
    with fs.open(f"{s3_fault_bucket}/dir/b", "wb") as f:
        f.write(b"b")
    assert sorted(fs.ls(f"{s3_fault_bucket}/dir", detail=False)) == [
        f"{s3_fault_bucket}/dir/a", f"{s3_fault_bucket}/dir/b"]
    assert fs.info(f"{s3_fault_bucket}/dir/b")["size"] == 1


def test_a_part_that_fails_is_sent_again_alone_and_the_object_is_the_bytes_written(
        s3_fault_endpoint, s3_fault_bucket):
    ep = s3_fault_endpoint
    data = os.urandom(25 * 2**20)
    fs, _ = fsspec.core.url_to_fs(f"retry::s3://{s3_fault_bucket}/x", **_options(ep))
    ep.reset_record()
    with fs.open(f"{s3_fault_bucket}/clean", "wb") as f:
        f.write(data)
    clean = _writes(ep)
    failed = ep.add_fault(S3Fault.slow_down(op="UploadPart", times=2))
    ep.reset_record()
    with fs.open(f"{s3_fault_bucket}/faulted", "wb") as f:
        f.write(data)
    assert ep.fired(failed) == 2
    faulted = _writes(ep)
    resent = sum(size for _, size in faulted) - sum(size for _, size in clean)
    assert [op for op, _ in faulted].count("UploadPart") == \
        [op for op, _ in clean].count("UploadPart") + 2
    assert 0 < resent <= 2 * max(size for _, size in clean)
    assert "AbortMultipartUpload" not in dict(faulted)
    assert ep.get_object(s3_fault_bucket, "faulted") == data


@pytest.mark.parametrize("gives_up", [False, True])
def test_an_upload_whose_start_fails_never_stores_an_empty_object_over_the_one_there(
        gives_up, s3_fault_endpoint, s3_fault_bucket):
    """pyarrow's lazily opened stream whose CreateMultipartUpload failed stores an empty
    object when closed: the file never closes a stream it gives up. The SDK's 3 attempts fail
    (its write client's), then retryfs replays into a fresh upload, or gives up."""
    ep = s3_fault_endpoint
    ep.put_object(s3_fault_bucket, "ckpt", b"the previous checkpoint")
    fs, _ = fsspec.core.url_to_fs(f"retry::s3://{s3_fault_bucket}/x", **_options(ep))
    data = os.urandom(12 * 2**20)
    failed = ep.add_fault(S3Fault.slow_down(op="CreateMultipartUpload",
                                            times=100 if gives_up else 3))
    ep.reset_record()
    if gives_up:
        with pytest.raises(OSError, match="SLOW_DOWN"), fs.open(
                f"{s3_fault_bucket}/ckpt", "wb") as f:
            f.write(data)
        assert ep.fired(failed) == 3 * RETRY["max_attempts"]
    else:
        with fs.open(f"{s3_fault_bucket}/ckpt", "wb") as f:
            f.write(data)
        assert ep.fired(failed) == 3
    assert ep.requests("PutObject") == []
    # the cost: the upload that started sent the 2 parts once; the failed starts sent none
    assert len(ep.requests("UploadPart")) == (0 if gives_up else 2)
    assert ep.get_object(s3_fault_bucket, "ckpt") == (
        b"the previous checkpoint" if gives_up else data)


@pytest.mark.parametrize("name", ["a b", "ü/é", "x?y", "x#y", "p%20q", "n" * 255,
                                  "sp ace/+plus", "dot./..x", "tab\tx"])
def test_hostile_names_write_their_own_object(name, s3_fault_endpoint, s3_fault_bucket):
    fs, _ = fsspec.core.url_to_fs(f"retry::s3://{s3_fault_bucket}/x",
                                  **_options(s3_fault_endpoint))
    with fs.open(f"retry::s3://{s3_fault_bucket}/{name}", "wb") as f:
        assert isinstance(f._last_inner, PartsInBackground)
        f.write(name.encode())
    assert s3_fault_endpoint.get_object(s3_fault_bucket, name) == name.encode()
    assert fs.cat_file(f"{s3_fault_bucket}/{name}") == name.encode()


def test_a_write_into_a_missing_bucket_raises_and_stores_nothing(s3_fault_endpoint,
                                                                s3_fault_bucket):
    fs, _ = fsspec.core.url_to_fs(f"retry::s3://{s3_fault_bucket}/x",
                                  **_options(s3_fault_endpoint))
    s3_fault_endpoint.reset_record()
    with pytest.raises(FileNotFoundError, match="no-such-bucket"), fs.open(
            "no-such-bucket/k", "wb") as f:
        f.write(b"lost")
    assert [r.status for r in s3_fault_endpoint.requests("PutObject")] == [404]


@pytest.mark.parametrize("mode", ["rb", "wb"])
def test_a_refused_request_is_a_permission_error_as_on_s3fs(mode, s3_fault_endpoint,
                                                            s3_fault_bucket):
    ep = s3_fault_endpoint
    ep.put_object(s3_fault_bucket, "secret", b"x")
    fs, _ = fsspec.core.url_to_fs(f"retry::s3://{s3_fault_bucket}/x", **_options(ep))
    refused = ep.add_fault(S3Fault.access_denied(op="HeadObject" if mode == "rb" else "PutObject"))
    with pytest.raises(PermissionError, match="ACCESS_DENIED"):
        with fs.open(f"{s3_fault_bucket}/secret", mode) as f:
            if mode == "wb":
                f.write(b"y")
    assert ep.fired(refused) == 1  # permanent: asked once, not retried
    assert ep.get_object(s3_fault_bucket, "secret") == b"x"


# -- any sequence of reads gives the file's bytes -----------------------------------------------

class _Face:
    retrier = None


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(steps=st.lists(st.tuples(st.integers(0, 3 * SMALL_BLOCK),
                                st.integers(0, 2 * SMALL_BLOCK),
                                st.sampled_from(["read", "readinto", "read_buffer",
                                                 "readline"])),
                      min_size=1, max_size=12))
def test_any_sequence_of_seeks_and_reads_gives_the_file_s_bytes(tmp_path, steps):
    from retryfs.core.classify import ErrorClassifier
    from retryfs.core.engine import Retrier
    from retryfs.core.policy import RetryPolicy
    from retryfs.core.stats import RetryStats

    path = tmp_path / "f.bin"
    if not path.exists():
        path.write_bytes(os.urandom(2 * SMALL_BLOCK + 999))
    data = path.read_bytes()
    local = pafs.LocalFileSystem()
    retrier = Retrier(lambda op: RetryPolicy(max_attempts=1), ErrorClassifier(), RetryStats())
    fetched = []

    def reopen():
        return local.open_input_file(str(path))

    f = RetryReadFile(_Face(), str(path), "rb", reopen(), reopen, retrier)
    fetch = f._fetch_block
    f._fetch_block = lambda start, end: fetched.append(end - start) or fetch(start, end)
    for offset, size, how in steps:
        f.seek(offset)
        expected = data[offset:offset + size]
        if how == "readline":
            rest = data[offset:]
            expected = rest[:rest.find(b"\n") + 1 or len(rest)][:size]
        if how == "readinto":
            buffer = bytearray(size)
            got = f.readinto(buffer)
            assert bytes(buffer[:got]) == expected
        else:
            got_data = getattr(f, how)(size)
            assert bytes(got_data) == expected
        assert f.tell() == offset + len(expected)
    assert all(n <= SMALL_BLOCK for n in fetched)
    f.close()


def test_small_reads_keep_only_a_few_blocks(monkeypatch, tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(os.urandom(8 * SMALL_BLOCK))
    local = pafs.LocalFileSystem()
    from retryfs.core.classify import ErrorClassifier
    from retryfs.core.engine import Retrier
    from retryfs.core.policy import RetryPolicy
    from retryfs.core.stats import RetryStats

    retrier = Retrier(lambda op: RetryPolicy(max_attempts=1), ErrorClassifier(), RetryStats())
    f = RetryReadFile(_Face(), str(path), "rb", local.open_input_file(str(path)),
                      lambda: local.open_input_file(str(path)), retrier)
    for block in range(8):
        f.seek(block * SMALL_BLOCK)
        f.read(10)
    assert len(f._blocks._kept) == face_files.SMALL_BLOCKS
    assert isinstance(f._inner, pa.NativeFile)

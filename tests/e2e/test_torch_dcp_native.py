"""torch.distributed.checkpoint through `retryfs.integrations.dcp`: DCP's own writer and reader
on retryfs's pyarrow face, under faults in every kind of request a save and a load make.

Each faulted save goes to a fresh location and is compared with a fault-free save of the same
state: the requests of the faulted kind are those of the clean save plus what the fault costs
(the request re-sent; the noted reconciliations), the bytes of the shard are sent once more only
where its own request failed, and the loaded tensors are ``torch.equal`` to the saved ones.
"""

import os
import pickle
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest
from _helpers import (
    DCP_WRITE_FAILURE,
    checkpoint_failures,
    dcp_writes_fail_after_one_item,
    require,
)

import retryfs
from retryfs.testing import S3Fault

torch = require("torch")
import torch.distributed.checkpoint as dcp  # noqa: E402

from retryfs.integrations import dcp as native  # noqa: E402
from retryfs.integrations.dcp import RetryingStorageReader, RetryingStorageWriter  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")

#: retry fast, no budget: a test's faults are all retried
QUERY = {"retry_max_attempts": 6, "retry_initial_delay": 0.001, "retry_max_delay": 0.01,
         "retry_budget": "false"}


def _state():
    generator = torch.Generator().manual_seed(0)
    # 12 MiB: more than a whole read (WHOLE_READ), so each item is a ranged read of its own
    return {"big": torch.randn(3072, 1024, generator=generator),
            "small": torch.arange(100, dtype=torch.float32)}


def _location(endpoint, path):
    return endpoint.uri(path, **QUERY)


def _save(endpoint, location):
    endpoint.reset_record()
    dcp.save(_state(), storage_writer=RetryingStorageWriter(location))
    return Counter(record.op for record in endpoint.requests())


def _load(endpoint, location):
    loaded = {name: torch.zeros_like(value) for name, value in _state().items()}
    endpoint.reset_record()
    dcp.load(loaded, storage_reader=RetryingStorageReader(location))
    assert all(torch.equal(loaded[name], value) for name, value in _state().items())
    return Counter(record.op for record in endpoint.requests())


def _shard_bytes_sent(endpoint):
    return sum(record.request_bytes for record in endpoint.requests(path="*.distcp")
               if record.op in ("UploadPart", "PutObject"))


#: The requests that change the store.
WRITES = frozenset({"PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload",
                    "AbortMultipartUpload", "CopyObject", "DeleteObjects", "DeleteObject"})

#: name -> (fault, the requests each firing adds, the shard's bytes sent again per firing)
SAVE_FAULTS = {
    "create_multipart_500": (S3Fault.internal_error(op="CreateMultipartUpload", times=1),
                             {"CreateMultipartUpload": 1}, 0),
    "upload_part_503": (S3Fault.slow_down(op="UploadPart", path="*.distcp", times=2),
                        {"UploadPart": 1}, 1),
    # pyarrow's client sends the commit once more after its retry was answered 200 (a plain
    # pyarrow.fs.S3FileSystem with 3 attempts does the same): two more commits, no part again
    "complete_multipart_500": (S3Fault.internal_error(op="CompleteMultipartUpload", times=1),
                               {"CompleteMultipartUpload": 2}, 0),
    "complete_multipart_applied_then_lost": (
        S3Fault.internal_error(op="CompleteMultipartUpload", times=1, applied=True),
        {"CompleteMultipartUpload": 2}, 0),
    # the rename of .metadata.tmp is a copy, then a delete, each retried on its own
    "rename_copy_503": (S3Fault.slow_down(op="CopyObject", times=2), {"CopyObject": 1}, 0),
    "rename_copy_applied_then_lost": (
        S3Fault.internal_error(op="CopyObject", times=1, applied=True), {"CopyObject": 1}, 0),
    # a retried delete first asks whether the lost attempt landed (one HEAD)
    "rename_delete_503": (S3Fault.slow_down(op="DeleteObject", times=2),
                          {"DeleteObject": 1, "HeadObject": 1}, 0),
}


@pytest.mark.parametrize("name", list(SAVE_FAULTS))
def test_a_native_dcp_save_costs_its_faults_and_nothing_else(
        name, s3_fault_endpoint, s3_fault_bucket):
    ep = s3_fault_endpoint
    fault, cost, resent = SAVE_FAULTS[name]
    clean = _save(ep, _location(ep, f"{s3_fault_bucket}/clean"))
    clean_bytes = _shard_bytes_sent(ep)
    ep.add_fault(fault)
    location = _location(ep, f"{s3_fault_bucket}/faulted")
    faulted = _save(ep, location)
    fired = len(ep.injected)
    assert fired == fault.times
    expected = Counter(clean)
    for kind, count in cost.items():
        expected[kind] += count * fired
    assert {k: v for k, v in faulted.items() if k in WRITES} == \
        {k: v for k, v in expected.items() if k in WRITES}, (clean, faulted)
    assert faulted["HeadObject"] == expected["HeadObject"], (clean, faulted)
    assert _shard_bytes_sent(ep) == clean_bytes * (1 + resent * fired) or resent and \
        _shard_bytes_sent(ep) < clean_bytes * (1 + fired)  # a part, not the whole shard
    ep.clear_faults()
    _load(ep, location)
    keys = ep.keys(s3_fault_bucket, "faulted/")
    assert "faulted/.metadata" in keys and "faulted/.metadata.tmp" not in keys


def test_a_failed_part_sends_that_part_again_not_the_shard(s3_fault_endpoint, s3_fault_bucket):
    ep = s3_fault_endpoint
    _save(ep, _location(ep, f"{s3_fault_bucket}/clean"))
    parts = ep.requests(op="UploadPart", path="*.distcp")
    ep.add_fault(S3Fault.slow_down(op="UploadPart", path="*.distcp", times=1))
    _save(ep, _location(ep, f"{s3_fault_bucket}/faulted"))
    faulted = ep.requests(op="UploadPart", path="*.distcp")
    assert len(ep.injected) == 1 and len(faulted) == len(parts) + 1
    sent = sum(record.request_bytes for record in faulted)
    assert sent - sum(record.request_bytes for record in parts) <= max(
        record.request_bytes for record in parts)


@pytest.mark.parametrize("op", ["GetObject", "HeadObject"])
def test_a_native_dcp_load_survives_read_faults(op, s3_fault_endpoint, s3_fault_bucket):
    ep = s3_fault_endpoint
    location = _location(ep, f"{s3_fault_bucket}/ckpt")
    _save(ep, location)
    clean = _load(ep, location)
    ep.add_fault(S3Fault.slow_down(op=op, times=2))
    faulted = _load(ep, location)
    assert len(ep.injected) == 2 and faulted[op] == clean[op] + 2, (clean, faulted)


def test_a_native_dcp_load_reads_each_stored_byte_once_in_ranged_gets(
        s3_fault_endpoint, s3_fault_bucket):
    """DCP's own slices read an item's zip headers piecemeal (a request each on an object
    store); this reader asks for each stored item's bytes at once: the shard's ranges tile it
    exactly (an item longer than retryfs's sub-read is read in several, in parallel), and
    ``.metadata`` is one GET."""
    ep = s3_fault_endpoint
    location = _location(ep, f"{s3_fault_bucket}/ckpt")
    _save(ep, location)
    (shard,) = [key for key in ep.keys(s3_fault_bucket, "ckpt/") if key.endswith(".distcp")]
    size = len(ep.get_object(s3_fault_bucket, shard))
    metadata = pickle.loads(ep.get_object(s3_fault_bucket, "ckpt/.metadata"))
    _load(ep, location)
    ranges = sorted(tuple(int(end) for end in record.headers["range"][6:].split("-"))
                    for record in ep.requests(op="GetObject", path="*.distcp"))
    assert ranges[0][0] == 0 and ranges[-1][1] == size - 1
    assert all(b[0] == a[1] + 1 for a, b in zip(ranges, ranges[1:], strict=False)), ranges
    starts = {info.offset for info in metadata.storage_data.values()}
    assert starts <= {start for start, _ in ranges} and len(starts) == 2
    assert len(ranges) <= 3  # 12 MiB in 8 MiB reads, and the small tensor
    assert len(ep.requests(op="GetObject", path="*/.metadata")) == 1


def test_a_second_save_to_a_location_replaces_its_metadata(s3_fault_endpoint, s3_fault_bucket):
    ep = s3_fault_endpoint
    location = _location(ep, f"{s3_fault_bucket}/ckpt")
    _save(ep, location)
    first = ep.get_object(s3_fault_bucket, "ckpt/.metadata")
    trained = {name: value + 1 for name, value in _state().items()}  # the next step's weights
    dcp.save(trained, storage_writer=RetryingStorageWriter(location))
    assert ep.get_object(s3_fault_bucket, "ckpt/.metadata") != first  # a new save_id
    loaded = {name: torch.zeros_like(value) for name, value in trained.items()}
    dcp.load(loaded, storage_reader=RetryingStorageReader(location))
    assert all(torch.equal(loaded[name], value) for name, value in trained.items())
    # DCP's mkdir makes no marker; pyarrow's client leaves an empty ckpt/ when it deletes
    # .metadata.tmp
    assert sorted(ep.keys(s3_fault_bucket, "ckpt/")) == [
        "ckpt/", "ckpt/.metadata", "ckpt/__0_0.distcp"]


def test_locations_as_users_write_them(s3_fault_endpoint, s3_fault_bucket, tmp_path):
    ep = s3_fault_endpoint
    fs, path = retryfs.from_uri(ep.uri(f"{s3_fault_bucket}/given", **QUERY))
    # a filesystem given: the location is a path on it; retry:: and a scheme are dropped
    # (two locations: the same tensors twice at one location within a second cannot be
    # proven new with this test's 10 ms retries; docs/semantics.md)
    for location in (f"{s3_fault_bucket}/given", f"retry::s3://{s3_fault_bucket}/given-too"):
        dcp.save(_state(), storage_writer=RetryingStorageWriter(location, fs))
        loaded = {name: torch.zeros_like(value) for name, value in _state().items()}
        dcp.load(loaded, storage_reader=RetryingStorageReader(location, fs))
        assert torch.equal(loaded["big"], _state()["big"])
    # an object store's filesystem given: no directory marker, the rename a copy and a delete
    ep.reset_record()
    dcp.save(_state(), storage_writer=RetryingStorageWriter(f"{s3_fault_bucket}/given2", fs))
    (copy,) = ep.requests(op="CopyObject")
    # (the only PutObject is the marker pyarrow's client leaves when it deletes .metadata.tmp)
    assert [record.seq > copy.seq for record in ep.requests(op="PutObject")] == [True]
    # a local filesystem given (in a subtree): directories made, the rename in place
    import pyarrow.fs as pafs

    subtree = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())
    dcp.save(_state(), storage_writer=RetryingStorageWriter("e/ckpt", subtree))
    assert sorted(os.listdir(tmp_path / "e" / "ckpt")) == [".metadata", "__0_0.distcp"]
    # a local directory, as a path and as a file:// URL: made, written, renamed in place
    for location in (str(tmp_path / "a" / "ckpt"), f"retry::file://{tmp_path}/b/ckpt"):
        dcp.save(_state(), storage_writer=RetryingStorageWriter(location))
        loaded = {name: torch.zeros_like(value) for name, value in _state().items()}
        dcp.load(loaded, storage_reader=RetryingStorageReader(location))
        assert torch.equal(loaded["big"], _state()["big"])
    assert sorted(os.listdir(tmp_path / "a" / "ckpt")) == [".metadata", "__0_0.distcp"]
    # checkpoint_id= on reset goes to the new location
    writer = RetryingStorageWriter(str(tmp_path / "c"))
    dcp.save(_state(), storage_writer=writer, checkpoint_id=str(tmp_path / "d"))
    assert os.listdir(tmp_path / "d") and not (tmp_path / "c").exists()


def test_options_and_bad_locations(tmp_path):
    writer = RetryingStorageWriter(str(tmp_path), policy=retryfs.RetryPolicy(max_attempts=2))
    assert writer.fs.fs.policy.max_attempts == 2
    with pytest.raises(TypeError, match="configure the RetryingFileSystem"):
        RetryingStorageWriter("x", retryfs.RetryingFileSystem(
            __import__("pyarrow.fs").fs.LocalFileSystem()), deadline=3)
    with pytest.raises(ValueError, match="path: an empty checkpoint location"):
        RetryingStorageReader("retry::")
    assert RetryingStorageWriter.validate_checkpoint_id("s3://b/k")
    assert not RetryingStorageReader.validate_checkpoint_id("")
    with pytest.raises(ValueError, match="mode"):
        with writer.fs.create_stream(str(tmp_path / "x"), "ab"):
            pass


def test_the_writer_and_reader_pickle_with_their_configuration(tmp_path):
    writer = RetryingStorageWriter(str(tmp_path), policy=retryfs.RetryPolicy(max_attempts=3))
    copy = pickle.loads(pickle.dumps(writer))
    assert copy.fs.fs.policy.max_attempts == 3 and copy.path == writer.path
    # a filesystem wrapped with options travels wrapped
    import pyarrow.fs as pafs

    reader = RetryingStorageReader(str(tmp_path), pafs.LocalFileSystem(),
                                   policy=retryfs.RetryPolicy(max_attempts=4))
    assert pickle.loads(pickle.dumps(reader)).fs.fs.policy.max_attempts == 4
    assert native.WHOLE_READ == 8 * 2**20


EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torch_dcp.py"


@pytest.mark.slow  # two processes start torch and gloo (about 5 s)
def test_the_native_dcp_example_saves_and_loads_on_two_processes_under_faults():
    result = subprocess.run([sys.executable, str(EXAMPLE), "--fault-endpoint", "--native",
                             "--world-size", "2"], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rank 0: checkpoint intact: True" in result.stdout
    assert "rank 1: checkpoint intact: True" in result.stdout
    # 503 twice on each of the 7 kinds of request, all fired and all retried
    assert "faults the endpoint injected: 14 " in result.stdout, result.stdout


def test_a_location_s_query_configures_its_own_filesystem(s3_fault_endpoint, s3_fault_bucket):
    from retryfs.integrations.locations import Locations, split_location

    ep = s3_fault_endpoint
    locations = Locations()
    four, path = locations.resolve(ep.uri(f"{s3_fault_bucket}/a/b", retry_max_attempts=4))
    again, other = locations.resolve(ep.uri(f"{s3_fault_bucket}/c", retry_max_attempts=4))
    seven, _ = locations.resolve(ep.uri(f"{s3_fault_bucket}/c", retry_max_attempts=7))
    # the credentials in the URL's userinfo are not part of the path
    assert (path, other) == (f"{s3_fault_bucket}/a/b", f"{s3_fault_bucket}/c")
    assert again is four and four.policy.max_attempts == 4 and seven.policy.max_attempts == 7
    # the store alone, then a path in it; an escaped path is decoded as from_uri decodes it
    bare = Locations()
    store = ep.uri(s3_fault_bucket, retry_max_attempts=2)
    assert bare.resolve(store)[1] == s3_fault_bucket
    key = ep.uri(f"{s3_fault_bucket}/k", retry_max_attempts=2)
    assert bare.resolve(key)[1] == f"{s3_fault_bucket}/k"
    assert bare.resolve(store)[1] == s3_fault_bucket
    escaped = ep.uri(f"{s3_fault_bucket}/a%20b", retry_max_attempts=2)
    assert bare.resolve(escaped) == (bare.resolve(key)[0],
                                     retryfs.from_uri(escaped)[1])
    assert split_location("s3://key:secret@b/k") == ("s3", "key:secret@b", "b/k")
    assert split_location("abfs://c@acct.dfs.core.windows.net/k")[2] == "c/k"
    writer = RetryingStorageWriter(ep.uri(f"{s3_fault_bucket}/w", retry_max_attempts=3))
    assert writer.fs.fs.policy.max_attempts == 3 and writer.path == f"{s3_fault_bucket}/w"


def test_a_save_on_two_writer_threads_loads_back(s3_fault_endpoint, s3_fault_bucket):
    ep = s3_fault_endpoint
    location = _location(ep, f"{s3_fault_bucket}/threads")
    ep.add_fault(S3Fault.slow_down(op="UploadPart", times=2))
    dcp.save(_state(), storage_writer=RetryingStorageWriter(location, thread_count=2))
    assert len(ep.injected) == 2
    shards = [key for key in ep.keys(s3_fault_bucket, "threads/") if key.endswith(".distcp")]
    assert len(shards) == 2  # one file per thread
    _load(ep, location)


def test_hostile_names_keep_their_exact_keys(s3_fault_endpoint, s3_fault_bucket):
    ep = s3_fault_endpoint
    fs, _ = retryfs.from_uri(_location(ep, s3_fault_bucket))
    state = {"w": torch.arange(10.0)}
    for name in ("ckpt dir/step 100", "ünï/çødé", "a+b%c#d;e"):
        location = f"{s3_fault_bucket}/{name}"
        dcp.save(state, storage_writer=RetryingStorageWriter(location, fs))
        loaded = {"w": torch.zeros(10)}
        dcp.load(loaded, storage_reader=RetryingStorageReader(location, fs))
        assert torch.equal(loaded["w"], state["w"])
        assert {f"{name}/.metadata", f"{name}/__0_0.distcp"} <= set(ep.keys(s3_fault_bucket, name))
    # in a URL a space is escaped (%20) and stored unescaped; unescaped, pyarrow refuses it
    dcp.save(state, storage_writer=RetryingStorageWriter(_location(ep, f"{s3_fault_bucket}/x%20y")))
    assert "x y/.metadata" in ep.keys(s3_fault_bucket, "x y/")
    with pytest.raises(Exception, match="Cannot parse URI"):
        RetryingStorageWriter(_location(ep, f"{s3_fault_bucket}/x y"))


def test_an_async_save_survives_a_part_fault(s3_fault_endpoint, s3_fault_bucket):
    ep = s3_fault_endpoint
    location = _location(ep, f"{s3_fault_bucket}/async")
    ep.add_fault(S3Fault.slow_down(op="UploadPart", times=1))
    future = dcp.async_save(_state(), storage_writer=RetryingStorageWriter(location))
    future.result()
    assert len(ep.injected) == 1
    _load(ep, location)


def test_a_shard_cut_short_by_a_third_party_is_a_clear_error(s3_fault_endpoint, s3_fault_bucket):
    ep = s3_fault_endpoint
    location = _location(ep, f"{s3_fault_bucket}/cut")
    _save(ep, location)
    shard = ep.get_object(s3_fault_bucket, "cut/__0_0.distcp")
    # cut to more than a whole read (ranged reads) and to less (read whole): the same error
    for size in (len(shard) - 100, len(shard) // 2):
        ep.put_object(s3_fault_bucket, "cut/__0_0.distcp", shard[:size])
        loaded = {name: torch.zeros_like(value) for name, value in _state().items()}
        with pytest.raises(dcp.api.CheckpointException,
                           match=rf"__0_0\.distcp: {size} bytes, but \d+ were stored"):
            dcp.load(loaded, storage_reader=RetryingStorageReader(location))


def test_a_save_that_fails_while_writing_a_shard_commits_none_of_it(s3_fault_endpoint,
                                                                   s3_fault_bucket,
                                                                   monkeypatch):
    """An error in DCP's own writing (here after the shard's first item was written) leaves
    no shard and no ``.metadata``: the shard's stream is given up on the way out of DCP's
    ``with`` block, where a pyarrow stream would store its prefix as the shard."""
    written = dcp_writes_fail_after_one_item(monkeypatch)
    ep = s3_fault_endpoint
    ep.reset_record()
    with pytest.raises(dcp.api.CheckpointException) as caught:
        dcp.save(_state(), storage_writer=RetryingStorageWriter(
            _location(ep, f"{s3_fault_bucket}/failed")))
    assert DCP_WRITE_FAILURE in checkpoint_failures(caught.value)
    assert written and ep.requests(["CreateMultipartUpload"])  # the shard's upload had begun
    assert ep.keys(s3_fault_bucket, "failed") == []
    assert not ep.requests(["CompleteMultipartUpload", "PutObject"])

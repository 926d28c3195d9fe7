"""torch.distributed.checkpoint on ``retry::`` URLs: DCP's own FsspecWriter and FsspecReader,
under faults in every kind of request a save and a load make, one process and two (gloo).

Each faulted save is compared with a fault-free save of the same state: the requests of the
faulted kind are those of the clean save plus one per fault that fired, every other kind
unchanged (a retry re-sends the request that failed, nothing else), and the loaded tensors are
``torch.equal`` to the saved ones.
"""

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

from retryfs.testing import S3Fault
from retryfs.testing.s3 import PYARROW_PART_SIZE

torch = require("torch")
import torch.distributed.checkpoint as dcp  # noqa: E402
from torch.distributed.checkpoint._fsspec_filesystem import (  # noqa: E402
    FsspecReader,
    FsspecWriter,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "torch_dcp.py"


def _state():
    generator = torch.Generator().manual_seed(0)
    # 12 MiB: two parts of pyarrow's 10 MiB (UploadPart; the files are written through
    # pyarrow's client, file_client), and a small tensor
    return {"big": torch.randn(3072, 1024, generator=generator),
            "small": torch.arange(100, dtype=torch.float32)}


def _options(endpoint):
    return {"s3": {"key": "testing", "secret": "testing", "endpoint_url": endpoint.url,
                   "client_kwargs": {"region_name": endpoint.region},
                   "default_block_size": 5 * 2**20, "skip_instance_cache": True},
            "retry": {"max_attempts": 6, "initial_delay": 0.001, "max_delay": 0.01,
                      "budget": False}}


def _save(endpoint, url):
    endpoint.reset_record()
    dcp.save(_state(), storage_writer=FsspecWriter(url, **_options(endpoint)))
    return Counter(record.op for record in endpoint.requests())


def _load(endpoint, url):
    loaded = {name: torch.zeros_like(value) for name, value in _state().items()}
    endpoint.reset_record()
    dcp.load(loaded, storage_reader=FsspecReader(url, **_options(endpoint)))
    return loaded, Counter(record.op for record in endpoint.requests())


def _shard_bytes_sent(endpoint):
    return sum(record.request_bytes for record in endpoint.requests(path="*.distcp")
               if record.op in ("UploadPart", "PutObject"))


#: The requests that change the store.
WRITES = frozenset({"PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload",
                    "AbortMultipartUpload", "CopyObject", "DeleteObjects", "DeleteObject"})

#: name -> (fault, the requests of other kinds each firing adds besides the one re-sent)
SAVE_FAULTS = {
    "put_object_503": (S3Fault.slow_down(op="PutObject", times=2), {}),
    "create_multipart_500": (S3Fault.internal_error(op="CreateMultipartUpload", times=1), {}),
    "upload_part_503": (S3Fault.slow_down(op="UploadPart", times=2), {}),
    # the commit of a multipart upload is retried in place too (the same upload and parts);
    # pyarrow's client sends it once more after its retry was answered 200 (a plain
    # pyarrow.fs.S3FileSystem with 3 attempts does the same): no part again
    "complete_multipart_500": (S3Fault.internal_error(op="CompleteMultipartUpload", times=1),
                               {"CompleteMultipartUpload": 1}),
    # applied, its answer lost: the retry is answered as the first was (the object is still
    # the upload's; tests/fsspec/test_face.py also has the NoSuchUpload answer)
    "complete_multipart_applied_then_lost": (
        S3Fault.internal_error(op="CompleteMultipartUpload", times=1, applied=True),
        {"CompleteMultipartUpload": 1}),
    # a retried copy first looks at the destination (did the lost attempt land?): one HEAD
    "rename_copy_503": (S3Fault.slow_down(op="CopyObject", times=2), {"HeadObject": 1}),
    "rename_delete_503": (S3Fault.slow_down(op="DeleteObjects", times=2), {}),
    "rename_copy_applied_then_lost": (
        S3Fault.internal_error(op="CopyObject", times=1, applied=True), {"HeadObject": 1}),
    "rename_delete_applied_then_lost": (
        S3Fault.internal_error(op="DeleteObjects", times=1, applied=True), {}),
}


@pytest.mark.parametrize("name", list(SAVE_FAULTS))
def test_a_dcp_save_on_a_retry_url_costs_its_faults_and_nothing_else(
        name, s3_fault_endpoint, s3_fault_bucket):
    fault, extra = SAVE_FAULTS[name]
    clean = _save(s3_fault_endpoint, f"retry::s3://{s3_fault_bucket}/clean")
    clean_bytes = _shard_bytes_sent(s3_fault_endpoint)
    s3_fault_endpoint.add_fault(fault)
    url = f"retry::s3://{s3_fault_bucket}/faulted"
    faulted = _save(s3_fault_endpoint, url)
    # a failed part costs that part again (one of pyarrow's 10 MiB, as the wire carries it),
    # anything else not one byte
    resent = _shard_bytes_sent(s3_fault_endpoint) - clean_bytes
    part = max(r.request_bytes for r in s3_fault_endpoint.requests("UploadPart"))
    assert PYARROW_PART_SIZE <= part < 1.01 * PYARROW_PART_SIZE
    assert 0 < resent <= fault.times * part if name == "upload_part_503" else resent == 0, \
        resent
    (op,) = fault.ops
    fired = len(s3_fault_endpoint.injected)
    assert fired == fault.times
    expected = Counter(clean)
    expected[op] += fired
    for kind, count in extra.items():
        expected[kind] += count * fired
    # the requests that change the store, exactly (the checks after each commit read: a HEAD,
    # and a read-back where a 2-part ETag cannot be compared with the bytes' MD5)
    assert {k: v for k, v in faulted.items() if k in WRITES} == \
        {k: v for k, v in expected.items() if k in WRITES}, (clean, faulted)
    assert faulted["GetObject"] <= clean["GetObject"] + 2 * fired, (clean, faulted)
    s3_fault_endpoint.clear_faults()
    loaded, _ = _load(s3_fault_endpoint, url)
    assert all(torch.equal(loaded[k], v) for k, v in _state().items())
    keys = s3_fault_endpoint.keys(s3_fault_bucket, "faulted/")
    assert "faulted/.metadata" in keys and "faulted/.metadata.tmp" not in keys


@pytest.mark.parametrize("op", ["GetObject", "HeadObject"])
def test_a_dcp_load_on_a_retry_url_survives_read_faults(op, s3_fault_endpoint, s3_fault_bucket):
    url = f"retry::s3://{s3_fault_bucket}/ckpt"
    _save(s3_fault_endpoint, url)
    _, clean = _load(s3_fault_endpoint, url)
    s3_fault_endpoint.add_fault(S3Fault.slow_down(op=op, times=2))
    loaded, faulted = _load(s3_fault_endpoint, url)
    assert len(s3_fault_endpoint.injected) == 2
    assert faulted[op] == clean[op] + 2, (clean, faulted)
    assert all(torch.equal(loaded[k], v) for k, v in _state().items())


def test_a_dcp_load_with_the_documented_read_options_fetches_each_byte_once_under_faults(
        s3_fault_endpoint, s3_fault_bucket):
    """docs/pytorch.md's read options (blocks kept by offset; 1 MiB here, 8 MiB there): DCP's
    reads out of the file's order fetch each byte of the shard once (with s3fs's default
    read-ahead 2.7 times), and two failed GETs cost two GETs more."""
    ep = s3_fault_endpoint
    url = f"retry::s3://{s3_fault_bucket}/ckpt"
    _save(ep, url)
    shard = sum(len(ep.get_object(s3_fault_bucket, key))
                for key in ep.keys(s3_fault_bucket, "ckpt/") if key.endswith(".distcp"))
    options = _options(ep)
    options["s3"].update(default_block_size=2**20, default_cache_type="blockcache")

    def load():
        loaded = {name: torch.zeros_like(value) for name, value in _state().items()}
        ep.reset_record()
        dcp.load(loaded, storage_reader=FsspecReader(url, **options))
        gets = ep.requests(op="GetObject", path="*.distcp")
        assert all(torch.equal(loaded[k], v) for k, v in _state().items())
        return len(gets), sum(record.response_bytes for record in gets)

    clean_gets, served = load()
    assert served == shard
    ep.add_fault(S3Fault.internal_error(op="GetObject", path="*.distcp", times=2))
    faulted_gets, _ = load()
    assert len(ep.injected) == 2 and faulted_gets == clean_gets + 2


def test_the_plain_s3_url_without_retries_loses_the_save(s3_fault_endpoint, s3_fault_bucket):
    # the contrast: the same fault on s3fs with its own retries cut to one attempt
    import s3fs

    s3fs.S3FileSystem.clear_instance_cache()
    options = _options(s3_fault_endpoint)["s3"]
    options["config_kwargs"] = {"retries": {"total_max_attempts": 1, "mode": "standard"}}
    s3_fault_endpoint.add_fault(S3Fault.slow_down(op="CopyObject", times=1))
    original = s3fs.S3FileSystem.retries
    s3fs.S3FileSystem.retries = 1
    try:
        with pytest.raises(dcp.api.CheckpointException):
            dcp.save(_state(), storage_writer=FsspecWriter(f"s3://{s3_fault_bucket}/plain",
                                                           **options))
    finally:
        s3fs.S3FileSystem.retries = original
    assert "plain/.metadata" not in s3_fault_endpoint.keys(s3_fault_bucket, "plain/")


@pytest.mark.slow  # two processes start torch and gloo (about 5 s)
def test_the_dcp_example_saves_and_loads_on_two_processes_under_faults():
    result = subprocess.run([sys.executable, str(EXAMPLE), "--fault-endpoint",
                             "--world-size", "2"], capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rank 0: checkpoint intact: True" in result.stdout
    assert "rank 1: checkpoint intact: True" in result.stdout
    assert "faults the endpoint injected: 12 " in result.stdout, result.stdout


def test_a_save_that_fails_while_writing_a_shard_commits_none_of_it(s3_fault_endpoint,
                                                                   s3_fault_bucket,
                                                                   monkeypatch):
    """DCP's ``create_stream`` deletes the shard when its writing raises, while the file is
    still open: on plain s3fs the ``with`` block then closes the file and stores the prefix as
    the shard. retryfs's file gives the upload up instead."""
    written = dcp_writes_fail_after_one_item(monkeypatch)
    ep = s3_fault_endpoint
    ep.reset_record()
    with pytest.raises(dcp.api.CheckpointException) as caught:
        dcp.save(_state(), storage_writer=FsspecWriter(f"retry::s3://{s3_fault_bucket}/failed",
                                                       **_options(ep)))
    assert DCP_WRITE_FAILURE in checkpoint_failures(caught.value)
    assert written and ep.keys(s3_fault_bucket, "failed") == []
    assert not ep.requests(["CompleteMultipartUpload", "PutObject"])

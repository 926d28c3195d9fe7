"""pyarrow's S3 client with ``allow_delayed_open``: its streams start their upload with their
first part, and one whose CreateMultipartUpload failed stores an empty object when closed
(pyarrow 26). retryfs never closes a broken stream of such a client: a replay or a copy
retried never puts an empty object over the one there, and one that gives up leaves it as it
was. Its own write client's 3 SDK attempts fail first (``client_write_attempts``)."""

import os

import pyarrow.fs as pafs
import pytest

from retryfs import RetryingFileSystem, RetryPolicy
from retryfs.datapath.iopool import opens_lazily
from retryfs.testing import S3Fault

POLICY = RetryPolicy(max_attempts=3, initial_delay=0.001, max_delay=0.01)
PREVIOUS = b"the previous checkpoint"


def _lazy(endpoint, bucket):
    endpoint.put_object(bucket, "ckpt", PREVIOUS)
    inner = endpoint.pyarrow_fs(allow_delayed_open=True)
    return RetryingFileSystem(inner, POLICY, client_attempts=1, budget=False)


def test_the_clients_that_open_lazily_are_told_apart(s3_fault_endpoint, tmp_path):
    lazy = s3_fault_endpoint.pyarrow_fs(allow_delayed_open=True)
    assert opens_lazily(lazy) and opens_lazily(pafs.SubTreeFileSystem("bucket/base", lazy))
    assert not opens_lazily(s3_fault_endpoint.pyarrow_fs())
    assert not opens_lazily(pafs.LocalFileSystem())


def _fail_starts(endpoint, gives_up):
    return endpoint.add_fault(S3Fault.slow_down(op="CreateMultipartUpload",
                                                times=100 if gives_up else 3))


def _outcome(endpoint, bucket, fault, gives_up, data):
    assert endpoint.fired(fault) == (3 * POLICY.max_attempts if gives_up else 3)
    assert endpoint.requests("PutObject") == []
    # what the faults cost: the upload that started sent the object's 2 parts once (10 MiB and
    # the rest); the failed starts sent no part
    parts = endpoint.requests("UploadPart")
    assert len(parts) == (0 if gives_up else 2)
    assert sum(r.request_bytes for r in parts) < (1 if gives_up else 1.01 * len(data))
    assert endpoint.get_object(bucket, "ckpt") == (PREVIOUS if gives_up else data)


@pytest.mark.parametrize("gives_up", [False, True])
def test_a_replayed_stream_never_stores_an_empty_object(gives_up, s3_fault_endpoint,
                                                        s3_fault_bucket):
    ep = s3_fault_endpoint
    fs = _lazy(ep, s3_fault_bucket)
    data = os.urandom(12 * 2**20)
    fault = _fail_starts(ep, gives_up)
    ep.reset_record()
    try:
        with fs.open_output_stream(f"{s3_fault_bucket}/ckpt") as out:
            out.write(data)
    except OSError as error:
        assert gives_up and "SLOW_DOWN" in str(error)
    else:
        assert not gives_up
    _outcome(ep, s3_fault_bucket, fault, gives_up, data)


@pytest.mark.parametrize("gives_up", [False, True])
def test_a_retried_copy_never_stores_an_empty_object(gives_up, s3_fault_endpoint,
                                                     s3_fault_bucket, tmp_path):
    ep = s3_fault_endpoint
    fs = _lazy(ep, s3_fault_bucket)
    data = os.urandom(12 * 2**20)
    (tmp_path / "ckpt").write_bytes(data)
    fault = _fail_starts(ep, gives_up)
    ep.reset_record()
    try:
        pafs.copy_files(str(tmp_path / "ckpt"), f"{s3_fault_bucket}/ckpt",
                        source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
    except OSError as error:
        assert gives_up and "SLOW_DOWN" in str(error)
    else:
        assert not gives_up
    _outcome(ep, s3_fault_bucket, fault, gives_up, data)

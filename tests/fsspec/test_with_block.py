"""A ``with`` block around a file open for writing that raises commits nothing, on s3fs,
with the upload not begun, and begun (parts sent, then aborted)."""

import gc

import pytest
from _helpers import FAST

from retryfs.fsspec.filesystem import RetryFileSystem


class _SaveFailed(Exception):
    pass


@pytest.mark.parametrize("size", [100, 12 * 2**20])  # one PutObject / a multipart upload
def test_a_with_block_that_raises_keeps_the_object_that_was_there(s3_fault_endpoint,
                                                                   s3_fault_bucket, size):
    """fsspec's files close on the way out of a ``with`` block that raised, and s3fs stores
    the prefix as the object; retryfs's file gives the upload up (s3fs aborts it)."""
    ep = s3_fault_endpoint
    ep.put_object(s3_fault_bucket, "ckpt", b"the last good checkpoint")
    fs = RetryFileSystem(fs=ep.s3fs(), policy=FAST, budget=False)
    for key in ("ckpt", "new"):
        with pytest.raises(_SaveFailed):
            with fs.open(f"retry::s3://{s3_fault_bucket}/{key}", "wb",
                         block_size=5 * 2**20) as f:
                f.write(b"n" * size)
                raise _SaveFailed("torch.save failed in the middle")
    gc.collect()
    assert ep.get_object(s3_fault_bucket, "ckpt") == b"the last good checkpoint"
    assert ep.keys(s3_fault_bucket) == ["ckpt"]
    assert not ep.requests(["PutObject", "CompleteMultipartUpload"])
    if size > 5 * 2**20:  # parts were sent: the upload was aborted, not left behind
        assert ep.requests(["UploadPart"]) and len(ep.requests(["AbortMultipartUpload"])) == 2


def test_plain_s3fs_commits_what_a_with_block_that_raised_had_written(s3_fault_endpoint,
                                                                     s3_fault_bucket):
    ep = s3_fault_endpoint
    ep.put_object(s3_fault_bucket, "ckpt", b"the last good checkpoint")
    with pytest.raises(_SaveFailed):
        with ep.s3fs().open(f"{s3_fault_bucket}/ckpt", "wb") as f:
            f.write(b"prefix")
            raise _SaveFailed("torch.save failed in the middle")
    assert ep.get_object(s3_fault_bucket, "ckpt") == b"prefix"

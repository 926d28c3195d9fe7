"""An append whose open fails on s3fs leaves no half-built file that commits an empty object.

s3fs's append mode asks for the object after fsspec's file constructor has run; when that
request fails, the half-built file's ``__del__`` (at garbage collection) commits an empty PUT
over the object. retryfs retries the open, so each failed attempt would leave one: Lightning's
``CSVLogger`` appends its ``metrics.csv`` this way.
"""

import gc

import pytest
from _helpers import FAST

from retryfs.fsspec.filesystem import RetryFileSystem
from retryfs.testing import S3Fault


@pytest.mark.parametrize("nth", [1, 2], ids=["exists", "head_object"])
def test_a_failed_append_open_commits_nothing(nth, s3_fault_endpoint, s3_fault_bucket):
    s3_fault_endpoint.put_object(s3_fault_bucket, "metrics.csv", b"step,loss\n0,1.0\n")
    fs = RetryFileSystem(fs=s3_fault_endpoint.s3fs(), policy=FAST, budget=False)
    s3_fault_endpoint.add_fault(S3Fault.slow_down(op="HeadObject", nth=nth))
    with fs.open(f"retry::s3://{s3_fault_bucket}/metrics.csv", "ab") as f:
        f.write(b"1,0.5\n")
    assert len(s3_fault_endpoint.injected) == 1
    gc.collect()  # the failed attempt's file, if it was left open, commits here
    assert s3_fault_endpoint.get_object(s3_fault_bucket, "metrics.csv") == \
        b"step,loss\n0,1.0\n1,0.5\n"
    puts = s3_fault_endpoint.requests(op="PutObject")
    assert len(puts) == 1 and puts[0].request_bytes > 0

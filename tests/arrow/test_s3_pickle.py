"""Pickled clients: what reaches a Ray worker.

pyarrow's `S3FileSystem` forgets its ``retry_strategy`` when pickled (``__reduce__`` carries
every option but that one), so a client tuned on the driver silently goes back to the AWS SDK's
default on the worker. A pickled `RetryingFileSystem` keeps its own policy and classifier on
the other side, and retries there by them: shown against the real server, with the endpoint's
record counting the requests.
"""

from __future__ import annotations

import pickle
from typing import Any

import pyarrow.fs as pafs
import pytest
from _helpers import require

from retryfs import RetryingFileSystem, RetryPolicy
from retryfs.testing.s3 import S3Fault, S3FaultEndpoint

POLICY = RetryPolicy(max_attempts=3, initial_delay=0.001, multiplier=2, max_delay=0.002,
                     jitter=False)


def _cloudpickle() -> Any:
    """What Ray uses to ship the filesystem to its workers (a missing ray: a reported skip,
    or under CI / `make test` an error naming it)."""
    return require("ray.cloudpickle")


def picklers() -> list[Any]:
    return [pytest.param(lambda: pickle, id="pickle"), pytest.param(_cloudpickle, id="cloudpickle")]


@pytest.fixture
def obj(s3_fault_endpoint: S3FaultEndpoint, s3_fault_bucket: str) -> str:
    s3_fault_endpoint.put_object(s3_fault_bucket, "obj", b"payload")
    return f"{s3_fault_bucket}/obj"


def test_pyarrow_s3_forgets_its_retry_strategy_when_pickled(s3_fault_endpoint: S3FaultEndpoint,
                                                           obj: str) -> None:
    ep = s3_fault_endpoint
    native = ep.pyarrow_fs(max_attempts=1)
    assert "retry_strategy" not in native.__reduce__()[1][0]
    ep.add_fault(S3Fault.internal_error(op="HeadObject", times=2))
    with pytest.raises(OSError, match="HTTP status 500"):
        native.get_file_info(obj)
    assert len(ep.requests(op="HeadObject")) == 1  # one attempt, as configured

    ep.reset_record()
    clone = pickle.loads(pickle.dumps(native))
    assert clone.get_file_info(obj).type == pafs.FileType.File
    assert [r.status for r in ep.requests(op="HeadObject")] == [500, 200]  # the SDK retried


@pytest.mark.parametrize("pickler", picklers())
def test_pickled_wrapper_keeps_its_policy_and_retries_by_it_on_the_other_side(
        s3_fault_endpoint: S3FaultEndpoint, obj: str, pickler: Any) -> None:
    pickler = pickler()
    ep = s3_fault_endpoint
    # Fresh IAM credentials can answer AccessDenied for a few seconds: a caller who knows that
    # makes it retryable, and that decision must reach the workers too.
    fs = RetryingFileSystem(ep.pyarrow_fs(max_attempts=1), POLICY, budget=False,
                            retryable_messages=["AWS Error ACCESS_DENIED"])
    clone = pickler.loads(pickler.dumps(fs))

    assert type(clone) is RetryingFileSystem and clone == fs
    assert clone.policy == POLICY and clone.classifier == fs.classifier
    assert isinstance(clone.unwrap(), pafs.S3FileSystem)

    # The SDK never retries a 403 (its restored default strategy would hide 5xx faults):
    # every request below is an attempt of the clone's own.
    denied = ep.add_fault(S3Fault.access_denied(op="HeadObject", times=2))
    assert clone.get_file_info(obj).type == pafs.FileType.File
    assert [r.status for r in ep.requests(op="HeadObject")] == [403, 403, 200]
    assert ep.fired(denied) == 2
    snapshot = clone.stats.snapshot()
    assert (snapshot["attempts"], snapshot["retries"], snapshot["giveups"]) == (3, 2, 0)
    assert fs.stats.snapshot()["calls"] == 0  # stats are per process: the original saw nothing

    # Denied for good: the clone gives up after exactly its policy's 3 attempts.
    ep.reset_record()
    ep.add_fault(S3Fault.access_denied(op="HeadObject"))
    with pytest.raises(OSError, match="AWS Error ACCESS_DENIED") as raised:
        clone.get_file_info(obj)
    assert "gave up after 3 attempt(s)" in "".join(getattr(raised.value, "__notes__", []))
    assert len(ep.requests(op="HeadObject")) == POLICY.max_attempts
    assert clone.stats.snapshot()["giveups"] == 1

"""`retryfs.patches.s3fs_one_try`: a request of an s3fs client that retryfs configured for one
attempt fails at once, without s3fs's 100 ms sleep after its last try; the error is the one s3fs
raises (translated, its cause the client's error); other s3fs clients keep s3fs's loop. A
throttled bucket probe is retried, never read as "no bucket".

The sleeps are counted, not timed: s3fs's loop sleeps ``min(1.7 ** i * 0.1, 15)`` seconds
through ``asyncio.sleep``, which the tests record.
"""

from __future__ import annotations

import asyncio
import pickle

import fsspec
import pytest
from botocore.exceptions import ClientError

import retryfs
from retryfs.clients import OneTry
from retryfs.patches import registry, s3fs_one_try
from retryfs.testing import S3Fault


@pytest.fixture
def sleeps(monkeypatch):
    """Every asyncio.sleep of 0.1 s (s3fs's first wait) in this test."""
    seen: list[float] = []
    real = asyncio.sleep

    async def recorded(delay, *args, **kwargs):
        if delay == pytest.approx(0.1):
            seen.append(delay)
        return await real(delay, *args, **kwargs)

    monkeypatch.setattr(asyncio, "sleep", recorded)
    return seen


def _url_face(endpoint):
    options = {"key": "testing", "secret": "testing", "endpoint_url": endpoint.url,
               "client_kwargs": {"region_name": endpoint.region}}
    fs, _ = fsspec.core.url_to_fs("retry::s3://bkt/k", s3=options,
                                  retry={"jitter": False, "initial_delay": 0.001,
                                         "budget": False})
    return fs


def test_a_retry_url_s3fs_client_fails_a_request_without_s3fs_s_sleep(
        s3_fault_endpoint, s3_fault_bucket, sleeps):
    s3_fault_endpoint.put_object(s3_fault_bucket, "k", b"value")
    fs = _url_face(s3_fault_endpoint)
    assert isinstance(fs.fs.retries, OneTry) and fs.fs.retries == 1
    errors: list[BaseException] = []
    fs.stats.on_retry(lambda event: errors.append(event.error))
    fault = s3_fault_endpoint.add_fault(S3Fault.slow_down(op="GetObject", times=2))
    assert fs.cat_file(f"retry::s3://{s3_fault_bucket}/k") == b"value"
    assert s3_fault_endpoint.fired(fault) == 2
    assert len(s3_fault_endpoint.requests("GetObject")) == 3  # each failed GET sent again once
    assert sleeps == []  # without the patch: one 0.1 s sleep per failed GetObject
    assert len(errors) == 2
    # the error s3fs raises: translated (a SlowDown is EBUSY), its cause botocore's error
    for error in errors:
        assert isinstance(error, OSError) and "reduce your request rate" in str(error)
        assert isinstance(error.__cause__, ClientError)
        assert error.__cause__.response["Error"]["Code"] == "SlowDown"
        assert error.__context__ is None or error.__context__ is error.__cause__


def test_an_s3fs_client_retryfs_did_not_configure_keeps_s3fs_s_loop(
        s3_fault_endpoint, s3_fault_bucket, sleeps):
    s3_fault_endpoint.put_object(s3_fault_bucket, "k", b"value")
    _url_face(s3_fault_endpoint)  # the patch is installed in this process
    import s3fs.core

    assert s3fs.core._error_wrapper.__wrapped__ is not None
    plain = s3_fault_endpoint.s3fs()  # botocore's one attempt, and
    plain.retries = 2  # s3fs's own loop of two (a plain int)
    fault = s3_fault_endpoint.add_fault(S3Fault.slow_down(op="GetObject", times=1))
    assert plain.cat_file(f"{s3_fault_bucket}/k") == b"value"
    assert s3_fault_endpoint.fired(fault) == 1
    assert len(s3_fault_endpoint.requests("GetObject")) == 2
    assert sleeps == [0.1]  # s3fs's own retry, after its own sleep


def test_a_permanent_error_is_translated_as_s3fs_translates_it(s3_fault_endpoint,
                                                                s3_fault_bucket):
    fs = _url_face(s3_fault_endpoint)
    with pytest.raises(FileNotFoundError):
        fs.cat_file(f"retry::s3://{s3_fault_bucket}/absent")
    denied = s3_fault_endpoint.add_fault(
        S3Fault.error(403, "AccessDenied", "denied", op="GetObject"))
    s3_fault_endpoint.put_object(s3_fault_bucket, "k", b"value")
    s3_fault_endpoint.reset_record()
    with pytest.raises(PermissionError):
        fs.cat_file(f"retry::s3://{s3_fault_bucket}/k")
    # permanent: sent once, never again
    assert s3_fault_endpoint.fired(denied) == len(s3_fault_endpoint.requests("GetObject")) == 1


def test_one_try_pickles_as_itself_and_the_patch_can_be_turned_off(monkeypatch):
    marked = pickle.loads(pickle.dumps(OneTry()))
    assert isinstance(marked, OneTry) and marked == 1 and list(range(marked)) == [0]
    monkeypatch.setenv(retryfs.patches.ENV, "s3fs_one_try")
    monkeypatch.setattr(s3fs_one_try, "_installed", False)
    monkeypatch.setattr(registry, "_installed", set())
    assert s3fs_one_try.install() is False
    assert retryfs.patches.status()["s3fs_one_try"] == "off"


def test_makedirs_in_a_bucket_whose_probes_are_throttled_never_creates_the_bucket(
        s3_fault_endpoint, s3_fault_bucket):
    """s3fs's makedirs probes the bucket (HeadBucket, then GetBucketLocation) and, both
    failing, creates it: a throttle on each was read as "no bucket" and the save failed with
    a CreateBucket error that is not retried."""
    fs = _url_face(s3_fault_endpoint)
    retries = fs.stats.snapshot()["retries"]  # (the face is fsspec's cached instance)
    throttles = [s3_fault_endpoint.add_fault(S3Fault.slow_down(op=op, times=1))
                 for op in ("HeadBucket", "GetBucketLocation", "HeadBucket")]
    fs.makedirs(f"retry::s3://{s3_fault_bucket}/ckpt/step-1", exist_ok=True)
    assert [s3_fault_endpoint.fired(f) for f in throttles] == [1, 1, 1]
    counts = s3_fault_endpoint.counts()
    assert counts["CreateBucket"] == 0
    # the two probes, the one that confirms (throttled), then the retry's probe
    assert (counts["HeadBucket"], counts["GetBucketLocation"]) == (3, 1)
    assert fs.stats.snapshot()["retries"] == retries + 1


def test_a_bucket_that_is_not_there_is_still_absent_and_one_that_is_there_present(
        s3_fault_endpoint, s3_fault_bucket):
    """s3fs's own ``_exists`` (what its ``_mkdir`` asks), patched: absent when the confirming
    probe finds nothing, present when only s3fs's probes failed."""
    from fsspec.asyn import sync

    inner = _url_face(s3_fault_endpoint).fs
    assert sync(inner.loop, inner._exists, "no-such-bucket-here") is False
    inner.invalidate_cache()
    s3_fault_endpoint.reset_record()
    faults = [s3_fault_endpoint.add_fault(S3Fault.slow_down(op=op, times=1))
              for op in ("HeadBucket", "GetBucketLocation")]
    assert sync(inner.loop, inner._exists, s3_fault_bucket) is True
    assert [s3_fault_endpoint.fired(f) for f in faults] == [1, 1]
    counts = s3_fault_endpoint.counts()  # s3fs's two probes, then the confirming HeadBucket
    assert (counts["HeadBucket"], counts["GetBucketLocation"]) == (2, 1)

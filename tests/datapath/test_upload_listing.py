"""A tree copy onto S3 proves its commits with two listings, not one HEAD per file.

``pyarrow.fs.copy_files`` of a directory onto a `RetryingFileSystem` (`retryfs.datapath.upload`)
checks that every file landed with its size, as a new object, by one recursive listing of the
destination before the copy and one after (`retryfs.datapath.verify`: a file absent before, or
listed otherwise after, is new), retried metadata calls (``verify``), instead of a HeadObject
each.
Counted on the real moto server behind `S3FaultEndpoint`: what a 100-file upload sends, what
a failed or refused listing costs, and that a file found missing or short is copied again and
a listing that gives up is never a silent success.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from _helpers import FAST

from retryfs import RetryingFileSystem
from retryfs.testing.s3 import S3Fault, S3FaultEndpoint

FILES = 100
UPLOADS = ("PutObject", "CompleteMultipartUpload")  # one commit each, whatever the client


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, str]:
    """100 small files (1-4 KiB) under ``tmp_path/ckpt``: ``{name: sha256}``."""
    rng = random.Random(13)
    root = tmp_path / "ckpt"
    root.mkdir()
    digests = {}
    for i in range(FILES):
        data = rng.randbytes(rng.randrange(1024, 4096))
        (root / f"f{i:03}.bin").write_bytes(data)
        digests[f"f{i:03}.bin"] = hashlib.sha256(data).hexdigest()
    return digests


def upload(fs: RetryingFileSystem, tmp_path: Path, bucket: str, threads: bool) -> None:
    pafs.copy_files(str(tmp_path / "ckpt"), f"{bucket}/up", destination_filesystem=fs,
                    use_threads=threads)


def stored(ep: S3FaultEndpoint, bucket: str) -> dict[str, str]:
    return {key[len("up/"):]: hashlib.sha256(ep.get_object(bucket, key)).hexdigest()
            for key in ep.keys(bucket, "up/")}


def commits(ep: S3FaultEndpoint, bucket: str) -> dict[str, int]:
    """Commits per file name (a PutObject or a CompleteMultipartUpload each)."""
    counted: dict[str, int] = {}
    for request in ep.requests(UPLOADS):
        name = request.path[len(f"{bucket}/up/"):]
        counted[name] = counted.get(name, 0) + 1
    return counted


@pytest.fixture
def s3(s3_fault_endpoint: S3FaultEndpoint,
       s3_fault_bucket: str) -> tuple[S3FaultEndpoint, RetryingFileSystem, str]:
    fs = RetryingFileSystem(s3_fault_endpoint.pyarrow_fs(), FAST, budget=False)
    return s3_fault_endpoint, fs, s3_fault_bucket


@pytest.mark.parametrize("threads", [False, True], ids=["serial", "threaded"])
def test_a_tree_upload_is_verified_by_one_listing(s3, tree, tmp_path, threads) -> None:
    ep, fs, bucket = s3
    upload(fs, tmp_path, bucket, threads)
    counts = ep.counts()
    assert counts.get("HeadObject", 0) == 0, counts  # was 100: one per file
    assert counts["ListObjectsV2"] == 2, counts  # before the copy, and after
    assert [r.path for r in ep.requests("ListObjectsV2")] == [bucket, bucket]
    assert stored(ep, bucket) == tree
    assert commits(ep, bucket) == {name: 1 for name in tree}
    by_operation = fs.stats.snapshot()["by_operation"]
    assert by_operation["verify"]["calls"] == 2 and by_operation["verify"]["retries"] == 0
    assert by_operation["copy_files"]["calls"] == FILES
    assert by_operation["copy_files"]["retries"] == 0
    assert fs.failed_commits() == {}


def test_a_failed_listing_is_retried_and_sends_nothing_again(s3, tree, tmp_path) -> None:
    ep, fs, bucket = s3
    throttled = ep.add_fault(S3Fault.slow_down(op="ListObjectsV2", times=1))
    upload(fs, tmp_path, bucket, threads=True)
    assert ep.fired(throttled) == 1
    counts = ep.counts()
    assert counts["ListObjectsV2"] == 3 and counts.get("HeadObject", 0) == 0, counts
    assert commits(ep, bucket) == {name: 1 for name in tree}  # no file copied again
    assert stored(ep, bucket) == tree
    verify = fs.stats.snapshot()["by_operation"]["verify"]
    assert verify["calls"] == 2 and verify["retries"] == 1, verify


@pytest.mark.parametrize("threads", [False, True], ids=["serial", "threaded"])
def test_a_file_the_listing_shows_missing_or_short_is_copied_again(s3, tree, tmp_path,
                                                                   threads) -> None:
    ep, fs, bucket = s3
    lost, short = "f007.bin", "f042.bin"
    done: list[str] = []

    listings: list[str] = []

    def behind_the_copys_back(request) -> bool:  # just before the listing after the copy
        listings.append(request.path)
        if len(listings) == 2 and not done:
            done.append(request.path)
            ep._backend.delete_object(bucket, f"up/{lost}")
            ep.put_object(bucket, f"up/{short}", b"truncated")
        return False  # the rule itself never fires: this is a hook

    ep.add_fault(S3Fault.internal_error(op="ListObjectsV2", when=behind_the_copys_back))
    upload(fs, tmp_path, bucket, threads)
    assert done == [bucket]
    assert stored(ep, bucket) == tree  # both copied again, from their source
    assert commits(ep, bucket) == {name: 2 if name in (lost, short) else 1 for name in tree}
    # the two copies again are checked by their own HEAD; the listing ran once
    assert sorted(r.path for r in ep.requests("HeadObject")) == [
        f"{bucket}/up/{lost}", f"{bucket}/up/{short}"]
    assert ep.counts()["ListObjectsV2"] == 2
    copy_files = fs.stats.snapshot()["by_operation"]["copy_files"]
    # as a file its own check found missing: one call, one retry
    assert copy_files["calls"] == FILES and copy_files["retries"] == 2, copy_files
    assert copy_files["attempts"] == FILES + 2, copy_files
    assert fs.failed_commits() == {}


@pytest.mark.parametrize("threads", [False, True], ids=["serial", "threaded"])
def test_a_listing_that_gives_up_fails_every_file_it_was_to_prove(s3, tree, tmp_path,
                                                                  threads) -> None:
    ep, fs, bucket = s3
    down = ep.add_fault(S3Fault.internal_error(op="ListObjectsV2"))
    with pytest.raises(OSError, match="INTERNAL_FAILURE during ListObjectsV2") as caught:
        upload(fs, tmp_path, bucket, threads)
    assert ep.fired(down) == 2 * FAST.max_attempts  # the listing before, then the one after
    assert type(caught.value) is OSError  # pyarrow's own error, not one of retryfs's
    notes = "\n".join(getattr(caught.value, "__notes__", []))
    assert all(f"{bucket}/up/{name}" in notes for name in tree), notes
    assert "100 object(s) were not committed" in notes
    failed = fs.failed_commits()
    assert sorted(failed) == sorted(f"{bucket}/up/{name}" for name in tree)
    assert all(error is caught.value for error in failed.values())
    assert ep.counts().get("HeadObject", 0) == 0
    assert commits(ep, bucket) == {name: 1 for name in tree}  # nothing copied again
    verify = fs.stats.snapshot()["by_operation"]["verify"]
    assert verify["calls"] == 2 and verify["giveups"] == 2, verify


@pytest.mark.parametrize("threads", [False, True], ids=["serial", "threaded"])
def test_a_refused_listing_falls_back_to_a_head_per_file(s3, tree, tmp_path, threads) -> None:
    """Put/get-only credentials (no s3:ListBucket): the listing's 403 is not a failure of the
    copy; each file is checked by its own HEAD, as before."""
    ep, fs, bucket = s3
    denied = ep.add_fault(S3Fault.access_denied(op="ListObjectsV2"))
    upload(fs, tmp_path, bucket, threads)
    assert ep.fired(denied) == 2  # permanent: one attempt, before the copy and after
    assert sorted(r.path for r in ep.requests("HeadObject")) == sorted(
        f"{bucket}/up/{name}" for name in tree)
    assert stored(ep, bucket) == tree
    assert commits(ep, bucket) == {name: 1 for name in tree}
    assert fs.failed_commits() == {}
    verify = fs.stats.snapshot()["by_operation"]["verify"]
    assert verify["calls"] == 2 + FILES, verify


def test_a_single_file_copy_keeps_its_head(s3, tree, tmp_path) -> None:
    ep, fs, bucket = s3
    pafs.copy_files(str(tmp_path / "ckpt" / "f000.bin"), f"{bucket}/one.bin",
                    destination_filesystem=fs)
    assert ep.counts()["HeadObject"] == 1 and "ListObjectsV2" not in ep.counts()


def test_no_check_at_all_without_verify_writes(s3_fault_endpoint, s3_fault_bucket, tree,
                                               tmp_path) -> None:
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    fs = RetryingFileSystem(ep.pyarrow_fs(), FAST, budget=False, verify_writes=False)
    upload(fs, tmp_path, bucket, threads=True)
    counts = ep.counts()
    assert "HeadObject" not in counts and "ListObjectsV2" not in counts, counts
    assert stored(ep, bucket) == tree


@pytest.mark.parametrize("threads", [False, True], ids=["serial", "threaded"])
def test_a_stalled_file_is_retried_and_checked_by_its_head(s3_fault_endpoint, s3_fault_bucket,
                                                           tree, tmp_path, threads) -> None:
    """The write timeout (the watchdog of a threaded copy) still turns a stalled upload into
    a retry; that file, retried, is checked by its own HEAD, the others by the listing."""
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    fs = RetryingFileSystem(ep.pyarrow_fs(), FAST, budget=False, write_timeout=1.0,
                            min_throughput=1 << 30)
    stalled = f"{bucket}/up/f013.bin"
    stall = ep.add_fault(S3Fault.stall(10.0, op=UPLOADS, path=stalled, times=1))
    # a stalled commit may still land: the copy reports success once it has ended; the stall
    # ends (a reset) when the retry begins, as a server's would some time later
    fs.stats.on_retry(lambda event: ep.release_stalls())
    try:
        upload(fs, tmp_path, bucket, threads)
    finally:
        ep.release_stalls()
    assert ep.fired(stall) == 1
    assert [r.path for r in ep.requests("HeadObject")] == [stalled]
    assert ep.counts()["ListObjectsV2"] == 2
    assert stored(ep, bucket) == tree
    copy_files = fs.stats.snapshot()["by_operation"]["copy_files"]
    assert copy_files["calls"] == FILES and copy_files["retries"] == 1, copy_files
    assert copy_files["timeouts"] == 1, copy_files
    assert fs.failed_commits() == {}

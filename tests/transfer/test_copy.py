"""retryfs.copy against the S3 fault endpoint: real transfers, real faults, no sleeps.

The S3 filesystems here have pyarrow's own retries off (``max_attempts=1``), so every injected
fault reaches retryfs and the attempt counts are exact.
"""

import hashlib
import os

import fsspec
import pyarrow.fs as pafs
import pytest
from _helpers import FAST, sha256

import retryfs
from retryfs import RetryingFileSystem
from retryfs.testing import FaultyFileSystem, errors
from retryfs.testing.s3 import S3Fault
from retryfs.transfer.copier import (
    CopyError,
    CopyProgress,
    CopyResult,
    VerificationError,
    _etag_matches,
    copy,
)

MiB = 1024 * 1024
UPLOADS = ("PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload")


def make_tree(root, sizes):
    digests = {}
    for rel, size in sizes.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(size)
        path.write_bytes(data)
        digests[rel] = hashlib.sha256(data).hexdigest()
    return digests


TREE = {"model.pt": 3 * MiB + 17, "optimizer.pt": 2 * MiB, "shards/a.bin": 1000,
        "shards/b.bin": 0, "meta.json": 42}


@pytest.fixture
def tree(tmp_path):
    src = tmp_path / "ckpt"
    return src, make_tree(src, TREE)


@pytest.fixture
def s3(s3_fault_endpoint, s3_fault_bucket):
    """(endpoint, a retrying S3 filesystem with pyarrow's retries off, bucket)."""
    fs = RetryingFileSystem(s3_fault_endpoint.pyarrow_fs(max_attempts=1), FAST)
    return s3_fault_endpoint, fs, s3_fault_bucket


def stored(ep, bucket, prefix, digests):
    return {rel: hashlib.sha256(ep.get_object(bucket, f"{prefix}/{rel}")).hexdigest()
            for rel in digests} == digests


def uploads(ep):
    return [r for r in ep.requests() if r.op in UPLOADS]


def test_copy_is_exported():
    assert retryfs.copy is copy


def test_upload_through_faults_lands_every_file(tree, s3):
    src, digests = tree
    ep, fs, bucket = s3
    ep.add_fault(S3Fault.error_in_200(path=f"{bucket}/up/model.pt", times=2))  # commit fails
    ep.add_fault(S3Fault.reset(op="UploadPart", path=f"{bucket}/up/optimizer.pt", times=1))
    ep.add_fault(S3Fault.slow_down(op="CreateMultipartUpload", path=f"{bucket}/up/meta.json",
                                   times=2))
    result = copy(str(src), (fs, f"{bucket}/up"), recursive=True, workers=3)
    assert isinstance(result, CopyResult) and result.ok
    assert len(result.copied) == len(TREE) and not result.skipped
    assert result.bytes_copied == sum(TREE.values())
    attempts = {f.path: f.attempts for f in result.files}
    assert attempts == {"model.pt": 3, "optimizer.pt": 2, "meta.json": 3, "shards/a.bin": 1,
                        "shards/b.bin": 1}
    assert result.retries == 5 == len(ep.injected)
    assert fs.stats.snapshot()["by_operation"]["copy"]["retries"] == 5
    assert stored(ep, bucket, "up", digests)
    assert sorted(ep.keys(bucket)) == sorted(f"up/{rel}" for rel in TREE)  # no markers


def test_a_second_run_sends_nothing(tree, s3):
    src, digests = tree
    ep, fs, bucket = s3
    copy(str(src), (fs, f"{bucket}/up"), recursive=True)
    ep.reset_record()
    again = copy(str(src), (fs, f"{bucket}/up"), recursive=True)
    assert not again.copied and len(again.skipped) == len(TREE)
    assert {f.reason for f in again.skipped} == {"same size and ETag"}
    assert uploads(ep) == []  # no PutObject, no multipart upload: nothing was sent


def test_resume_recopies_a_same_size_object_with_other_bytes(tree, s3):
    src, digests = tree
    ep, fs, bucket = s3
    copy(str(src), (fs, f"{bucket}/up"), recursive=True)
    ep.put_object(bucket, "up/meta.json", b"x" * TREE["meta.json"])  # same size, other bytes
    ep.reset_record()
    again = copy(str(src), (fs, f"{bucket}/up"), recursive=True)
    assert [f.path for f in again.copied] == ["meta.json"]
    assert again.copied[0].reason == "content differs (ETag)"
    assert stored(ep, bucket, "up", digests)


def test_multipart_etags_compare_with_local_files(tmp_path, s3):
    ep, fs, bucket = s3
    data = os.urandom(21 * MiB + 5)  # three 10 MiB parts with retryfs.copy
    (tmp_path / "big.bin").write_bytes(data)
    local = RetryingFileSystem(pafs.LocalFileSystem(), FAST)
    copy(str(tmp_path / "big.bin"), (fs, f"{bucket}/big.bin"))
    with ep.pyarrow_fs().open_input_stream(f"{bucket}/big.bin") as f:
        etag = f.metadata()["ETag"].decode().strip('"')
    assert etag.endswith("-3")
    assert _etag_matches(etag, local, str(tmp_path / "big.bin"), len(data)) is True
    # 5 MiB parts (5 of them): computed the same way, and a different file does not match
    parts = [hashlib.md5(data[i:i + 5 * MiB]).digest() for i in range(0, len(data), 5 * MiB)]
    five = f"{hashlib.md5(b''.join(parts)).hexdigest()}-{len(parts)}"
    assert _etag_matches(five, local, str(tmp_path / "big.bin"), len(data)) is True
    (tmp_path / "other.bin").write_bytes(os.urandom(len(data)))
    assert _etag_matches(etag, local, str(tmp_path / "other.bin"), len(data)) is False
    assert _etag_matches(f"{etag[:32]}-777", local, str(tmp_path / "big.bin"),
                         len(data)) is None  # no common part size gives 777 parts
    assert _etag_matches("not-an-md5", local, str(tmp_path / "big.bin"), len(data)) is None


def test_a_commit_that_does_not_land_is_retried(tree, s3):
    """The commit answers OK but the store holds something else: the size check sees it."""
    src, digests = tree
    ep, fs, bucket = s3
    shortened = []

    def lose_it(request):  # behind the tool's back, just before its check reads the object
        if not shortened:
            shortened.append(request.path)
            ep.put_object(bucket, "up/model.pt", b"truncated")
        return False  # the rule itself never fires: this is a hook

    ep.add_fault(S3Fault.internal_error(op="HeadObject", path=f"{bucket}/up/model.pt",
                                        when=lose_it))
    result = copy(str(src), (fs, f"{bucket}/up"), recursive=True)
    model = next(f for f in result.files if f.path == "model.pt")
    assert model.status == "copied" and model.attempts == 2
    assert result.retries == 1
    assert stored(ep, bucket, "up", digests)


def test_verify_hash_catches_corruption_and_reports_the_file(tree, s3):
    src, digests = tree
    ep, fs, bucket = s3

    def corrupt(request):  # every time the check re-reads it, the object has changed
        ep.put_object(bucket, "up/optimizer.pt", b"\0" * TREE["optimizer.pt"])
        return False

    ep.add_fault(S3Fault.internal_error(op="GetObject", path=f"{bucket}/up/optimizer.pt",
                                        when=corrupt))
    with pytest.raises(CopyError) as caught:
        copy(str(src), (fs, f"{bucket}/up"), recursive=True, verify="hash")
    result = caught.value.result
    assert [f.path for f in result.failed] == ["optimizer.pt"]
    failed = result.failed[0]
    assert isinstance(failed.error, VerificationError) and "SHA-256" in failed.reason
    assert failed.attempts == FAST.max_attempts
    assert "optimizer.pt" in str(caught.value) and "1 of 5 file(s) failed" in str(caught.value)
    assert len(result.copied) == len(TREE) - 1  # the others landed and are reported so


def test_a_permanent_error_fails_at_once_and_names_the_files(tree, s3):
    src, _ = tree
    ep, fs, bucket = s3
    ep.add_fault(S3Fault.access_denied(op="CreateMultipartUpload", path=f"{bucket}/up/shards/*"))
    with pytest.raises(CopyError) as caught:
        copy(str(src), (fs, f"{bucket}/up"), recursive=True)
    result = caught.value.result
    assert sorted(f.path for f in result.failed) == ["shards/a.bin", "shards/b.bin"]
    assert all(f.attempts == 1 and "ACCESS_DENIED" in f.reason for f in result.failed)
    assert isinstance(caught.value, OSError)
    assert len(result.copied) == 3 and not result.ok


def test_download_resumes_failed_reads(tree, s3, tmp_path):
    src, digests = tree
    ep, fs, bucket = s3
    copy(str(src), (fs, f"{bucket}/up"), recursive=True)
    ep.add_fault(S3Fault.reset(op="GetObject", path=f"{bucket}/up/model.pt", times=1))
    ep.add_fault(S3Fault.internal_error(op="ListObjectsV2", times=1))
    down = tmp_path / "down"
    result = copy((fs, f"{bucket}/up"), str(down), recursive=True, verify="hash")
    assert result.ok and len(result.copied) == len(TREE) and result.retries == 2
    assert all(f.attempts == 1 for f in result.files)  # reads resumed, no file restarted
    assert {rel: hashlib.sha256((down / rel).read_bytes()).hexdigest()
            for rel in TREE} == digests
    assert not [p for p in down.rglob("*") if ".retryfs-" in p.name]  # no temporary files
    again = copy((fs, f"{bucket}/up"), str(down), recursive=True)
    assert {f.reason for f in again.skipped} == {"same size and ETag"}


def test_remote_to_remote(tree, s3):
    src, digests = tree
    ep, fs, bucket = s3
    copy(str(src), (fs, f"{bucket}/a"), recursive=True)
    ep.add_fault(S3Fault.internal_error(op="UploadPart", path=f"{bucket}/b/*", times=2))
    result = copy((fs, f"{bucket}/a"), (fs, f"{bucket}/b"), recursive=True)
    assert result.ok and result.retries == 2
    assert stored(ep, bucket, "b", digests)
    ep.reset_record()
    again = copy((fs, f"{bucket}/a"), (fs, f"{bucket}/b"), recursive=True)
    assert len(again.skipped) == len(TREE) and uploads(ep) == []


def test_a_failing_source_leaves_no_partial_object(tmp_path, s3):
    ep, fs, bucket = s3
    (tmp_path / "big.bin").write_bytes(os.urandom(25 * MiB))  # three 10 MiB reads
    faulty = FaultyFileSystem(pafs.LocalFileSystem())
    faulty.inject("read", errors.network("GetObject"), skip=1, times=None)  # the 2nd read on
    with pytest.raises(CopyError) as caught:
        copy((faulty, str(tmp_path / "big.bin")), (fs, f"{bucket}/big.bin"), policy=FAST)
    failed = caught.value.result.failed[0]
    assert failed.attempts == 1  # the source's reads were retried where they failed, not here
    assert "NETWORK_CONNECTION" in failed.reason
    assert ep.keys(bucket) == []  # the partial upload did not stay
    # nor was it ever committed (and deleted after): the stream was dropped unclosed
    assert ep.requests(op=("PutObject", "CompleteMultipartUpload", "DeleteObject")) == []


def test_local_destination_never_shows_a_partial_file(tmp_path):
    """A real local destination (the write-beside-then-rename path): a source that fails after
    its first 10 MiB leaves nothing at the destination, neither the partial file nor the one
    written beside it; a copy that succeeds leaves the file alone."""
    (tmp_path / "big.bin").write_bytes(os.urandom(25 * MiB))  # three 10 MiB reads
    source = FaultyFileSystem(pafs.LocalFileSystem())
    source.inject("read", errors.access_denied("GetObject"), skip=1, times=None)
    (tmp_path / "out").mkdir()
    with pytest.raises(CopyError):
        copy((source, str(tmp_path / "big.bin")), str(tmp_path / "out" / "big.bin"), policy=FAST)
    assert source.injected["read"] == 1  # the second read failed, after 10 MiB went out
    assert os.listdir(tmp_path / "out") == []

    result = copy(str(tmp_path / "big.bin"), str(tmp_path / "out" / "big.bin"), policy=FAST)
    assert result.files[0].status == "copied"
    assert sha256((tmp_path / "out" / "big.bin").read_bytes()) == sha256(
        (tmp_path / "big.bin").read_bytes())
    assert os.listdir(tmp_path / "out") == ["big.bin"]


def test_fsspec_filesystems_both_ways(tree, tmp_path):
    src, digests = tree
    memory = fsspec.filesystem("memory")
    result = copy(str(src), (memory, "/copy-test/ckpt"), recursive=True, policy=FAST)
    assert result.ok and memory.cat_file("/copy-test/ckpt/shards/a.bin") == (
        src / "shards/a.bin").read_bytes()
    back = copy((memory, "/copy-test/ckpt"), str(tmp_path / "back"), recursive=True,
                verify=True)
    assert back.ok and back.verify == "hash"
    assert hashlib.sha256((tmp_path / "back/model.pt").read_bytes()).hexdigest() == digests[
        "model.pt"]
    again = copy(str(src), (memory, "/copy-test/ckpt"), recursive=True)
    assert {f.reason for f in again.skipped} == {"same size"}  # no checksum to compare here
    memory.rm("/copy-test", recursive=True)


def test_the_retry_protocol_is_not_wrapped_twice(tree):
    src, _ = tree
    memory = fsspec.filesystem("memory")
    retrying = fsspec.filesystem("retry", fs=memory, max_attempts=3, skip_instance_cache=True)
    result = copy(str(src), (retrying, "/retry-test/ckpt"), recursive=True)
    assert result.ok and result.destination == "memory:/retry-test/ckpt"
    # one layer: the unit of each file ran on the retry filesystem's own stats and policy
    assert retrying.stats.snapshot()["by_operation"]["copy"]["calls"] == len(TREE)
    assert memory.cat_file("/retry-test/ckpt/meta.json") == (src / "meta.json").read_bytes()
    memory.rm("/retry-test", recursive=True)


def test_single_file_destinations(tree, s3):
    src, _ = tree
    ep, fs, bucket = s3
    copy(str(src / "meta.json"), (fs, f"{bucket}/one/renamed.json"))
    copy(str(src / "meta.json"), (fs, f"{bucket}/into/"))
    assert ep.keys(bucket) == ["into/meta.json", "one/renamed.json"]
    copy(str(src / "model.pt"), (fs, f"{bucket}/into"))  # an existing "directory"
    assert "into/model.pt" in ep.keys(bucket)


def test_usage_errors(tree, tmp_path):
    src, _ = tree
    with pytest.raises(FileNotFoundError, match="source not found"):
        copy(str(tmp_path / "nothing"), str(tmp_path / "out"))
    with pytest.raises(IsADirectoryError, match="recursive"):
        copy(str(src), str(tmp_path / "out"))
    with pytest.raises(ValueError, match="retry_bogus"):
        copy(f"{src.as_uri()}?retry_bogus=1", str(tmp_path / "out"), recursive=True)
    with pytest.raises(ValueError, match="verify"):
        copy(str(src), str(tmp_path / "out"), verify="md5")
    with pytest.raises(ValueError, match="workers"):
        copy(str(src), str(tmp_path / "out"), workers=0)
    with pytest.raises(TypeError, match="URI"):
        copy(42, str(tmp_path / "out"))


def test_dry_run_writes_nothing(tree, s3):
    src, _ = tree
    ep, fs, bucket = s3
    copy(str(src / "meta.json"), (fs, f"{bucket}/up/meta.json"))
    ep.reset_record()
    result = copy(str(src), (fs, f"{bucket}/up"), recursive=True, dry_run=True)
    assert len(result.planned) == len(TREE) - 1 and [f.path for f in result.skipped] == [
        "meta.json"]
    assert uploads(ep) == [] and ep.keys(bucket) == ["up/meta.json"]
    assert result.summary().startswith("dry run: would copy 4 file(s)")


def test_progress_reports_bytes_files_and_retries(tree, s3):
    src, _ = tree
    ep, fs, bucket = s3
    ep.add_fault(S3Fault.reset(op="UploadPart", path=f"{bucket}/up/model.pt", times=1))
    seen: list[CopyProgress] = []
    copy(str(src), (fs, f"{bucket}/up"), recursive=True, workers=1, progress=seen.append)
    last = seen[-1]
    assert (last.files_done, last.files_total) == (len(TREE), len(TREE))
    assert last.bytes_done == last.bytes_total == sum(TREE.values())
    assert last.retries == 1 and last.copied == len(TREE)
    done = [p.file.path for p in seen if p.file is not None]
    assert sorted(done) == sorted(TREE)
    # the restarted upload of model.pt gave its bytes back before sending them again
    assert any(b.bytes_done < a.bytes_done for a, b in zip(seen, seen[1:], strict=False))


def test_result_to_dict_is_plain_data(tree, tmp_path):
    import json

    src, _ = tree
    result = copy(str(src), str(tmp_path / "out"), recursive=True)
    data = json.loads(json.dumps(result.to_dict()))
    assert data["ok"] and data["files"]["copied"] == len(TREE)
    assert {item["path"] for item in data["items"]} == set(TREE)

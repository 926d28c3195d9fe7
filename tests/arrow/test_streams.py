"""Writes replay, reads resume, and a commit that never succeeds is never silent."""

import os
import tempfile
import threading

import pyarrow.fs as pafs
import pytest
from _helpers import FAST, open_files_under, sha256

from retryfs import RetryingFileSystem
from retryfs.datapath.streams import GATHERED
from retryfs.testing import FaultyFileSystem, errors

MiB = 1024 * 1024


@pytest.fixture
def faulty(tmp_path):
    return FaultyFileSystem(pafs.LocalFileSystem())


def _write(fs, path, chunks):
    with fs.open_output_stream(path) as out:
        for chunk in chunks:
            out.write(chunk)


# pyarrow.PythonFile never forwards flush() to the Python file: on this face only write and close
# reach the inner stream (the fsspec face retries flush too).
@pytest.mark.parametrize("operation", ["write", "close"])
@pytest.mark.parametrize("spool_memory", [0, MiB, 64 * MiB])  # spilled / spilled past 1 MiB / in memory
def test_output_survives_faults_byte_identical(faulty, tmp_path, operation, spool_memory,
                                               monkeypatch):
    spool_dir = tmp_path / "spool"
    spool_dir.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(spool_dir))
    fs = RetryingFileSystem(faulty, FAST, spool_memory=spool_memory)
    chunks = [os.urandom(MiB + i) for i in range(5)]
    faulty.inject(operation, errors.network(), skip=2 if operation == "write" else 0, times=2)
    path = str(tmp_path / "model.pt")
    with fs.open_output_stream(path) as out:
        for chunk in chunks:
            out.write(chunk)
            out.flush()
        # the spool spilled to a temporary file, or stayed in memory below its bound
        assert len(open_files_under(spool_dir)) == (1 if spool_memory < 5 * MiB else 0)
    assert open_files_under(spool_dir) == []  # and the spill file went with the stream
    assert os.listdir(spool_dir) == []
    assert faulty.injected[operation] == 2
    with open(path, "rb") as f:
        assert sha256(f.read()) == sha256(b"".join(chunks))
    snap = fs.stats.snapshot()
    assert snap["by_operation"][operation]["retries"] == 2
    assert snap["bytes_replayed"] > 0


def test_a_commit_that_lands_nothing_is_caught_and_redone(faulty, tmp_path):
    fs = RetryingFileSystem(faulty, FAST)
    faulty.inject("close", errors.network(), silent=True, times=1)  # 200 OK, object lost
    path = str(tmp_path / "x.bin")
    data = os.urandom(3000)
    _write(fs, path, [data])
    with open(path, "rb") as f:
        assert f.read() == data
    assert fs.stats.snapshot()["by_operation"]["close"]["retries"] == 1


def test_without_verification_a_lost_commit_goes_unnoticed(faulty, tmp_path):
    fs = RetryingFileSystem(faulty, FAST, verify_writes=False)
    faulty.inject("close", errors.network(), silent=True, times=1)
    path = str(tmp_path / "x.bin")
    _write(fs, path, [b"data"])
    assert not os.path.exists(path)  # this is what verify_writes=True protects against


def test_write_that_gives_up_commits_nothing(faulty, tmp_path):
    fs = RetryingFileSystem(faulty, FAST)
    faulty.inject("write", errors.network(), skip=1, times=None)
    path = str(tmp_path / "partial.bin")
    with pytest.raises(OSError, match="NETWORK_CONNECTION"):
        _write(fs, path, [b"a" * GATHERED, b"b" * GATHERED, b"c" * GATHERED])
    assert not os.path.exists(path)


def test_close_that_gives_up_raises_and_leaves_nothing(faulty, tmp_path):
    fs = RetryingFileSystem(faulty, FAST)
    faulty.inject("close", errors.commit_failed(), times=None)
    path = str(tmp_path / "never.bin")
    with pytest.raises(OSError, match="CompleteMultipartUpload") as info:
        _write(fs, path, [b"data"])
    assert type(info.value) is OSError
    assert faulty.calls["close"] == FAST.max_attempts
    assert not os.path.exists(path)
    assert path in fs.failed_commits()


def _make_tree(root, files=40, big=3 * MiB):
    digests = {}
    for i in range(files):
        rel = f"shard_{i % 4}/part-{i:03d}.bin"
        data = os.urandom(big if i == 0 else 1000 + i * 37)
        os.makedirs(os.path.join(root, os.path.dirname(rel)), exist_ok=True)
        with open(os.path.join(root, rel), "wb") as f:
            f.write(data)
        digests[rel] = sha256(data)
    return digests


@pytest.mark.parametrize("use_threads", [True, False])
def test_copy_files_of_a_directory_survives_faults(faulty, tmp_path, use_threads):
    src, dst = tmp_path / "src", tmp_path / "dst"
    digests = _make_tree(str(src))
    # one file is one unit of retry on copy_files' direct path (open, writes, close, re-read
    # from the source), so the faults below may all land on one file: 9 failures in a row
    fs = RetryingFileSystem(faulty, FAST.replace(max_attempts=10))
    faulty.inject("write", errors.network(), skip=3, times=4)
    faulty.inject("close", errors.commit_failed(), skip=5, times=3)
    faulty.inject("open_output_stream", errors.throttle(), skip=7, times=2)
    faulty.inject("create_dir", errors.reset(), times=2)
    pafs.copy_files(str(src), str(dst), destination_filesystem=fs, use_threads=use_threads,
                    chunk_size=MiB)
    for rel, digest in digests.items():
        with open(dst / rel, "rb") as f:
            assert sha256(f.read()) == digest, rel
    assert sum(faulty.injected.values()) == 11
    assert fs.stats.snapshot()["giveups"] == 0


@pytest.mark.parametrize("use_threads", [True, False])
def test_copy_files_raises_when_a_commit_never_succeeds(faulty, tmp_path, use_threads):
    src, dst = tmp_path / "src", tmp_path / "dst"
    _make_tree(str(src), files=12, big=1000)
    faulty.inject("close", errors.commit_failed(), path="*/part-007.bin", times=None)
    fs = RetryingFileSystem(faulty, FAST)
    with pytest.raises(OSError, match="CompleteMultipartUpload") as info:
        pafs.copy_files(str(src), str(dst), destination_filesystem=fs, use_threads=use_threads)
    assert any("copy_files reported success but 1 object(s) were not committed" in note
               and "part-007.bin" in note for note in info.value.__notes__)
    # and the unwrapped faulty filesystem shows the trap retryfs closes: silent success
    faulty.clear()
    faulty.inject("close", errors.commit_failed(), path="*/part-007.bin", times=None)
    pafs.copy_files(str(src), str(tmp_path / "dst2"), destination_filesystem=faulty,
                    use_threads=use_threads)
    assert not (tmp_path / "dst2" / "shard_3" / "part-007.bin").exists()


def test_copy_files_of_a_single_file_raises_on_a_lost_commit(faulty, tmp_path):
    src = tmp_path / "one.bin"
    src.write_bytes(b"x" * 10)
    faulty.inject("close", errors.commit_failed(), times=None)
    fs = RetryingFileSystem(faulty, FAST)
    with pytest.raises(OSError, match="CompleteMultipartUpload"):
        pafs.copy_files(str(src), str(tmp_path / "out.bin"), destination_filesystem=fs)


def test_an_earlier_failure_elsewhere_does_not_fail_a_later_copy(faulty, tmp_path):
    fs = RetryingFileSystem(faulty, FAST)
    faulty.inject("close", errors.commit_failed(), times=None)
    with pytest.raises(OSError):
        _write(fs, str(tmp_path / "dst" / "early.bin"), [b"x"])  # raised to its caller already
    faulty.clear()
    src = tmp_path / "src"
    digests = _make_tree(str(src), files=3, big=10)
    pafs.copy_files(str(src), str(tmp_path / "dst"), destination_filesystem=fs)  # no raise
    assert str(tmp_path / "dst" / "early.bin") in fs.failed_commits()  # still on record
    for rel, digest in digests.items():
        assert sha256((tmp_path / "dst" / rel).read_bytes()) == digest


@pytest.mark.parametrize("opener", ["open_input_stream", "open_input_file"])
def test_reads_resume_at_the_same_offset(faulty, tmp_path, opener):
    data = os.urandom(5 * MiB)
    path = tmp_path / "blob"
    path.write_bytes(data)
    fs = RetryingFileSystem(faulty, FAST)
    faulty.inject("read", errors.network("GetObject"), skip=2, times=2)
    got = []
    with getattr(fs, opener)(str(path)) as f:
        while chunk := f.read(MiB // 3):
            got.append(chunk)
    assert sha256(b"".join(got)) == sha256(data)
    assert faulty.injected["read"] == 2
    # the first open, then one reopen per failure, random access so that it seeks to the offset
    assert faulty.calls[opener] == (3 if opener == "open_input_file" else 1)
    assert faulty.calls["open_input_file"] == (3 if opener == "open_input_file" else 2)


def test_random_access_reads_resume(faulty, tmp_path):
    data = os.urandom(MiB)
    path = tmp_path / "blob"
    path.write_bytes(data)
    fs = RetryingFileSystem(faulty, FAST)
    faulty.inject("read", errors.reset(), times=3)
    with fs.open_input_file(str(path)) as f:
        assert f.size() == MiB
        assert f.read_at(100, 5000) == data[5000:5100]
        f.seek(MiB - 10)
        assert f.read() == data[-10:]
    assert faulty.injected["read"] == 3
    assert fs.stats.snapshot()["by_operation"]["read"]["retries"] == 3


def test_download_through_copy_files_survives_read_faults(faulty, tmp_path):
    src = tmp_path / "src"
    digests = _make_tree(str(src), files=8)
    fs = RetryingFileSystem(faulty, FAST)
    faulty.inject("read", errors.network("GetObject"), skip=1, times=3)
    faulty.inject("get_file_info_selector", errors.unavailable(), times=1)
    pafs.copy_files(str(src), str(tmp_path / "down"), source_filesystem=fs)
    for rel, digest in digests.items():
        assert sha256((tmp_path / "down" / rel).read_bytes()) == digest
    assert (faulty.injected["read"], faulty.injected["get_file_info_selector"]) == (3, 1)


def test_appends_retry_the_open_only(faulty, tmp_path):
    path = tmp_path / "log.txt"
    path.write_bytes(b"start;")
    fs = RetryingFileSystem(faulty, FAST)
    faulty.inject("open_append_stream", errors.network(), times=2)
    with fs.open_append_stream(str(path)) as out:
        out.write(b"more")
    assert path.read_bytes() == b"start;more"
    assert faulty.calls["open_append_stream"] == 3


def test_many_threads_writing_at_once(faulty, tmp_path):
    fs = RetryingFileSystem(faulty, FAST.replace(max_attempts=25))
    faulty.inject("write", errors.network(), skip=10, times=20)
    payloads = {f"t{i}.bin": os.urandom(20_000 + i) for i in range(16)}
    failures = []

    def work(name):
        try:
            _write(fs, str(tmp_path / name), [payloads[name][:7000], payloads[name][7000:]])
        except Exception as exc:  # noqa: BLE001 - reported below
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(n,)) for n in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
    assert failures == []
    for name, data in payloads.items():
        assert (tmp_path / name).read_bytes() == data
    snap = fs.stats.snapshot()
    assert snap["by_operation"]["write"]["retries"] == 20
    assert snap["by_operation"]["open_output_stream"]["calls"] == 16 + 20  # 1 + 1 per replay


# -- a with block that raises commits nothing -----------------------------------------------------

class _SaveFailed(Exception):
    pass


def _write_then_fail(fs, path, chunks):
    with pytest.raises(_SaveFailed):
        with fs.open_output_stream(path) as out:
            for chunk in chunks:
                out.write(chunk)
            raise _SaveFailed("torch.save failed in the middle")


@pytest.mark.parametrize("size", [100, 12 * MiB])  # one PutObject / a multipart upload
def test_a_with_block_that_raises_keeps_the_object_that_was_there(s3_fault_endpoint,
                                                                   s3_fault_bucket, size):
    ep = s3_fault_endpoint
    ep.put_object(s3_fault_bucket, "ckpt", b"the last good checkpoint")
    fs = RetryingFileSystem(ep.pyarrow_fs(), FAST)
    _write_then_fail(fs, f"{s3_fault_bucket}/ckpt", [b"n" * size])
    _write_then_fail(fs, f"{s3_fault_bucket}/new", [b"n" * size])
    assert ep.get_object(s3_fault_bucket, "ckpt") == b"the last good checkpoint"
    assert ep.keys(s3_fault_bucket) == ["ckpt"]
    # nothing was committed: no PutObject, no CompleteMultipartUpload
    assert not [r for r in ep.requests(["PutObject", "CompleteMultipartUpload"])]


def test_unwrapped_pyarrow_commits_what_a_with_block_that_raised_had_written(s3_fault_endpoint,
                                                                            s3_fault_bucket):
    """The trap `OutputFile.__exit__` closes: pyarrow's own stream commits the prefix."""
    ep = s3_fault_endpoint
    ep.put_object(s3_fault_bucket, "ckpt", b"the last good checkpoint")
    _write_then_fail(ep.pyarrow_fs(), f"{s3_fault_bucket}/ckpt", [b"prefix"])
    assert ep.get_object(s3_fault_bucket, "ckpt") == b"prefix"


def test_abort_closes_the_stream_and_a_clean_with_block_commits(s3_fault_endpoint,
                                                                s3_fault_bucket):
    ep = s3_fault_endpoint
    fs = RetryingFileSystem(ep.pyarrow_fs(), FAST)
    out = fs.open_output_stream(f"{s3_fault_bucket}/aborted")
    out.write(b"x" * 1000)
    out.abort()
    assert out.closed
    with pytest.raises(ValueError):
        out.write(b"more")
    out.abort()  # twice is once
    with fs.open_output_stream(f"{s3_fault_bucket}/kept") as out:
        out.write(b"whole")
    assert ep.keys(s3_fault_bucket) == ["kept"]
    assert ep.get_object(s3_fault_bucket, "kept") == b"whole"


def test_a_with_block_that_raises_on_a_local_disk_keeps_what_was_written(tmp_path):
    """Written in place, as pyarrow writes it: the prefix stays (nothing more is written)."""
    fs = RetryingFileSystem(pafs.LocalFileSystem(), FAST)
    path = str(tmp_path / "partial.bin")
    _write_then_fail(fs, path, [b"a" * GATHERED, b"b" * 10])
    with open(path, "rb") as f:
        assert f.read() in (b"", b"a" * GATHERED, b"a" * GATHERED + b"b" * 10)


def test_a_stream_s_own_spool_memory_and_its_errors(tmp_path, monkeypatch):
    from retryfs.datapath import streams

    spools = []
    original = streams.replay_spool
    monkeypatch.setattr(streams, "replay_spool",
                        lambda memory: spools.append(memory) or original(memory))
    fs = RetryingFileSystem(pafs.LocalFileSystem(), FAST, spool_memory=MiB)
    for name, spool in (("a", None), ("b", "64MiB"), ("c", 0)):
        with fs.open_output_stream(str(tmp_path / name), spool_memory=spool) as out:
            out.write(b"data")
    assert spools == [MiB, 64 * MiB, 0]
    with pytest.raises(ValueError, match="spool_memory"):
        fs.open_output_stream(str(tmp_path / "d"), spool_memory="lots")
    assert not (tmp_path / "d").exists()

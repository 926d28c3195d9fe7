"""``copy_files`` onto retryfs never commits a file it did not copy whole.

Each file is one attempt through native streams (`retryfs.datapath.upload`). When the *source*
fails in the middle (its reads gave up), the destination stream is healthy, and closing it
would commit the prefix it holds as if it were the file: over an older object, or (a copy onto
itself) over the source, which the next attempt then re-reads and "copies" successfully. These
tests fail when the attempt closes the destination after a source failure.
"""

from __future__ import annotations

import hashlib
import os
import random
import threading

import pyarrow.fs as pafs
import pytest
from _helpers import FAST, open_files_under
from pyarrow._fs import _MockFileSystem

from retryfs import RetryingFileSystem
from retryfs.datapath import upload
from retryfs.testing import FaultyFileSystem, errors
from retryfs.testing.s3 import S3Fault, S3FaultEndpoint

OLD = b"checkpoint 1: the old, complete file"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_source_that_fails_mid_copy_leaves_the_old_s3_object(
        s3_fault_endpoint: S3FaultEndpoint, s3_fault_bucket: str) -> None:
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    new = random.Random(7).randbytes(256 * 1024)
    ep.put_object(bucket, "src/model.pt", new)
    ep.put_object(bucket, "dst/model.pt", OLD)
    # the first GET of the source delivers a prefix and is cut; every later one is reset
    cut = ep.add_fault(S3Fault.truncate(keep_bytes=64 * 1024, op="GetObject",
                                        path=f"{bucket}/src/model.pt", times=1))
    reset = ep.add_fault(S3Fault.reset(op="GetObject", path=f"{bucket}/src/model.pt"))
    fs = RetryingFileSystem(ep.pyarrow_fs(), FAST, budget=False)
    with pytest.raises(OSError):
        pafs.copy_files(f"{bucket}/src", f"{bucket}/dst", source_filesystem=fs,
                        destination_filesystem=fs, use_threads=False)
    assert ep.fired(cut) == 1 and ep.fired(reset) >= 1
    assert sha(ep.get_object(bucket, "dst/model.pt")) == sha(OLD), "a partial copy landed"
    # nothing was sent to the destination: no PutObject, no completed upload
    assert not [r for r in ep.requests("PutObject") + ep.requests("CompleteMultipartUpload")
                if r.path == f"{bucket}/dst/model.pt"]
    assert f"{bucket}/dst/model.pt" in fs.failed_commits()
    attempts = fs.stats.snapshot()["by_operation"]["copy_files"]
    assert attempts["attempts"] == FAST.max_attempts and attempts["giveups"] == 1, attempts


def _one_file_at_a_c() -> tuple[_MockFileSystem, FaultyFileSystem, RetryingFileSystem]:
    """A store holding ``a/c/z.bin`` (100 bytes), faults over it, retryfs over those."""
    store = _MockFileSystem()
    store.create_dir("a/c")
    with store.open_output_stream("a/c/z.bin") as out:
        out.write(b"z" * 100)
    faulty = FaultyFileSystem(store)
    return store, faulty, RetryingFileSystem(faulty, FAST, budget=False)


def test_a_copy_onto_itself_whose_first_read_gave_up_keeps_the_file() -> None:
    """The replayed simulation failure: ``copy_files("a/c", "a/c")`` (every file onto itself),
    the source's reads failing until they give up once. The first attempt's destination
    stream must not commit its empty prefix over the source, or the retry copies that."""
    store, faulty, fs = _one_file_at_a_c()
    fault = faulty.inject("read", errors.network(), times=FAST.max_attempts)  # 1 read gives up
    pafs.copy_files("a/c", "a/c", source_filesystem=fs, destination_filesystem=fs,
                    use_threads=False)
    assert fault.fired == FAST.max_attempts
    with store.open_input_stream("a/c/z.bin") as f:
        assert f.read() == b"z" * 100
    stats = fs.stats.snapshot()["by_operation"]
    assert stats["read"]["giveups"] == 1 and stats["copy_files"]["retries"] == 1, stats
    assert fs.failed_commits() == {}


def test_a_failed_copy_leaves_no_partial_tree() -> None:
    """The other replayed failure: a tree copied to a new place, the source failing for good:
    ``copy_files`` raises and the destination file does not exist, not empty nor a prefix."""
    store, faulty, fs = _one_file_at_a_c()
    fault = faulty.inject("read", errors.reset(), path="a/c/z.bin", times=None)
    with pytest.raises(ConnectionResetError):
        pafs.copy_files("a", "t", source_filesystem=fs, destination_filesystem=fs,
                        use_threads=False)
    assert fault.fired >= FAST.max_attempts
    assert store.get_file_info("t/c/z.bin").type == pafs.FileType.NotFound
    assert "t/c/z.bin" in fs.failed_commits()


def test_a_local_destination_is_replaced_whole_or_not_at_all(tmp_path) -> None:
    """A local file is written in place as it goes: the copy writes beside it and renames,
    so a failed copy leaves the old file (and no temporary file), a good one the new."""
    source_store = FaultyFileSystem(_MockFileSystem())
    source_store.create_dir("src")
    new = random.Random(3).randbytes(50_000)
    with source_store.open_output_stream("src/model.pt") as out:
        out.write(new)
    source = RetryingFileSystem(source_store, FAST, budget=False)
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "model.pt").write_bytes(OLD)
    local = RetryingFileSystem(pafs.LocalFileSystem(), FAST, budget=False)
    fault = source_store.inject("read", errors.reset(), skip=1, times=None)  # after 1 chunk
    with pytest.raises(ConnectionResetError):
        pafs.copy_files("src", str(tmp_path / "dst"), source_filesystem=source,
                        destination_filesystem=local, chunk_size=4096, use_threads=False)
    assert fault.fired >= FAST.max_attempts
    assert (tmp_path / "dst" / "model.pt").read_bytes() == OLD
    assert os.listdir(tmp_path / "dst") == ["model.pt"]
    source_store.clear()
    pafs.copy_files("src", str(tmp_path / "dst"), source_filesystem=source,
                    destination_filesystem=local, chunk_size=4096, use_threads=False)
    assert sha((tmp_path / "dst" / "model.pt").read_bytes()) == sha(new)
    assert os.listdir(tmp_path / "dst") == ["model.pt"]


def test_a_failed_small_local_copy_leaves_the_old_file_and_no_open_file(tmp_path) -> None:
    """A file of one chunk is pumped into its temporary file beside the destination: when the
    source fails, that file is closed and removed (not kept open for ever, as a stream that
    would commit must be), and the old file stays."""
    source_store = FaultyFileSystem(_MockFileSystem())
    source_store.create_dir("src")
    with source_store.open_output_stream("src/model.pt") as out:
        out.write(b"n" * 1000)
    source = RetryingFileSystem(source_store, FAST, budget=False)
    (tmp_path / "dst").mkdir()
    (tmp_path / "dst" / "model.pt").write_bytes(OLD)
    local = RetryingFileSystem(pafs.LocalFileSystem(), FAST, budget=False)
    fault = source_store.inject("read", errors.reset(), times=None)
    with pytest.raises(ConnectionResetError):
        pafs.copy_files("src", str(tmp_path / "dst"), source_filesystem=source,
                        destination_filesystem=local, use_threads=False)
    assert fault.fired >= FAST.max_attempts
    # the descriptors this process holds under the destination (a removed temporary file still
    # open shows as "... (deleted)"); counting every descriptor raced other tests' sockets
    assert open_files_under(tmp_path) == [], "a temporary file was left open"
    assert (tmp_path / "dst" / "model.pt").read_bytes() == OLD
    assert os.listdir(tmp_path / "dst") == ["model.pt"]


@pytest.mark.parametrize("ending", ["reset", "data"])
def test_an_abandoned_timed_attempt_never_commits_later(monkeypatch, ending) -> None:
    """A whole-file attempt that timed out goes on in the background. When its stalled source
    read finally ends (in a reset, or with the data), it must not commit: neither its empty
    prefix over the retry's complete copy, nor a stale copy over what was written since."""
    abandoned = []
    real = upload.run_with_timeout

    def keeping_the_future(fn, seconds, operation, path, *, on_abandon=None):
        def note(future):
            abandoned.append(future)
            if on_abandon is not None:
                on_abandon(future)
        return real(fn, seconds, operation, path, on_abandon=note)

    monkeypatch.setattr(upload, "run_with_timeout", keeping_the_future)
    source = FaultyFileSystem(_MockFileSystem())
    source.create_dir("src")
    new = random.Random(5).randbytes(10_000)
    with source.open_output_stream("src/model.pt") as out:
        out.write(new)
    store = _MockFileSystem()
    store.create_dir("dst")
    # 1 s per attempt: the stalled one is abandoned after it, and the retry (10 KB to memory)
    # ends well within it even on a loaded machine (0.2 s timed out a retry there too)
    fs = RetryingFileSystem(store, FAST, budget=False, write_timeout=1.0,
                            min_throughput=1 << 30)
    stall = source.inject("read", errors.reset() if ending == "reset" else None, stall=10.0)
    pafs.copy_files("src", "dst", source_filesystem=source, destination_filesystem=fs,
                    use_threads=False)
    assert stall.fired == 1 and len(abandoned) == 1
    assert fs.stats.snapshot()["by_operation"]["copy_files"]["retries"] == 1
    with store.open_output_stream("dst/model.pt") as out:  # the user's next version
        out.write(b"checkpoint 2")
    source.release()  # the abandoned attempt's read ends now
    abandoned[0].exception(timeout=10)  # wait for it: its outcome is discarded
    with store.open_input_stream("dst/model.pt") as f:
        assert f.read() == b"checkpoint 2", "the abandoned attempt committed over a newer file"


def test_a_serial_tree_copy_stops_at_the_first_file_that_fails_as_pyarrow_does() -> None:
    """Found by the simulation: ``copy_files("a", "a/c")`` where ``a/c/x`` is a directory. Arrow's
    serial copy stops at the first file that fails (``a/x`` onto that directory); retryfs's went
    on and copied ``a/y`` before raising, leaving a tree neither as it was nor as pyarrow's."""
    def tree() -> _MockFileSystem:
        store = _MockFileSystem()
        store.create_dir("a/c/x")
        for path, data in {"a/x": b"x", "a/y": b"y", "a/c/z.bin": b"z" * 100}.items():
            with store.open_output_stream(path) as out:
                out.write(data)
        return store

    reference, store = tree(), tree()
    fs = RetryingFileSystem(store, FAST, budget=False)
    for target, source_fs in ((reference, reference), (fs, fs)):
        with pytest.raises(OSError):
            pafs.copy_files("a", "a/c", source_filesystem=source_fs,
                            destination_filesystem=target, use_threads=False)
    selector = pafs.FileSelector("", recursive=True)
    listed = [sorted((i.path, i.type.name, i.size) for i in s.get_file_info(selector))
              for s in (reference, store)]
    assert listed[1] == listed[0]
    assert store.get_file_info("a/c/y").type == pafs.FileType.NotFound
    assert set(fs.failed_commits()) == {"a/c/x"}


@pytest.mark.parametrize("ending", ["reset", "data"])
def test_a_threaded_copy_whose_first_attempt_stalls_goes_on_and_never_commits_it(
        monkeypatch, ending) -> None:
    """A threaded copy runs each file's first attempt on its worker under the watchdog: when
    that attempt stalls, its retry goes on on another worker (counted as a timeout) and the
    copy returns; the stalled attempt, when its read finally ends, commits nothing, neither
    over the retry's copy nor over what was written since."""
    ended = {"dst/model.pt": 0}
    both_ended = threading.Event()
    real = upload._upload

    def noting_the_end(*args, **kwargs):
        try:
            return real(*args, **kwargs)
        finally:
            if args[3] == "dst/model.pt":  # the destination
                ended["dst/model.pt"] += 1
                if ended["dst/model.pt"] == 2:
                    both_ended.set()

    monkeypatch.setattr(upload, "_upload", noting_the_end)
    source = FaultyFileSystem(_MockFileSystem())
    source.create_dir("src")
    files = {"model.pt": random.Random(6).randbytes(10_000), "meta.json": b"{}"}
    for name, data in files.items():
        with source.open_output_stream(f"src/{name}") as out:
            out.write(data)
    store = _MockFileSystem()
    store.create_dir("dst")
    # 1 s per attempt: the stalled one is abandoned after it, and the retry (10 KB to memory)
    # ends well within it even on a loaded machine (0.2 s timed out a retry there too)
    fs = RetryingFileSystem(store, FAST, budget=False, write_timeout=1.0,
                            min_throughput=1 << 30)
    stall = source.inject("read", errors.reset() if ending == "reset" else None,
                          path="src/model.pt", stall=10.0)
    pafs.copy_files("src", "dst", source_filesystem=source, destination_filesystem=fs,
                    use_threads=True)
    assert stall.fired == 1
    stats = fs.stats.snapshot()
    assert stats["timeouts"] == 1 and stats["by_operation"]["copy_files"]["retries"] == 1
    for name, data in files.items():
        with store.open_input_stream(f"dst/{name}") as f:
            assert f.read() == data, name
    assert ended["dst/model.pt"] == 1  # the retry's; the stalled attempt still waits
    with store.open_output_stream("dst/model.pt") as out:  # the user's next version
        out.write(b"checkpoint 2")
    source.release()  # the stalled attempt's read ends now
    assert both_ended.wait(10), "the stalled attempt never ended"
    with store.open_input_stream("dst/model.pt") as f:
        assert f.read() == b"checkpoint 2", "the stalled attempt committed over a newer file"


def test_a_one_part_file_uploads_as_one_put_without_background_writes_retried_by_retryfs(
        s3_fault_endpoint: S3FaultEndpoint, s3_fault_bucket: str, tmp_path) -> None:
    """A file smaller than one part is uploaded by a write client without background writes
    (its part buffer freed where it was allocated) that opens its upload lazily: one
    PutObject, not a CreateMultipartUpload, an UploadPart and a CompleteMultipartUpload
    (unwrapped pyarrow's three). That client makes one SDK attempt per request, whatever the
    write client's: two failed PutObject are two retryfs retries, each copying the file again
    from its source (with the write client's SDK attempts, or a client that lost its retry
    strategy and made the SDK's 3 default attempts, the SDK would have re-sent them unseen and
    retryfs retried nothing); a multi-part file keeps the background-writing client."""
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    fs = RetryingFileSystem(ep.pyarrow_fs(), FAST, budget=False, client_attempts=1,
                            client_write_attempts=2)
    handler = fs.retry_handler
    small = handler.writer_for(64 * 1024)
    options = small.__reduce__()[1][0]
    assert options["background_writes"] is False and options["allow_delayed_open"] is True
    assert handler.writer_for(64 * 1024) is small  # built once
    assert handler.writer_for(6 << 20) is handler.writer
    assert handler.writer.__reduce__()[1][0]["background_writes"] is True
    data = random.Random(9).randbytes(64 * 1024)
    (tmp_path / "meta.bin").write_bytes(data)
    failed = ep.add_fault(S3Fault.internal_error(op="PutObject", times=2))
    pafs.copy_files(str(tmp_path / "meta.bin"), f"{bucket}/ckpt/meta.bin",
                    destination_filesystem=fs)
    counts = ep.counts()
    assert ep.fired(failed) == 2 and counts["PutObject"] == 3
    assert "UploadPart" not in counts and "CreateMultipartUpload" not in counts
    # what the two faults cost: the file sent once more each, no more (plus each body's
    # chunked framing, 53 bytes here)
    sent = sum(r.request_bytes for r in ep.requests(op="PutObject"))
    assert 3 * len(data) <= sent <= 3 * (len(data) + 1024), sent
    assert sha(ep.get_object(bucket, "ckpt/meta.bin")) == sha(data)
    assert fs.stats.snapshot()["by_operation"]["copy_files"]["retries"] == 2

"""Writes and commits have a per-attempt timeout: a stalled PutObject, UploadPart or
CompleteMultipartUpload on the S3 endpoint becomes a retry into a fresh upload, the object
lands byte for byte, and the deadline bounds the whole.

pyarrow's own client never gives up on a stalled upload (it waits until the connection is
reset), so without the timeout each of these waits out the whole stall.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import time

import fsspec
import pyarrow.fs as pafs
import pytest
from fsspec.asyn import AbstractAsyncStreamedFile
from fsspec.implementations.asyn_wrapper import AsyncFileSystemWrapper
from fsspec.implementations.memory import MemoryFileSystem

from retryfs import RetryingFileSystem, RetryPolicy
from retryfs.core.timeouts import AttemptTimeoutError, write_attempt_timeout
from retryfs.fsspec.filesystem import AsyncRetryFileSystem
from retryfs.testing.s3 import S3Fault, S3FaultEndpoint

MiB = 1 << 20
STALL = 10.0  # each stall holds its request this long (or until released), then resets it
POLICY = RetryPolicy(max_attempts=5, initial_delay=0.01, multiplier=1, max_delay=0.01,
                     jitter=False)
#: 1 s + 1 s per 16 MiB in flight (1.6 s for a 10 MiB part): what an attempt may take here
#: under load; the stalled one is abandoned after that, so each test costs about one timeout
FAST = {"write_timeout": 1.0, "min_throughput": 16 * MiB}


def upload(fs: pafs.FileSystem, path: str, data: bytes) -> float:
    started = time.monotonic()
    with fs.open_output_stream(path) as out:
        for start in range(0, len(data), MiB):
            out.write(data[start:start + MiB])
    return time.monotonic() - started


@pytest.mark.parametrize("op, size, delayed_open", [
    ("PutObject", 64 * 1024, True),                   # a small object: one PutObject at close
    ("UploadPart", 64 * 1024, False),                 # the last (only) part, sent at close
    ("UploadPart", 11 * MiB, False),                  # a 10 MiB part sent while writing
    ("CompleteMultipartUpload", 64 * 1024, False),    # the commit itself
])
def test_a_stalled_upload_becomes_a_retry(op: str, size: int, delayed_open: bool,
                                          s3_fault_endpoint: S3FaultEndpoint,
                                          s3_fault_bucket: str) -> None:
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    data = random.Random(size).randbytes(size)
    stall = ep.add_fault(S3Fault.stall(STALL, op=op, path=f"{bucket}/obj", times=1))
    fs = RetryingFileSystem(ep.pyarrow_fs(allow_delayed_open=delayed_open), POLICY,
                            budget=False, **FAST)
    # a stalled commit may still land: the call reports success only once it has ended; the
    # stall ends (a reset) when the retry begins, as a server's would some time later
    fs.stats.on_retry(lambda event: ep.release_stalls())
    elapsed = upload(fs, f"{bucket}/obj", data)
    ep.release_stalls()  # the abandoned attempt ends now (with a reset), not in 10 s
    assert hashlib.sha256(ep.get_object(bucket, "obj")).digest() == hashlib.sha256(data).digest()
    assert ep.fired(stall) == 1
    stats = fs.stats.snapshot()
    assert stats["timeouts"] == 1 and stats["giveups"] == 0, stats
    assert fs.failed_commits() == {}
    # the retry did not wait the stall out: its request came while the stalled one hung
    stalled = ep.requests(op, faulted=True)[0]
    later = [r for r in ep.requests(op, faulted=False) if r.seq > stalled.seq]
    assert later, f"no {op} after the stalled one"
    print(f"{op} {size}: {elapsed:.2f}s")
    assert elapsed < STALL, f"{elapsed:.1f}s: the stall was waited out"


def test_the_deadline_bounds_an_upload_that_stalls_every_time(
        s3_fault_endpoint: S3FaultEndpoint, s3_fault_bucket: str) -> None:
    """Every PutObject stalls: the close gives up with a timeout by the deadline (plus at most
    one attempt), is recorded as a failed commit, and nothing lands."""
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    stall = ep.add_fault(S3Fault.stall(STALL, op="PutObject", times=None))
    policy = POLICY.replace(max_attempts=100, deadline=1.0)
    fs = RetryingFileSystem(ep.pyarrow_fs(allow_delayed_open=True), policy, budget=False,
                            write_timeout=0.3, min_throughput=1e9)
    started = time.monotonic()
    with pytest.raises(TimeoutError) as raised:
        upload(fs, f"{bucket}/obj", b"x" * 1000)
    elapsed = time.monotonic() - started
    ep.release_stalls()
    assert ep.fired(stall) >= 1
    assert fs.stats.snapshot()["by_operation"]["close"]["attempts"] >= 2  # 0.3 s attempts
    assert "deadline reached" in raised.value.__notes__[-1]
    assert f"{bucket}/obj" in fs.failed_commits()
    assert ep.keys(bucket) == []
    assert elapsed <= policy.deadline + 0.3 + 1.0, f"{elapsed:.1f}s"  # generous slack


def test_write_attempt_timeout_is_a_floor_plus_bytes_at_the_minimum_throughput():
    assert write_attempt_timeout(60.0, MiB, 64 * MiB) == 124.0
    assert write_attempt_timeout(60.0, MiB, 0) == 60.0


@pytest.mark.parametrize("kwargs, name", [
    ({"write_timeout": 0}, "write_timeout"), ({"write_timeout": "soon"}, "write_timeout"),
    ({"write_timeout": True}, "write_timeout"), ({"min_throughput": 0}, "min_throughput"),
    ({"min_throughput": float("inf")}, "min_throughput"),
])
def test_bad_write_timeouts_are_refused(kwargs, name):
    with pytest.raises(ValueError, match=name):
        RetryingFileSystem(pafs.LocalFileSystem(), **kwargs)


def test_write_timeouts_survive_pickling():
    import pickle

    fs = RetryingFileSystem(pafs.LocalFileSystem(), write_timeout=7.0, min_throughput=1000)
    back = pickle.loads(pickle.dumps(fs))
    assert (back.retry_handler.retry_config.write_timeout,
            back.retry_handler.retry_config.min_throughput) == (7.0, 1000)
    assert back == fs


@pytest.mark.parametrize("op", ["PutObject", "UploadPart", "CompleteMultipartUpload"])
def test_copy_files_onto_retryfs_times_out_a_stalled_upload(
        op: str, s3_fault_endpoint: S3FaultEndpoint, s3_fault_bucket: str, tmp_path) -> None:
    """``pyarrow.fs.copy_files`` onto retryfs (Ray Train's upload) copies each file through
    native streams, not an output stream of retryfs: its whole-file attempts are timed too, so a
    stalled request becomes a retry that reads the source again, not a wait for the stall."""
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    files = {"model.pt": random.Random(1).randbytes(64 * 1024 if op == "PutObject" else 6 * MiB),
             "meta.json": b"{}"}
    for name, data in files.items():
        (tmp_path / name).write_bytes(data)
    stall = ep.add_fault(S3Fault.stall(STALL, op=op, path=f"{bucket}/ckpt/model.pt", times=1))
    fs = RetryingFileSystem(ep.pyarrow_fs(allow_delayed_open=op == "PutObject"), POLICY,
                            budget=False, **FAST)
    fs.stats.on_retry(lambda event: ep.release_stalls())  # the stalled commit ends (a reset)
    started = time.monotonic()
    pafs.copy_files(str(tmp_path), f"{bucket}/ckpt", source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=fs, use_threads=True)
    elapsed = time.monotonic() - started
    ep.release_stalls()
    assert ep.fired(stall) == 1
    for name, data in files.items():
        assert hashlib.sha256(ep.get_object(bucket, f"ckpt/{name}")).digest() == \
            hashlib.sha256(data).digest()
    stats = fs.stats.snapshot()
    assert stats["timeouts"] == 1 and stats["by_operation"]["copy_files"]["retries"] == 1, stats
    assert fs.failed_commits() == {}
    assert elapsed < STALL, f"{elapsed:.1f}s: the stall was waited out"


@pytest.mark.parametrize("op, size", [
    ("PutObject", 64 * 1024),                   # a small file: one PutObject at close
    ("UploadPart", 11 * MiB),                   # 5 MiB blocks, sent while writing
    ("CompleteMultipartUpload", 11 * MiB),      # the commit itself
])
def test_the_fsspec_face_times_out_a_stalled_upload(op: str, size: int,
                                                    s3_fault_endpoint: S3FaultEndpoint,
                                                    s3_fault_bucket: str) -> None:
    """The fsspec face (``retry`` over s3fs) times its writes as the pyarrow face does: a
    stalled request becomes a retry into a fresh upload, and the object lands byte for byte."""
    import fsspec

    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    data = random.Random(size).randbytes(size)
    stall = ep.add_fault(S3Fault.stall(STALL, op=op, path=f"{bucket}/obj", times=1))
    # a stalled commit (PutObject, CompleteMultipartUpload) may still land: the close returns
    # once its abandoned attempt has ended
    client = ep.s3fs()
    fs = fsspec.filesystem("retry", fs=client, skip_instance_cache=True, policy=POLICY,
                           budget=False, **FAST)
    fs.stats.on_retry(lambda event: ep.release_stalls())  # the stalled commit ends (a reset)
    started = time.monotonic()
    with fs.open(f"{bucket}/obj", "wb", block_size=5 * MiB) as out:
        for start in range(0, len(data), MiB):
            out.write(data[start:start + MiB])
    elapsed = time.monotonic() - started
    ep.release_stalls()
    assert ep.fired(stall) == 1
    assert hashlib.sha256(ep.get_object(bucket, "obj")).digest() == hashlib.sha256(data).digest()
    stats = fs.stats.snapshot()
    assert stats["timeouts"] >= 1 and stats["giveups"] == 0, stats
    assert elapsed < STALL, f"{elapsed:.1f}s: the stall was waited out"


# -- the async face: open_async's writes are timed too ---------------------------------------------
# No async filesystem installed here writes through open_async (s3fs's async file reads only), so
# the backend is fsspec's memory filesystem behind AsyncFileSystemWrapper with an async streamed
# file whose uploads can hang: a black-holed request, as the S3 endpoint's stalls are.

class _HangingUploads(AbstractAsyncStreamedFile):
    hangs = 0  # how many of the next uploads hang (for STALL seconds)

    async def _initiate_upload(self) -> None:
        pass

    async def _upload_chunk(self, final: bool = False) -> bool:
        if type(self).hangs:
            type(self).hangs -= 1
            await asyncio.sleep(STALL)
        if not final:
            return False  # keep buffering: the object is sent whole at close
        self.fs.sync_fs.pipe_file(self.path, self.buffer.getvalue())
        return True


class _AsyncMemory(AsyncFileSystemWrapper):
    async def open_async(self, path, mode="rb", **kwargs):
        return _HangingUploads(self, path, mode, **kwargs)


def test_the_async_face_times_out_a_hanging_upload_and_never_commits_it_later() -> None:
    memory = MemoryFileSystem(skip_instance_cache=True)
    memory.store, memory.pseudo_dirs = {}, [""]

    async def main() -> tuple[float, list[bool]]:
        fs = fsspec.filesystem("retry", fs=_AsyncMemory(memory, asynchronous=True),
                               policy=POLICY, budget=False, skip_instance_cache=True,
                               write_timeout=0.3, min_throughput=1 << 30)
        assert isinstance(fs, AsyncRetryFileSystem)
        _HangingUploads.hangs = 1
        started = time.monotonic()
        writer = await fs.open_async("/ckpt/model.pt", "wb")
        await writer.write(b"weights")
        with pytest.raises(AttemptTimeoutError):
            await writer.close()
        elapsed = time.monotonic() - started
        await writer.close()  # discarded: a second close sends nothing either
        seen = [memory.exists("/ckpt/model.pt")]
        async with await fs.open_async("/ckpt/model.pt", "wb") as again:  # the caller's redo
            await again.write(b"weights")
        seen.append(memory.cat_file("/ckpt/model.pt") == b"weights")
        return elapsed, seen

    elapsed, seen = asyncio.run(main())
    assert _HangingUploads.hangs == 0  # the hang happened
    assert seen == [False, True]
    assert elapsed < STALL, f"{elapsed:.1f}s: the hanging upload was waited out"


# -- local destinations write on the caller's thread ---------------------------------------------

def _hops(monkeypatch) -> list[str]:
    """The operations of output streams that hopped to a timed worker."""
    from retryfs.datapath import streams

    hopped: list[str] = []
    real = streams.run_with_timeout

    def counting(fn, seconds, operation, path, **kwargs):
        hopped.append(operation)
        return real(fn, seconds, operation, path, **kwargs)

    monkeypatch.setattr(streams, "run_with_timeout", counting)
    return hopped


@pytest.mark.parametrize("face", ["pyarrow", "fsspec", "pyarrow over fsspec"])
def test_a_local_destination_is_written_on_the_callers_thread(tmp_path, monkeypatch, face):
    from retryfs.fsspec.filesystem import RetryFileSystem

    hopped = _hops(monkeypatch)
    data = random.Random(3).randbytes(4096)
    target = str(tmp_path / "small.bin")
    if face == "fsspec":
        with RetryFileSystem(fs=fsspec.filesystem("file"), write_timeout=5.0).open(
                target, "wb") as out:
            out.write(data)
    else:
        inner = pafs.LocalFileSystem() if face == "pyarrow" else fsspec.filesystem("file")
        with RetryingFileSystem(inner, write_timeout=5.0).open_output_stream(target) as out:
            out.write(data)
    assert (tmp_path / "small.bin").read_bytes() == data
    assert hopped == []  # no hop: a local write waits on the kernel, not on a connection


def test_a_destination_that_may_stall_keeps_its_timed_writes(tmp_path, monkeypatch):
    hopped = _hops(monkeypatch)
    data = random.Random(4).randbytes(4096)
    wrapped = pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem())  # not known local
    with RetryingFileSystem(wrapped, write_timeout=5.0).open_output_stream("small.bin") as out:
        out.write(data)
    assert (tmp_path / "small.bin").read_bytes() == data
    assert hopped == ["write", "close"]


def test_a_commit_still_stalled_after_another_attempt_timeout_is_an_error(
        s3_fault_endpoint: S3FaultEndpoint, s3_fault_bucket: str) -> None:
    """The retry's commit landed, but the stalled one may land after it, at any time: the call
    does not report success; after one more attempt timeout it raises CommitInFlightError."""
    from retryfs.errors import CommitInFlightError

    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    stall = ep.add_fault(S3Fault.stall(STALL, op="PutObject", path=f"{bucket}/obj", times=1))
    fs = RetryingFileSystem(ep.pyarrow_fs(allow_delayed_open=True), POLICY, budget=False,
                            **FAST)
    try:
        with pytest.raises(CommitInFlightError, match="still under way"):
            upload(fs, f"{bucket}/obj", b"x" * 1000)
        elapsed_ok = fs.stats.snapshot()["timeouts"] == 1
    finally:
        ep.release_stalls()
    assert ep.fired(stall) == 1 and elapsed_ok
    assert f"{bucket}/obj" in fs.failed_commits()

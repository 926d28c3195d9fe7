"""``copy_files(local -> RetryingFileSystem(S3), use_threads=True)`` never hangs.

Every file's copy is a task on Arrow's IO pool, and each native S3 stream's close waits for
its part uploads, which are tasks on that same pool (apache/arrow#15233): with the pool full of
closes, nothing runs again. The wrapper lends the pool a thread around such a close
(`retryfs.datapath.iopool`). A small pool makes the hang certain without it: with one IO thread the
first close waits forever. A watchdog bounds each copy; past it, the threads are dumped and
the pool is grown so the hung copy can finish and the test fail cleanly.

The long hunt (hundreds of runs, CPU load, resets and stalls) is
``benchmarks/hunt_threaded_copy.py``.
"""

from __future__ import annotations

import faulthandler
import hashlib
import random
import sys
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from retryfs import RetryingFileSystem, RetryPolicy
from retryfs.testing.s3 import S3Fault, S3FaultEndpoint

MiB = 1 << 20
BOUND = 20.0  # seconds per copy before it counts as hung; a copy takes about 1-3 s here
POLICY = RetryPolicy(max_attempts=8, initial_delay=0.001, max_delay=0.01)


def checkpoint(root: Path) -> dict[str, str]:
    """41 files: one of 14 MiB (two parts), 40 small ones."""
    rng = random.Random(10)
    files = {"model.pt": rng.randbytes(14 * MiB)}
    for i in range(40):
        files[f"shards/{i:02d}.bin"] = rng.randbytes(rng.randint(1, 64) * 1024)
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return {name: hashlib.sha256(data).hexdigest() for name, data in files.items()}


def copy_within_bound(src: Path, dest: str, fs: pafs.FileSystem) -> None:
    failed: list[BaseException] = []

    def run() -> None:
        try:
            pafs.copy_files(str(src), dest, destination_filesystem=fs, use_threads=True)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            failed.append(exc)

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(BOUND)
    if worker.is_alive():
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        pa.set_io_thread_count(16)  # free the pool, so the copy ends and nothing stays hung
        worker.join(BOUND)
        pytest.fail(f"copy_files did not finish in {BOUND:g}s (threads dumped above)")
    if failed:
        raise failed[0]


@pytest.fixture
def io_threads():
    """Set Arrow's IO pool size for one test; restored after."""
    before = pa.io_thread_count()
    yield pa.set_io_thread_count
    pa.set_io_thread_count(before)


def stored(ep: S3FaultEndpoint, bucket: str, prefix: str) -> dict[str, str]:
    return {key.removeprefix(prefix): hashlib.sha256(ep.get_object(bucket, key)).hexdigest()
            for key in ep.keys(bucket, prefix) if not key.endswith("/")}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("threads, faulty", [(1, False), (2, True), (2, True)])
def test_threaded_copy_to_s3_finishes_on_a_small_io_pool(
        threads: int, faulty: bool, io_threads, s3_fault_endpoint: S3FaultEndpoint,
        s3_fault_bucket: str, tmp_path: Path) -> None:
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    hashes = checkpoint(tmp_path / "ckpt")
    io_threads(threads)
    fs = RetryingFileSystem(ep.pyarrow_fs(), POLICY, budget=False)
    faults = []
    if faulty:  # about 5 % of the requests answer 503 SlowDown once, 1 % are reset
        faults = [ep.add_fault(S3Fault.slow_down(probability=0.05, seed=threads,
                                                 path=f"{bucket}/ckpt/*")),
                  ep.add_fault(S3Fault.reset(probability=0.01, seed=threads + 1,
                                             path=f"{bucket}/ckpt/*"))]
    copy_within_bound(tmp_path / "ckpt", f"{bucket}/ckpt", fs)
    assert stored(ep, bucket, "ckpt/") == hashes
    assert fs.failed_commits() == {}
    assert pa.io_thread_count() == threads  # every lent thread was given back
    if faulty:
        assert ep.fired(faults[0]) >= 1, "no SlowDown fired"
        assert fs.stats.snapshot()["retries"] >= ep.fired(faults[0])

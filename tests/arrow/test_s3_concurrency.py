"""A checkpoint-shaped directory uploaded and restored under a seeded 5 % fault rate, by many
threads at once: ``pyarrow.fs.copy_files(use_threads=True)`` (Arrow's IO threads call the
wrapper, the way Ray Train uploads to any filesystem that is not a native S3FileSystem) and 8
threads of our own, against both clients. Everything lands, byte for byte; no call gives up; no
deadlock; bounded time.
"""

from __future__ import annotations

import hashlib
import random
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

from retryfs import RetryingFileSystem, RetryPolicy
from retryfs.testing.s3 import S3Fault, S3FaultEndpoint

MiB = 1 << 20
# A 5 % fault rate gives some operations several faults in a row: allow more attempts than
# the matrix does, still without real sleeps.
POLICY = RetryPolicy(max_attempts=8, initial_delay=0.001, multiplier=2, max_delay=0.01,
                     jitter=True)
WALL_CLOCK = 60.0  # generous: about 5 s here, on 2 shared cores


def checkpoint(root: Path) -> dict[str, bytes]:
    """One object over the multipart threshold (pyarrow: 10 MiB parts) and 48 small ones."""
    rng = random.Random(7)
    files = {"model.pt": rng.randbytes(11 * MiB)}
    for i in range(16):
        files[f"shards/rank-{i}.bin"] = rng.randbytes(rng.randint(1, 64) * 1024)
        files[f"optimizer/state-{i}.pt"] = rng.randbytes(rng.randint(1, 16) * 1024)
        files[f"meta/{i:02d}.json"] = b'{"epoch": %d}' % i
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return files


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def inject_five_percent(ep: S3FaultEndpoint, bucket: str) -> None:
    """About 5 % of the requests on the checkpoint fail, drawn from seeded generators: the
    first rule that fires wins, so the rates compound to 1 - (.98 * .985 * .99 * .995)."""
    where = {"path": f"{bucket}/ckpt*"}
    ep.add_fault(S3Fault.internal_error(probability=0.02, seed=1, **where))
    ep.add_fault(S3Fault.slow_down(probability=0.015, seed=2, **where))
    ep.add_fault(S3Fault.reset(probability=0.01, seed=3, **where))
    ep.add_fault(S3Fault.truncate(probability=0.005, seed=4, **where))


def make_inner(ep: S3FaultEndpoint, client: str) -> Any:
    if client == "pyarrow":
        return ep.pyarrow_fs()
    return ep.s3fs(default_block_size=5 * MiB, use_listings_cache=False)


def upload_with_threads(fs: pafs.FileSystem, files: dict[str, bytes], dest: str) -> None:
    def one(name: str) -> None:
        data = files[name]
        with fs.open_output_stream(f"{dest}/{name}") as f:
            for start in range(0, len(data), MiB):
                f.write(data[start:start + MiB])

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, sorted(files)))


def download_with_threads(fs: pafs.FileSystem, names: list[str], src: str) -> dict[str, bytes]:
    def one(name: str) -> bytes:
        with fs.open_input_stream(f"{src}/{name}") as f:
            return f.read()

    with ThreadPoolExecutor(8) as pool:
        return dict(zip(names, pool.map(one, names), strict=True))


@pytest.mark.timeout(180)
@pytest.mark.parametrize("how", ["copy_files", "8_threads"])
@pytest.mark.parametrize("client", ["pyarrow", "s3fs"])
def test_checkpoint_round_trip_under_a_five_percent_fault_rate(
        client: str, how: str, s3_fault_endpoint: S3FaultEndpoint, s3_fault_bucket: str,
        tmp_path: Path) -> None:
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    local = tmp_path / "ckpt"
    files = checkpoint(local)
    fs = RetryingFileSystem(make_inner(ep, client), POLICY, budget=False)
    dest = f"{bucket}/ckpt"
    inject_five_percent(ep, bucket)

    started = time.monotonic()
    if how == "copy_files":
        pafs.copy_files(str(local), dest, source_filesystem=pafs.LocalFileSystem(),
                        destination_filesystem=fs, use_threads=True)
    else:
        upload_with_threads(fs, files, dest)
    stored = {key.removeprefix("ckpt/"): ep.get_object(bucket, key)
              for key in ep.keys(bucket, "ckpt/") if not key.endswith("/")}
    assert {name: sha(data) for name, data in stored.items()} == {
        name: sha(data) for name, data in files.items()}

    if how == "copy_files":  # the restore path: Arrow's threads read through the wrapper
        restored = tmp_path / "restored"
        pafs.copy_files(dest, str(restored), source_filesystem=fs,
                        destination_filesystem=pafs.LocalFileSystem(), use_threads=True)
        back = {p.relative_to(restored).as_posix(): p.read_bytes()
                for p in restored.rglob("*") if p.is_file()}
    else:
        back = download_with_threads(fs, sorted(files), dest)
    assert {name: sha(data) for name, data in back.items()} == {
        name: sha(data) for name, data in files.items()}
    elapsed = time.monotonic() - started

    stats = fs.stats.snapshot()
    injected = len(ep.injected)
    assert injected >= 5, f"the plan barely fired ({injected} of {len(ep.requests())} requests)"
    assert stats["giveups"] == 0, stats
    assert 1 <= stats["retries"] <= injected, (stats["retries"], injected)  # no retry storm
    assert fs.failed_commits() == {}
    print(f"{client} {how}: {len(ep.requests())} requests, {injected} faults, "
          f"{stats['retries']} retries, {elapsed:.1f}s")
    assert elapsed < WALL_CLOCK, f"{elapsed:.1f}s"

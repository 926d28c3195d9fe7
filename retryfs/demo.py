"""`retryfs demo`: a checkpoint uploaded through injected faults, with and without retryfs.

Runs on an embedded default (no cloud account): a local directory as the destination store,
behind ``retryfs.testing.FaultyFileSystem``, which fails writes and commits the way S3 does.
"""

from __future__ import annotations

import hashlib
import logging
import os
import sys
import tempfile
from pathlib import Path

import pyarrow.fs as pafs

from .arrow import RetryingFileSystem
from .policy import RetryPolicy
from .testing.faulty import FaultyFileSystem, errors

MiB = 1024 * 1024


def make_checkpoint(root: Path, sizes: list[int], seed: int = 0) -> dict[str, str]:
    """Write a synthetic checkpoint; returns relative path -> sha256."""
    import random

    rng = random.Random(seed)
    digests = {}
    for i, size in enumerate(sizes):
        rel = "model.pt" if i == 0 else f"shards/optimizer-{i:02d}.bin"
        data = rng.randbytes(size)
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        digests[rel] = hashlib.sha256(data).hexdigest()
    return digests


SCENARIOS = {
    "3 failed commits of model.pt": lambda store: store.inject(
        "close", errors.commit_failed(), path="*/model.pt", times=3),
    "2 part uploads reset, 2 SlowDown": lambda store: (
        store.inject("write", errors.network("UploadPart"), skip=2, times=2),
        store.inject("open_output_stream", errors.throttle(), skip=4, times=2)),
}


def _audit(store_root: Path, digests: dict[str, str]) -> tuple[int, int]:
    """(objects present with identical bytes, objects expected)."""
    good = 0
    for rel, digest in digests.items():
        target = store_root / rel
        if target.exists() and hashlib.sha256(target.read_bytes()).hexdigest() == digest:
            good += 1
    return good, len(digests)


def _upload(label: str, fs: pafs.FileSystem, src: Path, dst: Path) -> str:
    try:
        pafs.copy_files(str(src), str(dst), destination_filesystem=fs, use_threads=True,
                        chunk_size=8 * MiB)
    except Exception as exc:  # noqa: BLE001 - the demo reports what the caller saw
        return f"raised {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
    return "success"


def run(out=sys.stdout) -> int:
    logging.basicConfig(level=logging.WARNING, format="  %(levelname)s %(message)s", stream=out)
    with tempfile.TemporaryDirectory(prefix="retryfs-demo-") as tmp:
        root = Path(tmp)
        src = root / "checkpoint"
        digests = make_checkpoint(src, [24 * MiB] + [MiB + i * 4096 for i in range(7)])
        total = sum(os.path.getsize(src / rel) for rel in digests)
        print(f"A synthetic checkpoint: {len(digests)} files, {total / MiB:.1f} MiB, uploaded "
              "with pyarrow.fs.copy_files to a store that fails like S3.\n", file=out)
        rows = []
        totals = {"calls": 0, "attempts": 0, "retries": 0, "giveups": 0, "bytes_replayed": 0}
        for n, (scenario, inject) in enumerate(SCENARIOS.items()):
            for label in ("pyarrow (plain)", "retryfs"):
                store = FaultyFileSystem(pafs.LocalFileSystem())
                inject(store)
                dst = root / f"{n}-{'plain' if label.startswith('pyarrow') else 'wrapped'}"
                fs: pafs.FileSystem = store
                if label == "retryfs":
                    print(f"retryfs at work, scenario '{scenario}':", file=out)
                    fs = RetryingFileSystem(store, RetryPolicy(max_attempts=6, initial_delay=0.05,
                                                               max_delay=0.5))
                reported = _upload(label, fs, src, dst)
                good, expected = _audit(dst, digests)
                rows.append((scenario, label, reported, f"{good}/{expected} identical"))
                if isinstance(fs, RetryingFileSystem):
                    snap = fs.stats.snapshot()
                    for key in totals:
                        totals[key] += snap[key]
        print(f"\n{'scenario':<34} {'uploaded with':<16} {'copy_files reported':<44} "
              "storage holds", file=out)
        for scenario, label, reported, held in rows:
            print(f"{scenario:<34} {label:<16} {reported[:44]:<44} {held}", file=out)
        print("\nretryfs stats: " + " ".join(f"{k}={v}" for k, v in totals.items()), file=out)
        wrapped_ok = all(held == f"{len(digests)}/{len(digests)} identical"
                         for _, label, _, held in rows if label == "retryfs")
        return 0 if wrapped_ok else 1

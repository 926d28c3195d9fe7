"""What retryfs costs on a real S3 server with no faults: a checkpoint upload and download.

Uploads a checkpoint-shaped directory (one big file over the multipart threshold, many small
ones) with ``pyarrow.fs.copy_files`` to moto's S3 server on loopback (``S3FaultEndpoint`` with
no faults), then downloads it, through:
- pyarrow's native ``S3FileSystem`` (what Ray Train uses by default; ``use_threads=False`` as
  Ray Train does for it),
- ``retryfs.RetryingFileSystem`` around it (threads on, as Ray Train does for any other fs),
- Ray Data's ``RetryingPyFileSystem`` around it (threads on).
Contenders alternate round by round; medians and ratios to native are printed.

Usage: python benchmarks/bench_s3_upload.py [--mib 128] [--rounds 3]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time

import pyarrow.fs as pafs

import retryfs
from retryfs.testing.s3 import S3FaultEndpoint


def make_checkpoint(root: str, mib: int) -> None:
    os.makedirs(os.path.join(root, "shards"))
    big = mib * 3 // 4
    with open(os.path.join(root, "model.pt"), "wb") as f:
        f.write(os.urandom(big << 20))
    small = ((mib - big) << 20) // 32
    for i in range(32):
        with open(os.path.join(root, "shards", f"{i:02d}.bin"), "wb") as f:
            f.write(os.urandom(small))


def contenders(native: pafs.S3FileSystem) -> dict[str, tuple[pafs.FileSystem, bool]]:
    found = {
        "pyarrow S3FileSystem": (native, False),
        "retryfs": (retryfs.RetryingFileSystem(native), True),
    }
    try:
        from ray.data._internal.util import RetryingPyFileSystem

        found["Ray Data RetryingPyFileSystem"] = (
            RetryingPyFileSystem.wrap(native, retryable_errors=["AWS Error"]), True)
    except ImportError:
        pass
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="retryfs-bench-s3-")
    src = os.path.join(work, "ckpt")
    make_checkpoint(src, args.mib)
    up: dict[str, list[float]] = {}
    down: dict[str, list[float]] = {}
    try:
        with S3FaultEndpoint() as endpoint:
            endpoint.create_bucket("bench")
            native = endpoint.pyarrow_fs(max_attempts=3)
            for round_no in range(args.rounds):
                for name, (fs, threads) in contenders(native).items():
                    dest = f"bench/{name.replace(' ', '_')}/{round_no}"
                    started = time.perf_counter()
                    pafs.copy_files(src, dest, destination_filesystem=fs, use_threads=threads,
                                    chunk_size=64 << 20)
                    up.setdefault(name, []).append(time.perf_counter() - started)
                    local = os.path.join(work, "down")
                    started = time.perf_counter()
                    pafs.copy_files(dest, local, source_filesystem=fs, use_threads=True,
                                    chunk_size=64 << 20)
                    down.setdefault(name, []).append(time.perf_counter() - started)
                    shutil.rmtree(local)
                    native.delete_dir(dest)
    finally:
        shutil.rmtree(work)
    base_up = statistics.median(up["pyarrow S3FileSystem"])
    base_down = statistics.median(down["pyarrow S3FileSystem"])
    print(f"copy_files of a {args.mib} MiB checkpoint to/from moto S3 on loopback, "
          f"{args.rounds} rounds, medians")
    print(f"{'filesystem':<32} {'upload s':>9} {'ratio':>6} {'download s':>11} {'ratio':>6}")
    for name in up:
        u, d = statistics.median(up[name]), statistics.median(down[name])
        print(f"{name:<32} {u:>9.2f} {u / base_up:>6.2f} {d:>11.2f} {d / base_down:>6.2f}")


if __name__ == "__main__":
    main()

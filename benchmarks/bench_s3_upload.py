"""What retryfs costs on a real S3 server with no faults: a checkpoint upload and download.

``pyarrow.fs.copy_files`` of a checkpoint-shaped tree to moto's S3 on loopback
(`S3FaultEndpoint` with no faults), then back to local disk, through pyarrow's native
``S3FileSystem`` unwrapped, the ``ProxyHandler`` floor, Ray Data's wrapper and retryfs
(threads on for all), in interleaved rounds.

Usage: python -m benchmarks.bench_s3_upload [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import time

import pyarrow.fs as pafs

from benchmarks.common import UNWRAPPED, Tree, four, scratch, timing_table
from retryfs.testing.s3 import S3FaultEndpoint

QUICK_TREE = Tree(big_files=1, big_mib=12, small_files=10, small_kib=64)
FULL_TREE = Tree(big_files=3, big_mib=128, small_files=300, small_kib=64)


def upload_download(tree: Tree, rounds: int, warmup: bool = True) -> list[str]:
    with scratch("s3") as work, S3FaultEndpoint() as endpoint:
        src = tree.make(os.path.join(work, "ckpt"))
        endpoint.create_bucket("bench-s3")
        native = endpoint.pyarrow_fs(max_attempts=3)  # pyarrow's default schedule
        fss = four(native)
        up: dict[str, list[float]] = {name: [] for name in fss}
        down: dict[str, list[float]] = {name: [] for name in fss}
        first = 0 if warmup else 1
        for round_no in range(first, rounds + 1):  # round 0 warms up and is not counted
            for name, fs in fss.items():
                dest = f"bench-s3/{name.replace(' ', '_')}/{round_no}"
                started = time.perf_counter()
                pafs.copy_files(src, dest, destination_filesystem=fs, use_threads=True,
                                chunk_size=64 << 20)
                uploaded = time.perf_counter() - started
                local = os.path.join(work, "down")
                started = time.perf_counter()
                pafs.copy_files(dest, local, source_filesystem=fs, use_threads=True,
                                chunk_size=64 << 20)
                downloaded = time.perf_counter() - started
                shutil.rmtree(local)
                native.delete_dir(dest)
                endpoint.reset_record()
                if round_no:
                    up[name].append(tree.nbytes / (1 << 20) / uploaded)
                    down[name].append(tree.nbytes / (1 << 20) / downloaded)
    what = f"{tree.describe()}, moto S3 on loopback, {rounds} rounds"
    return [
        timing_table(f"copy_files local -> S3 of {what}", "MiB/s", up, UNWRAPPED, digits=1,
                     ratio_name="throughput ratio"),
        timing_table(f"copy_files S3 -> local (download) of {what}", "MiB/s", down, UNWRAPPED,
                     digits=1, ratio_name="throughput ratio"),
    ]


def run(quick: bool) -> list[str]:
    return upload_download(QUICK_TREE, 2, warmup=False) if quick else upload_download(FULL_TREE, 5)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print("\n\n".join(run(args.quick)))


if __name__ == "__main__":
    main()

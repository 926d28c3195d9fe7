"""What retryfs costs on the happy path of a local filesystem, against the other wrappers.

- per call: ``get_file_info`` of one file, and a small write (open, 4 KiB, close);
- bulk: ``pyarrow.fs.copy_files`` of a checkpoint-shaped tree, local to local (tmpfs when
  there is room), threads on.

Each through the unwrapped ``LocalFileSystem``, the ``PyFileSystem(ProxyHandler(...))`` floor,
Ray Data's ``RetryingPyFileSystem`` and retryfs, in interleaved rounds.

Usage: python -m benchmarks.bench_overhead [--quick]
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable

import pyarrow.fs as pafs

from benchmarks.common import (
    FLOOR,
    RAY,
    UNWRAPPED,
    Tree,
    four,
    interleave,
    scratch,
    section_main,
    timing_table,
)

QUICK_TREE = Tree(big_files=1, big_mib=16, small_files=50, small_kib=64)
FULL_TREE = Tree(big_files=3, big_mib=128, small_files=300, small_kib=64)


def per_call(calls: int, rounds: int) -> list[str]:
    fss = four(pafs.LocalFileSystem())
    payload = os.urandom(4096)
    with scratch("calls") as work:
        path = os.path.join(work, "probe")
        with open(path, "wb") as f:
            f.write(payload)

        def info(fs: pafs.FileSystem) -> Callable[[], float]:
            def run() -> float:
                started = time.thread_time()
                for _ in range(calls):
                    fs.get_file_info(path)
                return (time.thread_time() - started) / calls * 1e6
            return run

        writes = max(1, calls // 20)

        def write(fs: pafs.FileSystem, name: str) -> Callable[[], float]:
            target = os.path.join(work, name.replace(" ", "_"))

            def run() -> float:
                started = time.thread_time()
                for _ in range(writes):
                    with fs.open_output_stream(target) as out:
                        out.write(payload)
                return (time.thread_time() - started) / writes * 1e6
            return run

        infos = interleave({name: info(fs) for name, fs in fss.items()}, rounds)
        small = interleave({name: write(fs, name) for name, fs in fss.items()}, rounds)
    return [
        timing_table(f"get_file_info of a local file, {calls} calls x {rounds} rounds", "CPU us/call",
                     infos, UNWRAPPED, also=(FLOOR, RAY)),
        timing_table(f"small write (open, 4 KiB, close) to tmpfs, {writes} x {rounds} rounds",
                     "CPU us/write", small, UNWRAPPED, also=(FLOOR, RAY)),
    ]


def copy_local(tree: Tree, rounds: int) -> list[str]:
    fss = four(pafs.LocalFileSystem())
    # The source is read through a filesystem that is not equal to the destination for every
    # contender alike, so that each copy goes through the destination's output streams.
    source_fs = pafs.SubTreeFileSystem("/", pafs.LocalFileSystem())
    with scratch("copy") as work:
        src = tree.make(os.path.join(work, "src"))

        def run_copy(name: str, fs: pafs.FileSystem) -> Callable[[], float]:
            def run() -> float:
                dst = os.path.join(work, "dst-" + name.replace(" ", "_"))
                started = time.perf_counter()
                pafs.copy_files(src, dst, source_filesystem=source_fs, destination_filesystem=fs,
                                use_threads=True, chunk_size=64 << 20)
                elapsed = time.perf_counter() - started
                shutil.rmtree(dst)
                return elapsed
            return run

        results = interleave({name: run_copy(name, fs) for name, fs in fss.items()}, rounds)
    mib = tree.nbytes / (1 << 20)
    throughput = {name: [mib / t for t in values] for name, values in results.items()}
    return [timing_table(f"copy_files local -> local (tmpfs) of {tree.describe()}, "
                         f"{rounds} rounds", "MiB/s", throughput, UNWRAPPED, digits=0,
                         ratio_name="throughput ratio")]


def run(quick: bool) -> list[str]:
    if quick:
        return [*per_call(1000, 21), *copy_local(QUICK_TREE, 3)]
    return [*per_call(2000, 51), *copy_local(FULL_TREE, 9)]


if __name__ == "__main__":
    section_main(run, __doc__)

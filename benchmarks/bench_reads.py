"""What serving one large read as sub-reads costs on the happy path, by sub-read size.

A single ``read()`` of a whole 64 MiB object through ``open_input_stream``: unwrapped pyarrow,
and retryfs (as ``from_uri`` builds it) with ``retryfs.datapath.streams.SUB_READ`` set to each size in
turn (the largest, 64 MiB, is one attempt for the whole read, as before sub-reads), in
interleaved rounds, from local tmpfs, moto's S3 (a process of its own) and SeaweedFS's S3.
Each figure: wall-clock MiB/s and the client's CPU seconds per GiB (``time.process_time`` of
this process; the servers' CPU is in theirs). On S3 every sub-read is one ranged GET, so the
size trades requests on the happy path against what one fault costs (at most one sub-read).

Usage: python -m benchmarks.bench_reads [--quick] [--servers local,moto,seaweedfs]
"""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pyarrow.fs as pafs

import retryfs
from benchmarks.bench_s3_upload import SERVERS
from benchmarks.common import UNWRAPPED, MiB, interleave, scratch, timing_table
from retryfs.datapath import streams

SIZES_MIB = (2, 4, 8, 16, 64)
BUCKET = "bench-reads"


def _reader(fs: pafs.FileSystem, path: str, nbytes: int, sub_read: int | None
            ) -> Callable[[], tuple[float, float]]:
    def once() -> tuple[float, float]:
        if sub_read is not None:
            streams.SUB_READ = sub_read
        wall, cpu = time.perf_counter(), time.process_time()
        with fs.open_input_stream(path) as stream:
            got = stream.read(nbytes)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        assert len(got) == nbytes
        return wall, cpu

    return once


@contextmanager
def _served(server: str, nbytes: int) -> Iterator[tuple[pafs.FileSystem, str, str]]:
    """``(unwrapped filesystem, path of an nbytes object, uri for from_uri)``."""
    data = os.urandom(MiB) * (nbytes // MiB)
    if server == "local":
        with scratch("reads") as work:
            path = os.path.join(work, "object")
            with open(path, "wb") as f:
                f.write(data)
            yield pafs.LocalFileSystem(), path, "file://" + work
        return
    serve, key, secret = SERVERS[server]
    with serve(BUCKET) as endpoint:
        native = pafs.S3FileSystem(access_key=key, secret_key=secret, region="us-east-1",
                                   scheme="http", endpoint_override=endpoint)
        with native.open_output_stream(f"{BUCKET}/object") as out:
            out.write(data)
        uri = (f"s3://{key}:{secret}@{BUCKET}?scheme=http&endpoint_override={endpoint}"
               "&region=us-east-1")
        yield native, f"{BUCKET}/object", uri


def one_read(server: str, nbytes: int, rounds: int) -> list[str]:
    default = streams.SUB_READ
    try:
        with _served(server, nbytes) as (native, path, uri):
            wrapped, _ = retryfs.from_uri(uri)
            fns = {UNWRAPPED: _reader(native, path, nbytes, None)}
            for mib in SIZES_MIB:
                if mib * MiB <= nbytes:
                    fns[f"retryfs, {mib} MiB sub-reads"] = _reader(wrapped, path, nbytes,
                                                                   mib * MiB)
            pairs = interleave(fns, rounds)  # type: ignore[arg-type]
    finally:
        streams.SUB_READ = default
    mib = nbytes / MiB
    speed = {name: [mib / wall for wall, _ in runs] for name, runs in pairs.items()}
    cpu = {name: [c / mib * 1024 for _, c in runs] for name, runs in pairs.items()}
    what = f"one read() of a {mib:.0f} MiB object (open_input_stream), {server}, {rounds} rounds"
    return [timing_table(what, "MiB/s", speed, UNWRAPPED, digits=0,
                         ratio_name="throughput ratio"),
            timing_table("  the same: client CPU", "CPU s/GiB", cpu, UNWRAPPED, digits=2,
                         ratio_name="CPU ratio")]


def run(quick: bool, servers: tuple[str, ...] = ("local", "moto", "seaweedfs")) -> list[str]:
    """Quick: local and moto only, small objects, 2 rounds."""
    if quick:
        return one_read("local", 16 * MiB, 2) + one_read("moto", 16 * MiB, 2)
    tables: list[str] = []
    for server in servers:
        if server == "seaweedfs":
            from benchmarks.seaweed import weed_binary
            if weed_binary() is None:
                tables.append("seaweedfs: skipped (weed not installed)")
                continue
        tables += one_read(server, 64 * MiB, 15 if server == "local" else 7)
    return tables


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--servers", default="local,moto,seaweedfs")
    parser.add_argument("--rounds", type=int, default=0, help="override the rounds")
    args = parser.parse_args()
    servers = tuple(s.strip() for s in args.servers.split(",") if s.strip())
    if args.rounds:
        for server in servers:
            print("\n\n".join(one_read(server, 64 * MiB, args.rounds)), flush=True)
    else:
        print("\n\n".join(run(args.quick, servers)))


if __name__ == "__main__":
    main()

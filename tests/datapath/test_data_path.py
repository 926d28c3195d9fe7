"""A fault costs what it broke: bytes and requests counted on the S3 fault endpoint.

Each test puts a real client (pyarrow's native ``S3FileSystem`` or s3fs, their own retries at
one attempt) behind `RetryingFileSystem`, injects faults in the HTTP exchange, and counts what
crossed the wire (``RequestRecord.response_bytes`` for downloads, ``request_bytes`` for
uploads). The sizes are small (moto stores about 40 MB/s here); the ratios are what matter.
"""

from __future__ import annotations

import hashlib
import random

import pytest

from retryfs import RetryingFileSystem, RetryPolicy
from retryfs.datapath import streams
from retryfs.fsspec.filesystem import RetryFileSystem
from retryfs.testing import S3Fault

MiB = 1 << 20
POLICY = RetryPolicy(max_attempts=4, initial_delay=0.001, multiplier=2, max_delay=0.004,
                     jitter=False)
OBJECT = random.Random(13).randbytes(8 * MiB)
MULTIPART = random.Random(14).randbytes(12 * MiB)  # pyarrow: 2 parts of 10 MiB; s3fs: 3 of 5
RESUME_AT = 7 * MiB  # as one reset at 56 MiB of a 64 MiB object


def _sent_by_server(endpoint, op="GetObject") -> int:
    return sum(r.response_bytes for r in endpoint.requests(op=op))


def _ranged_from(offset: int):
    return lambda request: request.headers.get("range", "").startswith(f"bytes={offset}-")


def _read_all(f, chunk: int = MiB) -> bytes:
    parts = []
    while block := f.read(chunk):
        parts.append(block)
    return b"".join(parts)


@pytest.fixture
def stored(s3_fault_endpoint, s3_fault_bucket):
    s3_fault_endpoint.put_object(s3_fault_bucket, "big.bin", OBJECT)
    return f"{s3_fault_bucket}/big.bin"


# -- reads resume with a ranged read -----------------------------------------------------------

@pytest.mark.parametrize("opener", ["open_input_stream", "open_input_file"])
def test_one_reset_late_in_a_read_resumes_at_its_offset(s3_fault_endpoint, stored, opener):
    ep = s3_fault_endpoint
    fs = RetryingFileSystem(ep.pyarrow_fs(), POLICY, budget=False)
    reset = ep.add_fault(S3Fault.reset(op="GetObject", when=_ranged_from(RESUME_AT), times=1))
    with getattr(fs, opener)(stored) as f:
        data = _read_all(f)
    assert data == OBJECT and ep.fired(reset) == 1
    assert fs.stats.snapshot()["by_operation"]["read"]["retries"] == 1
    assert _sent_by_server(ep) <= 1.05 * len(OBJECT)  # was 1.875x: the prefix downloaded again
    # the resumed GET asked for the rest from the offset, not from byte 0
    ranges = [r.headers.get("range", "") for r in ep.requests(op="GetObject")]
    assert sum(rng.startswith(f"bytes={RESUME_AT}-") for rng in ranges) == 2


def test_five_percent_of_gets_resetting_costs_under_five_percent(s3_fault_endpoint, stored):
    ep = s3_fault_endpoint
    fs = RetryingFileSystem(ep.pyarrow_fs(), POLICY, budget=False)
    resets = ep.add_fault(S3Fault.reset(op="GetObject", probability=0.05, seed=7))
    # copy_files' path: open_input_stream, 1 MiB reads
    with fs.open_input_stream(stored) as f:
        data = _read_all(f, MiB // 4)
    assert data == OBJECT and ep.fired(resets) >= 2
    assert _sent_by_server(ep) <= 1.05 * len(OBJECT)


def test_a_truncated_body_resumes_where_the_bytes_stopped(s3_fault_endpoint, stored):
    ep = s3_fault_endpoint
    fs = RetryingFileSystem(ep.pyarrow_fs(), POLICY, budget=False)
    cut = ep.add_fault(S3Fault.truncate(op="GetObject", when=_ranged_from(RESUME_AT), times=1))
    with fs.open_input_stream(stored) as f:
        data = _read_all(f)
    assert data == OBJECT and ep.fired(cut) == 1
    assert _sent_by_server(ep) <= len(OBJECT) + MiB


@pytest.mark.parametrize("face", ["fsspec", "pyarrow-over-s3fs"])
def test_the_fsspec_face_resumes_with_a_ranged_read(s3_fault_endpoint, stored, face):
    ep = s3_fault_endpoint
    inner = ep.s3fs(default_block_size=MiB, default_cache_type="none")
    # aiohttp replays an idempotent request once when the connection drops: reset it twice
    reset = ep.add_fault(S3Fault.reset(op="GetObject", when=_ranged_from(RESUME_AT), times=2))
    if face == "fsspec":
        fs = RetryFileSystem(fs=inner, max_attempts=4, initial_delay=0.001, jitter=False,
                             budget=False)
        f = fs.open(stored, "rb")
    else:
        f = RetryingFileSystem(inner, POLICY, budget=False).open_input_stream(stored)
    with f:
        data = _read_all(f)
    assert data == OBJECT and ep.fired(reset) == 2
    assert _sent_by_server(ep) <= 1.05 * len(OBJECT)


# -- one large read is served as sub-reads: a fault costs one sub-read --------------------------

SUB = MiB  # streams.SUB_READ for these tests: an 8 MiB read is 8 sub-reads


@pytest.fixture
def small_sub_reads(monkeypatch):
    monkeypatch.setattr(streams, "SUB_READ", SUB)


def _covers(offset: int):
    """The GET whose ``Range: bytes=a-b`` holds byte ``offset``."""
    def holds(request) -> bool:
        rng = request.headers.get("range", "")
        if not rng.startswith("bytes="):
            return False
        first, _, last = rng[len("bytes="):].partition("-")
        return int(first) <= offset and (not last or offset <= int(last))
    return holds


def _sha(data) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("opener", ["open_input_stream", "open_input_file"])
def test_a_cut_inside_one_large_read_costs_one_sub_read(s3_fault_endpoint, stored, opener,
                                                       small_sub_reads):
    ep = s3_fault_endpoint
    fs = RetryingFileSystem(ep.pyarrow_fs(), POLICY, budget=False)
    # the worst place: the body of the GET holding byte 7 MiB ends one byte short
    cut = ep.add_fault(S3Fault.truncate(keep_bytes=len(OBJECT), op="GetObject",
                                        when=_covers(RESUME_AT), times=1))
    with getattr(fs, opener)(stored) as f:
        data = f.read(len(OBJECT))  # one read of the whole object
    assert _sha(data) == _sha(OBJECT) and ep.fired(cut) == 1
    assert fs.stats.snapshot()["by_operation"]["read"]["retries"] == 1
    # was 2 GETs and 1.875x: the whole read sent again; now one sub-read of 1 MiB again
    assert len(OBJECT) < _sent_by_server(ep) <= len(OBJECT) + SUB
    assert len(ep.requests(op="GetObject")) == len(OBJECT) // SUB + 1


def test_a_whole_read_of_a_stream_is_served_as_sub_reads(s3_fault_endpoint, stored,
                                                         small_sub_reads):
    ep = s3_fault_endpoint
    fs = RetryingFileSystem(ep.pyarrow_fs(), POLICY, budget=False)
    cut = ep.add_fault(S3Fault.truncate(keep_bytes=len(OBJECT), op="GetObject",
                                        when=_covers(RESUME_AT), times=1))
    with fs.open_input_stream(stored) as f:
        data = f.read()
    assert _sha(data) == _sha(OBJECT) and ep.fired(cut) == 1
    assert _sent_by_server(ep) <= len(OBJECT) + SUB
    assert len(ep.requests(op="GetObject")) == len(OBJECT) // SUB + 1


def test_one_large_read_of_a_stream_keeps_its_sub_reads_in_flight(s3_fault_endpoint, stored,
                                                                   small_sub_reads):
    """``open_input_stream`` on pyarrow S3 opens the random-access file (the same one HEAD),
    so one large read's sub-reads are ranged GETs in flight together: the first, answered
    2 s late, is answered after the others in flight with it (one after the other, it would
    be answered first)."""
    ep = s3_fault_endpoint
    fs = RetryingFileSystem(ep.pyarrow_fs(), POLICY, budget=False)
    late = ep.add_fault(S3Fault.delay(2.0, op="GetObject", when=_ranged_from(0), times=1))
    with fs.open_input_stream(stored) as f:
        data = f.read(len(OBJECT))
    assert _sha(data) == _sha(OBJECT) and ep.fired(late) == 1
    ranges = [r.headers.get("range", "") for r in ep.requests(op="GetObject")]
    assert len(ranges) == len(OBJECT) // SUB
    assert ranges.index(f"bytes=0-{SUB - 1}") >= streams.READ_AHEAD - 1, ranges
    assert len(ep.requests(op="HeadObject")) == 1


@pytest.mark.parametrize("method", ["read", "read_buffer", "readinto"])
def test_a_sub_read_that_waits_does_not_hold_up_the_ones_after_it(s3_fault_endpoint, stored,
                                                                 small_sub_reads, method):
    """A large read into memory keeps `READ_AHEAD` sub-reads unfinished, not `READ_AHEAD`
    sub-reads ahead of the one it waits for: while the first of 8 is answered 2 s late (a
    slow or retried request), the other 7 are answered. Held in order, the first would be
    answered fourth, the last four waiting for it."""
    ep = s3_fault_endpoint
    fs = RetryingFileSystem(ep.pyarrow_fs(), POLICY, budget=False)
    late = ep.add_fault(S3Fault.delay(2.0, op="GetObject", when=_ranged_from(0), times=1))
    with fs.open_input_file(stored) as f:
        if method == "readinto":
            target = bytearray(len(OBJECT))
            assert f.readinto(target) == len(OBJECT)
            data = bytes(target)
        else:
            data = bytes(getattr(f, method)(len(OBJECT)))
    assert _sha(data) == _sha(OBJECT) and ep.fired(late) == 1
    ranges = [r.headers.get("range", "") for r in ep.requests(op="GetObject")]
    assert len(ranges) == len(OBJECT) // SUB  # each sub-read asked once
    assert ranges[-1] == f"bytes=0-{SUB - 1}", ranges


@pytest.mark.parametrize("face", ["pyarrow", "fsspec"])  # ranged sub-reads; sequential ones
def test_a_large_read_that_gives_up_leaves_the_position_where_it_was(s3_fault_endpoint, stored,
                                                                     small_sub_reads, face):
    ep = s3_fault_endpoint
    broken = ep.add_fault(S3Fault.internal_error(op="GetObject", when=_covers(RESUME_AT)))
    if face == "pyarrow":
        f = RetryingFileSystem(ep.pyarrow_fs(), POLICY, budget=False).open_input_file(stored)
    else:
        inner = ep.s3fs(default_block_size=MiB, default_cache_type="none")
        f = RetryFileSystem(fs=inner, max_attempts=4, initial_delay=0.001, jitter=False,
                            budget=False).open(stored, "rb")
    with f:
        with pytest.raises(OSError):
            f.read(len(OBJECT))
        assert f.tell() == 0 and ep.fired(broken) == POLICY.max_attempts
        ep.clear_faults()
        assert _sha(f.read(len(OBJECT))) == _sha(OBJECT)


def test_the_fsspec_face_serves_one_large_read_as_sub_reads(s3_fault_endpoint, stored,
                                                            small_sub_reads):
    ep = s3_fault_endpoint
    inner = ep.s3fs(default_block_size=MiB, default_cache_type="none")
    fs = RetryFileSystem(fs=inner, max_attempts=4, initial_delay=0.001, jitter=False,
                         budget=False)
    cut = ep.add_fault(S3Fault.truncate(keep_bytes=len(OBJECT), op="GetObject",
                                        when=_covers(RESUME_AT), times=1))
    with fs.open(stored, "rb") as f:
        data = f.read(len(OBJECT))
    assert _sha(data) == _sha(OBJECT) and ep.fired(cut) == 1
    assert _sent_by_server(ep) <= len(OBJECT) + SUB


# -- verification is its own metadata call -----------------------------------------------------

#: What a request body carries beyond its payload (pyarrow signs parts in aws-chunked framing).
FRAMING = 64 * 1024


def _uploaded(endpoint) -> int:
    return sum(r.request_bytes for r in endpoint.requests()
               if r.op in ("PutObject", "UploadPart"))


@pytest.mark.parametrize("client", ["pyarrow", "s3fs"])
def test_a_failed_verification_head_sends_no_object_bytes_again(s3_fault_endpoint,
                                                                 s3_fault_bucket, client):
    ep = s3_fault_endpoint
    inner = ep.pyarrow_fs() if client == "pyarrow" else ep.s3fs(default_block_size=5 * MiB)
    fs = RetryingFileSystem(inner, POLICY, budget=False)
    # the 2nd HEAD: the 1st is the look at the destination before the commit (`retryfs.core.proof`:
    # an object this large is proven new by its change)
    head = ep.add_fault(S3Fault.slow_down(op="HeadObject", nth=2))
    with fs.open_output_stream(f"{s3_fault_bucket}/model.pt") as f:
        f.write(MULTIPART)
    data = MULTIPART
    assert ep.fired(head) == 1
    faulted, = ep.requests(op="HeadObject", faulted=True)
    complete, = ep.requests(op="CompleteMultipartUpload")
    assert faulted.seq > complete.seq  # the fault hit the verification, after the commit
    assert ep.get_object(s3_fault_bucket, "model.pt") == data
    assert ep.counts()["CompleteMultipartUpload"] == 1  # committed once
    assert _uploaded(ep) <= len(data) + FRAMING  # was 2x: the HEAD's failure replayed it all
    by_operation = fs.stats.snapshot()["by_operation"]
    assert by_operation["verify"]["retries"] == 1
    assert by_operation["close"]["retries"] == 0



def test_a_verification_that_gives_up_raises_and_sends_nothing_again(s3_fault_endpoint,
                                                                      s3_fault_bucket):
    ep = s3_fault_endpoint
    fs = RetryingFileSystem(ep.pyarrow_fs(), POLICY, budget=False)
    heads = ep.add_fault(S3Fault.internal_error(op="HeadObject"))
    path = f"{s3_fault_bucket}/unproven.bin"
    with pytest.raises(OSError, match="HTTP status 500"):
        with fs.open_output_stream(path) as f:
            f.write(OBJECT[:MiB])
    assert ep.fired(heads) == POLICY.max_attempts
    assert ep.counts()["CompleteMultipartUpload"] == 1
    assert _uploaded(ep) <= MiB + FRAMING
    assert path in fs.failed_commits()  # unproven: copy_files raises rather than trusting it


def test_the_async_reader_resumes_with_ranged_reads(s3_fault_endpoint, stored):
    import asyncio

    ep = s3_fault_endpoint
    fs = RetryFileSystem(fs=ep.s3fs(asynchronous=True), max_attempts=4, initial_delay=0.001,
                         jitter=False, budget=False, asynchronous=True)
    cut = ep.add_fault(S3Fault.truncate(op="GetObject", times=1))  # the body stops halfway

    async def read_all() -> bytes:
        session = await fs.fs.set_session()
        try:
            f = await fs.open_async(stored, "rb")
            parts = []
            async with f:
                while block := await f.read(MiB):
                    parts.append(block)
            return b"".join(parts)
        finally:
            await session.close()

    assert asyncio.run(read_all()) == OBJECT and ep.fired(cut) == 1
    assert _sent_by_server(ep) <= 1.05 * len(OBJECT)  # was 1.5x: the first half sent again


# -- a failed part re-sends that part ----------------------------------------------------------

PART = 10 * MiB  # pyarrow's part size (retryfs.testing.PYARROW_PART_SIZE)
S3FS_PART = 5 * MiB
UPLOAD = random.Random(15).randbytes(2 * PART + MiB)  # pyarrow: 3 parts; s3fs: 5


def _write_in_chunks(fs, path: str, data: bytes) -> None:
    with fs.open_output_stream(path) as f:
        for start in range(0, len(data), MiB):  # as copy_files writes
            f.write(data[start:start + MiB])


@pytest.mark.parametrize("client", ["pyarrow", "s3fs"])
def test_one_failed_part_re_sends_that_part(s3_fault_endpoint, s3_fault_bucket, client):
    ep = s3_fault_endpoint
    if client == "pyarrow":  # retryfs the only layer for the rest: client_attempts=1
        fs, part = RetryingFileSystem(ep.pyarrow_fs(), POLICY, budget=False,
                                      client_attempts=1), PART
    else:
        fs, part = RetryingFileSystem(ep.s3fs(default_block_size=S3FS_PART), POLICY,
                                      budget=False), S3FS_PART
    parts = -(-len(UPLOAD) // part)
    failed = ep.add_fault(S3Fault.internal_error(op="UploadPart", query={"partNumber": parts - 1},
                                                 times=1))
    _write_in_chunks(fs, f"{s3_fault_bucket}/shard.bin", UPLOAD)
    assert ep.get_object(s3_fault_bucket, "shard.bin") == UPLOAD and ep.fired(failed) == 1
    assert ep.counts()["UploadPart"] == parts + 1  # was 2 x parts: the stream replayed
    assert _uploaded(ep) <= len(UPLOAD) + part + FRAMING
    assert ep.counts()["CreateMultipartUpload"] == 1
    assert fs.stats.snapshot()["bytes_replayed"] == 0


@pytest.mark.parametrize("client", ["pyarrow", "s3fs"])
def test_a_seeded_rate_of_failed_parts_costs_only_those_parts(s3_fault_endpoint, s3_fault_bucket,
                                                              client):
    """Each failed part costs one part: bytes = object + failed parts (at 2 % of parts that is
    1.02x at any size; the rate here is higher so that a small object sees several)."""
    ep = s3_fault_endpoint
    if client == "pyarrow":
        fs, part = RetryingFileSystem(ep.pyarrow_fs(), POLICY, budget=False,
                                      client_attempts=1), PART
    else:
        fs, part = RetryingFileSystem(ep.s3fs(default_block_size=S3FS_PART), POLICY,
                                      budget=False), S3FS_PART
    # seed 2 fails the 3rd and 4th of the first seven draws: whatever order the parts go out
    # in, no part fails more than twice (within the SDK's 3 attempts)
    faults = ep.add_fault(S3Fault.internal_error(op="UploadPart", probability=0.25, seed=2))
    _write_in_chunks(fs, f"{s3_fault_bucket}/shard.bin", UPLOAD)
    fired = ep.fired(faults)
    assert ep.get_object(s3_fault_bucket, "shard.bin") == UPLOAD and fired >= 2
    assert ep.counts()["UploadPart"] == -(-len(UPLOAD) // part) + fired
    assert _uploaded(ep) <= len(UPLOAD) + fired * part + FRAMING
    assert fs.stats.snapshot()["bytes_replayed"] == 0


# -- copy_files onto retryfs: native streams, the source re-read -------------------------------

def _tree(root) -> dict[str, bytes]:
    rng = random.Random(16)
    files = {"model.pt": rng.randbytes(2 * PART + MiB), "meta/a.json": b'{"epoch": 1}',
             "meta/b.json": rng.randbytes(3000)}
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return files


@pytest.mark.parametrize("part_failures", [1, 3], ids=["sdk-resends-the-part", "file-re-read"])
def test_copy_files_to_s3_re_reads_the_source_not_a_spool(s3_fault_endpoint, s3_fault_bucket,
                                                          tmp_path, part_failures):
    """One failed part: the write client's SDK re-sends it (one part extra). Three in a row
    (its 3 attempts): the file's attempt fails and is copied again from its source."""
    import pyarrow.fs as pafs

    ep = s3_fault_endpoint
    files = _tree(tmp_path)
    fs = RetryingFileSystem(ep.pyarrow_fs(), POLICY, budget=False, client_attempts=1)
    failed = ep.add_fault(S3Fault.internal_error(op="UploadPart", path="*/model.pt",
                                                 query={"partNumber": 2}, times=part_failures))
    pafs.copy_files(str(tmp_path), f"{s3_fault_bucket}/ckpt", destination_filesystem=fs,
                    use_threads=True)
    for name, data in files.items():
        assert ep.get_object(s3_fault_bucket, f"ckpt/{name}") == data, name
    assert ep.fired(failed) == part_failures
    copies = fs.stats.snapshot()["by_operation"]["copy_files"]
    assert copies["calls"] == len(files) and copies["retries"] == (part_failures == 3)
    assert fs.stats.snapshot()["bytes_replayed"] == 0  # nothing went through a replay spool
    big = len(files["model.pt"])
    sent = sum(r.request_bytes for r in ep.requests(op="UploadPart", path="*/model.pt"))
    # the object, each failed send of part 2, and (once the SDK's attempts ran out) the file
    # copied again from its source: never a replay of a spool on top
    allowed = big + part_failures * PART + (big if part_failures == 3 else 0)
    assert sent <= allowed + FRAMING


def test_copy_files_of_a_file_that_never_commits_raises(s3_fault_endpoint, s3_fault_bucket,
                                                        tmp_path):
    import pyarrow.fs as pafs

    ep = s3_fault_endpoint
    # 6 MiB, above retryfs.arrow.filesystem.ONE_PART: the multipart write client, whose commit can fail
    # inside a 200 (a file within one part is a single PutObject, as meta.json)
    (tmp_path / "model.pt").write_bytes(OBJECT[:6 * MiB])
    (tmp_path / "meta.json").write_bytes(b"{}")
    fs = RetryingFileSystem(ep.pyarrow_fs(), POLICY, budget=False, client_attempts=1,
                            client_write_attempts=1)
    ep.add_fault(S3Fault.error_in_200(path="*/model.pt"))  # every commit of model.pt
    with pytest.raises(OSError, match="CompleteMultipartUpload") as info:
        pafs.copy_files(str(tmp_path), f"{s3_fault_bucket}/ckpt", destination_filesystem=fs)
    assert "model.pt" in "\n".join(getattr(info.value, "__notes__", []))
    assert f"{s3_fault_bucket}/ckpt/model.pt" in fs.failed_commits()
    assert "ckpt/model.pt" not in ep.keys(s3_fault_bucket)
    assert ep.get_object(s3_fault_bucket, "ckpt/meta.json") == b"{}"
    counts = ep.counts()
    assert counts["CompleteMultipartUpload"] == POLICY.max_attempts and counts["PutObject"] == 1

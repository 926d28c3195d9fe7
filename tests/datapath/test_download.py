"""``copy_files`` from a retryfs source (a download): native streams, reads resumed at their
offset, never a partial destination (`retryfs.datapath.download`).

Counted on the S3 fault endpoint: requests and the bytes the server sent. Without the native
download, Arrow's own copy read the source through ``PythonFile`` and, when the source failed
for good, closed the destination stream, committing the prefix as the file (a partial local
file, a partial S3 object over the old one) and dropping the source's metadata.
"""

from __future__ import annotations

import itertools
import os
import random
import tempfile

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from _helpers import FAST, sha256
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from retryfs import RetryingFileSystem
from retryfs.datapath.download import unlisted_parents
from retryfs.testing import S3Fault

MiB = 1 << 20
CHUNK = MiB
OBJECT = random.Random(21).randbytes(6 * MiB)
OLD = b"checkpoint 1: the old, complete file"


def _range_from(offset: int):
    return lambda request: request.headers.get("range", "").startswith(f"bytes={offset}-")


def _not_from_zero(request) -> bool:
    return not request.headers.get("range", "").startswith("bytes=0-")


def _gets(ep, key: str):
    return ep.requests(op="GetObject", path=f"*/{key}")


def _source(ep) -> RetryingFileSystem:
    return RetryingFileSystem(ep.pyarrow_fs(), FAST, budget=False, client_attempts=1)


def test_a_cut_mid_download_resends_at_most_the_chunk_being_read(s3_fault_endpoint,
                                                                  s3_fault_bucket, tmp_path):
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    ep.put_object(bucket, "ckpt/model.pt", OBJECT)
    at = 4 * MiB  # the GET of the 5th chunk delivers half of it, then the connection closes
    cut = ep.add_fault(S3Fault.truncate(keep_bytes=CHUNK // 2, op="GetObject",
                                        when=_range_from(at), times=1))
    fs = _source(ep)
    pafs.copy_files(f"{bucket}/ckpt/model.pt", str(tmp_path / "model.pt"), source_filesystem=fs,
                    chunk_size=CHUNK)
    assert ep.fired(cut) == 1
    assert sha256((tmp_path / "model.pt").read_bytes()) == sha256(OBJECT)
    gets = _gets(ep, "model.pt")
    # one GET per chunk, the cut one asked again from its offset (a ranged read), not from 0
    assert len(gets) == len(OBJECT) // CHUNK + 1
    assert sum(_range_from(at)(r) for r in gets) == 2
    assert sum(r.response_bytes for r in gets) <= len(OBJECT) + CHUNK
    assert fs.stats.snapshot()["by_operation"]["read"]["retries"] == 1
    assert os.listdir(tmp_path) == ["model.pt"]  # no temporary file left beside


def _tree(ep, bucket: str) -> dict[str, bytes]:
    rng = random.Random(22)
    files = {"a.json": b'{"epoch": 1}', "model.pt": OBJECT, "shards/0.bin": rng.randbytes(3000),
             "shards/1.bin": rng.randbytes(70_000)}
    for name, data in files.items():
        ep.put_object(bucket, f"ckpt/{name}", data)
    return files


def _on_disk(root) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in root.rglob("*")
            if p.is_file()}


@pytest.mark.parametrize("use_threads", [True, False], ids=["threaded", "serial"])
def test_a_source_that_fails_for_good_leaves_no_destination_file(s3_fault_endpoint,
                                                                 s3_fault_bucket, tmp_path,
                                                                 use_threads):
    """After its first chunk, every GET of model.pt is reset (and every GET of shards/1.bin):
    its read gives up after exactly the policy's attempts, copy_files raises the storage
    error, and model.pt is not on disk (no prefix, no temporary file). Threaded, every other
    file is copied (as Arrow's copy does) and the note names both failed files; serial, the
    copy stops at model.pt (the listing's order: a.json before, shards after)."""
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    files = _tree(ep, bucket)
    fs = _source(ep)
    reset = ep.add_fault(S3Fault.reset(op="GetObject", path="*/model.pt", when=_not_from_zero))
    ep.add_fault(S3Fault.reset(op="GetObject", path="*/shards/1.bin"))
    down = tmp_path / "down"
    with pytest.raises(OSError, match="GetObject") as info:
        pafs.copy_files(f"{bucket}/ckpt", str(down), source_filesystem=fs, chunk_size=CHUNK,
                        use_threads=use_threads)
    notes = "\n".join(info.value.__notes__)
    assert "'retryfs-test/ckpt/model.pt' gave up after 4 attempt" in notes
    assert ep.fired(reset) == FAST.max_attempts
    assert len(_gets(ep, "model.pt")) == 1 + FAST.max_attempts  # the good chunk, then 4 tries
    reads = fs.stats.snapshot()["by_operation"]["read"]
    failed = 2 if use_threads else 1
    assert reads["giveups"] == failed and reads["retries"] == failed * (FAST.max_attempts - 1)
    copied = _on_disk(down)
    assert "model.pt" not in copied and "shards/1.bin" not in copied
    expected = {name: data for name, data in files.items()
                if name not in ("model.pt", "shards/1.bin")}
    if use_threads:
        assert "did not copy 2 files" in notes and "shards/1.bin" in notes
    else:
        expected = {"a.json": files["a.json"]}
        assert not _gets(ep, "shards/1.bin")  # never started
    assert {n: sha256(d) for n, d in copied.items()} == {n: sha256(d)
                                                          for n, d in expected.items()}
    assert not [name for name in os.listdir(down) if name.startswith(".")]


def test_a_download_to_s3_keeps_the_old_object_and_the_metadata(s3_fault_endpoint,
                                                                s3_fault_bucket):
    """Onto an unwrapped S3 destination: a failed source commits nothing over the old object
    (no PutObject, no completed upload), and a good copy keeps the source's Content-Type."""
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    native = ep.pyarrow_fs()
    with native.open_output_stream(f"{bucket}/src/model.pt",
                                   metadata={"Content-Type": "application/x-checkpoint"}) as out:
        out.write(OBJECT)
    ep.put_object(bucket, "dst/model.pt", OLD)
    fs = _source(ep)
    reset = ep.add_fault(S3Fault.reset(op="GetObject", path="*/src/model.pt",
                                       when=_not_from_zero))
    with pytest.raises(OSError, match="GetObject"):
        pafs.copy_files(f"{bucket}/src", f"{bucket}/dst", source_filesystem=fs,
                        destination_filesystem=native, chunk_size=CHUNK)
    assert ep.fired(reset) == FAST.max_attempts
    assert ep.get_object(bucket, "dst/model.pt") == OLD, "a partial copy landed"
    assert not [r for r in ep.requests() if r.path == f"{bucket}/dst/model.pt"
                and r.op in ("PutObject", "UploadPart", "CompleteMultipartUpload")]
    ep.clear_faults()
    pafs.copy_files(f"{bucket}/src", f"{bucket}/dst", source_filesystem=fs,
                    destination_filesystem=native, chunk_size=CHUNK)
    assert sha256(ep.get_object(bucket, "dst/model.pt")) == sha256(OBJECT)
    with native.open_input_stream(f"{bucket}/dst/model.pt") as f:
        assert f.metadata()["Content-Type"] == b"application/x-checkpoint"


# -- large chunks (Ray Train's 64 MiB): sub-reads in flight ---------------------------------------

BIG_CHUNK = 64 * MiB
SUB = 8 * MiB  # retryfs.datapath.streams.SUB_READ
LARGE = random.Random(23).randbytes(5 * SUB - 1000)  # five sub-reads, the last one short


def _ranges(gets) -> list[str]:
    return [r.headers.get("range", "") for r in gets]


def test_a_large_chunk_is_read_as_ranged_sub_reads_in_flight_together(s3_fault_endpoint,
                                                                      s3_fault_bucket,
                                                                      tmp_path):
    """One read of a 64 MiB chunk through a stream would be one GET holding the whole chunk,
    its sub-reads one after the other as many GETs each waiting for its round trip. The file
    is opened for random access (one HEAD) and its five sub-reads are ranged GETs in flight
    at once: the one from byte 0, answered 2 s late, is the last to be answered (one at a
    time it would be the first), and the bytes are the file's."""
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    ep.put_object(bucket, "ckpt/model.pt", LARGE)
    late = ep.add_fault(S3Fault.delay(2.0, op="GetObject", when=_range_from(0), times=1))
    fs = _source(ep)
    (tmp_path / "down").mkdir()
    pafs.copy_files(f"{bucket}/ckpt", str(tmp_path / "down"), source_filesystem=fs,
                    chunk_size=BIG_CHUNK)
    assert ep.fired(late) == 1
    assert sha256((tmp_path / "down" / "model.pt").read_bytes()) == sha256(LARGE)
    gets = _gets(ep, "model.pt")
    expected = [f"bytes={start}-{min(start + SUB, len(LARGE)) - 1}"
                for start in range(0, len(LARGE), SUB)]
    assert sorted(_ranges(gets)) == sorted(expected)  # one GET per sub-read, none again
    assert _ranges(gets)[-1] == expected[0], _ranges(gets)  # answered after all the others
    assert len(ep.requests(op="HeadObject", path="*/model.pt")) == 1
    assert sum(r.response_bytes for r in gets) == len(LARGE)
    assert fs.stats.snapshot()["by_operation"]["read"]["retries"] == 0


def test_in_a_tree_a_small_chunk_reads_a_large_file_in_sub_reads(s3_fault_endpoint,
                                                                  s3_fault_bucket, tmp_path):
    """copy_files's default 1 MiB chunk: a listed file of 20 MiB is three ranged GETs (8, 8
    and 4 MiB, one in flight), not twenty GETs of 1 MiB one after the other; a cut in the
    second costs that sub-read once more, and the bytes are the file's."""
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    data = random.Random(23).randbytes(2 * SUB + SUB // 2)
    ep.put_object(bucket, "ckpt/model.pt", data)
    ep.put_object(bucket, "ckpt/a.json", b"{}")
    cut = ep.add_fault(S3Fault.truncate(op="GetObject", when=_range_from(SUB), times=1))
    fs = _source(ep)
    (tmp_path / "down").mkdir()
    pafs.copy_files(f"{bucket}/ckpt", str(tmp_path / "down"), source_filesystem=fs,
                    chunk_size=MiB)
    assert ep.fired(cut) == 1
    assert (tmp_path / "down" / "model.pt").read_bytes() == data
    gets = _gets(ep, "model.pt")
    assert _ranges(gets) == [f"bytes=0-{SUB - 1}", f"bytes={SUB}-{2 * SUB - 1}",
                             f"bytes={SUB}-{2 * SUB - 1}", f"bytes={2 * SUB}-{len(data) - 1}"]
    assert sum(r.response_bytes for r in gets) <= len(data) + SUB
    assert fs.stats.snapshot()["by_operation"]["read"]["retries"] == 1


def test_in_a_tree_a_large_file_has_one_sub_read_in_flight_until_the_others_are_done(
        s3_fault_endpoint, s3_fault_bucket, tmp_path):
    """A tree of one large file and ten small ones, 8 IO threads (`TreeShare`). While the
    small files are copied, the large one has one sub-read in flight: its first, answered 2 s
    late, is the first of its GETs answered, after every small file's. Then it has the lanes
    to itself: its second sub-read, answered 1 s late, is the last one answered (its third to
    fifth were in flight beside it). The bytes are every file's."""
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    ep.put_object(bucket, "ckpt/model.pt", LARGE)
    small = {f"ckpt/shards/{i}.bin": random.Random(i).randbytes(1000) for i in range(10)}
    for key, data in small.items():
        ep.put_object(bucket, key, data)
    first = ep.add_fault(S3Fault.delay(2.0, op="GetObject", when=_range_from(0), times=1,
                                       path=f"{bucket}/ckpt/model.pt"))
    second = ep.add_fault(S3Fault.delay(1.0, op="GetObject", when=_range_from(SUB), times=1,
                                        path=f"{bucket}/ckpt/model.pt"))
    fs = _source(ep)
    down = tmp_path / "down"
    down.mkdir()
    threads = pa.io_thread_count()
    pa.set_io_thread_count(8)
    try:
        pafs.copy_files(f"{bucket}/ckpt", str(down), source_filesystem=fs,
                        chunk_size=BIG_CHUNK)
    finally:
        pa.set_io_thread_count(threads)
    assert ep.fired(first) == 1 and ep.fired(second) == 1
    assert sha256((down / "model.pt").read_bytes()) == sha256(LARGE)
    for key, data in small.items():
        assert (down / key.removeprefix("ckpt/")).read_bytes() == data
    ranges = _ranges(_gets(ep, "model.pt"))
    assert len(ranges) == 5, ranges
    assert ranges[0] == f"bytes=0-{SUB - 1}" and ranges[-1] == f"bytes={SUB}-{2 * SUB - 1}"
    answered = [r.path for r in ep.requests(op="GetObject")]
    assert answered.index(f"{bucket}/ckpt/model.pt") == len(small)  # after every small file


def test_a_trees_files_share_the_io_threads_left_to_them() -> None:
    from retryfs.datapath.download import MAX_WINDOW, TreeShare
    share = TreeShare(8, 101)
    assert share() == 1
    for _ in range(97):
        share.file_done()
    assert share() == 2  # 4 files left
    for _ in range(3):
        share.file_done()
    assert share() == MAX_WINDOW == 8  # the last file alone
    assert TreeShare(16, 1)() == 8 and TreeShare(8, 2)() == 4 and TreeShare(8, 3)() == 2
    assert TreeShare(0, 5)() == 1 and TreeShare(1, 0)() == 1


def test_a_cut_sub_read_costs_that_sub_read_only(s3_fault_endpoint, s3_fault_bucket, tmp_path):
    """A GET cut half-way through the third sub-read: that sub-read alone is asked again
    (the same range), the others are not; the server sends the file plus at most one
    sub-read."""
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    ep.put_object(bucket, "ckpt/model.pt", LARGE)
    third = f"bytes={2 * SUB}-{3 * SUB - 1}"
    cut = ep.add_fault(S3Fault.truncate(keep_bytes=SUB // 2, op="GetObject", times=1,
                                        when=lambda r: r.headers.get("range") == third))
    fs = _source(ep)
    pafs.copy_files(f"{bucket}/ckpt/model.pt", str(tmp_path / "model.pt"),
                    source_filesystem=fs, chunk_size=BIG_CHUNK)
    assert ep.fired(cut) == 1
    assert sha256((tmp_path / "model.pt").read_bytes()) == sha256(LARGE)
    ranges = _ranges(_gets(ep, "model.pt"))
    assert len(ranges) == 5 + 1 and ranges.count(third) == 2
    assert sum(r.response_bytes for r in _gets(ep, "model.pt")) <= len(LARGE) + SUB
    assert fs.stats.snapshot()["by_operation"]["read"]["retries"] == 1
    assert os.listdir(tmp_path) == ["model.pt"]


@pytest.mark.parametrize("use_threads", [True, False], ids=["threaded", "serial"])
def test_a_sub_read_that_fails_for_good_leaves_no_destination_file(s3_fault_endpoint,
                                                                   s3_fault_bucket, tmp_path,
                                                                   use_threads):
    """Every GET of the fourth sub-read reset: the read gives up after the policy's attempts,
    copy_files raises the storage error, and no file, prefix or temporary, is on disk."""
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    ep.put_object(bucket, "ckpt/model.pt", LARGE)
    fourth = f"bytes={3 * SUB}-{4 * SUB - 1}"
    reset = ep.add_fault(S3Fault.reset(op="GetObject",
                                       when=lambda r: r.headers.get("range") == fourth))
    fs = _source(ep)
    down = tmp_path / "down"
    down.mkdir()
    with pytest.raises(OSError, match="GetObject"):
        pafs.copy_files(f"{bucket}/ckpt", str(down), source_filesystem=fs,
                        chunk_size=BIG_CHUNK, use_threads=use_threads)
    assert ep.fired(reset) == FAST.max_attempts
    reads = fs.stats.snapshot()["by_operation"]["read"]
    assert reads["giveups"] == 1 and reads["retries"] == FAST.max_attempts - 1
    assert not list(down.rglob("*.pt")) and not [p for p in down.rglob(".*")]


def test_which_downloads_keep_sub_reads_in_flight() -> None:
    """A file of several sub-reads on S3 or Azure (through a SubTreeFileSystem too), as many
    in flight as one chunk holds, and one for a smaller chunk of a file whose size the listing
    gave; never GCS (its input file opens lazily holding the GIL), a local disk, a small file,
    or a small chunk of one file whose size is unknown (a stream)."""
    from retryfs.datapath.download import _window
    s3 = pafs.S3FileSystem(anonymous=True, region="us-east-1")
    assert _window(s3, BIG_CHUNK, None) == 8
    assert _window(s3, BIG_CHUNK, 100 * MiB) == 8
    assert _window(pafs.SubTreeFileSystem("bucket/base", s3), BIG_CHUNK, None) == 8
    assert _window(s3, 3 * SUB, 3 * SUB) == 3 and _window(s3, 2 * SUB + 1, None) == 3
    assert _window(s3, 1024 * 1024 * 1024, None) == 8  # at most 64 MiB in flight
    assert _window(s3, SUB, None) == 0 and _window(s3, MiB, None) == 0
    assert _window(s3, MiB, SUB + 1) == 1 and _window(s3, SUB, 3 * SUB) == 1
    assert _window(s3, BIG_CHUNK, SUB) == 0
    assert _window(pafs.LocalFileSystem(), BIG_CHUNK, None) == 0
    gcs = pafs.GcsFileSystem(anonymous=True, endpoint_override="localhost:1", scheme="http")
    assert _window(gcs, BIG_CHUNK, None) == 0


def test_a_threaded_tree_runs_one_task_per_io_thread_not_one_per_file(tmp_path, monkeypatch):
    """30 small files, 3 IO threads: 3 lanes, each taking the listing's next file when done
    with its last, at most 3 files at a time (not a task, a future and a semaphore per
    file: `_download_in_lanes`). Every file is copied; of two that fail, the first in the
    listing is raised, with a note naming both, whichever failed first in time."""
    import threading

    import retryfs.datapath.download as native_download

    src, down = tmp_path / "src", tmp_path / "down"
    files = {f"{i:02d}.bin": random.Random(i).randbytes(3000 + i) for i in range(30)}
    src.mkdir()
    for name, data in files.items():
        (src / name).write_bytes(data)
    for broken in ("07.bin", "21.bin"):  # a directory in the way of these two
        (down / broken).mkdir(parents=True)
    submitted, running, most = [], [0], [0]
    lock, later_failed = threading.Lock(), threading.Event()
    real_download, real_background = native_download._download, native_download.in_background

    def counted(*args, **kwargs):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            if args[1].endswith("21.bin"):  # the later one fails first
                later_failed.set()
                raise IsADirectoryError(21, "in the way", args[3])
            if args[1].endswith("07.bin"):
                assert later_failed.wait(10)
            return real_download(*args, **kwargs)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr(native_download, "_download", counted)
    monkeypatch.setattr(native_download, "in_background",
                        lambda fn: submitted.append(fn) or real_background(fn))
    threads = pa.io_thread_count()
    pa.set_io_thread_count(3)
    try:
        with pytest.raises(OSError) as raised:
            pafs.copy_files(str(src), str(down), source_filesystem=RetryingFileSystem(
                pafs.LocalFileSystem(), FAST, budget=False))
    finally:
        pa.set_io_thread_count(threads)
    assert len(submitted) == 3 and most[0] <= 3
    assert "07.bin" in str(raised.value) and "did not copy 2 files" in "".join(
        getattr(raised.value, "__notes__", []))
    for name, data in files.items():
        if name not in ("07.bin", "21.bin"):
            assert sha256((down / name).read_bytes()) == sha256(data), name


def test_a_file_that_grew_since_the_listing_is_read_in_growing_reads(tmp_path):
    """Listed at 10 bytes and empty, two files have grown to 1 MiB when they are copied by the
    resumable reader (a read timeout keeps them off `_copied_whole`): each is copied whole,
    past its listed size in reads twice as large each time (41 reads for both), not in reads
    of its listed size (1,153,444 for both before)."""
    src, down = tmp_path / "src", tmp_path / "down"
    src.mkdir()
    down.mkdir()
    (src / "log.txt").write_bytes(b"0123456789")
    (src / "empty.txt").write_bytes(b"")
    grown = {name: random.Random(name).randbytes(MiB + 7) for name in ("log.txt", "empty.txt")}
    fs = RetryingFileSystem(pafs.LocalFileSystem(), FAST, budget=False, timeout={"read": 60})
    listing = fs.handler.get_file_info_selector

    def listed_then_grown(selector):
        infos = listing(selector)
        for name, data in grown.items():
            (src / name).write_bytes(data)
        return infos

    fs.handler.get_file_info_selector = listed_then_grown
    pafs.copy_files(str(src), str(down), source_filesystem=fs, chunk_size=BIG_CHUNK)
    for name, data in grown.items():
        assert sha256((down / name).read_bytes()) == sha256(data), name
    reads = fs.stats.snapshot()["by_operation"]["read"]["calls"]
    assert reads <= 2 * 22, reads


# -- small files onto a local disk: whole-file attempts of Arrow's own copy ----------------------

SMALL = random.Random(24).randbytes(700_000)  # under WHOLE_FILE (1 MiB)


@pytest.mark.parametrize("read_timeout", [None, 60.0], ids=["whole", "resumable"])
def test_a_small_file_cut_mid_get_costs_what_a_resumable_read_costs(s3_fault_endpoint,
                                                                    s3_fault_bucket, tmp_path,
                                                                    read_timeout):
    """A small file's GET cut after 300,000 bytes: the file arrives whole, nothing beside it,
    one retry. Copied whole (`_copied_whole`), it is one call of ``read``, whose retry is the
    whole file again. Under a read timeout the resumable reader opens it (``open_input_stream``)
    and reads it in calls of ``read``; its one GET held the whole file, so its resume is a HEAD
    and a GET from byte 0 too: the same requests and bytes either way."""
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    ep.put_object(bucket, "ckpt/meta/small.bin", SMALL)
    cut = ep.add_fault(S3Fault.truncate(keep_bytes=300_000, op="GetObject", times=1))
    timeouts = {} if read_timeout is None else {"timeout": {"read": read_timeout}}
    fs = RetryingFileSystem(ep.pyarrow_fs(), FAST, budget=False, client_attempts=1, **timeouts)
    down = tmp_path / "down"
    down.mkdir()
    pafs.copy_files(f"{bucket}/ckpt", str(down), source_filesystem=fs)
    assert ep.fired(cut) == 1
    assert sha256((down / "meta" / "small.bin").read_bytes()) == sha256(SMALL)
    assert os.listdir(down / "meta") == ["small.bin"]
    gets = _gets(ep, "small.bin")
    assert _ranges(gets) == [f"bytes=0-{len(SMALL) - 1}"] * 2
    assert len(ep.requests(op="HeadObject", path="*/small.bin")) == 2
    assert sum(r.response_bytes for r in gets) == len(SMALL) + 300_000
    by_operation = fs.stats.snapshot()["by_operation"]
    assert by_operation["read"]["retries"] == 1
    if read_timeout is None:
        assert by_operation["read"]["calls"] == 1 and "open_input_stream" not in by_operation
    else:
        assert by_operation["read"]["calls"] >= 2
        assert by_operation["open_input_stream"]["calls"] == 1


def test_a_small_file_that_fails_for_good_is_tried_the_policys_attempts(s3_fault_endpoint,
                                                                        s3_fault_bucket,
                                                                        tmp_path):
    """Every GET of a small file reset: exactly ``max_attempts`` whole-file attempts (one GET
    each: the SDK's own retries are off), the storage error raised with retryfs's note, and
    nothing on disk, neither the file nor a temporary one beside it."""
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    ep.put_object(bucket, "ckpt/small.bin", SMALL)
    ep.put_object(bucket, "ckpt/other.bin", b"fine")
    reset = ep.add_fault(S3Fault.reset(op="GetObject", path="*/small.bin"))
    fs = _source(ep)
    down = tmp_path / "down"
    down.mkdir()
    with pytest.raises(OSError, match="GetObject") as info:
        pafs.copy_files(f"{bucket}/ckpt", str(down), source_filesystem=fs)
    assert ep.fired(reset) == FAST.max_attempts == len(_gets(ep, "small.bin"))
    assert sum(r.response_bytes for r in _gets(ep, "small.bin")) == 0  # reset before a byte
    assert f"gave up after {FAST.max_attempts} attempt" in "\n".join(info.value.__notes__)
    reads = fs.stats.snapshot()["by_operation"]["read"]
    assert reads["giveups"] == 1 and reads["retries"] == FAST.max_attempts - 1
    assert os.listdir(down) == ["other.bin"]


def test_a_destination_error_of_a_small_file_is_not_retried(tmp_path):
    """A directory in the way of a small file's destination: the rename into place fails
    (a local error, not a transient one), once; the temporary copy beside is removed and the
    other file is copied."""
    src, down = tmp_path / "src", tmp_path / "down"
    src.mkdir()
    (src / "a.bin").write_bytes(b"a" * 5000)
    (src / "b.bin").write_bytes(b"b" * 5000)
    (down / "a.bin").mkdir(parents=True)
    (down / "a.bin" / "keep").write_bytes(b"")
    fs = RetryingFileSystem(pafs.LocalFileSystem(), FAST, budget=False)
    with pytest.raises(OSError):
        pafs.copy_files(str(src), str(down), source_filesystem=fs)
    reads = fs.stats.snapshot()["by_operation"]["read"]
    assert reads["retries"] == 0 and reads["giveups"] == 0
    assert sorted(os.listdir(down)) == ["a.bin", "b.bin"]
    assert (down / "b.bin").read_bytes() == b"b" * 5000


def test_a_small_object_replaced_since_the_listing_is_read_in_whole_file_reads(
        s3_fault_endpoint, s3_fault_bucket, tmp_path):
    """Listed at 10 bytes and empty, two objects are replaced by 1 MiB + 7 bytes before their
    copy: each arrives whole in 2 GETs (reads of `WHOLE_FILE`), not in GETs of its listed
    size (a byte each for the empty one: a million)."""
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    ep.put_object(bucket, "ckpt/log.txt", b"0123456789")
    ep.put_object(bucket, "ckpt/empty.txt", b"")
    grown = {name: random.Random(name).randbytes(MiB + 7) for name in ("log.txt", "empty.txt")}
    fs = _source(ep)
    listing = fs.handler.get_file_info_selector

    def listed_then_replaced(selector):
        infos = listing(selector)
        for name, data in grown.items():
            ep.put_object(bucket, f"ckpt/{name}", data)
        return infos

    fs.handler.get_file_info_selector = listed_then_replaced
    down = tmp_path / "down"
    down.mkdir()
    pafs.copy_files(f"{bucket}/ckpt", str(down), source_filesystem=fs, use_threads=False)
    for name, data in grown.items():
        assert sha256((down / name).read_bytes()) == sha256(data), name
        assert len(_gets(ep, name)) == 2, _ranges(_gets(ep, name))


def test_which_downloads_are_copied_whole(tmp_path) -> None:
    """Files of at most 1 MiB, listed, from pyarrow S3, Azure or a local disk (through a
    SubTreeFileSystem too), onto a local disk, with no timeout on the open or the reads.
    Never from GCS or a PyFileSystem (an fsspec source: Arrow would read it through Python
    anyway), onto an object store, or a file larger or of unknown size."""
    from retryfs.datapath.download import WHOLE_FILE, _copied_whole
    local = pafs.LocalFileSystem()
    s3 = pafs.S3FileSystem(anonymous=True, region="us-east-1")

    def whole(inner, size, destination=local, **options) -> bool:
        return _copied_whole(RetryingFileSystem(inner, **options).handler, destination, size)

    assert whole(s3, 0) and whole(s3, WHOLE_FILE) and whole(local, 1000)
    assert whole(pafs.SubTreeFileSystem("bucket/base", s3), 1000)
    assert whole(s3, 1000, pafs.SubTreeFileSystem(str(tmp_path), local))
    assert not whole(s3, WHOLE_FILE + 1) and not whole(s3, None) and not whole(s3, -1)
    assert not whole(s3, 1000, s3)
    assert not whole(s3, 1000, timeout={"read": 5})
    assert not whole(s3, 1000, timeout={"open_input_stream": 5})
    assert not whole(s3, 1000, timeout={"open_input_file": 5})
    assert whole(s3, 1000, timeout={"metadata": 5}, write_timeout=5)
    gcs = pafs.GcsFileSystem(anonymous=True, endpoint_override="localhost:1", scheme="http")
    assert not whole(gcs, 1000)
    from pyarrow.fs import FSSpecHandler, PyFileSystem
    fsspec = pytest.importorskip("fsspec")
    assert not whole(PyFileSystem(FSSpecHandler(fsspec.filesystem("memory"))), 1000)


# -- any tree, any few transient faults: every file whole, each fault one retry ------------------

#: Sizes on both sides of WHOLE_FILE (1 MiB, copied whole) and of copy_files's 1 MiB chunk.
_SIZES = [0, 1, 3000, 700_000, MiB, MiB + 1, 2 * MiB + 3]
_FAULTS = {"reset": S3Fault.reset, "truncate": S3Fault.truncate,
           "slow_down": S3Fault.slow_down, "internal_error": S3Fault.internal_error}
_examples = itertools.count()


@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(sizes=st.lists(st.sampled_from(_SIZES), min_size=1, max_size=6),
       faults=st.lists(st.tuples(st.integers(0, 5), st.sampled_from(sorted(_FAULTS)),
                                 st.sampled_from(["GetObject", "HeadObject"])),
                       min_size=1, max_size=FAST.max_attempts - 1),
       use_threads=st.booleans())
def test_any_tree_under_a_few_transient_faults_arrives_whole(s3_fault_endpoint, s3_fault_bucket,
                                                             sizes, faults, use_threads):
    """A tree of files of any of the sizes, fewer transient faults (reset, truncated body, 503,
    500) than the policy has retries, each on one file's GET or HEAD: every file arrives with
    its bytes, nothing else is on disk, each fault that fired cost exactly one retry, and the
    server sent the tree plus at most one chunk (1 MiB, or the file if smaller) per fault on
    a GET, whichever path the file took (copied whole or resumable)."""
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    prefix = f"prop-{next(_examples)}"
    files = {f"{prefix}/d{i % 2}/f{i}.bin": random.Random(i).randbytes(size)
             for i, size in enumerate(sizes)}
    for key, data in files.items():
        ep.put_object(bucket, key, data)
    ep.clear_faults()
    ep.reset_record()
    keys = list(files)
    planned = []
    for index, kind, op in faults:
        if kind == "truncate" and op == "HeadObject":
            kind = "reset"  # a HEAD has no body to cut
        planned.append(ep.add_fault(_FAULTS[kind](op=op, path=f"*/{keys[index % len(keys)]}",
                                                  times=1)))
    fs = _source(ep)
    with tempfile.TemporaryDirectory() as down:
        pafs.copy_files(f"{bucket}/{prefix}", down, source_filesystem=fs,
                        use_threads=use_threads)
        on_disk = {os.path.relpath(os.path.join(root, name), down)
                   for root, _, names in os.walk(down) for name in names}
        assert on_disk == {key.removeprefix(f"{prefix}/") for key in keys}
        for key, data in files.items():
            with open(os.path.join(down, key.removeprefix(f"{prefix}/")), "rb") as f:
                assert sha256(f.read()) == sha256(data), key
    fired = {id(fault): ep.fired(fault) for fault in planned}
    retries = sum(op["retries"] for op in fs.stats.snapshot()["by_operation"].values())
    event(f"faults fired: {sum(fired.values())}")
    assert retries == sum(fired.values())
    allowance = sum(min(len(files[keys[index % len(keys)]]), CHUNK)
                    for (index, _, op), fault in zip(faults, planned, strict=True)
                    if op == "GetObject" and fired[id(fault)])
    sent = sum(r.response_bytes for r in ep.requests(op="GetObject")
               if r.status in (200, 206))  # the object's bytes, not an error's XML
    assert sum(map(len, files.values())) <= sent <= sum(map(len, files.values())) + allowance


# -- directories the listing does not name ------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("use_threads", [True, False], ids=["threaded", "serial"])
def test_a_bucket_without_directory_markers_downloads_into_its_directories(
        gcs_process_fault_endpoint, tmp_path, use_threads):
    """A GCS bucket written by another tool has no directory markers, and pyarrow's GCS listing
    then names no directory: Arrow's own copy fails to open the first local file (its
    directory was never made); the download makes the directories the files need."""
    ep = gcs_process_fault_endpoint
    bucket = f"retryfs-markers-{use_threads}".lower()
    ep.create_bucket(bucket)
    tree = {"ckpt/meta.json": b"{}", "ckpt/shards/0": b"0" * 1000, "ckpt/shards/deep/1": b"1"}
    for key, data in tree.items():
        ep.put_object(bucket, key, data)
    listed = ep.pyarrow_fs().get_file_info(pafs.FileSelector(f"{bucket}/ckpt", recursive=True))
    assert {info.type for info in listed} == {pafs.FileType.File}  # what Arrow's copy meets
    with pytest.raises(FileNotFoundError):
        pafs.copy_files(f"{bucket}/ckpt", str(tmp_path / "plain"), source_filesystem=ep.pyarrow_fs())
    fs = RetryingFileSystem(ep.pyarrow_fs(), FAST, budget=False, client_attempts=1)
    pafs.copy_files(f"{bucket}/ckpt", str(tmp_path / "back"), source_filesystem=fs,
                    use_threads=use_threads)
    for key, data in tree.items():
        assert (tmp_path / "back" / key.removeprefix("ckpt/")).read_bytes() == data, key


def test_the_directories_a_download_makes_are_the_deepest_of_each_branch() -> None:
    files = [("s", f"/t/back/{name}", 1, 1) for name in ("a", "shards/0", "shards/x/1", "x-y/1")]
    assert unlisted_parents(files, "/t/back") == ["/t/back/shards/x", "/t/back/x-y"]
    assert unlisted_parents(files[:1], "/t/back/") == ["/t/back"]
    assert unlisted_parents([], "/t/back") == []  # an empty tree: nothing made, as Arrow's copy
    assert unlisted_parents([("s", "a", 1, 1), ("s", "b/c", 1, 1)], "") == ["b"]

"""`RetryingFileSystem.write_with`: a write made again from its source, with no replay spool.

On moto behind the fault endpoint. ``ep.pyarrow_fs()`` makes one SDK attempt per request, so
one injected fault breaks the upload and the whole write is made again; under `from_uri`'s
write client (3 SDK attempts) a single failed part is re-sent alone and ``write`` runs once.
"""

import hashlib

import pyarrow.fs as pafs
import pytest
from _helpers import FAST

import retryfs
from retryfs.datapath import streams
from retryfs.testing import FaultyFileSystem, S3Fault, errors

MiB = 1 << 20
BIG = bytes(range(256)) * (12 * MiB // 256)  # 3 parts of pyarrow's 5 MiB (the last shorter)


class Writer:
    """``write`` for `write_with`: writes ``data`` in 1 MiB pieces and counts its calls."""

    def __init__(self, data: bytes, fail: BaseException | None = None) -> None:
        self.data, self.fail, self.calls = data, fail, 0

    def __call__(self, file) -> None:
        self.calls += 1
        for start in range(0, len(self.data), MiB):
            file.write(self.data[start:start + MiB])
            if self.fail is not None and start >= 6 * MiB:
                raise self.fail


@pytest.fixture
def no_spool(monkeypatch):
    """Every replay spool made while the test runs (a write_with must make none)."""
    made = []
    original = streams.replay_spool
    monkeypatch.setattr(streams, "replay_spool", lambda memory: made.append(memory)
                        or original(memory))
    return made


def _fs(ep, **options):
    return retryfs.RetryingFileSystem(ep.pyarrow_fs(), FAST, budget=False, **options)


def _sent(ep, key):
    return sum(r.request_bytes for r in ep.requests(op=("PutObject", "UploadPart"))
               if r.key == key)


@pytest.mark.parametrize("data", [b"small object", BIG], ids=["one_put", "parts"])
def test_a_fault_free_write_with_stores_the_bytes_once_and_keeps_no_spool(
        data, s3_fault_endpoint, s3_fault_bucket, no_spool):
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    writer = Writer(data)
    _fs(ep).write_with(f"{bucket}/m.bin", writer)
    assert ep.get_object(bucket, "m.bin") == data and writer.calls == 1
    assert no_spool == []
    assert len(data) <= _sent(ep, "m.bin") <= len(data) * 1.001 + 4096


@pytest.mark.parametrize("op", ["UploadPart", "CompleteMultipartUpload", "CreateMultipartUpload"])
def test_an_upload_that_fails_is_written_again_from_the_source(op, s3_fault_endpoint,
                                                               s3_fault_bucket, no_spool):
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    fault = ep.add_fault(S3Fault.slow_down(op=op, times=1))
    fs = _fs(ep)
    writer = Writer(BIG)
    fs.write_with(f"{bucket}/m.bin", writer)
    # (a failed CreateMultipartUpload is the stream's open, retried before write runs)
    calls, retried = (1, "open_output_stream") if op.startswith("Create") else (2, "write")
    assert ep.fired(fault) == 1 and writer.calls == calls
    assert hashlib.sha256(ep.get_object(bucket, "m.bin")).digest() == \
        hashlib.sha256(BIG).digest()
    assert no_spool == []
    # one commit: the broken upload was dropped, never completed
    completes = [r for r in ep.requests("CompleteMultipartUpload") if r.status == 200]
    assert len(completes) == 1
    # the write again, no more: what the first attempt had sent, and the whole object once
    assert _sent(ep, "m.bin") <= 2 * len(BIG) * 1.001 + 4096
    assert fs.stats.snapshot()["by_operation"][retried]["retries"] == 1


def test_one_failed_part_under_from_uri_is_resent_alone_and_write_runs_once(
        s3_fault_endpoint, s3_fault_bucket, no_spool):
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    fs, _ = retryfs.from_uri(ep.uri(bucket, retry_initial_delay=0.001, retry_budget="false"))
    fault = ep.add_fault(S3Fault.slow_down(op="UploadPart", times=1))
    writer = Writer(BIG)
    fs.write_with(f"{bucket}/m.bin", writer)
    assert ep.fired(fault) == 1 and writer.calls == 1
    assert ep.get_object(bucket, "m.bin") == BIG
    failed = [r for r in ep.requests("UploadPart") if r.fault is not None]
    assert len(BIG) <= _sent(ep, "m.bin") - failed[0].request_bytes <= len(BIG) * 1.001 + 4096


def test_an_error_of_write_itself_is_raised_at_once_and_commits_nothing(
        s3_fault_endpoint, s3_fault_bucket):
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    ep.put_object(bucket, "m.bin", b"the last good one")
    # a transient type, raised by write itself (not the stream): still not retried
    writer = Writer(BIG, fail=ConnectionResetError("the producer's own"))
    with pytest.raises(ConnectionResetError, match="the producer's own"):
        _fs(ep).write_with(f"{bucket}/m.bin", writer)
    assert writer.calls == 1
    assert ep.get_object(bucket, "m.bin") == b"the last good one"
    assert not ep.requests(("PutObject", "CompleteMultipartUpload"))


def _faulty_write(tmp_path):
    """A retrying local filesystem whose second write of a stream fails once (a write that
    fails inside ``write``: on S3 a part's failure shows at the next flush or the close)."""
    faulty = FaultyFileSystem(pafs.LocalFileSystem())
    faulty.inject("write", errors.network(), skip=1, times=1)
    return retryfs.RetryingFileSystem(faulty, FAST, budget=False), str(tmp_path / "m.bin")


def _catching(calls, label, error):
    """``write`` of `BIG` that catches the stream's failure, notes ``label`` and raises
    ``error()`` from it (as torch.save's zip writer may wrap it, or Ctrl-C may come)."""
    def write(file):
        calls.append("called")
        try:
            Writer(BIG)(file)
        except OSError as exc:
            calls.append(label)
            raise error() from exc

    return write


def test_a_stream_failure_that_write_wraps_is_still_retried(tmp_path):
    fs, path = _faulty_write(tmp_path)
    calls = []
    fs.write_with(path, _catching(calls, "wrapped", lambda: RuntimeError("serialisation")))
    assert calls == ["called", "wrapped", "called"]
    assert fs.retry_handler.original.injected["write"] == 1
    assert fs.stats.snapshot()["by_operation"]["write"]["retries"] == 1
    with open(path, "rb") as f:
        assert f.read() == BIG


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, SystemExit])
def test_an_interrupt_after_the_stream_failed_is_not_a_retry(interrupt, tmp_path):
    fs, path = _faulty_write(tmp_path)
    calls = []
    with pytest.raises(interrupt):
        fs.write_with(path, _catching(calls, "interrupted", interrupt))
    assert calls == ["called", "interrupted"]
    assert fs.retry_handler.original.injected["write"] == 1
    assert fs.stats.snapshot()["by_operation"].get("write", {}).get("retries", 0) == 0


def test_a_write_that_keeps_failing_raises_the_storage_error_and_commits_nothing(
        s3_fault_endpoint, s3_fault_bucket):
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    ep.put_object(bucket, "m.bin", b"the last good one")
    fault = ep.add_fault(S3Fault.slow_down(op="UploadPart"))  # every time
    writer = Writer(BIG)
    fs = _fs(ep)
    with pytest.raises(OSError, match="SLOW_DOWN|SlowDown|reduce your request rate"):
        fs.write_with(f"{bucket}/m.bin", writer)
    assert writer.calls == FAST.max_attempts
    # each attempt's upload broke at a refused part: at least one fault an attempt, and the
    # engine's retries between them (its last attempt given up on)
    assert ep.fired(fault) >= FAST.max_attempts
    assert fs.stats.snapshot()["by_operation"]["write"]["retries"] == FAST.max_attempts - 1
    assert ep.get_object(bucket, "m.bin") == b"the last good one"
    assert not ep.requests(("PutObject", "CompleteMultipartUpload"))


def test_write_with_names_its_wrong_arguments(s3_fault_endpoint, s3_fault_bucket):
    fs = _fs(s3_fault_endpoint)
    with pytest.raises(TypeError, match="write: a callable"):
        fs.write_with(f"{s3_fault_bucket}/m.bin", b"bytes")
    with pytest.raises(TypeError, match="path: a str"):
        fs.write_with(7, lambda f: None)


# -- on a local disk: written beside, renamed into place -----------------------------------------

def test_a_local_write_with_goes_beside_and_never_shows_a_partial_file(tmp_path):
    fs = retryfs.RetryingFileSystem(pafs.LocalFileSystem(), FAST)
    path = str(tmp_path / "m.bin")
    with open(path, "wb") as f:
        f.write(b"the last good one")
    seen = []

    def write(file):
        Writer(BIG)(file)
        with open(path, "rb") as f:
            seen.append(f.read())  # under its name, meanwhile: the last good one
        names = sorted(p.name for p in tmp_path.iterdir())
        assert len(names) == 2 and names[0].startswith(".m.bin.retryfs-")

    fs.write_with(path, write)
    assert seen == [b"the last good one"]
    with open(path, "rb") as f:
        assert f.read() == BIG
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.bin"]  # no temporary left


def test_a_local_write_with_whose_write_raises_leaves_the_last_good_file(tmp_path):
    fs = retryfs.RetryingFileSystem(pafs.LocalFileSystem(), FAST)
    path = str(tmp_path / "m.bin")
    with open(path, "wb") as f:
        f.write(b"the last good one")
    writer = Writer(BIG, fail=RuntimeError("own"))
    with pytest.raises(RuntimeError, match="own"):
        fs.write_with(path, writer)
    assert writer.calls == 1
    with open(path, "rb") as f:
        assert f.read() == b"the last good one"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.bin"]


def test_a_local_write_with_made_again_after_a_stream_failure(tmp_path):
    fs, path = _faulty_write(tmp_path)  # (not seen as local: written in place)
    writer = Writer(BIG)
    fs.write_with(path, writer)
    assert writer.calls == 2 and fs.retry_handler.original.injected["write"] == 1
    assert fs.stats.snapshot()["by_operation"]["write"]["retries"] == 1
    with open(path, "rb") as f:
        assert f.read() == BIG


def test_write_with_in_a_local_subtree(tmp_path):
    base = tmp_path / "base"
    base.mkdir()
    (base / "m.bin").write_bytes(b"the last good one")
    subtree = pafs.SubTreeFileSystem(str(base), pafs.LocalFileSystem())
    fs = retryfs.RetryingFileSystem(subtree, FAST)
    seen = []

    def write(file):
        file.write(b"in the subtree")
        seen.append((base / "m.bin").read_bytes())

    fs.write_with("m.bin", write)
    assert seen == [b"the last good one"]
    assert (base / "m.bin").read_bytes() == b"in the subtree"
    assert sorted(p.name for p in base.iterdir()) == ["m.bin"]


def test_two_local_write_with_of_one_path_at_once_write_two_temporaries(tmp_path):
    """Two writers of one name (two processes on a shared disk, two threads) each write their
    own temporary file: with one name for both, the second would truncate the first's file and
    rename it away under it."""
    fs = retryfs.RetryingFileSystem(pafs.LocalFileSystem(), FAST)
    path = str(tmp_path / "m.bin")

    def outer(file):
        file.write(b"A" * 1000)
        fs.write_with(path, lambda inner: inner.write(b"B"))  # the other writer, meanwhile
        file.write(b"A")

    fs.write_with(path, outer)
    with open(path, "rb") as f:
        assert f.read() == b"A" * 1001  # the last renamed
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.bin"]

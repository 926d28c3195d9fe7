"""Files whose names end like compressed files (``.gz``, ``.bz2``, ``.zst``...) are stored and
copied byte for byte. pyarrow's Python ``open_input_stream`` and ``open_output_stream``
(de)compress by the name's suffix unless told ``compression=None``: retryfs's own opens of
the inner filesystem must not, or a ``copy_files`` of a checkpoint holding ``state.json.gz``
uploads it decompressed and then recompressed (and fails its own check after the commit), and
a stream of one is (de)compressed twice."""

import gzip
import os

import pyarrow.fs as pafs
import pytest
from _helpers import FAST

import retryfs
from retryfs import RetryingFileSystem
from retryfs.testing import S3Fault

RAW = gzip.compress(b"step,loss\n" * 2000)
BIG = gzip.compress(os.urandom(7 * 2**20))  # a multipart upload


@pytest.fixture
def s3(s3_fault_endpoint, s3_fault_bucket):
    fs, _ = retryfs.from_uri(s3_fault_endpoint.uri(s3_fault_bucket, retry_initial_delay=0.001,
                                                   retry_max_delay=0.01, retry_budget="false"))
    return fs


@pytest.mark.parametrize("use_threads", [True, False])
def test_copy_files_up_and_down_keeps_the_bytes(s3, s3_fault_endpoint, s3_fault_bucket,
                                                tmp_path, use_threads):
    source = tmp_path / "ckpt"
    source.mkdir()
    (source / "state.json.gz").write_bytes(RAW)
    (source / "model.bin.gz").write_bytes(BIG)
    (source / "notes.txt.bz2").write_bytes(b"not really bzip2")
    s3_fault_endpoint.add_fault(S3Fault.slow_down(op="UploadPart", times=1))
    pafs.copy_files(str(source), f"{s3_fault_bucket}/ckpt", destination_filesystem=s3,
                    use_threads=use_threads)
    assert len(s3_fault_endpoint.injected) == 1
    # the failed part was sent again, and nothing else (request bytes carry the SDK's chunk
    # signatures): the bytes as stored, not decompressed ones
    parts = s3_fault_endpoint.requests(op="UploadPart")
    failed = [record for record in parts if record.fault is not None]
    sent = sum(record.request_bytes for record in parts if record.fault is None)
    assert len(failed) == 1 and len(BIG) <= sent <= len(BIG) * 1.001
    for name in ("state.json.gz", "model.bin.gz", "notes.txt.bz2"):
        assert s3_fault_endpoint.get_object(s3_fault_bucket, f"ckpt/{name}") == \
            (source / name).read_bytes()
    back = tmp_path / "back"
    pafs.copy_files(f"{s3_fault_bucket}/ckpt", str(back), source_filesystem=s3,
                    use_threads=use_threads)
    for name in ("state.json.gz", "model.bin.gz", "notes.txt.bz2"):
        assert (back / name).read_bytes() == (source / name).read_bytes()


def test_streams_compress_and_decompress_once_as_pyarrow_s(s3, s3_fault_endpoint,
                                                          s3_fault_bucket):
    with s3.open_output_stream(f"{s3_fault_bucket}/log.gz") as out:  # "detect": gzip
        out.write(b"hello " * 100)
    stored = s3_fault_endpoint.get_object(s3_fault_bucket, "log.gz")
    assert gzip.decompress(stored) == b"hello " * 100  # compressed once
    with s3.open_input_stream(f"{s3_fault_bucket}/log.gz") as stream:
        assert stream.read() == b"hello " * 100  # decompressed once
    with s3.open_input_stream(f"{s3_fault_bucket}/log.gz", compression=None) as stream:
        assert stream.read() == stored
    with s3.open_output_stream(f"{s3_fault_bucket}/raw.gz", compression=None) as out:
        out.write(RAW)
    assert s3_fault_endpoint.get_object(s3_fault_bucket, "raw.gz") == RAW


def test_a_local_wrapper_compresses_once_and_appends_raw(tmp_path):
    fs = RetryingFileSystem(pafs.LocalFileSystem(), FAST)
    path = str(tmp_path / "a.gz")
    with fs.open_output_stream(path) as out:
        out.write(b"abc")
    assert gzip.decompress((tmp_path / "a.gz").read_bytes()) == b"abc"
    (tmp_path / "b.gz").write_bytes(RAW)
    with fs.open_append_stream(str(tmp_path / "b.gz"), compression=None) as out:
        out.write(b"!")
    assert (tmp_path / "b.gz").read_bytes() == RAW + b"!"


def test_the_cli_cat_prints_the_stored_bytes(s3_fault_endpoint, s3_fault_bucket, capsysbinary):
    from retryfs.cli import main

    s3_fault_endpoint.put_object(s3_fault_bucket, "x.gz", RAW)
    assert main(["cat", s3_fault_endpoint.uri(f"{s3_fault_bucket}/x.gz")]) == 0
    assert capsysbinary.readouterr().out == RAW


def test_retryfs_copy_up_and_down_keeps_the_bytes(s3, s3_fault_endpoint, s3_fault_bucket,
                                                  tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    (source / "state.json.gz").write_bytes(RAW)
    result = retryfs.copy(str(source), (s3, f"{s3_fault_bucket}/up"), recursive=True,
                          verify="hash")
    assert result.ok
    assert s3_fault_endpoint.get_object(s3_fault_bucket, "up/state.json.gz") == RAW
    down = retryfs.copy((s3, f"{s3_fault_bucket}/up"), str(tmp_path / "down"), recursive=True,
                        verify="hash")
    assert down.ok and (tmp_path / "down" / "state.json.gz").read_bytes() == RAW

"""Ambiguous outcomes: the server applied a request and the answer was lost (or never sent).

A retry then meets the changed state (nothing to delete, a directory already there, no source
to move) and must decide whether that is this call's own work. Success is claimed only when it
is proven; the checks that decide retry through the same engine; every exit leaves the counters
whole. Faults are injected with `FaultyFileSystem(applied=True)` in process and with
`S3Fault(applied=True)` on a real S3 endpoint (moto), where pyarrow's own client sees them.
"""

from __future__ import annotations

import fsspec
import pyarrow.fs as pafs
import pytest
from _helpers import FAST
from fsspec.implementations.asyn_wrapper import AsyncFileSystemWrapper
from fsspec.implementations.memory import MemoryFileSystem

from retryfs import RetryingFileSystem
from retryfs.fsspec.filesystem import AsyncRetryFileSystem
from retryfs.testing import FaultyFileSystem, errors
from retryfs.testing.s3 import S3Fault, S3FaultEndpoint

NETWORK = errors.network("CopyObject")


def consistent(stats: dict) -> None:
    """attempts == calls + retries, in total and per operation."""
    assert stats["attempts"] == stats["calls"] + stats["retries"], stats
    for name, op in stats["by_operation"].items():
        assert op["attempts"] == op["calls"] + op["retries"], (name, op)


@pytest.fixture
def local(tmp_path):
    faulty = FaultyFileSystem(pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem()))
    return faulty, RetryingFileSystem(faulty, FAST, budget=False)


def write(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    with fs.open_output_stream(path) as out:
        out.write(data)


def read(fs: pafs.FileSystem, path: str) -> bytes:
    with fs.open_input_stream(path) as f:
        return f.read()


# -- move: success only when this call's effect is proven -----------------------------------------

def test_move_of_a_source_that_never_existed_fails_though_the_destination_exists(local):
    faulty, fs = local
    write(faulty, "ckpt", b"old checkpoint")
    faulty.inject("move", NETWORK)  # the first attempt fails before doing anything
    with pytest.raises(FileNotFoundError):
        fs.move("new-ckpt", "ckpt")
    assert faulty.injected["move"] == 1
    assert read(faulty, "ckpt") == b"old checkpoint"
    stats = fs.stats.snapshot()
    consistent(stats)
    assert stats["by_operation"]["move"] == {**stats["by_operation"]["move"], "calls": 1,
                                             "attempts": 2, "retries": 1}


def test_move_applied_then_lost_is_success(local):
    faulty, fs = local
    write(faulty, "new", b"new checkpoint")
    write(faulty, "ckpt", b"old")
    faulty.inject("move", NETWORK, applied=True)
    fs.move("new", "ckpt")
    assert faulty.injected["move"] == 1
    assert read(faulty, "ckpt") == b"new checkpoint"
    assert faulty.get_file_info("new").type == pafs.FileType.NotFound
    stats = fs.stats.snapshot()
    consistent(stats)
    assert stats["by_operation"]["move"]["attempts"] == 2


def test_move_whose_source_vanished_and_destination_is_not_it_fails(local):
    """The source existed at the first attempt, which failed without moving; then someone else
    deleted it. The destination holds an older object of another size: not this call's work."""
    faulty, fs = local
    write(faulty, "new", b"new checkpoint")
    write(faulty, "ckpt", b"old")
    def vanish(src: str, dest: str) -> None:
        faulty.handler.inner.delete_file(src)
        raise NETWORK()

    faulty.handler.inner = _Patched(faulty.handler.inner, move=vanish)
    try:
        with pytest.raises(FileNotFoundError):
            fs.move("new", "ckpt")
    finally:
        faulty.handler.inner = faulty.handler.inner.wrapped
    assert read(faulty, "ckpt") == b"old"
    consistent(fs.stats.snapshot())


class _Patched:
    """A filesystem with some methods replaced (the rest forwarded)."""

    def __init__(self, wrapped, **methods):
        self.wrapped = wrapped
        self.__dict__.update(methods)

    def __getattr__(self, name):
        return getattr(self.wrapped, name)


def test_move_on_s3_of_a_missing_source_fails(s3_fault_endpoint: S3FaultEndpoint,
                                              s3_fault_bucket: str) -> None:
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    fs = RetryingFileSystem(ep.pyarrow_fs(), FAST, budget=False)
    ep.put_object(bucket, "ckpt", b"old checkpoint")
    fault = ep.add_fault(S3Fault.internal_error(op="CopyObject", nth=1))
    with pytest.raises(OSError, match="NO_SUCH_KEY|No such|does not exist"):
        fs.move(f"{bucket}/new-ckpt", f"{bucket}/ckpt")
    assert ep.fired(fault) == 1
    assert ep.get_object(bucket, "ckpt") == b"old checkpoint"
    assert [r.status for r in ep.requests(op="CopyObject")] == [500, 404]
    consistent(fs.stats.snapshot())


def test_move_on_s3_applied_then_answered_500_is_success(s3_fault_endpoint: S3FaultEndpoint,
                                                         s3_fault_bucket: str) -> None:
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    fs = RetryingFileSystem(ep.pyarrow_fs(), FAST, budget=False)
    ep.put_object(bucket, "new", b"new checkpoint")
    ep.put_object(bucket, "ckpt", b"old")
    fault = ep.add_fault(S3Fault.internal_error(op="DeleteObject", applied=True, nth=1))
    fs.move(f"{bucket}/new", f"{bucket}/ckpt")
    assert ep.fired(fault) == 1
    assert ep.get_object(bucket, "ckpt") == b"new checkpoint"
    assert "new" not in ep.keys(bucket)
    assert [r.status for r in ep.requests(op="CopyObject")] == [200, 404]
    consistent(fs.stats.snapshot())


# -- delete_dir_contents on S3 --------------------------------------------------------------------

def test_delete_dir_contents_applied_then_500_on_s3_is_success(
        s3_fault_endpoint: S3FaultEndpoint, s3_fault_bucket: str) -> None:
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    fs = RetryingFileSystem(ep.pyarrow_fs(), FAST, budget=False)
    for name in ("a", "b", "sub/c"):
        ep.put_object(bucket, f"run/{name}", b"x")
    ep.put_object(bucket, "keep", b"k")
    fault = ep.add_fault(S3Fault.internal_error(op="DeleteObjects", applied=True, nth=1))
    fs.delete_dir_contents(f"{bucket}/run")
    assert ep.fired(fault) == 1
    assert ep.keys(bucket) == ["keep"]
    stats = fs.stats.snapshot()
    consistent(stats)
    assert stats["by_operation"]["delete_dir_contents"]["retries"] == 1
    assert stats["giveups"] == 0


def test_delete_dir_contents_that_finds_no_directory_without_a_fault_still_fails(
        s3_fault_endpoint: S3FaultEndpoint, s3_fault_bucket: str) -> None:
    fs = RetryingFileSystem(s3_fault_endpoint.pyarrow_fs(), FAST, budget=False)
    with pytest.raises(FileNotFoundError):
        fs.delete_dir_contents(f"{s3_fault_bucket}/never")
    assert fs.stats.snapshot()["retries"] == 0


# -- the check that decides retries through the engine; the counters stay whole --------------------

def test_a_transient_error_in_the_reconciliation_check_is_retried(local):
    faulty, fs = local
    write(faulty, "new", b"new checkpoint")
    faulty.inject("move", NETWORK, applied=True)
    # the check's first try (skip: the look at the destination before the first attempt)
    faulty.inject("get_file_info", errors.unavailable(), path="ckpt", skip=1)
    fs.move("new", "ckpt")
    assert faulty.injected["move"] == 1 and faulty.injected["get_file_info"] == 1
    assert read(faulty, "ckpt") == b"new checkpoint"
    stats = fs.stats.snapshot()
    consistent(stats)
    assert stats["by_operation"]["get_file_info"]["retries"] == 1
    assert stats["by_operation"]["move"]["attempts"] == 2
    assert stats["giveups"] == 0


def test_a_reconciliation_check_that_gives_up_raises_its_error_and_counts_a_giveup(local):
    faulty, fs = local
    write(faulty, "new", b"new checkpoint")
    faulty.inject("move", NETWORK, applied=True)
    faulty.inject("get_file_info", errors.unavailable(), path="ckpt", times=None, skip=1)
    with pytest.raises(OSError, match="HTTP status 503") as raised:
        fs.move("new", "ckpt")
    assert any("checking whether an earlier attempt" in n for n in raised.value.__notes__)
    stats = fs.stats.snapshot()
    consistent(stats)
    assert stats["by_operation"]["get_file_info"]["giveups"] == 1
    assert stats["by_operation"]["move"]["giveups"] == 1
    assert stats["by_operation"]["move"]["calls"] == 1


# -- create_dir, delete_dir, fsspec mkdir: applied, then the answer lost ---------------------------

@pytest.mark.parametrize("recursive", [False, True])
def test_create_dir_applied_then_lost_is_success(local, recursive):
    faulty, fs = local
    faulty.inject("create_dir", errors.network("CreateDir"), applied=True)
    faulty.inject("create_dir", FileExistsError(17, "File exists"), path="d")  # the retry's
    fs.create_dir("d", recursive=recursive)
    assert faulty.injected["create_dir"] == 2
    assert faulty.get_file_info("d").type == pafs.FileType.Directory
    stats = fs.stats.snapshot()
    consistent(stats)
    assert stats["by_operation"]["create_dir"]["attempts"] == 2


def test_create_dir_over_a_file_is_not_reconciled(local):
    faulty, fs = local
    write(faulty, "d", b"a file, not a directory")
    faulty.inject("create_dir", errors.network("CreateDir"))
    with pytest.raises(FileExistsError):
        fs.create_dir("d", recursive=False)
    assert faulty.injected["create_dir"] == 1


def test_delete_dir_applied_then_lost_is_success(local):
    faulty, fs = local
    faulty.create_dir("d/e")
    write(faulty, "d/e/f", b"x")
    faulty.inject("delete_dir", errors.network("DeleteDir"), applied=True)
    fs.delete_dir("d")
    assert faulty.injected["delete_dir"] == 1
    assert faulty.get_file_info("d").type == pafs.FileType.NotFound
    stats = fs.stats.snapshot()
    consistent(stats)
    assert stats["by_operation"]["delete_dir"]["attempts"] == 2


@pytest.mark.parametrize("method", ["mkdir", "makedirs"])
def test_fsspec_mkdir_applied_then_lost_is_success(tmp_path, method):
    faulty = FaultyFileSystem(pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem()))
    fs = fsspec.filesystem("retry", fs=faulty, policy=FAST, budget=False,
                           skip_instance_cache=True)
    faulty.inject("create_dir", errors.network("CreateDir"), applied=True)
    # the retry finds it (an object store, or a local directory made meanwhile, says so)
    faulty.inject("create_dir", FileExistsError(17, "File exists"), path="d")
    if method == "mkdir":
        fs.mkdir("d", create_parents=False)
    else:
        fs.makedirs("d", exist_ok=False)
    assert faulty.injected["create_dir"] == 2
    assert faulty.get_file_info("d").type == pafs.FileType.Directory
    consistent(fs.stats.snapshot())
    assert fs.stats.snapshot()["by_operation"][method]["retries"] == 1


def test_fsspec_mkdir_over_a_file_is_not_reconciled(tmp_path):
    faulty = FaultyFileSystem(pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem()))
    write(faulty, "d", b"a file")
    fs = fsspec.filesystem("retry", fs=faulty, policy=FAST, budget=False,
                           skip_instance_cache=True)
    faulty.inject("create_dir", errors.network("CreateDir"))
    with pytest.raises(FileExistsError):
        fs.mkdir("d", create_parents=False)
    assert faulty.injected["create_dir"] == 1


# -- fsspec mv: success only when this call's effect is proven, as on the pyarrow face ---------------

@pytest.fixture
def fsspec_local(tmp_path):
    faulty = FaultyFileSystem(pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem()))
    return faulty, fsspec.filesystem("retry", fs=faulty, policy=FAST, budget=False,
                                     skip_instance_cache=True)


@pytest.mark.parametrize("method", ["mv", "move", "rename"])
def test_fsspec_mv_applied_then_lost_is_success(fsspec_local, method):
    faulty, fs = fsspec_local
    write(faulty, "new", b"new checkpoint")
    write(faulty, "ckpt", b"old")
    faulty.inject("move", NETWORK, applied=True)
    getattr(fs, method)("new", "ckpt")
    assert faulty.injected["move"] == 1
    assert read(faulty, "ckpt") == b"new checkpoint"
    assert faulty.get_file_info("new").type == pafs.FileType.NotFound
    stats = fs.stats.snapshot()
    consistent(stats)
    mv = stats["by_operation"]["mv"]  # fsspec's move and rename are its mv
    assert (mv["calls"], mv["attempts"], mv["giveups"]) == (1, 2, 0), mv


def test_fsspec_mv_of_a_source_that_never_existed_fails_though_the_destination_exists(
        fsspec_local):
    faulty, fs = fsspec_local
    write(faulty, "ckpt", b"old checkpoint")
    faulty.inject("move", NETWORK)
    with pytest.raises(FileNotFoundError):
        fs.mv("new-ckpt", "ckpt")
    assert faulty.injected["move"] == 1
    assert read(faulty, "ckpt") == b"old checkpoint"
    consistent(fs.stats.snapshot())


def test_fsspec_mv_whose_source_vanished_and_destination_is_not_it_fails(fsspec_local):
    faulty, fs = fsspec_local
    write(faulty, "new", b"new checkpoint")
    write(faulty, "ckpt", b"old")

    def vanish(src: str, dest: str) -> None:  # someone else deletes it; our answer is lost
        faulty.handler.inner.delete_file(src)
        raise NETWORK()

    faulty.handler.inner = _Patched(faulty.handler.inner, move=vanish)
    try:
        with pytest.raises(FileNotFoundError):
            fs.mv("new", "ckpt")
    finally:
        faulty.handler.inner = faulty.handler.inner.wrapped
    assert read(faulty, "ckpt") == b"old"
    consistent(fs.stats.snapshot())


# -- the async face: mkdir proves a directory is there, as the sync face does ------------------------

class _FlakyMemory(MemoryFileSystem):
    """fsspec's memory filesystem whose next ``mkdir`` calls fail before doing anything."""

    protocol = "retryfs-flaky-memory"
    failing_mkdirs = 0

    def mkdir(self, path, create_parents=True, **kwargs):
        if self.failing_mkdirs:
            self.failing_mkdirs -= 1
            raise ConnectionResetError(104, "Connection reset by peer")
        return super().mkdir(path, create_parents=create_parents, **kwargs)


@pytest.fixture
def async_memory():
    memory = _FlakyMemory(skip_instance_cache=True)
    memory.store, memory.pseudo_dirs = {}, [""]  # its own, not the class's shared store
    fs = fsspec.filesystem("retry", fs=AsyncFileSystemWrapper(memory), policy=FAST,
                           budget=False, skip_instance_cache=True)
    assert isinstance(fs, AsyncRetryFileSystem)
    return memory, fs


def test_async_mkdir_over_a_file_is_not_reconciled(async_memory):
    memory, fs = async_memory
    memory.pipe_file("/d/ckpt", b"a file")
    memory.failing_mkdirs = 1
    with pytest.raises(FileExistsError):
        fs.mkdir("/d/ckpt")
    assert memory.failing_mkdirs == 0 and memory.isfile("/d/ckpt")
    consistent(fs.stats.snapshot())


def test_async_mkdir_that_finds_its_directory_on_a_retry_is_success(async_memory):
    memory, fs = async_memory
    memory.failing_mkdirs = 1
    fs.mkdir("/d/new")
    assert memory.isdir("/d/new")
    memory.makedirs("/d/made")  # a retry that finds the directory: success (it is one)
    memory.failing_mkdirs = 1
    fs.mkdir("/d/made", create_parents=False)
    stats = fs.stats.snapshot()
    consistent(stats)
    assert stats["by_operation"]["mkdir"]["retries"] == 2, stats


# -- found by the simulation (tests/test_simulation.py): the fsspec face never reads an error as
#    "absent" -----------------------------------------------------------------------------------

@pytest.fixture
def fsspec_face(tmp_path):
    faulty = FaultyFileSystem(pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem()))
    faulty.create_dir("a/c")
    write(faulty, "a/x", b"x")
    return faulty, fsspec.filesystem("retry", fs=faulty, policy=FAST, budget=False,
                                     skip_instance_cache=True)


def test_fsspec_find_raises_when_a_listing_gives_up_instead_of_dropping_it(fsspec_face):
    faulty, fs = fsspec_face
    assert sorted(fs.find("a", withdirs=True)) == ["a", "a/c", "a/x"]
    faulty.inject("get_file_info_selector", errors.access_denied(), path="a/c")
    with pytest.raises(OSError, match="ACCESS_DENIED"):
        fs.find("a", withdirs=True)
    assert faulty.injected["get_file_info_selector"] == 1


def test_fsspec_exists_and_isdir_raise_an_error_that_outlived_the_retries(fsspec_face):
    faulty, fs = fsspec_face
    faulty.inject("get_file_info", errors.network("HeadObject"), times=None)
    for probe in (fs.exists, fs.isdir, fs.isfile):
        with pytest.raises(OSError, match="NETWORK_CONNECTION"):
            probe("a")
    assert faulty.injected["get_file_info"] == 3 * FAST.max_attempts
    faulty.clear()
    assert fs.exists("a") and fs.isdir("a") and not fs.isfile("a") and not fs.exists("nope")

"""The ``copy_files`` commit guard holds whatever wraps the wrapper.

``pyarrow.fs.copy_files`` ignores a failed close. retryfs raises after the copy when a commit of
one of *its streams opened during the call* finally failed, so the destination's type does not
matter: a `RetryingFileSystem` under a ``SubTreeFileSystem``, under a ``PyFileSystem`` over an
fsspec filesystem, or under another `RetryingFileSystem`.
"""

from __future__ import annotations

import pyarrow.fs as pafs
import pytest
from _helpers import FAST
from fsspec.implementations.arrow import ArrowFSWrapper

from retryfs import RetryingFileSystem
from retryfs.testing import FaultyFileSystem, errors

FILES = {"model.pt": b"m" * 3000, "meta.json": b"{}", "sub/opt.pt": b"o" * 100}


@pytest.fixture
def source(tmp_path):
    root = tmp_path / "src"
    for name, data in FILES.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return str(root)


@pytest.fixture
def store(tmp_path):
    (tmp_path / "dst").mkdir()
    return FaultyFileSystem(pafs.SubTreeFileSystem(str(tmp_path / "dst"), pafs.LocalFileSystem()))


def _subtree(retrying: RetryingFileSystem) -> tuple[pafs.FileSystem, str]:
    retrying.create_dir("ckpts")
    return pafs.SubTreeFileSystem("ckpts", retrying), "run1"


def _pyfs_over_fsspec(retrying: RetryingFileSystem) -> tuple[pafs.FileSystem, str]:
    return pafs.PyFileSystem(pafs.FSSpecHandler(ArrowFSWrapper(retrying))), "ckpts/run1"


def _retry_over_retry(retrying: RetryingFileSystem) -> tuple[pafs.FileSystem, str]:
    return RetryingFileSystem(retrying, FAST, budget=False), "ckpts/run1"


WRAPPERS = {"SubTreeFileSystem": _subtree, "PyFileSystem(FSSpecHandler(fsspec(retryfs)))":
            _pyfs_over_fsspec, "RetryingFileSystem(RetryingFileSystem)": _retry_over_retry,
            "RetryingFileSystem": lambda fs: (fs, "ckpts/run1")}


@pytest.mark.parametrize("use_threads", [False, True], ids=["serial", "threaded"])
@pytest.mark.parametrize("wrap", list(WRAPPERS.values()), ids=list(WRAPPERS))
def test_a_commit_that_finally_failed_fails_copy_files(source, store, wrap, use_threads):
    retrying = RetryingFileSystem(store, FAST, budget=False)
    destination, path = wrap(retrying)
    fault = store.inject("close", errors.commit_failed(), path="*model.pt", times=None)
    with pytest.raises(OSError, match="INTERNAL_FAILURE") as raised:
        pafs.copy_files(source, path, destination_filesystem=destination,
                        use_threads=use_threads)
    assert fault.fired >= FAST.max_attempts  # every commit of model.pt was tried, and failed
    assert any("not committed" in note and "model.pt" in note
               for note in raised.value.__notes__)
    assert destination.get_file_info(f"{path}/model.pt").type == pafs.FileType.NotFound
    # retryfs's own serial copy stops at the file that failed, as Arrow's does (it raises); the
    # stream path (pyarrow's copy, which ignores the failed close) and threads copy the rest
    listed = [info.path for info in pafs.LocalFileSystem().get_file_info(
        pafs.FileSelector(source, recursive=True)) if info.type == pafs.FileType.File]
    stops = not use_threads and isinstance(destination, RetryingFileSystem)
    landed = not stops or listed.index(f"{source}/meta.json") < listed.index(
        f"{source}/model.pt")
    assert destination.get_file_info(f"{path}/meta.json").type == (
        pafs.FileType.File if landed else pafs.FileType.NotFound)


@pytest.mark.parametrize("wrap", list(WRAPPERS.values()), ids=list(WRAPPERS))
def test_a_commit_that_recovered_leaves_copy_files_successful(source, store, wrap):
    retrying = RetryingFileSystem(store, FAST, budget=False)
    destination, path = wrap(retrying)
    fault = store.inject("close", errors.commit_failed(), path="*model.pt", times=1)
    pafs.copy_files(source, path, destination_filesystem=destination, use_threads=False)
    assert fault.fired == 1
    with destination.open_input_stream(f"{path}/model.pt") as f:
        assert f.read() == FILES["model.pt"]


def test_a_stream_opened_before_the_copy_does_not_fail_it(source, store):
    """Only the streams opened during the call count: one opened before it, whose commit fails,
    is its own caller's error (raised at its close), not the copy's."""
    retrying = RetryingFileSystem(store, FAST, budget=False)
    store.inject("close", errors.commit_failed(), path="elsewhere", times=None)
    early = retrying.open_output_stream("elsewhere")
    early.write(b"x")
    pafs.copy_files(source, "ckpts/run1", destination_filesystem=retrying)
    with pytest.raises(OSError, match="INTERNAL_FAILURE"):
        early.close()
    assert "elsewhere" in retrying.failed_commits()

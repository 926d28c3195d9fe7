"""The small files of a threaded local tree copy go through one tight loop (`retryfs.datapath.small_files`)
with the generic path's promises: bytes identical, written beside and renamed, checked, a
failed file retried alone (its attempt counted), a permanent error as unwrapped pyarrow's, a
stalled file retried while the stalled worker never renames again."""

from __future__ import annotations

import errno
import hashlib
import os
import threading
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from _helpers import FAST
from hypothesis import given, settings
from hypothesis import strategies as st

from retryfs import RetryingFileSystem
from retryfs.datapath import small_files, upload
from retryfs.datapath.small_files import SMALL_FILE, local_path, local_root

BIG = SMALL_FILE + 1  # the smallest file the generic path copies


def make_tree(root: Path, sizes: list[int]) -> dict[str, str]:
    """Files ``shards/NNN.bin`` of ``sizes``; their SHA-256 by path relative to ``root``."""
    (root / "shards").mkdir(parents=True)
    digests = {}
    for index, size in enumerate(sizes):
        data = os.urandom(size)
        relative = f"shards/{index:03d}.bin"
        (root / relative).write_bytes(data)
        digests[relative] = hashlib.sha256(data).hexdigest()
    return digests


def tree_of(root: Path) -> dict[str, str]:
    return {str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in root.rglob("*") if path.is_file()}


def copy_tree(src: Path, dst: Path, fs: pafs.FileSystem) -> None:
    pafs.copy_files(str(src), str(dst), source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=fs, use_threads=True)


def by_op(fs: RetryingFileSystem, operation: str) -> dict:
    return fs.stats.snapshot()["by_operation"].get(operation, {})


@pytest.fixture
def generic_copies(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The destinations the generic path (`upload._upload`) copied, one per attempt."""
    seen: list[str] = []
    original = upload._upload

    def counted(handler, source_fs, source, destination, *args):  # type: ignore[no-untyped-def]
        seen.append(destination)
        return original(handler, source_fs, source, destination, *args)

    monkeypatch.setattr(upload, "_upload", counted)
    return seen


def test_small_files_take_the_batch_and_land_identical(tmp_path: Path,
                                                       generic_copies: list[str]) -> None:
    sizes = [0, 1, 4096, 65536, SMALL_FILE, BIG, 3 * SMALL_FILE] + [1000 + i for i in range(40)]
    digests = make_tree(tmp_path / "src", sizes)
    fs = RetryingFileSystem(pafs.LocalFileSystem(), FAST, budget=False)
    copy_tree(tmp_path / "src", tmp_path / "dst", fs)
    assert tree_of(tmp_path / "dst") == digests  # every byte, and no temporary file left
    # only the two files above SMALL_FILE went through the generic path
    assert sorted(os.path.basename(d) for d in generic_copies) == ["005.bin", "006.bin"]
    copies, checks = by_op(fs, "copy_files"), by_op(fs, "verify")
    assert copies["calls"] == copies["attempts"] == len(sizes) and copies["retries"] == 0
    assert checks["calls"] == len(sizes)
    assert fs.failed_commits() == {}


def test_a_subtree_destination_and_source_are_batched(tmp_path: Path,
                                                      generic_copies: list[str]) -> None:
    digests = make_tree(tmp_path / "src", [100] * 10)
    fs = RetryingFileSystem(pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem()),
                            FAST, budget=False)
    pafs.copy_files("src", "out/dst", source_filesystem=pafs.SubTreeFileSystem(
        str(tmp_path), pafs.LocalFileSystem()), destination_filesystem=fs)
    assert tree_of(tmp_path / "out" / "dst") == digests
    assert generic_copies == []


def test_a_serial_copy_keeps_the_generic_path(tmp_path: Path,
                                              generic_copies: list[str]) -> None:
    """``use_threads=False`` stops at the first failing file, in listing order, as Arrow's."""
    digests = make_tree(tmp_path / "src", [100] * 5)
    fs = RetryingFileSystem(pafs.LocalFileSystem(), FAST, budget=False)
    pafs.copy_files(str(tmp_path / "src"), str(tmp_path / "dst"), destination_filesystem=fs,
                    use_threads=False)
    assert tree_of(tmp_path / "dst") == digests
    assert len(generic_copies) == 5


def fail_replace_of(monkeypatch: pytest.MonkeyPatch, names: dict[str, int],
                    error: int = errno.EBUSY) -> dict[str, int]:
    """``os.replace`` onto a destination named in ``names`` fails that many times."""
    left = dict(names)
    original = os.replace

    def replace(src, dst, *args, **kwargs):  # type: ignore[no-untyped-def]
        name = os.path.basename(dst)
        if left.get(name, 0) > 0:
            left[name] -= 1
            raise OSError(error, os.strerror(error), dst)
        return original(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", replace)
    return left


def test_a_transient_failure_re_copies_that_file_alone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, generic_copies: list[str]) -> None:
    digests = make_tree(tmp_path / "src", [2000] * 30)
    left = fail_replace_of(monkeypatch, {"007.bin": 1})
    fs = RetryingFileSystem(pafs.LocalFileSystem(), FAST, budget=False)
    copy_tree(tmp_path / "src", tmp_path / "dst", fs)
    assert left == {"007.bin": 0}
    assert tree_of(tmp_path / "dst") == digests  # the failed attempt's temporary removed
    assert [os.path.basename(d) for d in generic_copies] == ["007.bin"]  # one file re-sent
    copies = by_op(fs, "copy_files")
    assert copies["calls"] == 30 and copies["attempts"] == 31 and copies["retries"] == 1
    assert copies["errors"] == {"OSError[EBUSY]": 1}, copies
    assert fs.failed_commits() == {}


def test_a_permanent_failure_raises_what_unwrapped_pyarrow_raises(tmp_path: Path) -> None:
    make_tree(tmp_path / "src", [100] * 6)
    raised = {}
    for name, fs in (("unwrapped", pafs.LocalFileSystem()),
                     ("retryfs", RetryingFileSystem(pafs.LocalFileSystem(), FAST,
                                                    budget=False))):
        (tmp_path / name / "shards" / "002.bin" / "in-the-way").mkdir(parents=True)
        with pytest.raises(OSError) as caught:
            copy_tree(tmp_path / "src", tmp_path / name, fs)
        raised[name] = type(caught.value)
        copied = sorted(p.name for p in (tmp_path / name / "shards").iterdir())
        assert copied == [f"{i:03d}.bin" for i in range(6)], copied  # no temporary left
    assert raised["retryfs"] is raised["unwrapped"] is IsADirectoryError


def test_a_failed_check_copies_the_file_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, generic_copies: list[str]) -> None:
    digests = make_tree(tmp_path / "src", [3000] * 8)
    original = small_files._holds
    lied = []

    def holds(path: str, size: int) -> bool:
        if path.endswith("004.bin") and not lied:
            lied.append(path)
            return False  # a short destination, proven by the check
        return original(path, size)

    monkeypatch.setattr(small_files, "_holds", holds)
    fs = RetryingFileSystem(pafs.LocalFileSystem(), FAST, budget=False)
    copy_tree(tmp_path / "src", tmp_path / "dst", fs)
    assert tree_of(tmp_path / "dst") == digests
    assert [os.path.basename(d) for d in generic_copies] == ["004.bin"]
    copies = by_op(fs, "copy_files")
    assert copies["retries"] == 1 and copies["errors"] == {"CommitNotVisibleError": 1}, copies


def test_a_stalled_file_is_retried_and_the_stalled_worker_never_renames(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An NFS write that hangs: the watchdog expires it after ``write_timeout``, the file is
    retried and the rest of the batch goes on; when the hang ends, the abandoned attempt
    finds itself expired and removes its temporary file instead of renaming it."""
    digests = make_tree(tmp_path / "src", [5000] * 20)
    stalled = str(tmp_path / "src" / "shards" / "005.bin")
    release, entered, ended = threading.Event(), threading.Event(), threading.Event()
    original = small_files.SmallFileBatch._copy_one

    def copy_one(self, file, index, worker):  # type: ignore[no-untyped-def]
        if file.source != stalled or entered.is_set():
            return original(self, file, index, worker)
        entered.set()
        try:
            assert release.wait(30), "never released"
            return original(self, file, index, worker)
        finally:
            ended.set()

    worked = small_files.SmallFileBatch._work
    left_behind = threading.Event()  # the stalled worker returned from its loop

    def work(self):  # type: ignore[no-untyped-def]
        worked(self)
        if ended.is_set():
            left_behind.set()

    monkeypatch.setattr(small_files.SmallFileBatch, "_copy_one", copy_one)
    monkeypatch.setattr(small_files.SmallFileBatch, "_work", work)
    fs = RetryingFileSystem(pafs.LocalFileSystem(), FAST, budget=False, write_timeout=0.5)
    copy_tree(tmp_path / "src", tmp_path / "dst", fs)
    assert entered.is_set() and not ended.is_set()
    assert tree_of(tmp_path / "dst") == digests  # the stalled file by its retry, the rest too
    copies = by_op(fs, "copy_files")
    assert copies["retries"] == 1 and copies["errors"] == {"AttemptTimeoutError": 1}, copies
    # the source changes, then the hang ends: a rename now would land the new bytes
    Path(stalled).write_bytes(b"changed after the copy returned")
    release.set()
    assert left_behind.wait(30)
    assert tree_of(tmp_path / "dst") == digests
    assert by_op(fs, "copy_files") == copies  # it stopped: no more attempts, no more files
    assert fs.failed_commits() == {}


@settings(max_examples=20, deadline=None)
@given(plan=st.lists(st.tuples(st.integers(0, 9000), st.sampled_from(["ok", "busy", "short"])),
                     min_size=2, max_size=12))
def test_any_mix_of_failures_costs_one_attempt_each(
        tmp_path_factory: pytest.TempPathFactory, plan: list[tuple[int, str]]) -> None:
    """Property: whatever files fail once (a transient rename error, a short check), every
    file lands identical, each failure is one retry of that file, nothing else is retried."""
    root = tmp_path_factory.mktemp("mix")
    digests = make_tree(root / "src", [size for size, _ in plan])
    failing = {f"{i:03d}.bin": outcome for i, (_, outcome) in enumerate(plan) if outcome != "ok"}
    with pytest.MonkeyPatch.context() as patch:
        busy = fail_replace_of(patch, {name: 1 for name, how in failing.items() if how == "busy"})
        short = {name for name, how in failing.items() if how == "short"}
        original = small_files._holds

        def holds(path: str, size: int) -> bool:
            name = os.path.basename(path)
            if name in short:
                short.discard(name)
                return False
            return original(path, size)

        patch.setattr(small_files, "_holds", holds)
        resent: list[str] = []
        generic = upload._upload

        def counted(handler, source_fs, source, destination, *args):  # type: ignore[no-untyped-def]
            resent.append(os.path.basename(destination))
            return generic(handler, source_fs, source, destination, *args)

        patch.setattr(upload, "_upload", counted)
        fs = RetryingFileSystem(pafs.LocalFileSystem(), FAST, budget=False)
        copy_tree(root / "src", root / "dst", fs)
    assert tree_of(root / "dst") == digests
    assert not short and not any(busy.values())  # every fault fired
    assert sorted(resent) == sorted(failing)  # each failed file copied again once, alone
    copies = by_op(fs, "copy_files")
    assert copies["attempts"] == len(plan) + len(failing) and copies["giveups"] == 0, copies
    assert fs.failed_commits() == {}


def test_local_paths() -> None:
    local = pafs.LocalFileSystem()
    assert local_root(local) == ""
    assert local_root(pafs.SubTreeFileSystem("/a", local)) == "/a/"
    assert local_root(pafs.SubTreeFileSystem("/b", pafs.SubTreeFileSystem("/a", local))) \
        == "/a/b/"
    assert local_root(pafs.PyFileSystem(pafs.FSSpecHandler(_fsspec_local()))) is None
    assert local_root(RetryingFileSystem(local)) is None  # a wrapper: not a plain local path
    assert local_path("", "/x/y") == "/x/y"
    assert local_path("/a/", "/x/y") == "/a/x/y"
    assert local_path("/a/", "x") == "/a/x"
    for hostile in ("x/y", "/x/../y", "/x//y", "/x/./y", ""):
        assert local_path("", hostile) is None, hostile
    assert local_path("/a/", "../etc") is None


def _fsspec_local():  # type: ignore[no-untyped-def]
    import fsspec

    return fsspec.filesystem("file")

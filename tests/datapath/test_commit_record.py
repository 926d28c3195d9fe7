"""The commit guard's own parts: its install over pyarrow, the failed-commit records, the note.

The guard is installed once, when `retryfs.arrow.filesystem` is imported, so the end-to-end guard tests
never see the install itself run: here it runs against stand-ins for pyarrow's two functions
(``monkeypatch`` puts the real, guarded ones back), and the records and the note that lists
the lost objects are checked word for word (mutation testing found these unguarded).
"""

from __future__ import annotations

import pyarrow.fs as pafs
import pytest

from retryfs.datapath.commits import CopySession, FailedCommits, raise_failed
from retryfs.errors import CopyFilesGuardError
from retryfs.patches.copy_files import install_copy_files_guard


@pytest.fixture
def plain(monkeypatch):
    """Unguarded stand-ins for ``pyarrow.fs._copy_files`` and ``_copy_files_selector``."""
    calls = []

    def copy_files(*args, **kwargs):
        calls.append(("_copy_files", args, kwargs))
        return "copied"

    def copy_files_selector(*args, **kwargs):
        calls.append(("_copy_files_selector", args, kwargs))
        return "copied by selector"

    monkeypatch.setattr(pafs, "_copy_files", copy_files)
    monkeypatch.setattr(pafs, "_copy_files_selector", copy_files_selector)
    return copy_files, copy_files_selector, calls


def test_the_install_wraps_both_functions_and_serves_retryfs_destinations_directly(plain):
    copy_files, copy_files_selector, calls = plain

    def direct(*args, **kwargs):
        calls.append(("direct", args, kwargs))
        return "direct" if kwargs.get("to_retryfs") else NotImplemented

    install_copy_files_guard({"_copy_files": direct})
    for name, original in (("_copy_files", copy_files),
                           ("_copy_files_selector", copy_files_selector)):
        guarded = getattr(pafs, name)
        assert guarded is not original and guarded.__wrapped__ is original
        assert guarded.__retryfs_guard__ is True
    assert pafs._copy_files("src", "dst", to_retryfs=True) == "direct"
    assert pafs._copy_files("src", "dst") == "copied"  # not a retryfs destination
    assert pafs._copy_files_selector("sel", "dst") == "copied by selector"  # no direct one
    assert calls == [("direct", ("src", "dst"), {"to_retryfs": True}),
                     ("direct", ("src", "dst"), {}),
                     ("_copy_files", ("src", "dst"), {}),
                     ("_copy_files_selector", ("sel", "dst"), {})]


def test_a_second_install_keeps_the_guard_and_guards_what_pyarrow_replaced(plain, monkeypatch):
    _, copy_files_selector, _ = plain
    install_copy_files_guard()
    first, selector = pafs._copy_files, pafs._copy_files_selector
    install_copy_files_guard()  # once per process: never a guard around a guard
    assert (pafs._copy_files, pafs._copy_files_selector) == (first, selector)
    monkeypatch.setattr(pafs, "_copy_files_selector", copy_files_selector)  # unguarded again
    install_copy_files_guard()
    assert pafs._copy_files is first
    assert pafs._copy_files_selector.__wrapped__ is copy_files_selector


@pytest.mark.parametrize("name", ["_copy_files", "_copy_files_selector"])
def test_a_pyarrow_without_the_function_fails_the_install_naming_it(plain, monkeypatch, name):
    monkeypatch.delattr(pafs, name)
    with pytest.raises(CopyFilesGuardError) as raised:
        install_copy_files_guard()
    assert str(raised.value) == (
        f"pyarrow.fs.{name} is missing (pyarrow pyarrow.fs); retryfs cannot guard copy_files "
        "against silently failed commits")


@pytest.mark.parametrize("record", [CopySession, FailedCommits])
def test_a_later_commit_of_the_path_clears_its_failure(record):
    first, other = OSError("CompleteMultipartUpload failed"), OSError("other")
    commits = record()
    commits.record("b/fresh", None)  # a commit that landed the first time: nothing to clear
    commits.record("b/ckpt", first)
    commits.record("b/other", other)
    failed = commits.failed if record is CopySession else commits.snapshot()
    assert failed == {"b/ckpt": first, "b/other": other}
    commits.record("b/ckpt", None)  # a later stream of the same path committed
    failed = commits.failed if record is CopySession else commits.snapshot()
    assert failed == {"b/other": other}


@pytest.mark.parametrize("count, listed", [
    (1, "'b/p00'"),
    (10, ", ".join(f"'b/p{i:02d}'" for i in range(10))),
    (11, ", ".join(f"'b/p{i:02d}'" for i in range(10)) + " and 1 more"),
    (12, ", ".join(f"'b/p{i:02d}'" for i in range(10)) + " and 2 more"),
])
def test_the_note_names_the_first_ten_lost_objects_and_counts_the_rest(count, listed):
    errors = {f"b/p{i:02d}": OSError(f"commit {i} failed") for i in reversed(range(count))}
    with pytest.raises(OSError) as raised:
        raise_failed(errors, "pyarrow.fs.copy_files")
    assert raised.value is errors["b/p00"]  # the first path's own exception
    assert raised.value.__notes__ == [
        f"retryfs: pyarrow.fs.copy_files reported success but {count} object(s) were not "
        f"committed: {listed}"]


def test_nothing_failed_raises_nothing():
    assert raise_failed({}, "pyarrow.fs.copy_files") is None

"""Hostile locations for `from_uri`, `retryfs.copy` and the `retryfs` command.

Empty, blank, parameters-only, ``retry::``-only, NUL, very long, ``..``, unicode, roots and the
working directory: each is a clear error (``ValueError``; exit 2 with one line in the CLI) and
nothing is touched. Every CLI test runs inside a sandbox working directory whose whole tree
(names and bytes) is compared before and after.
"""

import hashlib
import io
import os

import pyarrow.fs as pafs
import pytest

import retryfs
from retryfs.cli import main
from retryfs.core.locations import dangerous_target

DEGENERATE = ["", "   ", "\t\n", "retry::", "retry::retry::", "?retry_max_attempts=3",
              "retry::?retry_max_attempts=3", "#fragment"]


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = main([str(a) for a in argv], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def tree(root):
    """Every file and directory under ``root`` with a hash of each file's bytes."""
    found = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames:
            found[os.path.relpath(os.path.join(dirpath, name), root)] = "dir"
        for name in filenames:
            path = os.path.join(dirpath, name)
            with open(path, "rb") as f:
                found[os.path.relpath(path, root)] = hashlib.sha256(f.read()).hexdigest()
    return found


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """A working directory holding a small tree, and the directory above it (also compared)."""
    outer = tmp_path / "outer"
    here = outer / "work"
    (here / "sub").mkdir(parents=True)
    (here / "a.txt").write_bytes(b"a" * 10)
    (here / "sub" / "b.bin").write_bytes(os.urandom(100))
    (outer / "sibling.txt").write_bytes(b"keep me")
    monkeypatch.chdir(here)
    before = tree(tmp_path)
    yield here
    assert tree(tmp_path) == before, "a refused command touched the files"


@pytest.mark.parametrize("uri", DEGENERATE)
def test_from_uri_refuses_a_location_that_names_no_place(uri, sandbox):
    with pytest.raises(ValueError, match="location") as info:
        retryfs.from_uri(uri)
    assert "current directory" in str(info.value) or "names no place" in str(info.value)


def test_from_uri_refuses_a_nul_character(sandbox):
    with pytest.raises(ValueError, match="NUL"):
        retryfs.from_uri("a.txt\x00/../../etc")


def test_from_uri_still_takes_dot_dot_and_unicode(sandbox):
    fs, path = retryfs.from_uri("..")
    assert path == os.path.dirname(str(sandbox))
    (sandbox / "données-✓").mkdir()
    fs, path = retryfs.from_uri("données-✓")
    assert fs.get_file_info(path).type == pafs.FileType.Directory
    (sandbox / "données-✓").rmdir()  # the sandbox's tree is compared at the end


@pytest.mark.parametrize("argv", [
    ["ls", ""], ["ls", "   "], ["ls", "retry::"], ["ls", "?retry_max_attempts=3"],
    ["rm", "-r", ""], ["rm", "-r", " "], ["rm", "-r", "retry::"],
    ["rm", "-r", "?retry_max_attempts=3"], ["rm", ""],
    ["cat", ""], ["cp", "a.txt", ""], ["cp", "a.txt", "retry::"], ["cp", "-r", "sub", "retry::"],
    ["cp", "-r", "", "out"], ["cp", "-r", "sub", "?retry_max_attempts=3"],
    ["ls", "a.txt\x00"], ["rm", "-r", "sub\x00"], ["cp", "a.txt", "out\x00"],
])
def test_cli_refuses_a_location_that_names_no_place(argv, sandbox):
    code, out, err = run(*argv)
    assert code == 2, (out, err)
    assert err.startswith("retryfs: error: ") and err.count("\n") == 1
    assert "empty" in err or "names no place" in err or "NUL" in err
    assert out == ""


@pytest.mark.parametrize("target", [".", "..", "./", "sub/..", "{here}", "{outer}", "/",
                                    "file:///", "{here_uri}"])
def test_rm_r_refuses_the_working_directory_its_parents_and_the_root(target, sandbox):
    target = target.format(here=sandbox, outer=sandbox.parent, here_uri=sandbox.as_uri())
    code, out, err = run("rm", "-r", target)
    assert code == 2, (out, err)
    assert "refusing to remove" in err and "--no-preserve-root" in err
    assert out == ""


def test_rm_r_of_an_ordinary_directory_still_works_and_no_preserve_root_is_explicit(
        tmp_path, monkeypatch):
    here = tmp_path / "doomed"
    (here / "x").mkdir(parents=True)
    (here / "x" / "f").write_bytes(b"1")
    (here / "other").mkdir()
    (here / "other" / "g").write_bytes(b"22")
    monkeypatch.chdir(here)
    code, out, err = run("rm", "-r", "other")
    assert code == 0, err
    assert "removed 1 file(s) (2 B)" in out and not (here / "other").exists()
    assert run("rm", "-r", ".")[0] == 2 and (here / "x" / "f").exists()
    code, out, err = run("rm", "-r", "--no-preserve-root", ".")
    assert code == 0, err
    assert "removed 1 file(s)" in out and not (here / "x").exists()


@pytest.mark.parametrize("name", ["x" * 5000, "d/" * 3000])
def test_a_name_too_long_is_a_usage_error(name, sandbox):
    for argv in (["ls", name], ["rm", "-r", name], ["cp", "a.txt", name]):
        code, out, err = run(*argv)
        assert code == 2, (argv[0], out, err)
        assert err == ("retryfs: error: a name in the location is too long for the filesystem "
                       "(errno 36, File name too long)\n")


def test_unicode_locations_work_and_missing_ones_are_clear(sandbox):
    code, out, err = run("ls", "nicht-da-ü✓")
    assert code == 2 and "not found" in err and "nicht-da-ü✓" in err
    code, out, err = run("cp", "a.txt", "kopie-ü✓.txt")
    assert code == 0, err
    assert (sandbox / "kopie-ü✓.txt").read_bytes() == b"a" * 10
    (sandbox / "kopie-ü✓.txt").unlink()  # the sandbox's tree is compared at the end


def test_copy_refuses_an_empty_location_in_every_form(sandbox):
    for src, dst in [("", "out"), ("a.txt", ""), ("a.txt", "retry::"),
                     ((pafs.LocalFileSystem(), ""), "out"),
                     ("a.txt", (pafs.LocalFileSystem(), "  "))]:
        with pytest.raises(ValueError, match="src|dst"):
            retryfs.copy(src, dst)


def test_rm_r_refuses_a_bucket_and_the_whole_store(s3_fault_endpoint, s3_fault_bucket):
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    ep.put_object(bucket, "ckpt/model.pt", b"weights")
    for path in (bucket, f"{bucket}/", ""):
        code, out, err = run("rm", "-r", ep.uri(path, retry_max_attempts=1))
        assert code == 2, (path, out, err)
        assert "refusing to remove" in err and "--no-preserve-root" in err
    # the SDK would send bucket/ckpt/.. to the bucket itself (a DeleteBucket)
    for argv in (["rm", "-r"], ["rm"], ["ls"]):
        for path in (f"{bucket}/ckpt/..", f"{bucket}/ckpt/../ckpt", f"{bucket}/./ckpt"):
            code, out, err = run(*argv, ep.uri(path, retry_max_attempts=1))
            assert code == 2 and "'..' segment" in err, (argv, path, out, err)
    assert ep.keys(bucket) == ["ckpt/model.pt"]
    assert not [r for r in ep.requests() if r.op.startswith("Delete")]
    code, out, err = run("rm", "-r", ep.uri(f"{bucket}/ckpt", retry_max_attempts=1))
    assert code == 0 and "removed 1 file(s)" in out, err


@pytest.mark.parametrize("fs, path, refused", [
    (pafs.LocalFileSystem(), "/", True),
    (pafs.LocalFileSystem(), "/tmp/../", True),
    (pafs.SubTreeFileSystem("/", pafs.LocalFileSystem()), "", True),
    (pafs.SubTreeFileSystem("/", pafs.LocalFileSystem()), "bucket-like/x", False),
])
def test_dangerous_target_of_other_filesystems(fs, path, refused):
    assert (dangerous_target(fs, path) is not None) == refused

"""`retryfs.patches.registry`: every change to another library in one place, version-checked, logged
once, and possible to turn off; nothing patched by ``import retryfs`` alone."""

import subprocess
import sys
import textwrap

import pytest

from retryfs.patches import registry as _compat

PROBE = textwrap.dedent("""
    import logging, sys
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(message)s")
    import pyarrow.fs as pafs
    import retryfs
    from retryfs.patches import registry as _compat
    {before}
    print("after import:", getattr(pafs._copy_files, "__retryfs_guard__", False))
    retryfs.RetryingFileSystem(pafs.LocalFileSystem())
    print("after a wrapper:", getattr(pafs._copy_files, "__retryfs_guard__", False),
          getattr(pafs._copy_files_selector, "__retryfs_guard__", False))
    print("status:", _compat.status()["copy_files"])
""")


def _probe(before: str = "", env: dict | None = None) -> subprocess.CompletedProcess:
    import os

    return subprocess.run([sys.executable, "-c", PROBE.format(before=before)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})


def test_import_patches_nothing_a_wrapper_applies_the_copy_files_guard_and_logs_it_once():
    result = _probe()
    assert result.returncode == 0, result.stderr
    assert "after import: False" in result.stdout
    assert "after a wrapper: True True" in result.stdout
    assert "status: installed" in result.stdout
    assert result.stderr.count("patch copy_files: pyarrow.fs._copy_files") == 1


def test_an_unknown_pyarrow_version_skips_the_patch_with_a_warning():
    result = _probe('_compat._version_of = lambda package: "99.1.0"')
    assert result.returncode == 0, result.stderr
    assert "after a wrapper: False False" in result.stdout
    assert "status: skipped (pyarrow 99.1.0)" in result.stdout
    assert "patch copy_files skipped: pyarrow 99.1.0 is not a version it was written " \
           "against (14.0 to 26.99)" in result.stderr
    assert "a commit that finally failed is ignored by copy_files" in result.stderr


@pytest.mark.parametrize("how", ["environment", "function"])
def test_the_copy_files_patch_can_be_turned_off(how):
    if how == "environment":
        result = _probe(env={"RETRYFS_DISABLE_PATCHES": "s3fs_parts,copy_files"})
    else:
        result = _probe('_compat.disable("copy_files")')
    assert result.returncode == 0, result.stderr
    assert "after a wrapper: False False" in result.stdout
    assert "status: off" in result.stdout


def test_the_s3fs_parts_patch_applies_per_file_and_can_be_turned_off(s3_fault_endpoint,
                                                                     s3_fault_bucket):
    from retryfs.fsspec.filesystem import RetryFileSystem

    fs = RetryFileSystem(fs=s3_fault_endpoint.s3fs())
    with fs.open(f"{s3_fault_bucket}/a", "wb") as f:
        patched = f._last_inner.file._call_s3
        f.write(b"x")
    assert getattr(patched, "__name__", "") == "retried"
    _compat.disable("s3fs_parts")
    try:
        with fs.open(f"{s3_fault_bucket}/b", "wb") as f:
            plain = f._last_inner.file._call_s3
            f.write(b"x")
    finally:
        _compat.enable("s3fs_parts")
    assert getattr(plain, "__name__", "") == "_call_s3"  # s3fs's own method
    assert s3_fault_endpoint.get_object(s3_fault_bucket, "b") == b"x"


def test_versions_and_names():
    patch = _compat.PATCHES["copy_files"]
    assert _compat.version_fits(patch, "26.0.1") and _compat.version_fits(patch, "14.0.0")
    assert not _compat.version_fits(patch, "13.0.0") and not _compat.version_fits(patch, "27.0")
    assert not _compat.version_fits(patch, None) and not _compat.version_fits(patch, "dev")
    assert _compat.version_fits(_compat.PATCHES["s3fs_parts"], "2026.9.0")
    with pytest.raises(ValueError, match="unknown patch 'nope'; known: copy_files, s3fs_parts"):
        _compat.disable("nope")

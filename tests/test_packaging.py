"""Packaging metadata as a build backend sees it, and documented return types that match."""

import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.fs as pafs
import pytest
from _helpers import FAST

from retryfs import RetryingFileSystem
from retryfs.testing import FaultyFileSystem, errors

ROOT = Path(__file__).resolve().parent.parent

_METADATA = """\
import sys, warnings
from setuptools import build_meta
warnings.simplefilter("always")
with warnings.catch_warnings(record=True) as caught:
    name = build_meta.prepare_metadata_for_build_wheel(sys.argv[1])
for w in caught:
    print("WARNING", w.category.__name__, str(w.message).splitlines()[0])
print("DIST", name)
"""


def test_license_is_an_spdx_expression_with_its_file():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["license"] == "Apache-2.0"  # a string (PEP 639), not a {text = ...} table
    files = project["license-files"]
    assert files and all((ROOT / name).is_file() for name in files)
    assert "Apache License" in (ROOT / files[0]).read_text()[:200]


def test_the_build_backend_writes_the_license_expression(tmp_path):
    """The metadata setuptools builds from a copy of the tree: License-Expression, the license
    file shipped, and no deprecation warning about the license (setuptools drops the table form
    on 2027-02-18)."""
    pytest.importorskip("setuptools", minversion="77")
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src / name)
    shutil.copytree(ROOT / "retryfs", src / "retryfs",
                    ignore=shutil.ignore_patterns("__pycache__"))
    out = tmp_path / "meta"
    out.mkdir()
    done = subprocess.run([sys.executable, "-c", _METADATA, str(out)], cwd=src,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    warnings = [line for line in done.stdout.splitlines() if line.startswith("WARNING")]
    assert not [w for w in warnings if "license" in w.lower()], warnings
    dist = out / done.stdout.split("DIST ", 1)[1].strip()
    metadata = (dist / "METADATA").read_text()
    assert "License-Expression: Apache-2.0" in metadata
    assert "License-File: LICENSE" in metadata
    assert (dist / "licenses" / "LICENSE").is_file()


def test_failed_commits_is_the_dict_the_documentation_describes(tmp_path):
    faulty = FaultyFileSystem(pafs.LocalFileSystem())
    fs = RetryingFileSystem(faulty, FAST)
    faulty.inject("close", errors.commit_failed(), times=None)
    path = str(tmp_path / "lost.bin")
    with pytest.raises(OSError) as raised:
        with fs.open_output_stream(path) as out:
            out.write(b"weights")
    failed = fs.failed_commits()
    assert isinstance(failed, dict) and list(failed) == [path]
    assert failed[path] is raised.value  # the original exception, to inspect or re-raise
    failed.clear()  # a snapshot: the caller's copy, not the record
    assert list(fs.failed_commits()) == [path]
    docs = " ".join(" ".join(page.read_text().split())
                    for page in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")])
    assert "`fs.failed_commits()` returns a dict `{path: exception}`" in docs
    assert "failed_commits()` lists" not in docs

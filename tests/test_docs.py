"""The documentation: the site builds with ``mkdocs build --strict`` (a broken link or anchor, a
missing page, a docstring the API reference cannot render fails), and every Python example of
the README and of ``docs/`` runs (Sybil), in page order with one namespace per page, against the
embedded S3 server: ``s3://bucket/...`` and ``pyarrow.fs.S3FileSystem(...)`` in an example
reach the session's moto endpoint (a bucket named ``bucket`` exists), s3fs through
``AWS_ENDPOINT_URL``, and the working directory holds a small ``./checkpoint``. An example that
cannot run here says so in its page, with the reason and its tested twin, and is skipped by a
``<!-- skip: next "reason" -->`` directive beside it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
from sybil import Sybil
from sybil.parsers.markdown import PythonCodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

BUCKET = "bucket"


def test_the_site_builds_strictly(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir",
         str(tmp_path / "site")], cwd=ROOT, capture_output=True, text=True, timeout=300,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tmp_path / "site" / "api" / "index.html").read_text().count("RetryingFileSystem")


def test_the_configuration_page_lists_every_option():
    sys.path.insert(0, str(ROOT / "docs" / "hooks"))
    try:
        from options import MARKER, options_table
    finally:
        sys.path.pop(0)
    from retryfs.config import PARAMETERS

    assert MARKER in (ROOT / "docs" / "configuration.md").read_text()
    table = options_table()
    for parameter in PARAMETERS.values():
        assert f"`{parameter.url_name}`" in table
    for row in table.splitlines()[2:]:
        if row.startswith("| `retry_"):
            assert row.split(" | ")[2], row  # every option's type is known


def test_the_readme_is_a_front_page():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.splitlines()) <= 250
    for target in re.findall(r"\]\((docs/[^)#]*)(?:#[^)]*)?\)", readme):
        assert (ROOT / target).exists(), target  # (the site's build checks the pages' links)


#: What user documentation never carries: dates, clock times, commit hashes (the record of a
#: run is benchmarks/results/history.txt; the performance page shows the current run).
DATED = re.compile(r"\b20\d\d-\d\d-\d\d\b|\b\d{1,2}:\d\d(?:[-–]\d{1,2}:\d\d)? UTC\b"
                   r"|\b(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,12}\b")


@pytest.mark.parametrize("page", [*PAGES, ROOT / "benchmarks" / "results" / "latest.txt"],
                         ids=lambda page: str(page.relative_to(ROOT)))
def test_the_documentation_carries_no_dates_or_commits(page):
    assert not DATED.findall(page.read_text())


def _examples() -> Iterator[Any]:
    parser = Sybil(parsers=[PythonCodeBlockParser(), SkipParser()])
    for page in PAGES:
        document = parser.parse(page)
        for example in document.examples():
            yield pytest.param(example, id=f"{page.relative_to(ROOT)}:{example.line}")


EXAMPLES = list(_examples())


class _LocalS3(pafs.S3FileSystem):
    """``pyarrow.fs.S3FileSystem`` pointed at the session's S3 server (pyarrow reads no
    endpoint from the environment: apache/arrow#49643)."""

    endpoint = ""

    def __init__(self, **options: Any) -> None:
        options.setdefault("endpoint_override", self.endpoint)
        options.setdefault("scheme", "http")
        options.setdefault("access_key", "testing")
        options.setdefault("secret_key", "testing")
        super().__init__(**options)


@pytest.fixture(scope="module")
def local_s3(s3_fault_server, tmp_path_factory) -> Iterator[None]:
    import retryfs.uri

    endpoint = f"{s3_fault_server.host}:{s3_fault_server.port}"
    s3_fault_server.reset()
    s3_fault_server.create_bucket(BUCKET)
    work = tmp_path_factory.mktemp("docs")
    for name in ("model.pt", "optimizer.pt"):
        (work / "checkpoint").mkdir(exist_ok=True)
        (work / "checkpoint" / name).write_bytes(name.encode() * 1000)
    arrow_from_uri = retryfs.uri._arrow_from_uri

    def from_uri(uri: str) -> Any:
        if uri.startswith("s3://"):
            uri += ("&" if "?" in uri else "?") + (
                f"endpoint_override={endpoint}&scheme=http")
        return arrow_from_uri(uri)

    _LocalS3.endpoint = endpoint
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pafs, "S3FileSystem", _LocalS3)
        patch.setattr(retryfs.uri, "_arrow_from_uri", from_uri)
        for name, value in {"AWS_ENDPOINT_URL": f"http://{endpoint}",
                            "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                            "AWS_DEFAULT_REGION": "us-east-1"}.items():
            patch.setenv(name, value)
        patch.chdir(work)
        patch.setattr(tempfile, "tempdir", str(work))  # an example's temporary files, removed
        yield
    s3_fault_server.reset()


@pytest.mark.parametrize("example", EXAMPLES)
def test_the_example_runs(example, local_s3):
    example.evaluate()

"""The session check of ``tests/conftest.py``: a run that leaves files in the temporary
directory fails, naming them; a clean one passes; other sessions' files are not counted."""

import os
import tempfile
from pathlib import Path

import pytest
from hypothesis import settings

CONFTEST = Path(__file__).with_name("conftest.py").read_text()


def test_tmpdir_is_this_sessions_own():
    own = tempfile.gettempdir()
    assert os.environ["TMPDIR"] == own and os.path.basename(own).startswith("rfs-")


@pytest.fixture(autouse=True)
def _not_strict(monkeypatch):
    """The inner sessions run a copy of the conftest in pytester's directory, which has no
    pyproject.toml to check the test extra against: `make test`'s strict switch is not theirs."""
    for name in ("CI", "RETRYFS_STRICT_TEST_DEPS"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture(autouse=True)
def _outer_hypothesis_profile():
    """The inner sessions run in this process (no interpreter to start) and import the
    conftest's copy, which loads a hypothesis profile: this session's is loaded again after."""
    profile = settings.get_current_profile_name()
    yield
    settings.load_profile(profile)


def test_a_run_that_leaves_files_behind_fails(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_leaky="""
        import os, tempfile

        def test_leaks_a_file():
            fd, _ = tempfile.mkstemp(prefix="checkpoint_tmp_")
            os.close(fd)

        def test_leaks_a_directory():
            os.mkdir(os.path.join(tempfile.gettempdir(), "lightning_checkpoints-x"))

        def test_tmp_path_is_fine(tmp_path):
            (tmp_path / "kept-by-pytest").write_text("ok")
    """)
    outside = Path(os.environ["TMPDIR"], "another-session-file")  # not this inner session's
    outside.write_text("x")
    try:
        result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    finally:
        outside.unlink()
    result.assert_outcomes(passed=3)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*tests left 2 entries in the temporary directory*"
                                 "checkpoint_tmp_*lightning_checkpoints-x*"])
    assert "another-session-file" not in result.stdout.str()


def test_a_clean_run_passes(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_clean="""
        import tempfile

        def test_cleans_up(tmp_path):
            with tempfile.TemporaryDirectory():
                pass
            (tmp_path / "f").write_text("ok")
    """)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    assert result.ret == 0 and "leftovers" not in result.stdout.str()


@pytest.mark.slow  # two worker interpreters start (about 5-15 s): the check runs under make test
def test_under_xdist_the_controller_checks_once_every_worker_has_finished(pytester):
    """`make test-fast` runs two pytest-xdist workers in the controller's directory: what a test
    in either leaves fails the run, named once, and the workers themselves leave nothing."""
    pytest.importorskip("xdist")
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_workers="""
        import os, tempfile

        def test_leaks_a_file():
            fd, _ = tempfile.mkstemp(prefix="checkpoint_tmp_")
            os.close(fd)

        def test_cleans_up(tmp_path):
            with tempfile.TemporaryDirectory(prefix="in-flight-"):
                pass
            (tmp_path / "f").write_text("ok")

        def test_runs_in_a_worker():
            assert os.environ["PYTEST_XDIST_WORKER"].startswith("gw")
    """)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-n", "2")
    result.assert_outcomes(passed=3)
    assert result.ret == 1
    result.stdout.fnmatch_lines(["*tests left 1 entry in the temporary directory*checkpoint_tmp_*"])

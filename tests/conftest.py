"""Fixtures shared by the test suite, the session's own temporary directory, and the check
that a CI run has every test dependency.

Each pytest session gets a temporary directory of its own (``TMPDIR``, ``tempfile.tempdir``,
inherited by subprocesses and Ray workers; pytest's ``tmp_path`` lives inside it too), so that
what this session leaves behind can be told apart from what other sessions on the machine do.
At the end, anything left in it besides pytest's own ``tmp_path`` tree fails the run, named
(tests clean up what they and the code under test create); then the directory is removed.
"""

import os
import re
import shutil
import sys
import tempfile
from importlib import metadata
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# gcsfs's experimental bucket-type probe speaks gRPC to the endpoint (60 s against an emulator)
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

from retryfs.core.budget import reset_budgets
from retryfs.core.ratelimit import reset_limiters
from retryfs.core.redact import registered_secrets, reset_secrets
from retryfs.testing import FaultyFileSystem

pytest_plugins = ["pytester", "retryfs.testing.pytest_plugin"]

#: What the session itself keeps in its directory: pytest's basetemp root (tmp_path), and
#: torch's compile cache (pointed there with TORCHINDUCTOR_CACHE_DIR, which the workers inherit;
#: torch makes it whenever it is imported, in any test).
_PYTEST_OWN = ("pytest-of-", "torchinductor-cache")


def _xdist_worker(config) -> bool:
    """A pytest-xdist worker (``make test-fast`` runs two): it shares the controller's directory,
    which the controller checks once every worker has finished (a worker's own check would see
    the other's files in flight as leftovers)."""
    return hasattr(config, "workerinput")


def pytest_configure(config):
    if hasattr(config, "_retryfs_tmp") or _xdist_worker(config):
        return
    saved = (os.environ.get("TMPDIR"), tempfile.tempdir)
    own = tempfile.mkdtemp(prefix="rfs-")  # short: Ray's AF_UNIX socket paths sit below it
    os.environ["TMPDIR"] = own
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(own, "torchinductor-cache"))
    tempfile.tempdir = own
    config._retryfs_tmp = (own, saved)


def leftovers(directory):
    """What is in ``directory`` besides pytest's own tree, sorted."""
    return sorted(name for name in os.listdir(directory) if not name.startswith(_PYTEST_OWN))


@pytest.hookimpl(tryfirst=True)
def pytest_sessionfinish(session, exitstatus):
    own, _ = getattr(session.config, "_retryfs_tmp", (None, None))
    if own is None or not os.path.isdir(own):
        return
    left = leftovers(own)
    if left:
        shown = ", ".join(left[:20]) + (f" and {len(left) - 20} more" if len(left) > 20 else "")
        message = (f"tests left {len(left)} entr{'y' if len(left) == 1 else 'ies'} in the "
                   f"temporary directory ({own}): {shown}")
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_sep("=", "leftovers in the temporary directory", red=True)
            reporter.write_line(message)
        else:
            print(message)
        if session.exitstatus == pytest.ExitCode.OK:
            session.exitstatus = pytest.ExitCode.TESTS_FAILED


def pytest_unconfigure(config):
    own, saved = getattr(config, "_retryfs_tmp", (None, (None, None)))
    if own is None:
        return
    shutil.rmtree(own, ignore_errors=True)
    tmpdir, tempdir = saved
    if tmpdir is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = tmpdir
    tempfile.tempdir = tempdir
    del config._retryfs_tmp


def _test_extra() -> list[str]:
    """The distribution names of pyproject's `test` extra (what `make test` installs)."""
    pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
    if sys.version_info >= (3, 11):
        import tomllib

        extra = tomllib.loads(pyproject.read_text())["project"]["optional-dependencies"]["test"]
    else:  # pragma: no cover - CI runs 3.11
        extra = re.findall(r'^\s+"([^"]+)",$', pyproject.read_text().split("test = [", 1)[1]
                           .split("]\n", 1)[0], re.M)
    return [re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0] for requirement in extra]


def missing_test_dependencies() -> list[str]:
    missing = []
    for name in _test_extra():
        try:
            metadata.distribution(name)
        except metadata.PackageNotFoundError:
            missing.append(name)
    return missing


def pytest_sessionstart(session: pytest.Session) -> None:
    # the same switch as _helpers.strict_dependencies (this file stands alone: tests copy it)
    strict = any(os.environ.get(name, "").lower() in ("1", "true", "yes")
                 for name in ("CI", "RETRYFS_STRICT_TEST_DEPS"))
    if strict and (missing := missing_test_dependencies()):
        pytest.exit(f"missing test dependencies (pyproject's `test` extra): {', '.join(missing)}"
                    " -- install them (`make test` does) rather than skip their tests",
                    returncode=4)


@pytest.fixture(autouse=True)
def _every_injected_fault_fires(request, monkeypatch):
    """A test that injects a fault asserts an outcome under that fault: one that never fired
    means the test did not test what it says (a path that matched nothing, a no-op plan)."""
    if request.node.get_closest_marker("unfired_faults_ok"):
        yield
        return
    injected: list = []
    original = FaultyFileSystem.inject

    def inject(self, *args, **kwargs):
        fault = original(self, *args, **kwargs)
        injected.append(fault)
        return fault

    monkeypatch.setattr(FaultyFileSystem, "inject", inject)
    yield
    unfired = [f"{fault.operation} on {fault.path!r} (skip={fault.skip})"
               for fault in injected if fault.fired == 0]
    if unfired:
        pytest.fail(f"injected faults that never fired: {'; '.join(unfired)}", pytrace=False)


@pytest.fixture(autouse=True)
def _disengaged_rate_limiters():
    """The rate limiters are per process and endpoint: a storm one test made must not make the
    next test's throttles slow (its limiter engaged) or pace its requests."""
    reset_limiters()
    yield


@pytest.fixture(autouse=True)
def _isolated_secret_registry():
    """The secret registry is process-wide: what one test registers must not mask another's
    leak, so every test ends with the registry as it found it."""
    saved = registered_secrets()
    yield
    reset_secrets(saved)


@pytest.fixture
def clean_retryfs_env(monkeypatch):
    """No ``RETRYFS_*`` defaults from the environment, and fresh retry budgets before and after."""
    for name in list(os.environ):
        if name.startswith("RETRYFS_"):
            monkeypatch.delenv(name)
    reset_budgets()
    yield
    reset_budgets()


# Hypothesis profiles: the default one for `make test`; `fast` for `make test-fast`;
# `--hypothesis-profile=long` for thousands of examples (tests/test_simulation.py). A failing example prints its blob to replay it.
# derandomize: `make test` (CI) runs the same examples every time; explore with the long profile
settings.register_profile("default", deadline=None, print_blob=True, max_examples=200,
                          derandomize=True,
                          stateful_step_count=20,
                          suppress_health_check=[HealthCheck.too_slow])
settings.register_profile("long", settings.get_profile("default"), max_examples=3000, derandomize=False,
                          stateful_step_count=40)
# `make test-fast` (contributors): a quarter of the examples, the same derandomized draw; the
# full 200 stay in `make test` (CI). Tests with their own @settings(max_examples=...) keep theirs.
settings.register_profile("fast", settings.get_profile("default"), max_examples=50)
settings.load_profile(os.environ.get("RETRYFS_HYPOTHESIS_PROFILE", "default"))

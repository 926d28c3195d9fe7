"""pyarrow's own filesystem tests, run through `RetryingFileSystem`.

pyarrow ships ``pyarrow/tests/test_fs.py``; its ``fs``-parametrized tests run against
``PyFileSystem(ProxyHandler(...))`` and ``PyFileSystem(FSSpecHandler(...))``, pyarrow's own
Python-level proxies. Here every one of those tests runs with a `RetryingFileSystem` in the
proxy's place (over the same inner filesystem), so the wrapper must pass what the proxies pass:
metadata, mtimes, pickling, errors, every edge pyarrow checks.
"""

from __future__ import annotations

import inspect
import pathlib

import fsspec
import pyarrow.fs as pafs
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from pyarrow.tests import test_fs as _pyarrow_fs_tests
from pyarrow.tests.test_fs import _MockFileSystem

import retryfs

#: The fixtures of pyarrow's suite a test must take to be a filesystem-conformance test.
_FS_FIXTURES = {"fs", "pathfn", "filesystem_config", "allow_move_dir", "allow_append_to_file"}


def _conformance_tests() -> dict[str, object]:
    found = {}
    for name, value in vars(_pyarrow_fs_tests).items():
        if name.startswith("test_") and callable(value):
            params = set(inspect.signature(value).parameters)
            if params & _FS_FIXTURES:
                found[name] = value
    return found


globals().update(_conformance_tests())
# the fixtures that read the config (pyarrow's own); `filesystem_config` itself is ours, below
fs = _pyarrow_fs_tests.fs
pathfn = _pyarrow_fs_tests.pathfn
allow_move_dir = _pyarrow_fs_tests.allow_move_dir
allow_append_to_file = _pyarrow_fs_tests.allow_append_to_file


def _wrapped(inner: object) -> retryfs.RetryingFileSystem:
    return retryfs.RetryingFileSystem(inner, policy=retryfs.RetryPolicy(max_attempts=3,
                                                                        initial_delay=0.001))


@pytest.fixture
def tempdir(tmp_path: pathlib.Path) -> pathlib.Path:
    return tmp_path


@pytest.fixture(params=["builtin_pickle", "cloudpickle"])
def pickle_module(request: pytest.FixtureRequest):
    import pickle

    import cloudpickle

    return pickle if request.param == "builtin_pickle" else cloudpickle


@pytest.fixture(params=[True, False])
def pickle_with_and_without_subtree_filesystem(pickle_module, request):
    if request.param:
        return _pyarrow_fs_tests._PickleModuleSubTreeFileSystemWrapper(pickle_module)
    return pickle_module


_CONFIGS = {
    "retry(LocalFileSystem())": (lambda tmp: _wrapped(pafs.LocalFileSystem()), True),
    "retry(_MockFileSystem())": (lambda tmp: _wrapped(_MockFileSystem()), False),
    "retry(fsspec.LocalFileSystem())": (lambda tmp: _wrapped(fsspec.filesystem("file")), True),
    "retry(fsspec.filesystem('memory'))": (
        lambda tmp: _wrapped(MemoryFileSystem()), False),
}


@pytest.fixture(params=list(_CONFIGS), ids=list(_CONFIGS))
def filesystem_config(request: pytest.FixtureRequest, tempdir: pathlib.Path):
    make, local = _CONFIGS[request.param]
    fs = make(tempdir)
    MemoryFileSystem.store.clear()  # one store per process: start each test empty
    MemoryFileSystem.pseudo_dirs[:] = [""]
    yield dict(
        fs=fs,
        pathfn=(lambda p: (tempdir / p).as_posix()) if local else (lambda p: p),
        allow_move_dir=True,
        allow_append_to_file=True,
    )
    assert fs.stats.snapshot()["retries"] == 0, "pyarrow's tests inject no faults"

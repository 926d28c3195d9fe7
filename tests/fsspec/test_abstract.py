"""fsspec's own test suite for implementers (``fsspec.tests.abstract``), run through ``retry``.

Three wrapped filesystems: local, memory, and a memory filesystem whose every storage call fails
once with a connection reset before it works (so that the whole suite runs on retries: the
wrapper must be invisible even when it is busy).
"""

from __future__ import annotations

import os
import threading
from collections import Counter

import fsspec
import fsspec.tests.abstract as abstract
import pytest
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from retryfs import RetryPolicy
from retryfs.fsspec.filesystem import RetryFileSystem

FAST = RetryPolicy(max_attempts=3, initial_delay=0.0, max_delay=0.0, jitter=False)
# A flaky call may itself make several flaky calls (memory's makedirs calls mkdir per level).
PATIENT = FAST.replace(max_attempts=30)


def _retry(inner: fsspec.AbstractFileSystem, policy: RetryPolicy = FAST) -> RetryFileSystem:
    return fsspec.filesystem("retry", fs=inner, policy=policy, budget=False,
                             skip_instance_cache=True)


def RetryFileSystem_methods():  # noqa: N802
    from retryfs.fsspec.filesystem import SYNC_METHODS

    return [name for name in SYNC_METHODS
            if name not in ("walk", "tree") and callable(getattr(MemoryFileSystem, name))]


class FlakyMemoryFileSystem(MemoryFileSystem):
    """A memory filesystem whose every call from outside fails once per path (ECONNRESET).

    Only calls that come from outside fail, the way a request fails: the calls it makes to
    itself inside one (memory's ``rm`` calls ``isfile``, which swallows errors) never do, or the
    filesystem would misbehave on its own, wrapped or not.
    """

    protocol = "flakymemory"
    _FLAKY = tuple(name for name in (
        "ls", "info", "cat_file", "pipe_file", "rm_file", "_rm", "mkdir", "makedirs", "cp_file",
        "_open", "rmdir", "exists", "isdir", "isfile", "put_file", "get_file", "rm", "mv")
        if name in vars(MemoryFileSystem))

    def __init__(self, *args, **kwargs):
        super().__init__(*args, global_store=False, **kwargs)
        self.failed: Counter[str] = Counter()
        self._seen: set[tuple[str, str]] = set()
        self._depth = threading.local()


def _entry(name):
    """Every method is an entry point; the storage calls among them fail once per path."""
    original = getattr(MemoryFileSystem, name)
    flaky = name in FlakyMemoryFileSystem._FLAKY

    def method(self, *args, **kwargs):
        depth = getattr(self._depth, "n", 0)
        key = (name, str(args[0] if args else sorted(kwargs.items())))
        if flaky and depth == 0 and key not in self._seen:
            self._seen.add(key)
            self.failed[name] += 1
            raise ConnectionResetError(104, "Connection reset by peer")
        self._depth.n = depth + 1
        try:
            return original(self, *args, **kwargs)
        finally:
            self._depth.n = depth

    method.__name__ = name
    return method


for _name in {*FlakyMemoryFileSystem._FLAKY, *RetryFileSystem_methods()}:
    setattr(FlakyMemoryFileSystem, _name, _entry(_name))


class LocalRetryFixtures(abstract.AbstractFixtures):
    @pytest.fixture(scope="class")
    def fs(self):
        return _retry(LocalFileSystem(auto_mkdir=True))

    @pytest.fixture
    def fs_path(self, tmpdir):
        return str(tmpdir)


class MemoryRetryFixtures(abstract.AbstractFixtures):
    @pytest.fixture(scope="class")
    def fs(self):
        return _retry(MemoryFileSystem(global_store=False, skip_instance_cache=True))

    @pytest.fixture
    def fs_join(self):
        return lambda *args: "/".join(args)

    @pytest.fixture
    def fs_path(self):
        return ""


class FlakyRetryFixtures(MemoryRetryFixtures):
    @pytest.fixture(scope="class")
    def fs(self):
        flaky = _retry(FlakyMemoryFileSystem(skip_instance_cache=True), PATIENT)
        yield flaky
        # the suite really ran on retries, and every injected failure was retried (once)
        injected = sum(flaky.fs.failed.values())
        assert injected > 0
        assert flaky.stats.snapshot()["retries"] == injected
        assert flaky.stats.snapshot()["giveups"] == 0


class TestLocalCopy(abstract.AbstractCopyTests, LocalRetryFixtures):
    pass


class TestLocalGet(abstract.AbstractGetTests, LocalRetryFixtures):
    pass


class TestLocalPut(abstract.AbstractPutTests, LocalRetryFixtures):
    pass


class TestLocalOpen(abstract.AbstractOpenTests, LocalRetryFixtures):
    pass


class TestLocalPipe(abstract.AbstractPipeTests, LocalRetryFixtures):
    pass


class TestMemoryCopy(abstract.AbstractCopyTests, MemoryRetryFixtures):
    pass


class TestMemoryGet(abstract.AbstractGetTests, MemoryRetryFixtures):
    pass


class TestMemoryPut(abstract.AbstractPutTests, MemoryRetryFixtures):
    pass


class TestMemoryOpen(abstract.AbstractOpenTests, MemoryRetryFixtures):
    pass


class TestMemoryPipe(abstract.AbstractPipeTests, MemoryRetryFixtures):
    pass


class TestFlakyMemoryCopy(abstract.AbstractCopyTests, FlakyRetryFixtures):
    pass


class TestFlakyMemoryGet(abstract.AbstractGetTests, FlakyRetryFixtures):
    pass


class TestFlakyMemoryPut(abstract.AbstractPutTests, FlakyRetryFixtures):
    pass


class TestFlakyMemoryPipe(abstract.AbstractPipeTests, FlakyRetryFixtures):
    pass


def test_the_suite_is_the_installed_fsspec_one():
    # guard against a silently empty suite: fsspec ships these classes with dozens of tests
    tests = [name for cls in (abstract.AbstractCopyTests, abstract.AbstractGetTests,
                              abstract.AbstractPutTests) for name in dir(cls)
             if name.startswith("test_")]
    assert len(tests) >= 40
    assert os.path.dirname(abstract.__file__).endswith(os.path.join("fsspec", "tests",
                                                                    "abstract"))

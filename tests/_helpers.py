"""Shared test helpers (not fixtures): tiny policies, hashing, required test dependencies."""

import hashlib
import importlib
import os
from types import ModuleType
from typing import Any

import pytest

from retryfs import RetryPolicy

FAST = RetryPolicy(max_attempts=4, initial_delay=0.001, multiplier=2, max_delay=0.004,
                   jitter=False)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def strict_dependencies() -> bool:
    """Under CI or `make test` a missing test dependency fails the run instead of skipping."""
    return any(os.environ.get(name, "").lower() in ("1", "true", "yes")
               for name in ("CI", "RETRYFS_STRICT_TEST_DEPS"))


def require(module: str) -> ModuleType:
    """``pytest.importorskip`` for a developer's partial install; under CI or `make test` a
    missing test dependency is an error that names it, never a skip."""
    if strict_dependencies():
        return importlib.import_module(module)
    return pytest.importorskip(module)


def open_files_under(directory) -> list[str]:
    """Files this process holds open under ``directory`` (a spilled spool is an unnamed
    temporary file there: it shows only as an open descriptor)."""
    found = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(directory) + os.sep):
            found.append(target)
    return found


class Clock:
    """An injected monotonic clock; the sleeps advance it and are remembered."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds

    async def async_sleep(self, seconds: float) -> None:
        self.sleep(seconds)


def retry_events(stats: Any) -> tuple[list[Any], list[Any]]:
    """The retry and give-up events ``stats`` (a `RetryStats`) reports from now on."""
    retries: list[Any] = []
    giveups: list[Any] = []
    stats.on_retry(retries.append)
    stats.on_giveup(giveups.append)
    return retries, giveups


#: What `dcp_writes_fail_after_one_item` makes DCP raise.
DCP_WRITE_FAILURE = "serialisation failed in the middle of the shard"


def dcp_writes_fail_after_one_item(monkeypatch: Any) -> list[bool]:
    """DCP's writer raises after it wrote one item of a shard (its stream open, bytes in it);
    the list holds one True once that item was written."""
    import torch.distributed.checkpoint.filesystem as dcp_filesystem

    written: list[bool] = []
    original = dcp_filesystem._write_item

    def write_once_then_fail(*args: Any, **kwargs: Any) -> Any:
        if written:
            raise RuntimeError(DCP_WRITE_FAILURE)
        written.append(True)
        return original(*args, **kwargs)

    monkeypatch.setattr(dcp_filesystem, "_write_item", write_once_then_fail)
    return written


def checkpoint_failures(error: Any) -> str:
    """The text of every rank's failure in a DCP ``CheckpointException``."""
    return "".join(str(failure) for failure in error.failures.values())

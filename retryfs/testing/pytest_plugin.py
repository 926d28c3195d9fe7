"""Pytest fixtures for chaos-testing against a faulty S3 endpoint.

Enable them with ``pytest_plugins = ["retryfs.testing.pytest_plugin"]`` in your top-level
``conftest.py``. One endpoint serves the whole session (it starts in milliseconds, but a
session-wide one keeps ports and threads quiet); each test gets it back with no faults, an
empty record and an empty store.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .s3 import S3FaultEndpoint

__all__ = ["s3_fault_bucket", "s3_fault_endpoint", "s3_fault_server"]

#: A stall never outlives this in the fixtures, so a forgotten stall cannot hang a test run.
MAX_STALL = 10.0


@pytest.fixture(scope="session")
def s3_fault_server() -> Iterator[S3FaultEndpoint]:
    """The session's endpoint, as it is: prefer `s3_fault_endpoint`, which resets it."""
    with S3FaultEndpoint(max_stall=MAX_STALL) as endpoint:
        yield endpoint


@pytest.fixture
def s3_fault_endpoint(s3_fault_server: S3FaultEndpoint) -> Iterator[S3FaultEndpoint]:
    """The session's endpoint with no faults, an empty record and an empty store."""
    s3_fault_server.reset()
    yield s3_fault_server
    s3_fault_server.reset()  # a plan left behind must not fire in the next test


@pytest.fixture
def s3_fault_bucket(s3_fault_endpoint: S3FaultEndpoint) -> str:
    """The name of an empty bucket on `s3_fault_endpoint`."""
    name = "retryfs-test"
    s3_fault_endpoint.create_bucket(name)
    return name

"""Pytest fixtures for chaos-testing against a faulty S3 endpoint, GCS and Azure emulators.

Enable them with ``pytest_plugins = ["retryfs.testing.pytest_plugin"]`` in your top-level
``conftest.py``. One endpoint serves the whole session (it starts in milliseconds, but a
session-wide one keeps ports and threads quiet); each test gets it back with no faults, an
empty record and an empty store. The GCS and Azure emulators (fake-gcs-server, Azurite) start
once per session on first use (a few seconds) and stop at its end; each test gets a fresh
bucket or container on them (`gcs_fault_bucket`, `azure_fault_container`).
`gcs_process_fault_endpoint` is GCS with the proxy in a child process (see
`retryfs.testing.http_process`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from .emulators import AzureFaultEndpoint, GcsFaultEndpoint
from .s3 import S3FaultEndpoint

__all__ = ["azure_fault_container", "azure_fault_endpoint", "azure_fault_server",
           "gcs_fault_bucket", "gcs_fault_endpoint", "gcs_fault_server",
           "gcs_process_fault_endpoint", "gcs_process_fault_server", "s3_fault_bucket",
           "s3_fault_endpoint", "s3_fault_server"]

_names = itertools.count(1)

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


@pytest.fixture(scope="session")
def gcs_fault_server() -> Iterator[GcsFaultEndpoint]:
    """fake-gcs-server behind a fault proxy, for the session (raises if it cannot start)."""
    with GcsFaultEndpoint(max_stall=MAX_STALL) as endpoint:
        yield endpoint


@pytest.fixture
def gcs_fault_endpoint(gcs_fault_server: GcsFaultEndpoint) -> Iterator[GcsFaultEndpoint]:
    """The session's GCS endpoint with no faults and an empty record."""
    gcs_fault_server.reset()
    yield gcs_fault_server
    gcs_fault_server.reset()


@pytest.fixture
def gcs_fault_bucket(gcs_fault_endpoint: GcsFaultEndpoint) -> str:
    """The name of a new, empty bucket on `gcs_fault_endpoint`."""
    name = f"retryfs-test-{next(_names)}"
    gcs_fault_endpoint.create_bucket(name)
    return name


@pytest.fixture(scope="session")
def gcs_process_fault_server() -> Iterator[GcsFaultEndpoint]:
    """fake-gcs-server behind a fault proxy in a process of its own (`ProcessFaultProxy`): for
    clients that hold the GIL while they wait, such as pyarrow's GCS ``open_input_file``."""
    with GcsFaultEndpoint(max_stall=MAX_STALL, proxy_process=True) as endpoint:
        yield endpoint


@pytest.fixture
def gcs_process_fault_endpoint(
        gcs_process_fault_server: GcsFaultEndpoint) -> Iterator[GcsFaultEndpoint]:
    """`gcs_process_fault_server` with no faults and an empty record."""
    gcs_process_fault_server.reset()
    yield gcs_process_fault_server
    gcs_process_fault_server.reset()


@pytest.fixture(scope="session")
def azure_fault_server() -> Iterator[AzureFaultEndpoint]:
    """Azurite's blob service behind a fault proxy, for the session (raises if it cannot
    start: ``npm install azurite`` in the project, or set ``RETRYFS_AZURITE``)."""
    with AzureFaultEndpoint(max_stall=MAX_STALL) as endpoint:
        yield endpoint


@pytest.fixture
def azure_fault_endpoint(azure_fault_server: AzureFaultEndpoint) -> Iterator[AzureFaultEndpoint]:
    """The session's Azure endpoint with no faults and an empty record."""
    azure_fault_server.reset()
    yield azure_fault_server
    azure_fault_server.reset()


@pytest.fixture
def azure_fault_container(azure_fault_endpoint: AzureFaultEndpoint) -> str:
    """The name of a new, empty container on `azure_fault_endpoint`."""
    name = f"retryfs-test-{next(_names)}"
    azure_fault_endpoint.create_bucket(name)
    return name

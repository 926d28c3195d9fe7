"""Fixtures shared by the test suite."""

import os

import pytest

from retryfs.budget import reset_budgets

pytest_plugins = ["retryfs.testing.pytest_plugin"]


@pytest.fixture
def clean_retryfs_env(monkeypatch):
    """No ``RETRYFS_*`` defaults from the environment, and fresh retry budgets before and after."""
    for name in list(os.environ):
        if name.startswith("RETRYFS_"):
            monkeypatch.delenv(name)
    reset_budgets()
    yield
    reset_budgets()

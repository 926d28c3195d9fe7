"""Fixtures shared by the test suite."""

pytest_plugins = ["retryfs.testing.pytest_plugin"]

"""Fault injection for your own tests: a faulty filesystem, a faulty S3 endpoint."""

from .faulty import Fault, FaultyFileSystem, errors

__all__ = ["Fault", "FaultyFileSystem", "errors"]

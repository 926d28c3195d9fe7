"""Fault injection for your own tests: a faulty filesystem, a faulty S3 endpoint.

``S3FaultEndpoint`` and ``S3Fault`` need ``moto[server]`` (the ``demo`` or ``test`` extra); they
are imported on first use so that ``import retryfs.testing`` does not need moto.
"""

from typing import Any

from .faulty import Fault, FaultyFileSystem, errors

__all__ = ["Fault", "FaultyFileSystem", "S3Fault", "S3FaultEndpoint", "errors"]


def __getattr__(name: str) -> Any:
    if name in ("S3Fault", "S3FaultEndpoint"):
        from . import s3

        return getattr(s3, name)
    raise AttributeError(f"module 'retryfs.testing' has no attribute {name!r}")

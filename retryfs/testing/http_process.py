"""`HttpFaultProxy` in a process of its own, for clients that hold the GIL while they wait.

An in-process proxy serves from Python threads, so it needs the GIL to answer. A client that
makes a request while holding the GIL then waits forever: pyarrow 26's
`GcsFileSystem.open_input_file` opens its download lazily in ``NativeFile.closed`` (which
``seek``, ``read`` and ``tell`` call before they release the GIL), so its first seek or read
through an in-process proxy never returns. `ProcessFaultProxy` is the same proxy with the same
methods, run in a child process (a fresh interpreter, ``python -m``; it ends with its parent):

    with ProcessFaultProxy(upstream, GCS) as proxy:
        fault = proxy.add_fault(HttpFault.internal_error(op="objects.download", times=1))
        ...  # point the client at proxy.url
        assert proxy.fired(fault) == 1

Faults travel by pickle: a ``when=`` predicate must be a module-level function, not a lambda.
The records it returns carry the very fault objects that were added, so ``record.fault is
fault`` holds as in process.
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections import Counter
from collections.abc import Iterable
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from ._wire import Listening, die_with_parent
from .http import GCS, Dialect, HttpFault, HttpFaultProxy, HttpRecord

__all__ = ["ProcessFaultProxy"]


class _Host:
    """The proxy inside the child; faults are named by their index in `added`."""

    def __init__(self, upstream: str | None, dialect: Dialect, options: dict[str, Any]) -> None:
        self.proxy = HttpFaultProxy(upstream, dialect, **options)
        self.added: list[HttpFault] = []

    def start(self) -> int:
        self.proxy.start()
        return self.proxy.port

    def stop(self) -> None:
        self.proxy.stop()

    def set_upstream(self, upstream: str | None) -> None:
        self.proxy.upstream = upstream

    def add_fault(self, fault: HttpFault) -> int:
        self.proxy.add_fault(fault)
        self.added.append(fault)
        return len(self.added) - 1

    def clear_faults(self) -> None:
        self.proxy.clear_faults()

    def fired(self, index: int) -> int:
        return self.proxy.fired(self.added[index])

    def requests(self, op: Any, method: str | None, path: str | None,
                 faulted: bool | None) -> list[tuple[HttpRecord, int | None]]:
        found = self.proxy.requests(op, method=method, path=path, faulted=faulted)
        index = {id(fault): i for i, fault in enumerate(self.added)}
        return [(dataclasses.replace(r, fault=None),
                 None if r.fault is None else index.get(id(r.fault))) for r in found]

    def reset_record(self) -> None:
        self.proxy.reset_record()

    def reset(self) -> None:
        self.proxy.reset()


def _serve() -> None:
    """The child: one `_Host`, called over one connection until the parent closes it."""
    die_with_parent()
    authkey = bytes.fromhex(os.environ.pop("RETRYFS_PROXY_AUTHKEY"))
    with Listener(("127.0.0.1", 0), authkey=authkey) as listener:
        print(f"{listener.address[0]}:{listener.address[1]}", flush=True)
        with listener.accept() as conn:
            host: _Host | None = None
            while True:
                try:
                    method, args = conn.recv()
                except EOFError:
                    break
                try:
                    if method == "__init__":
                        host, result = _Host(*args), None
                    else:
                        result = getattr(host, method)(*args)
                except Exception as exc:  # noqa: BLE001 - handed to the caller
                    conn.send(("error", exc))
                else:
                    conn.send(("ok", result))
            if host is not None:
                host.stop()


class ProcessFaultProxy(Listening):
    """`HttpFaultProxy`'s interface (plan, record, lifecycle), served from a child process."""

    def __init__(self, upstream: str | None = None, dialect: Dialect = GCS, *,
                 host: str = "127.0.0.1", port: int = 0, max_stall: float = 30.0,
                 timeout: float = 60.0) -> None:
        self.dialect = dialect
        self._upstream = upstream
        self._host_name = host
        self._options = dict(host=host, port=port, max_stall=max_stall, timeout=timeout)
        self._process: subprocess.Popen[bytes] | None = None
        self._conn: Connection | None = None
        self._port: int | None = None
        self._faults: list[HttpFault] = []  # every fault added, by its index in the child
        self._cleared = 0  # those before this index were cleared from the plan

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> ProcessFaultProxy:
        if self._process is not None:
            raise RuntimeError("ProcessFaultProxy already started")
        authkey = os.urandom(16)
        self._process = subprocess.Popen(
            [sys.executable, "-c", "from retryfs.testing.http_process import _serve; _serve()"],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
            env={**os.environ, "RETRYFS_PROXY_AUTHKEY": authkey.hex()})
        try:
            assert self._process.stdout is not None
            address = self._process.stdout.readline().decode().strip()
            if not address:
                raise RuntimeError(f"ProcessFaultProxy: the child exited with status "
                                   f"{self._process.wait()} before serving")
            host, _, port = address.rpartition(":")
            self._conn = Client((host, int(port)), authkey=authkey)
            self._call("__init__", self._upstream, self.dialect, self._options)
            self._port = self._call("start")
        except BaseException:
            self.stop()
            raise
        return self

    def _call(self, method: str, *args: Any) -> Any:
        if self._conn is None:
            raise RuntimeError("ProcessFaultProxy is not started")
        self._conn.send((method, args))
        status, result = self._conn.recv()
        if status == "error":
            raise result
        return result

    def stop(self) -> None:
        """Stop the proxy (its threads joined in the child), then the child process."""
        conn, self._conn = self._conn, None
        process, self._process = self._process, None
        self._port = None
        if conn is not None:
            conn.close()  # the child stops its proxy and exits
        if process is not None:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()

    def __enter__(self) -> ProcessFaultProxy:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def upstream(self) -> str | None:
        return self._upstream

    @upstream.setter
    def upstream(self, value: str | None) -> None:
        self._upstream = value
        if self._conn is not None:
            self._call("set_upstream", value)

    @property
    def port(self) -> int:
        if self._port is None:
            raise RuntimeError("ProcessFaultProxy is not started")
        return self._port

    @property
    def host(self) -> str:
        return self._host_name

    def __repr__(self) -> str:
        state = f"{self.url} -> {self.upstream}" if self._port is not None else "stopped"
        return f"ProcessFaultProxy({self.dialect.name}, {state}, {len(self.faults)} faults)"

    # -- the plan and the record -------------------------------------------------------------------

    def add_fault(self, fault: HttpFault) -> HttpFault:
        self._call("add_fault", fault)  # refused there (unknown op) before it is kept here
        self._faults.append(fault)
        return fault

    def clear_faults(self) -> None:
        self._call("clear_faults")
        self._cleared = len(self._faults)

    @property
    def faults(self) -> tuple[HttpFault, ...]:
        return tuple(self._faults[self._cleared:])

    def fired(self, fault: HttpFault) -> int:
        indexes = [i for i, added in enumerate(self._faults) if added is fault]
        return sum(self._call("fired", i) for i in indexes)

    def requests(self, op: str | Iterable[str] | None = None, *, method: str | None = None,
                 path: str | None = None, faulted: bool | None = None) -> list[HttpRecord]:
        if op is not None and not isinstance(op, str):
            op = list(op)
        return [dataclasses.replace(record, fault=None if i is None else self._faults[i])
                for record, i in self._call("requests", op, method, path, faulted)]

    def counts(self) -> Counter[str]:
        return Counter(r.op for r in self.requests())

    @property
    def injected(self) -> list[HttpRecord]:
        return self.requests(faulted=True)

    def reset_record(self) -> None:
        self._call("reset_record")

    def reset(self) -> None:
        self._call("reset")
        self._cleared = len(self._faults)

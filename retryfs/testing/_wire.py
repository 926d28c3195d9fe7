"""What every fault endpoint shares: firing rules, a server that can reset a connection, bodies.

`S3FaultEndpoint` (moto in-process) and `HttpFaultProxy` (any upstream) both serve on this
server and arm their plans with `Armed`, so a plan fires the same way on either.
"""

from __future__ import annotations

import logging
import os
import random
import socket
import struct
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, cast

from werkzeug.serving import ThreadedWSGIServer, WSGIRequestHandler

log = logging.getLogger(__name__)


class Listening:
    """What a client connects to, from a loopback server's ``host`` and ``port`` (the fault
    endpoint and both fault proxies)."""

    @property
    def host(self) -> str:
        raise NotImplementedError

    @property
    def port(self) -> int:
        raise NotImplementedError

    @property
    def endpoint(self) -> str:
        """``host:port``, what pyarrow's ``endpoint_override`` takes."""
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        """``http://host:port``, what boto3's / s3fs's ``endpoint_url`` takes."""
        return f"http://{self.endpoint}"


@dataclass
class Armed:
    """A fault in a plan and its counters (the plan's state, so a fault stays reusable).

    The fault needs ``matches(request)``, ``nth``, ``times``, ``probability``."""

    fault: Any
    rng: random.Random
    matched: int = 0
    fired: int = 0

    def fires(self, request: Any) -> bool:
        fault = self.fault
        if not fault.matches(request):
            return False
        self.matched += 1
        if self.matched < (fault.nth or 1):
            return False
        times = fault.times if fault.times is not None else (1 if fault.nth else None)
        if times is not None and self.fired >= times:
            return False
        if fault.probability is not None and self.rng.random() >= fault.probability:
            return False
        self.fired += 1
        return True


class Drop(ConnectionAbortedError):
    """Raised inside the WSGI app to make werkzeug drop the connection without a response."""


#: The request's headers exactly as they arrived (``environ`` drops names with ``_``, like
#: Azure's ``x-ms-meta-is_directory``, which a proxy must forward: they are signed).
RAW_HEADERS = "retryfs.raw_headers"


class QuietHandler(WSGIRequestHandler):  # type: ignore[misc]  # untyped library
    """werkzeug's request handler, quiet, closing the connection when the app drops it."""

    def run_wsgi(self) -> None:
        # werkzeug answers every "Expect: 100-continue" with an interim 100 at once; a client
        # that sends its body without waiting for one and reads no interim answer (the Azure
        # C++ SDK under pyarrow's AzureFileSystem) takes it for the final answer
        if "Expect" in self.headers and (
                not getattr(self.server, "send_continue", True)
                or self.headers.get("Content-Length", "").strip() == "0"):
            del self.headers["Expect"]
        super().run_wsgi()

    def setup(self) -> None:
        super().setup()
        self.rfile = _Input(self.rfile)  # type: ignore[has-type]

    def send_header(self, keyword: str, value: str) -> None:
        # werkzeug ends every response with "Connection: close" and closes the connection. The
        # Azure C++ SDK (pyarrow's AzureFileSystem) closes its side the moment it reads that
        # header, before the body (Azure/azure-sdk-for-cpp#4137), then parses whatever its
        # buffer holds as the error's XML ("75\r\n..." for "Content-Length: 175") and aborts
        # the process ("Failed to parse xml"). Such servers keep the connection alive instead.
        if (keyword.lower() == "connection" and value.lower() == "close"
                and not getattr(self.server, "announce_close", True)):
            return  # the request's own keep-alive stands (see `_Input`)
        super().send_header(keyword, value)

    def make_environ(self) -> dict[str, Any]:
        environ = super().make_environ()
        environ[RAW_HEADERS] = list(self.headers.items())
        environ[_HANDLER] = self
        self.rfile.draining = False
        return cast("dict[str, Any]", environ)

    def connection_dropped(self, error: BaseException, environ: Any = None) -> None:
        self.close_connection = True

    def log(self, type: str, message: str, *args: Any) -> None:
        log.debug("%s " + message, self.address_string(), *args)


_HANDLER = "retryfs.handler"


class _Input:
    """The handler's input, blind while werkzeug "drains" it after a kept-alive response (it
    reads whatever follows, 10 ms long: the client's next request)."""

    def __init__(self, raw: Any) -> None:
        self._raw = raw
        self.draining = False

    def read(self, size: int = -1) -> bytes:
        if self.draining:
            return b""
        return bytes(self._raw.read(size))

    def __getattr__(self, name: str) -> Any:
        return getattr(self._raw, name)


def _answered(app: Any) -> Any:
    """`app` whose response, once all sent, marks the request's input as drained."""
    def wrapped(environ: dict[str, Any], start_response: Any) -> Iterator[bytes]:
        yield from app(environ, start_response)
        handler = environ.get(_HANDLER)
        if handler is not None and not handler.close_connection:
            handler.rfile.draining = True
    return wrapped


class FaultServer(ThreadedWSGIServer):  # type: ignore[misc]  # untyped library
    """werkzeug's threaded server that knows its open connections, to end them on stop, and
    can close one with a TCP RST instead of a FIN. Its request threads are joined by `stop`
    (werkzeug's are daemons, which ``server_close`` does not wait for)."""

    daemon_threads = False

    def __init__(self, host: str, port: int, app: Any, *, handler: type = QuietHandler,
                 name: str = "fault-server") -> None:
        self._live: set[socket.socket] = set()
        self._aborting: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._name = name
        self._thread: threading.Thread | None = None
        self.send_continue = True  # answer "Expect: 100-continue" with an interim 100
        self.announce_close = True  # send "Connection: close" with the response that ends one
        super().__init__(host, port, _answered(app), handler=handler)

    def serve_in_thread(self) -> None:
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05},
                                        name=f"{self._name}-{self.server_address[1]}",
                                        daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop serving, end open connections, join the request threads and the server's."""
        self.shutdown()
        self.end_connections()
        self.server_close()  # joins the request threads
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, address = super().get_request()
        with self._lock:
            self._live.add(sock)
        return sock, address

    def abort(self, sock: socket.socket) -> None:
        """Close `sock` with a reset when its request ends (SO_LINGER 0, no shutdown)."""
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        with self._lock:
            self._aborting.add(sock)

    def shutdown_request(self, request: Any) -> None:
        with self._lock:
            self._live.discard(request)
            aborting = request in self._aborting
            self._aborting.discard(request)
        if aborting:
            request.close()
        else:
            super().shutdown_request(request)

    def end_connections(self) -> None:
        with self._lock:
            live = list(self._live)
        for sock in live:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.warning("%s: error while serving %s", self._name, client_address, exc_info=True)


def die_with_parent() -> None:
    """In a child process: end with the test process, even one killed before it could stop us."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):  # not Linux: stop() still ends it
        pass


def read_body(environ: Mapping[str, Any]) -> bytes:
    """The whole request body (Content-Length or chunked), so the client is done sending."""
    from werkzeug.wsgi import get_input_stream

    stream = get_input_stream(dict(environ), safe_fallback=True)
    chunks = []
    while chunk := stream.read(1 << 20):
        chunks.append(chunk)
    return b"".join(chunks)


def request_id() -> str:
    return os.urandom(8).hex().upper()  # not `random`: a user's seeded sequence stays theirs


def status_line(status: int) -> str:
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return f"{status} Unknown"


def then_drop(payload: bytes) -> Iterator[bytes]:
    if payload:
        yield payload
    raise Drop("fault: truncated body")

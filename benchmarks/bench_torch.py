"""PyTorch checkpoints side by side: a state_dict saved and loaded through each client a PyTorch
user checkpoints with, fault-free and with a seeded 5 % of requests answered 503 SlowDown.

Contenders, each with its own retries as shipped:

- ``s3torchconnector``: AWS's CRT-based connector, ``S3Checkpoint`` writer and reader (the peer);
- ``retryfs stream``: `retryfs.from_uri`, ``torch.save`` into ``open_output_stream``, the load
  one ``open_input_file`` read;
- ``retryfs write_with``: the same save through ``fs.write_with(path, lambda f: torch.save(...))``
  (no replay spool: a failed upload runs ``torch.save`` again), the same load;
- ``retryfs DCP``: ``torch.distributed.checkpoint`` with retryfs's own ``RetryingStorageWriter``/
  ``RetryingStorageReader`` (`retryfs.integrations.dcp`, pyarrow's native client) on a
  ``from_uri`` location (one process);
- ``retryfs DCP, fsspec``: DCP's ``FsspecWriter``/``FsspecReader`` on a ``retry::s3://`` URL,
  with the options docs/pytorch.md gives (``sync_files=False``; s3fs reads in blocks of 8 MiB
  kept by offset, ``DCP_READS``);
- ``s3fs DCP``: the same on a plain ``s3://`` URL (s3fs with its own retries), the same options:
  DCP's own cost, beside which ``retryfs DCP, fsspec``'s is retryfs's;
- ``retryfs Lightning``: `retryfs.integrations.lightning.RetryingCheckpointIO` over ``from_uri``;
- ``s3fs``: ``fs.open(..., "wb")`` and ``"rb"`` (its own 5 attempts over botocore's);
- ``pyarrow S3``: pyarrow's ``S3FileSystem`` streams (the AWS SDK's 3 attempts);
- ``retryfs stream, no CRC`` and ``pyarrow S3, no CRC``: the same two saves with the AWS SDK's
  request checksums off (``AWS_REQUEST_CHECKSUM_CALCULATION=when_required``). By default the
  SDK under pyarrow sends every upload ``aws-chunked`` with a CRC64NVME trailer, which moto
  decodes and checks in Python (about half of a 200 MiB save's time there); the CRT connector
  sends ``UNSIGNED-PAYLOAD`` and no checksum, s3fs a CRC32 header. These rows compare the
  transfer itself; the default rows keep the checksum, as retryfs does.

The 200 MiB state_dict runs on `S3FaultEndpoint` (moto on loopback, which also injects the
faults) in a process of its own (`benchmarks.remote_endpoint`: in the client's process, moto's
Python would hold the GIL the Python clients need and the CRT does not); the 1 GiB one on
SeaweedFS, fault-free (``--quick``: 32 MiB on moto only). Every round
loads what it saved and compares every tensor (``torch.equal``), each save and load timed after
an ``os.sync()`` (a 1 GiB save leaves about 0.6 s of the server's writes to the disk; a load
right after one took up to twice its time). "Intact" counts the rounds
whose save and both loads succeeded with equal tensors. Each object is loaded twice: "load" is
its first read, "again" its second. On SeaweedFS the first read of a freshly written 1 GiB
object varies with the server more than with the client (the same save and load code timed
1.79 s and 2.63 s in two rows of one run; the first and second reads of one object, 3.84 s and
1.58 s). Times are medians of the rounds with their spread, and each median's ratio to
s3torchconnector's. The contenders' order is shuffled each round (seeded by the round): turned
by one, each would follow the same neighbour in every round, and a server still busy with one
contender's object would slow the next one's every time.

Usage: python -m benchmarks.bench_torch [--quick]
"""

from __future__ import annotations

import io
import logging
import os
import random
import time
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

from benchmarks.common import Figure, request_checksums_off, section_main, table

REGION = "us-east-1"
#: Rounds per table. The machine is shared with the server: one client's 1 GiB save on
#: SeaweedFS varied by a third from round to round, so two or three rounds' median says little.
ROUNDS = 5


@dataclass
class Store:
    """An S3 endpoint: ``host:port``, credentials, and whether it can inject faults."""

    host: str
    access_key: str
    secret_key: str
    fault_endpoint: Any = None  # an S3FaultEndpoint (moto) or None

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def uri(self, bucket: str) -> str:
        query = urlencode({"endpoint_override": self.host, "scheme": "http", "region": REGION})
        return f"s3://{self.access_key}:{self.secret_key}@{bucket}?{query}"

    def s3fs_options(self) -> dict[str, Any]:
        return {"key": self.access_key, "secret": self.secret_key, "endpoint_url": self.url,
                "client_kwargs": {"region_name": REGION}, "skip_instance_cache": True}


@dataclass
class Contender:
    name: str
    save: Callable[[dict[str, Any], str], None]  # state, "bucket/key"
    load: Callable[[str], dict[str, Any]]


def state_dict(mib: int) -> dict[str, Any]:
    import torch

    generator = torch.Generator().manual_seed(0)
    layers = max(1, mib // 16)
    per_layer = mib * 2**20 // 4 // layers
    return {f"layer{i}.weight": torch.randn(per_layer, generator=generator)
            for i in range(layers)}


def _read_all_then_load(stream: Any) -> dict[str, Any]:
    import torch

    loaded: dict[str, Any] = torch.load(io.BytesIO(stream.read()), weights_only=True)
    return loaded


def contenders(store: Store) -> list[Contender]:
    import pyarrow.fs as pafs
    import s3fs
    import torch
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader, FsspecWriter

    import retryfs
    from retryfs.integrations.dcp import RetryingStorageReader, RetryingStorageWriter
    from retryfs.integrations.lightning import RetryingCheckpointIO

    found = []
    try:
        from s3torchconnector import S3Checkpoint, S3ClientConfig

        os.environ["AWS_ACCESS_KEY_ID"] = store.access_key
        os.environ["AWS_SECRET_ACCESS_KEY"] = store.secret_key
        crt = S3Checkpoint(region=REGION, endpoint=store.url,
                           s3client_config=S3ClientConfig(force_path_style=True))

        def crt_save(state: dict[str, Any], path: str) -> None:
            with crt.writer(f"s3://{path}") as writer:
                torch.save(state, writer)

        def crt_load(path: str) -> dict[str, Any]:
            with crt.reader(f"s3://{path}") as reader:
                loaded: dict[str, Any] = torch.load(reader, weights_only=True)
            return loaded

        found.append(Contender("s3torchconnector", crt_save, crt_load))
    except ImportError:  # the bench extra installs it
        pass

    def retryfs_fs(bucket: str) -> Any:
        return retryfs.from_uri(store.uri(bucket))[0]

    def stream_save(state: dict[str, Any], path: str) -> None:
        fs = retryfs_fs(path.split("/", 1)[0])
        with fs.open_output_stream(path) as stream:
            torch.save(state, stream)

    def stream_load(path: str) -> dict[str, Any]:
        with retryfs_fs(path.split("/", 1)[0]).open_input_file(path) as stream:
            return _read_all_then_load(stream)

    found.append(Contender("retryfs stream", stream_save, stream_load))

    def write_with_save(state: dict[str, Any], path: str) -> None:
        retryfs_fs(path.split("/", 1)[0]).write_with(path, lambda f: torch.save(state, f))

    found.append(Contender("retryfs write_with", write_with_save, stream_load))

    def native_dcp_save(state: dict[str, Any], path: str) -> None:
        dcp.save(state, storage_writer=RetryingStorageWriter(
            f"s3://{path}", retryfs_fs(path.split("/", 1)[0])))

    def native_dcp_load(path: str) -> dict[str, Any]:
        target = {name: torch.empty(tensor.numel()) for name, tensor in _shapes.items()}
        dcp.load(target, storage_reader=RetryingStorageReader(
            f"s3://{path}", retryfs_fs(path.split("/", 1)[0])))
        return target

    found.append(Contender("retryfs DCP", native_dcp_save, native_dcp_load))
    dcp_options = dict(store.s3fs_options(), **DCP_READS)
    options = {"s3": dcp_options}

    def dcp_save(state: dict[str, Any], path: str) -> None:
        dcp.save(state, storage_writer=FsspecWriter(f"retry::s3://{path}", sync_files=False,
                                                    **options))

    def dcp_load(path: str) -> dict[str, Any]:
        size = {name: tensor.numel() for name, tensor in _shapes.items()}
        target = {name: torch.empty(n) for name, n in size.items()}
        dcp.load(target, storage_reader=FsspecReader(f"retry::s3://{path}", **options))
        return target

    found.append(Contender("retryfs DCP, fsspec", dcp_save, dcp_load))

    def plain_dcp_save(state: dict[str, Any], path: str) -> None:
        dcp.save(state, storage_writer=FsspecWriter(f"s3://{path}", sync_files=False,
                                                    **dcp_options))

    def plain_dcp_load(path: str) -> dict[str, Any]:
        size = {name: tensor.numel() for name, tensor in _shapes.items()}
        target = {name: torch.empty(n) for name, n in size.items()}
        dcp.load(target, storage_reader=FsspecReader(f"s3://{path}", **dcp_options))
        return target

    found.append(Contender("s3fs DCP", plain_dcp_save, plain_dcp_load))

    def plugin_save(state: dict[str, Any], path: str) -> None:
        RetryingCheckpointIO(retryfs_fs(path.split("/", 1)[0])).save_checkpoint(
            state, f"s3://{path}")

    def plugin_load(path: str) -> dict[str, Any]:
        return RetryingCheckpointIO(retryfs_fs(path.split("/", 1)[0])).load_checkpoint(
            f"s3://{path}", weights_only=True)

    found.append(Contender("retryfs Lightning", plugin_save, plugin_load))

    def s3fs_save(state: dict[str, Any], path: str) -> None:
        with s3fs.S3FileSystem(**store.s3fs_options()).open(path, "wb") as f:
            torch.save(state, f)

    def s3fs_load(path: str) -> dict[str, Any]:
        with s3fs.S3FileSystem(**store.s3fs_options()).open(path, "rb") as f:
            return _read_all_then_load(f)

    found.append(Contender("s3fs", s3fs_save, s3fs_load))

    def arrow() -> pafs.S3FileSystem:
        return pafs.S3FileSystem(access_key=store.access_key, secret_key=store.secret_key,
                                 region=REGION, scheme="http", endpoint_override=store.host)

    def arrow_save(state: dict[str, Any], path: str) -> None:
        with arrow().open_output_stream(path) as stream:
            torch.save(state, stream)

    def arrow_load(path: str) -> dict[str, Any]:
        with arrow().open_input_file(path) as stream:
            return _read_all_then_load(stream)

    found.append(Contender("pyarrow S3", arrow_save, arrow_load))
    found.append(Contender("retryfs stream, no CRC", _without_checksums(stream_save),
                           stream_load))
    found.append(Contender("pyarrow S3, no CRC", _without_checksums(arrow_save), arrow_load))
    return found


def _without_checksums(save: Callable[[dict[str, Any], str], None]
                       ) -> Callable[[dict[str, Any], str], None]:
    """``save`` with the AWS SDK's request checksums off (`request_checksums_off`)."""
    def unchecked(state: dict[str, Any], path: str) -> None:
        with request_checksums_off():
            save(state, path)

    return unchecked


_shapes: dict[str, Any] = {}  # the state the DCP load fills (its shapes)
#: The read options docs/pytorch.md gives DCP on s3fs: blocks of 8 MiB kept by offset. With
#: s3fs's defaults (50 MiB read-ahead) a 200 MiB checkpoint's load fetched 583 MiB.
DCP_READS = {"default_block_size": 8 * 2**20, "default_cache_type": "blockcache"}


def _intact(loaded: dict[str, Any], state: dict[str, Any]) -> bool:
    import torch

    return set(loaded) == set(state) and all(
        torch.equal(loaded[name].reshape(-1), state[name].reshape(-1)) for name in state)


@contextmanager
def _faults(store: Store, rate: float, seed: int) -> Any:
    endpoint = store.fault_endpoint
    if rate and endpoint is not None:
        from retryfs.testing.s3 import S3Fault

        endpoint.add_fault(S3Fault.slow_down(probability=rate, seed=seed))
    try:
        yield
    finally:
        if endpoint is not None:
            endpoint.clear_faults()


def measure(store: Store, bucket: str, mib: int, rate: float, rounds: int
            ) -> dict[str, dict[str, list[float] | int]]:
    """Per contender: save and load times of the rounds that stayed intact, and the count."""
    state = state_dict(mib)
    _shapes.clear()
    _shapes.update(state)
    found = contenders(store)
    results: dict[str, dict[str, Any]] = {  # the table's rows in the contenders' order
        contender.name: {"save": [], "load": [], "again": [], "intact": 0, "rounds": 0}
        for contender in found}
    for round_no in range(rounds):
        for contender in random.Random(round_no).sample(found, len(found)):
            entry = results[contender.name]
            path = f"{bucket}/{contender.name.replace(' ', '-')}/r{round_no}/model.pt"
            entry["rounds"] += 1
            try:
                os.sync()  # the last save's writeback (the server's files) out of this time
                with _faults(store, rate, seed=1000 * round_no + 1):
                    start = time.perf_counter()
                    contender.save(state, path)
                    saved = time.perf_counter() - start
                os.sync()
                loads, intact = [], True
                for seed in (2, 3):  # the first read of the object, then the second
                    with _faults(store, rate, seed=1000 * round_no + seed):
                        start = time.perf_counter()
                        loaded = contender.load(path)
                        loads.append(time.perf_counter() - start)
                    intact = intact and _intact(loaded, state)
                    del loaded
            except Exception as error:  # noqa: BLE001 - a lost checkpoint is a result
                entry.setdefault("errors", []).append(f"{type(error).__name__}")
                continue
            if intact:
                entry["intact"] += 1
                entry["save"].append(saved)
                entry["load"].append(loads[0])
                entry["again"].append(loads[1])
    return results


def _table(title: str, results: dict[str, dict[str, Any]]) -> str:
    base = results.get("s3torchconnector")

    def show(values: list[float], kind: str) -> tuple[str, str]:
        if not values:
            return "-", "-"
        own = Figure.of(values).median
        peer = Figure.of(base[kind]).median if base and base.get(kind) else None
        return Figure.of(values).show(2), f"{own / peer:.2f}" if peer else "-"

    rows = []
    for name, entry in results.items():
        save, save_ratio = show(entry["save"], "save")
        load, load_ratio = show(entry["load"], "load")
        again, again_ratio = show(entry.get("again", []), "again")
        errors = ",".join(sorted(set(entry.get("errors", [])))) or ""
        rows.append([name, save, save_ratio, load, load_ratio, again, again_ratio,
                     f"{entry['intact']}/{entry['rounds']}", errors])
    header = ["", "save s (spread)", "vs CRT", "load s (spread)", "vs CRT", "again s (spread)",
              "vs CRT", "intact", "errors"]
    return table(title, header, rows)


def run(quick: bool) -> list[str]:
    from benchmarks.remote_endpoint import RemoteFaultEndpoint
    from retryfs.testing.s3 import ACCESS_KEY, SECRET_KEY

    logging.getLogger("retryfs").setLevel(logging.ERROR)  # one WARNING per retry otherwise
    tables = []
    mib, rounds = (32, 1) if quick else (200, ROUNDS)
    with RemoteFaultEndpoint() as endpoint:
        endpoint.create_bucket("bench-torch")
        store = Store(f"{endpoint.host}:{endpoint.port}", ACCESS_KEY, SECRET_KEY, endpoint)
        for rate in (0.0, 0.05):
            endpoint.reset_storage()
            endpoint.create_bucket("bench-torch")
            results = measure(store, "bench-torch", mib, rate, rounds)
            tables.append(_table(f"state_dict of {mib} MiB on moto, {rate:.0%} of requests "
                                 f"503 SlowDown, {rounds} rounds (median, spread)", results))
    if not quick:
        from benchmarks.seaweed import ACCESS_KEY as WEED_KEY
        from benchmarks.seaweed import SECRET_KEY as WEED_SECRET
        from benchmarks.seaweed import seaweed_s3

        with seaweed_s3() as server:
            server.pyarrow_fs().create_dir("bench-torch")
            store = Store(server.endpoint, WEED_KEY, WEED_SECRET)
            results = measure(store, "bench-torch", 1024, 0.0, ROUNDS)
            tables.append(_table(f"state_dict of 1 GiB on SeaweedFS, fault-free, {ROUNDS} "
                                 "rounds (median, spread)", results))
    return tables


if __name__ == "__main__":
    section_main(run, __doc__)

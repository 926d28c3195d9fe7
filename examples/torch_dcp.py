"""torch.distributed.checkpoint (DCP) through retryfs, one process or several (gloo).

DCP's ``FsspecWriter``/``FsspecReader`` open the checkpoint directory with fsspec, so putting
``retry::`` in front of the URL is the whole change: every request of the save (the shard
files, their parts, the ``.metadata.tmp`` -> ``.metadata`` rename, which is a CopyObject and a
DeleteObjects on S3) and of the load is retried under retryfs's policy, one retry layer.

    # real storage: s3fs reads the usual AWS_* variables; the retry policy from the environment
    RETRYFS_MAX_ATTEMPTS=8 python examples/torch_dcp.py "retry::s3://my-bucket/ckpt" --world-size 2

    # no cloud account: retryfs's S3 fault endpoint (moto on loopback), 503 SlowDown injected
    # into every kind of request the save and the load make
    python examples/torch_dcp.py --fault-endpoint --world-size 2

With ``--native``, the save and the load go through `retryfs.integrations.dcp` instead: DCP's
own ``FileSystemWriter``/``FileSystemReader`` on retryfs's pyarrow face (the native S3 client,
parts in parallel, one ranged read per stored item). Its location is what `retryfs.from_uri`
takes, ``retry_*`` query parameters included:

    python examples/torch_dcp.py "s3://my-bucket/ckpt?retry_max_attempts=8" --native
    python examples/torch_dcp.py --fault-endpoint --native --world-size 2

For ``FsspecWriter``, configuration goes through the environment because ``dcp.save(..., checkpoint_id=url)`` makes
the writer with no storage options: fsspec reads ``FSSPEC_<PROTOCOL>_<OPTION>`` (for example
``FSSPEC_S3_ENDPOINT_URL``, ``FSSPEC_RETRY_MAX_ATTEMPTS``) and retryfs ``RETRYFS_*``. With a
writer you build yourself, pass them as keywords instead:
``FsspecWriter(url, s3={...}, retry={"max_attempts": 8})``.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
from collections import Counter
from typing import Any

#: A small model's state: one tensor per rank (DCP shards by key) and one replicated.
SHAPES = {"layer.weight": (512, 256), "layer.bias": (512,)}


def state_for(rank: int) -> dict[str, Any]:
    import torch

    generator = torch.Generator().manual_seed(1234 + rank)
    state = {name: torch.randn(*shape, generator=torch.Generator().manual_seed(7))
             for name, shape in SHAPES.items()}
    state[f"rank{rank}.moments"] = torch.randn(256, 256, generator=generator)
    return state


def save_and_load(url: str, rank: int, native: bool = False) -> bool:
    """Save this rank's state with DCP, load it back into zeros, compare (``torch.equal``)."""
    import torch
    import torch.distributed.checkpoint as dcp

    state = state_for(rank)
    loaded = {name: torch.zeros_like(value) for name, value in state.items()}
    if native:
        from retryfs.integrations.dcp import RetryingStorageReader, RetryingStorageWriter

        dcp.save(state, storage_writer=RetryingStorageWriter(url))
        dcp.load(loaded, storage_reader=RetryingStorageReader(url))
    else:
        dcp.save(state, checkpoint_id=url)
        dcp.load(loaded, checkpoint_id=url)
    return all(torch.equal(loaded[name], state[name]) for name in state)


def _worker(rank: int, world_size: int, port: int, url: str, native: bool) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=world_size)
    try:
        intact = save_and_load(url, rank, native)
        print(f"rank {rank}: checkpoint intact: {intact}", flush=True)
        if not intact:
            raise SystemExit(f"rank {rank}: the loaded state differs from the saved one")
        dist.barrier()  # every rank done before any leaves: rank 0 holds the group's store
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def run(url: str, world_size: int, native: bool = False) -> None:
    """Save and load on ``world_size`` processes (gloo), or in this one when it is 1."""
    if world_size == 1:
        intact = save_and_load(url, 0, native)
        print(f"rank 0: checkpoint intact: {intact}")
        if not intact:
            raise SystemExit("the loaded state differs from the saved one")
        return
    import torch.multiprocessing as mp

    mp.spawn(_worker, args=(world_size, _free_port(), url, native), nprocs=world_size,
             join=True)


def fault_plan(native: bool = False) -> list[Any]:
    """503 SlowDown on every kind of request a DCP save and load make, twice each."""
    from retryfs.testing import S3Fault

    ops: tuple[str, ...] = ("PutObject", "CopyObject", "DeleteObjects", "HeadObject",
                            "GetObject", "ListObjectsV2")
    if native:  # pyarrow's client: every stream a multipart upload, a delete per object
        ops = ("CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload", "CopyObject",
               "DeleteObject", "HeadObject", "GetObject")
    return [S3Fault.slow_down(op=op, times=2) for op in ops]


def configure_environment(endpoint: Any) -> None:
    """Point s3fs at ``endpoint`` and set the retry policy, for this process and its children
    (through fsspec's ``FSSPEC_*`` configuration: DCP's ``checkpoint_id=`` passes no options)."""
    import fsspec.config

    os.environ.update({
        "FSSPEC_S3_ENDPOINT_URL": endpoint.url, "FSSPEC_S3_KEY": "testing",
        "FSSPEC_S3_SECRET": "testing", "AWS_DEFAULT_REGION": endpoint.region,
        "FSSPEC_RETRY_MAX_ATTEMPTS": "10", "FSSPEC_RETRY_INITIAL_DELAY": "0.01",
        "FSSPEC_RETRY_MAX_DELAY": "0.1",
    })
    fsspec.config.set_conf_env(fsspec.config.conf)  # already imported: read the variables again


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url", nargs="?", default="retry::s3://dcp-example/ckpt",
                        help="the checkpoint directory, a retry:: URL")
    parser.add_argument("--world-size", type=int, default=1)
    parser.add_argument("--fault-endpoint", action="store_true",
                        help="run against an embedded S3 server with injected faults")
    parser.add_argument("--native", action="store_true",
                        help="retryfs.integrations.dcp's writer and reader (a from_uri location)")
    args = parser.parse_args(argv)
    if not args.fault_endpoint:
        run(args.url, args.world_size, args.native)
        return 0
    from retryfs.testing import S3FaultEndpoint

    with S3FaultEndpoint() as endpoint:
        endpoint.create_bucket(args.url.split("://", 1)[1].split("/", 1)[0])
        configure_environment(endpoint)
        url = args.url
        if args.native:  # the endpoint, credentials and the policy in the location
            url = endpoint.uri(url.split("://", 1)[1], retry_max_attempts=10,
                               retry_initial_delay=0.01, retry_max_delay=0.1)
        for fault in fault_plan(args.native):
            endpoint.add_fault(fault)
        run(url, args.world_size, args.native)
        fired = {op: n for op, n in sorted(Counter(r.op for r in endpoint.injected).items())}
        print(f"faults the endpoint injected: {sum(fired.values())} {fired}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Ray Train on CPU against the S3 fault endpoint: the training loop, the storage, the checks.

Shared by ``tests/e2e/test_ray_train_e2e.py`` and ``benchmarks/ray_train_comparison.py``. Ray pickles
the training function and the storage filesystem to its workers by reference; `ray_init` puts
this directory on the workers' ``PYTHONPATH`` so that they import this module.

The training function is plain Ray Train: ``prepare_model`` (gloo DDP), ``ray.train.report``
with a checkpoint per epoch from rank 0, ``ray.train.get_checkpoint`` to resume. Nothing in it
knows about retryfs. Each checkpoint holds ``model.pt`` (a state_dict of about 12.5 MiB, so its
upload is a two-part multipart upload), ``model.pt.sha256`` and ``meta.json``; the sha256 also
goes out in the reported metrics, through Ray, not through storage, so the checks compare what
storage holds with what the worker wrote.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from retryfs.demo import ray as demo_ray

MODEL_FILE = "model.pt"
HASH_FILE = "model.pt.sha256"
META_FILE = "meta.json"
#: 32 -> 1792 -> 1792 -> 1: 3.27 M float32 parameters, a 12.5 MiB state_dict (> one 10 MiB part).
WIDTH = 1792
IN_FEATURES = 32


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- storage -------------------------------------------------------------------------------------


def s3_options(endpoint: Any) -> dict[str, Any]:
    """pyarrow ``S3FileSystem`` options for the fault endpoint (dummy credentials)."""
    from retryfs.testing import s3

    return dict(access_key=s3.ACCESS_KEY, secret_key=s3.SECRET_KEY, region=endpoint.region,
                scheme="http", endpoint_override=endpoint.endpoint)


def native_s3(endpoint: Any, **kwargs: Any) -> pafs.S3FileSystem:
    """pyarrow's ``S3FileSystem`` on the endpoint, as a user builds it: the AWS SDK's default
    retries (3 attempts per request; on a Ray worker whatever was set, since pickling drops
    ``retry_strategy``). Wrap it with ``client_attempts=1`` to make retryfs the only layer."""
    return pafs.S3FileSystem(**{**s3_options(endpoint), **kwargs})


def s3fs_filesystem(endpoint: Any) -> Any:
    """An s3fs filesystem on the endpoint whose retries (botocore's and s3fs's own) stay at one
    attempt on Ray workers too."""
    from retryfs.testing import s3

    return OneAttemptS3FS(
        key=s3.ACCESS_KEY, secret=s3.SECRET_KEY, token=None, endpoint_url=endpoint.url,
        client_kwargs={"region_name": endpoint.region},
        config_kwargs={"retries": {"total_max_attempts": 1, "mode": "standard"}},
        skip_instance_cache=True)


try:
    import s3fs as _s3fs
except ImportError:  # pragma: no cover - a test dependency
    _s3fs = None
else:
    class OneAttemptS3FS(_s3fs.S3FileSystem):
        """s3fs with its own retry loop (``retries``, a class attribute it reads) at 1."""

        retries = 1


# -- the training loop (runs on the workers) -----------------------------------------------------


def make_model() -> Any:
    import torch

    return torch.nn.Sequential(
        torch.nn.Linear(IN_FEATURES, WIDTH), torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, WIDTH), torch.nn.ReLU(),
        torch.nn.Linear(WIDTH, 1))


def train_loop(config: dict[str, Any]) -> None:
    """Plain Ray Train: DDP on gloo, a checkpoint per epoch, resume from the last one."""
    import ray.train
    import ray.train.torch
    import torch
    import torch.nn.functional as F

    torch.set_num_threads(1)
    rank = ray.train.get_context().get_world_rank()
    torch.manual_seed(0)
    model = make_model()
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:  # resumed: download, check, load
        with checkpoint.as_directory() as local:
            data = Path(local, MODEL_FILE).read_bytes()
            written = Path(local, HASH_FILE).read_text().strip()
            if sha256(data) != written:
                raise RuntimeError(f"restored {MODEL_FILE} does not match its sha256")
            model.load_state_dict(torch.load(io.BytesIO(data)))
            start = json.loads(Path(local, META_FILE).read_text())["epoch"] + 1
    model = ray.train.torch.prepare_model(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    generator = torch.Generator().manual_seed(rank)
    for epoch in range(start, config["epochs"]):
        for _ in range(config.get("steps", 2)):
            x = torch.randn(8, IN_FEATURES, generator=generator)
            loss = F.mse_loss(model(x), x.sum(dim=1, keepdim=True))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        metrics = {"epoch": epoch, "loss": loss.item(), "resumed_from": start}
        if config.get("every_rank") or config.get("async"):
            _report_from_every_rank(model, metrics, rank, asynchronous=config.get("async"))
            continue
        if rank != 0:
            ray.train.report(metrics)
            continue
        with tempfile.TemporaryDirectory() as local:
            buffer = io.BytesIO()
            torch.save(getattr(model, "module", model).state_dict(), buffer)
            data = buffer.getvalue()
            Path(local, MODEL_FILE).write_bytes(data)
            Path(local, HASH_FILE).write_text(sha256(data))
            Path(local, META_FILE).write_text(json.dumps({"epoch": epoch}))
            metrics.update(sha256=sha256(data), size=len(data))
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(local))


def rank_file(rank: int) -> str:
    return f"model-rank{rank}.pt"


def _report_from_every_rank(model: Any, metrics: dict[str, Any], rank: int, *,
                            asynchronous: bool) -> None:
    """Each rank uploads its own ``model-rank<r>.pt`` (+ sha256) into the same checkpoint; with
    ``asynchronous`` through ``CheckpointUploadMode.ASYNC`` (Ray uploads in the background and
    deletes the local directory after, so it is not a ``TemporaryDirectory``)."""
    import ray.train
    import torch

    local = tempfile.mkdtemp(prefix="ckpt-")
    buffer = io.BytesIO()
    torch.save(getattr(model, "module", model).state_dict(), buffer)
    data = buffer.getvalue()
    Path(local, rank_file(rank)).write_bytes(data)
    Path(local, rank_file(rank) + ".sha256").write_text(sha256(data))
    if rank == 0:
        Path(local, META_FILE).write_text(json.dumps({"epoch": metrics["epoch"]}))
    metrics = {**metrics, "sha256": sha256(data)}
    checkpoint = ray.train.Checkpoint.from_directory(local)
    if asynchronous:
        ray.train.report(metrics, checkpoint=checkpoint,
                         checkpoint_upload_mode=ray.train.CheckpointUploadMode.ASYNC)
    else:
        try:
            ray.train.report(metrics, checkpoint=checkpoint)
        finally:
            shutil.rmtree(local, ignore_errors=True)


def report_worker_state(bucket: str, s3: dict[str, Any]) -> None:
    """Write what this worker's storage filesystem (the one Ray unpickled here) says about
    itself to ``<bucket>/workers/rank-<r>.json``: node, pid, type, policy, stats, failed
    commits. Called at the end of a training loop; ``s3`` are `s3_options` of the endpoint."""
    import ray
    import ray.train

    fs = ray.train.get_context().get_storage().storage_filesystem
    rank = ray.train.get_context().get_world_rank()
    state = {"node": ray.get_runtime_context().get_node_id(), "pid": os.getpid(),
             "type": type(fs).__name__, "policy": repr(getattr(fs, "policy", None)),
             "client_attempts": getattr(getattr(fs, "retry_handler", None), "client_attempts",
                                        None),
             "stats": fs.stats.snapshot() if hasattr(fs, "stats") else None,
             "failed_commits": sorted(fs.failed_commits()) if hasattr(fs, "failed_commits")
             else None}
    with pafs.S3FileSystem(**s3).open_output_stream(  # not through fs: its stats stay as read
            f"{bucket}/workers/rank-{rank}.json") as out:
        out.write(json.dumps(state, default=str).encode())


def cluster_train_loop(config: dict[str, Any]) -> None:
    """`train_loop`, then `report_worker_state`."""
    train_loop(config)
    report_worker_state(config["bucket"], config["s3"])


# -- driving a run -------------------------------------------------------------------------------


#: Train v2 with fewer helper actors and log files per run (shared with `retryfs demo --ray`): on
#: 2 cores each helper process costs about a second (a run takes 15 s with these, 22 s without).
QUIET_RAY = demo_ray.QUIET_RAY


def ray_init(**kwargs: Any) -> None:
    """One quiet local Ray for 2 CPUs (never an existing cluster)."""
    import ray

    for name, value in QUIET_RAY.items():
        os.environ.setdefault(name, value)
    options: dict[str, Any] = dict(address="local", num_cpus=2, include_dashboard=False,
                                   log_to_driver=os.environ.get("RETRYFS_RAY_LOGS") == "1",
                                   configure_logging=False)
    options.update(kwargs)
    # Ray's worker processes inherit the environment of the raylet this call starts.
    saved = os.environ.get("PYTHONPATH")
    here = str(Path(__file__).resolve().parent)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, saved) if p)
    try:
        ray.init(**options)
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved


#: What Ray Train, its Lightning callback and torch leave in the temporary directory: a
#: checkpoint download that failed half-way (``Checkpoint.as_directory``), the callback's empty
#: per-rank directories, Ray's file locks, torch's compile cache (made when a worker imports it).
RAY_LEFTOVERS = ("checkpoint_tmp_", "lightning_checkpoints-", "_ray_lockfiles", "torchinductor_")


@contextlib.contextmanager
def ray_session(**kwargs: Any) -> Iterator[str]:
    """`ray_init` for the block, leaving nothing in the temporary directory; yields Ray's temp dir.

    Ray's session directory goes to a short directory of its own in the temporary directory
    (under pytest's deep ``tmp_path`` Ray's socket paths would pass the 107 bytes of AF_UNIX),
    removed after ``ray.shutdown()``, with what Ray left there (`RAY_LEFTOVERS`) since the block
    began. Anything else left in the temporary directory is for the session check to see.
    """
    import ray

    with _ray_temp_dir() as ray_dir:
        ray_init(_temp_dir=ray_dir, **kwargs)
        try:
            yield ray_dir
        finally:
            ray.shutdown()


@contextlib.contextmanager
def _ray_temp_dir() -> Iterator[str]:
    """A short temp dir for Ray (also ``RAY_TMPDIR``: its lock files and address file go there),
    removed after, with `RAY_LEFTOVERS` that appeared in the temporary directory meanwhile."""
    tmp = tempfile.gettempdir()
    before = set(os.listdir(tmp))
    ray_dir = tempfile.mkdtemp(prefix="ray-")
    os.mkdir(os.path.join(ray_dir, "ray"))  # where Ray writes its address file
    saved = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = ray_dir
    try:
        yield ray_dir
    finally:
        if saved is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = saved
        shutil.rmtree(ray_dir, ignore_errors=True)
        for name in set(os.listdir(tmp)) - before:
            if name.startswith(RAY_LEFTOVERS):
                path = os.path.join(tmp, name)
                if os.path.isdir(path) and not os.path.islink(path):
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(path)


@contextlib.contextmanager
def two_node_cluster() -> Iterator[Any]:
    """A `ray.cluster_utils.Cluster` of two nodes on this machine (1 CPU each, a custom resource
    ``node_a`` / ``node_b`` apiece), the driver connected; nothing left in the temp dir after."""
    import ray
    from ray.cluster_utils import Cluster

    for name, value in QUIET_RAY.items():
        os.environ.setdefault(name, value)
    with _ray_temp_dir() as ray_dir:
        saved = os.environ.get("PYTHONPATH")
        here = str(Path(__file__).resolve().parent)
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (here, saved) if p)
        cluster = Cluster()
        try:
            cluster.add_node(num_cpus=1, resources={"node_a": 1}, temp_dir=ray_dir,
                             include_dashboard=False)
            cluster.add_node(num_cpus=1, resources={"node_b": 1}, temp_dir=ray_dir)
            cluster.wait_for_nodes()
            ray.init(address=cluster.address, log_to_driver=os.environ.get(
                "RETRYFS_RAY_LOGS") == "1", configure_logging=False)
            yield cluster
        finally:
            if saved is None:
                os.environ.pop("PYTHONPATH", None)
            else:
                os.environ["PYTHONPATH"] = saved
            ray.shutdown()
            cluster.shutdown()


def fit(storage: pafs.FileSystem, name: str, *, epochs: int = 3, bucket: str = "ray-e2e",
        steps: int = 2, max_failures: int = 0, loop: Any = None,
        scaling: dict[str, Any] | None = None, **config: Any) -> Any:
    """Run `train_loop` (or ``loop``) with 2 CPU workers (``scaling``: more `ScalingConfig`
    arguments; ``config``: more of the loop's config); returns the ``Result`` (or raises what
    fit raised)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    trainer = TorchTrainer(
        loop or train_loop,
        train_loop_config={"epochs": epochs, "steps": steps, "bucket": bucket, **config},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False, **(scaling or {})),
        torch_config=TorchConfig(backend="gloo"),
        run_config=RunConfig(
            name=name, storage_path=f"{bucket}/exp", storage_filesystem=storage,
            checkpoint_config=CheckpointConfig(num_to_keep=None),
            failure_config=FailureConfig(max_failures=max_failures)),
    )
    return trainer.fit()


@dataclass
class Outcome:
    """What a run reported and what the store really holds."""

    fit: str  # "success" or "<ErrorType>: first line"
    reported: list[dict[str, Any]] = field(default_factory=list)  # metrics of each checkpoint
    paths: list[str] = field(default_factory=list)  # bucket/key of each reported checkpoint
    intact: list[bool] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # reported checkpoints without model.pt
    seconds: float = 0.0
    result: Any = None
    error: BaseException | None = None

    @property
    def ok(self) -> bool:
        return self.fit == "success"

    @property
    def n_intact(self) -> int:
        return sum(self.intact)


def stored_checkpoint(endpoint: Any, path: str) -> tuple[bytes | None, str | None]:
    """``(model.pt bytes, model.pt.sha256 text)`` of a checkpoint as the endpoint stores it."""
    bucket, _, key = path.partition("/")
    found: list[Any] = []
    for name in (MODEL_FILE, HASH_FILE):
        try:
            found.append(endpoint.get_object(bucket, f"{key}/{name}"))
        except KeyError:
            found.append(None)
    model, digest = found
    return model, (digest.decode().strip() if digest is not None else None)


def run_and_inspect(endpoint: Any, storage: pafs.FileSystem, name: str, **kwargs: Any
                    ) -> Outcome:
    """`fit`, then compare every reported checkpoint with what the endpoint stores."""
    started = time.perf_counter()
    try:
        result = fit(storage, name, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the outcome records it
        first = str(exc).strip().splitlines()
        return Outcome(fit=f"{type(exc).__name__}: {first[0] if first else ''}", error=exc,
                       seconds=time.perf_counter() - started)
    outcome = Outcome(fit="success" if result.error is None else
                      f"{type(result.error).__name__}", result=result, error=result.error,
                      seconds=time.perf_counter() - started)
    for checkpoint, metrics in result.best_checkpoints or []:
        model, digest = stored_checkpoint(endpoint, checkpoint.path)
        outcome.reported.append(metrics)
        outcome.paths.append(checkpoint.path)
        good = model is not None and sha256(model) == metrics["sha256"] == digest
        outcome.intact.append(good)
        if model is None:
            outcome.missing.append(checkpoint.path)
    return outcome


def restore_hash(checkpoint: Any) -> str:
    """Download a checkpoint through its filesystem (``as_directory``) and hash model.pt."""
    with checkpoint.as_directory() as local:
        return sha256(Path(local, MODEL_FILE).read_bytes())

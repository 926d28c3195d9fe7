"""Ray Train on CPU against the S3 fault endpoint: the training loop, the storage, the checks.

Shared by ``tests/test_ray_train_e2e.py`` and ``benchmarks/ray_train_comparison.py``. Ray pickles
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

import hashlib
import io
import json
import os
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from retryfs import demo_ray

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
    ``retry_strategy``). Wrap it with ``native_attempts=1`` to make retryfs the only layer."""
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


def fit(storage: pafs.FileSystem, name: str, *, epochs: int = 3, bucket: str = "ray-e2e",
        steps: int = 2, max_failures: int = 0) -> Any:
    """Run `train_loop` with 2 CPU workers; returns the ``Result`` (or raises what fit raised)."""
    from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"epochs": epochs, "steps": steps},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
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

"""`retryfs demo --ray`: a short Ray Train job checkpointing to the faulty S3 endpoint.

The training function is plain Ray Train (a tiny torch model, a checkpoint per epoch from rank
0); nothing in it knows about retryfs. It runs twice under the same fault, the commit of the
second checkpoint's ``model.pt`` failing 3 times (as many as pyarrow's own retries): once with
``RunConfig(storage_filesystem=pyarrow.fs.S3FileSystem(...))``, once with that filesystem
wrapped in `RetryingFileSystem`. Then it shows what training reported and what storage holds.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, TextIO

from retryfs.arrow.filesystem import RetryingFileSystem

from .common import BUCKET, POLICY, _fresh, print_table

EPOCHS = 3
#: Train v2 (the default since Ray 2.51) with fewer helper actors and log files: on a small
#: machine each helper process costs about a second.
QUIET_RAY = {
    "RAY_TRAIN_V2_ENABLED": "1",
    "RAY_USAGE_STATS_ENABLED": "0",
    "RAY_TRAIN_HEALTH_CHECK_INTERVAL_S": "0.2",
    "RAY_TRAIN_ENABLE_PREEMPTION_WATCHER": "0",
    "RAY_TRAIN_METRICS_ENABLED": "0",
    "RAY_TRAIN_ENABLE_STATE_ACTOR_RECONCILIATION": "0",
    "RAY_TRAIN_ENABLE_CONTROLLER_STRUCTURED_LOGGING": "0",
    "RAY_TRAIN_ENABLE_WORKER_STRUCTURED_LOGGING": "0",
    "RAY_TRAIN_ENABLE_PRINT_PATCH": "0",
}


def train_loop(config: dict[str, Any]) -> None:
    """Plain Ray Train: a checkpoint (model.pt, meta.json) per epoch from rank 0."""
    import json

    import ray.train
    import ray.train.torch
    import torch

    torch.manual_seed(0)
    model = ray.train.torch.prepare_model(torch.nn.Sequential(
        torch.nn.Linear(64, 512), torch.nn.ReLU(), torch.nn.Linear(512, 1)))
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    for epoch in range(config["epochs"]):
        x = torch.randn(16, 64)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with tempfile.TemporaryDirectory() as local:
            torch.save(getattr(model, "module", model).state_dict(), Path(local, "model.pt"))
            Path(local, "meta.json").write_text(json.dumps({"epoch": epoch}))
            ray.train.report({"epoch": epoch, "loss": loss.item()},
                             checkpoint=ray.train.Checkpoint.from_directory(local))


def _fit(storage: Any, name: str, bucket: str) -> tuple[str, int]:
    """Run the job; ``(what training reported, checkpoints it reported)``."""
    from ray.train import CheckpointConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    trainer = TorchTrainer(
        train_loop, train_loop_config={"epochs": EPOCHS},
        scaling_config=ScalingConfig(num_workers=1),
        run_config=RunConfig(name=name, storage_path=f"{bucket}/ray",
                             storage_filesystem=storage,
                             checkpoint_config=CheckpointConfig(num_to_keep=None)))
    try:
        result = trainer.fit()
    except Exception as exc:  # noqa: BLE001 - the demo shows what the caller saw
        return f"failed: {type(exc).__name__}", 0
    reported = len(result.best_checkpoints or []) or (1 if result.checkpoint else 0)
    return "finished", reported


def _held(endpoint: Any, bucket: str, name: str) -> tuple[int, list[int]]:
    """(checkpoint directories in storage, the numbers (1-based, in time order) of those
    without model.pt)."""
    keys = endpoint.keys(bucket, f"ray/{name}/")
    dirs = sorted({k.split("/")[2] for k in keys
                   if len(k.split("/")) > 3 and k.split("/")[2].startswith("checkpoint_")})
    without = [n for n, d in enumerate(dirs, 1) if f"ray/{name}/{d}/model.pt" not in keys]
    return len(dirs), without


def run(out: TextIO, endpoint: Any) -> bool:
    """Print the Ray Train comparison; True when the retryfs run kept every checkpoint."""
    try:
        import ray  # noqa: F401
        import torch  # noqa: F401
    except ImportError:
        print("\nRay Train part skipped: install ray[train] and torch "
              "(in the retryfs checkout: pip install '.[ray]' torch).", file=out)
        return True
    from retryfs.testing.s3 import S3Fault

    for key, value in QUIET_RAY.items():
        os.environ.setdefault(key, value)
    import ray

    print(f"\nRay Train: {EPOCHS} epochs, one checkpoint (model.pt, meta.json) per epoch, "
          "training code untouched.", file=out)
    print("The commit of the 2nd checkpoint's model.pt fails 3 times in a row "
          "(CompleteMultipartUpload, '200 OK' + <Error>).", file=out)
    print("Starting a local Ray (2 CPUs) ...", file=out, flush=True)
    started = time.monotonic()
    rows = []
    # Ray's session files go to a directory of the demo's own, removed after (nothing left behind)
    ray_dir = tempfile.mkdtemp(prefix="ray-")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False, _temp_dir=ray_dir)
    ok = True
    try:
        for label in ("pyarrow (plain)", "retryfs"):
            name = "plain" if label.startswith("pyarrow") else "retryfs"
            _fresh(endpoint, [S3Fault.error_in_200(op="CompleteMultipartUpload",
                                                   path=f"{BUCKET}/ray/{name}/*/model.pt",
                                                   nth=2, times=3)])
            s3 = endpoint.pyarrow_fs(max_attempts=3)
            storage = RetryingFileSystem(s3, POLICY) if name == "retryfs" else s3
            print(f"  training with storage_filesystem = {label} ...", file=out, flush=True)
            t0 = time.monotonic()
            reported, checkpoints = _fit(storage, name, BUCKET)
            held, without = _held(endpoint, BUCKET, name)
            if without:
                numbers = ", ".join(f"#{n}" for n in without)
                holds = f"{held - len(without)}/{held} have model.pt ({numbers} has none)"
            else:
                holds = f"{held}/{held} have model.pt"
            rows.append((label, f"{reported}, {checkpoints} checkpoints reported", holds,
                         f"{time.monotonic() - t0:.0f}s"))
            if name == "retryfs":
                ok = reported == "finished" and held == EPOCHS and not without
    finally:
        ray.shutdown()
        shutil.rmtree(ray_dir, ignore_errors=True)
    print(file=out)
    print_table(out, ("storage_filesystem", "training", "checkpoints in storage", "time"), rows)
    print(f"(Ray part: {time.monotonic() - started:.0f}s. A complete training script with "
          "retryfs.from_uri: examples/ray_train_torch.py)", file=out)
    return ok

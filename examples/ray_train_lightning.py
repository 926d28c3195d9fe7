"""Ray Train with PyTorch Lightning, checkpoints that survive storage faults.

The Lightning setup Ray documents: ``RayDDPStrategy``, ``RayLightningEnvironment``,
``RayTrainReportCallback`` (which saves ``checkpoint.ckpt`` at every epoch end and reports it)
and ``prepare_trainer``. Nothing in the training code knows about retryfs; the only change is
``RunConfig(storage_path=path, storage_filesystem=fs)`` with ``fs, path = retryfs.from_uri(uri)``:
every checkpoint upload and restore is retried part by part and commit by commit, and a commit
that finally fails is an error instead of a checkpoint silently missing.

    # real storage: retry_* parameters configure retryfs, the others go to pyarrow
    python examples/ray_train_lightning.py \\
        "s3://my-bucket/experiments?region=us-east-1&retry_max_attempts=8&retry_max_delay=30&retry_deadline=300"

    # no cloud account: retryfs's S3 fault endpoint (moto on loopback, pip install '.[demo]')
    # with a plan of faults; the URI names only the bucket and the retry parameters
    python examples/ray_train_lightning.py --fault-endpoint

Run it twice with the same ``--name`` and the second run resumes from the last checkpoint
(``trainer.fit(..., ckpt_path=...)``). At the end every reported checkpoint is downloaded
again and loaded.
"""

from __future__ import annotations

import argparse
import contextlib
import io
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import retryfs

DEFAULT_FAULT_URI = "s3://ray-example/experiments?retry_max_attempts=20&retry_initial_delay=0.05"
CHECKPOINT = "checkpoint.ckpt"  # RayTrainReportCallback.CHECKPOINT_NAME


def train_func(config: dict[str, Any]) -> None:
    """Runs on every worker: a LightningModule trained with Ray's DDP strategy."""
    import lightning.pytorch as pl
    import ray.train
    import torch
    from ray.train.lightning import (
        RayDDPStrategy,
        RayLightningEnvironment,
        RayTrainReportCallback,
        prepare_trainer,
    )

    class Regressor(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 1024), torch.nn.ReLU(),
                                           torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                           torch.nn.Linear(1024, 1))

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            features, target = batch
            loss = torch.nn.functional.mse_loss(self.net(features), target)
            self.log("loss", loss, sync_dist=True)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=1e-3)

    torch.manual_seed(0)
    x = torch.randn(256, 16)
    loader = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=64)
    trainer = pl.Trainer(
        max_epochs=config["epochs"], accelerator="cpu", devices="auto",
        strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()],
        callbacks=[RayTrainReportCallback()],
        enable_progress_bar=False, enable_model_summary=False, logger=False,
        enable_checkpointing=False)  # Ray's callback does the checkpointing
    trainer = prepare_trainer(trainer)

    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        trainer.fit(Regressor(), train_dataloaders=loader)
    else:  # a resumed run: Lightning continues after the epoch saved in the checkpoint
        with checkpoint.as_directory() as local:
            trainer.fit(Regressor(), train_dataloaders=loader,
                        ckpt_path=str(Path(local, CHECKPOINT)))


# -- the driver ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("storage", nargs="?", help="storage URI with retry_* parameters, e.g. "
                        "s3://bucket/experiments?region=us-east-1&retry_max_attempts=8")
    parser.add_argument("--fault-endpoint", action="store_true",
                        help="store on an embedded S3 fault endpoint (moto on loopback) under a "
                        "plan of faults; the URI then names only the bucket, path and retry_*")
    parser.add_argument("--name", default="ray-train-lightning", help="the run's name (same name: "
                        "resume)")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args(argv)
    if args.storage is None and not args.fault_endpoint:
        parser.error("give a storage URI, or --fault-endpoint")
    return args


@contextlib.contextmanager
def fault_endpoint(uri: str) -> Iterator[tuple[str, Any]]:
    """An S3 fault endpoint with a plan of faults, and ``uri`` pointed at it."""
    from retryfs.testing.s3 import S3Fault, S3FaultEndpoint

    parts = urlsplit(uri)
    model = f"{parts.netloc}/*/checkpoint_*/{CHECKPOINT}"
    with S3FaultEndpoint() as endpoint:
        endpoint.create_bucket(parts.netloc)
        # the 2nd checkpoint's commit fails 3 times (pyarrow alone: a checkpoint silently lost)
        endpoint.add_fault(S3Fault.error_in_200(path=model, nth=2, times=3))
        endpoint.add_fault(S3Fault.slow_down(op="UploadPart", path=model, times=6))  # throttled
        endpoint.add_fault(S3Fault.reset(op=("GetObject", "HeadObject"),  # flaky downloads
                                         path=f"{parts.netloc}/*/checkpoint_*/*",
                                         probability=0.2, seed=1))
        yield endpoint.uri(f"{parts.netloc}{parts.path}", **dict(parse_qsl(parts.query))), endpoint


def check_checkpoints(result: Any) -> int:
    """Download every reported checkpoint again and load it."""
    import torch

    intact = 0
    for checkpoint, metrics in result.best_checkpoints:
        with checkpoint.as_directory() as local:  # through retryfs too
            data = Path(local, CHECKPOINT).read_bytes()
        state = torch.load(io.BytesIO(data), weights_only=False, map_location="cpu")
        good = state["epoch"] == metrics["epoch"] and "state_dict" in state
        intact += good
        print(f"  epoch {metrics['epoch']}: {checkpoint.path} ({len(data)} bytes): "
              f"{'intact' if good else 'NOT the checkpoint reported'}")
    print(f"checkpoints intact: {intact}/{len(result.best_checkpoints)}")
    return intact


def main(argv: list[str] | None = None) -> Any:
    args = parse_args(argv)
    import ray
    import ray.train
    from ray.train.torch import TorchConfig, TorchTrainer

    with (fault_endpoint(args.storage or DEFAULT_FAULT_URI) if args.fault_endpoint
          else contextlib.nullcontext((args.storage, None))) as (uri, endpoint):
        fs, path = retryfs.from_uri(uri)
        if not ray.is_initialized():  # the endpoint listens on loopback: a local Ray then
            ray.init(address="local" if endpoint is not None else None)
        trainer = TorchTrainer(
            train_func,
            train_loop_config={"epochs": args.epochs},
            scaling_config=ray.train.ScalingConfig(num_workers=args.workers, use_gpu=False),
            torch_config=TorchConfig(backend="gloo"),
            run_config=ray.train.RunConfig(name=args.name, storage_path=path,
                                           storage_filesystem=fs),
        )
        result = trainer.fit()  # raises ray.train.TrainingFailedError if training failed
        print(f"fit() succeeded: {len(result.best_checkpoints)} checkpoint(s) reported")
        check_checkpoints(result)
        if endpoint is not None:
            print(f"faults the endpoint injected: {len(endpoint.injected)} "
                  f"({', '.join(sorted({r.op for r in endpoint.injected}))})")
    return result


if __name__ == "__main__":
    main()

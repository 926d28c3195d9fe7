"""Ray Train (PyTorch DDP) with checkpoints that survive storage faults.

The training function below is plain Ray Train; nothing in it knows about retryfs. The only
change is where the checkpoints go: ``RunConfig(storage_path=path, storage_filesystem=fs)``
with ``fs, path = retryfs.from_uri(uri)``, so every checkpoint upload (and every restore) is
retried part by part and commit by commit, and a commit that finally fails is an error instead
of a checkpoint silently missing.

    # real storage: retry_* parameters configure retryfs, the others go to pyarrow
    python examples/ray_train_torch.py \\
        "s3://my-bucket/experiments?region=us-east-1&retry_max_attempts=8&retry_max_delay=30&retry_deadline=300"

    # no cloud account: retryfs's S3 fault endpoint (moto on loopback, pip install '.[demo]')
    # with a plan of faults; the URI names only the bucket and the retry parameters
    python examples/ray_train_torch.py --fault-endpoint
    python examples/ray_train_torch.py --fault-endpoint "s3://ray-example/experiments?retry_max_attempts=20"

Run it twice with the same ``--name`` and the second run resumes from the last checkpoint.
At the end each reported checkpoint is downloaded again and checked against the sha256 the
worker reported through Ray (not through storage).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, urlsplit

import retryfs

DEFAULT_FAULT_URI = "s3://ray-example/experiments?retry_max_attempts=20&retry_initial_delay=0.05"


def train_func(config: dict[str, Any]) -> None:
    """Runs on every worker: DDP over gloo, a checkpoint per epoch, resume from the last one."""
    import ray.train
    import ray.train.torch
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1024), torch.nn.ReLU(),
                                torch.nn.Linear(1024, 1))  # 4.3 MiB of weights
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
    start = 0
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is not None:  # a resumed run: continue after the last checkpoint
        with checkpoint.as_directory() as local:
            state = torch.load(Path(local, "model.pt"), weights_only=True)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start = json.loads(Path(local, "meta.json").read_text())["epoch"] + 1

    model = ray.train.torch.prepare_model(model)
    x = torch.randn(256, 16)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    loader = ray.train.torch.prepare_data_loader(
        torch.utils.data.DataLoader(data, batch_size=64, shuffle=True))

    for epoch in range(start, config["epochs"]):
        if ray.train.get_context().get_world_size() > 1:
            loader.sampler.set_epoch(epoch)
        for features, target in loader:
            loss = torch.nn.functional.mse_loss(model(features), target)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        metrics = {"epoch": epoch, "loss": loss.item()}
        if ray.train.get_context().get_world_rank() != 0:
            ray.train.report(metrics)
            continue
        with tempfile.TemporaryDirectory() as local:
            buffer = io.BytesIO()
            torch.save({"model": model.module.state_dict() if hasattr(model, "module")
                        else model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
            Path(local, "model.pt").write_bytes(buffer.getvalue())
            Path(local, "meta.json").write_text(json.dumps({"epoch": epoch}))
            metrics["sha256"] = hashlib.sha256(buffer.getvalue()).hexdigest()
            ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(local))


# -- the driver ------------------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("storage", nargs="?", help="storage URI with retry_* parameters, e.g. "
                        "s3://bucket/experiments?region=us-east-1&retry_max_attempts=8")
    parser.add_argument("--fault-endpoint", action="store_true",
                        help="store on an embedded S3 fault endpoint (moto on loopback) under a "
                        "plan of faults; the URI then names only the bucket, path and retry_*")
    parser.add_argument("--name", default="ray-train-torch", help="the run's name (same name: "
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
    model = f"{parts.netloc}/*/checkpoint_*/model.pt"
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
    """Download every reported checkpoint again and compare it with what the worker wrote."""
    intact = 0
    for checkpoint, metrics in result.best_checkpoints:
        with checkpoint.as_directory() as local:  # through retryfs too
            data = Path(local, "model.pt").read_bytes()
        good = hashlib.sha256(data).hexdigest() == metrics["sha256"]
        intact += good
        print(f"  epoch {metrics['epoch']}: {checkpoint.path}: "
              f"{'intact' if good else 'DIFFERENT from what the worker wrote'}")
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

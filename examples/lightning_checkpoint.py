"""Lightning (without Ray) checkpointing to object storage through retryfs: ``retry::`` URLs for
``default_root_dir`` and ``ModelCheckpoint``, and `RetryingCheckpointIO` for the checkpoints.

    # real storage: credentials and region from the environment (AWS_* for s3fs and pyarrow);
    # RETRYFS_* set the policy, e.g. RETRYFS_MAX_ATTEMPTS=8
    python examples/lightning_checkpoint.py "retry::s3://my-bucket/lightning-exp"

    # no cloud account: retryfs's S3 fault endpoint (moto on loopback) with injected 503s
    python examples/lightning_checkpoint.py --fault-endpoint

It trains two epochs, resumes from ``last.ckpt`` for a third, then downloads the last
checkpoint again and checks its weights against the model's.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import retryfs
from retryfs.integrations.lightning import RetryingCheckpointIO


def make_model() -> Any:
    import lightning.pytorch as pl
    import torch

    class Regression(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.layer = torch.nn.Linear(16, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.layer(x), y)
            self.log("loss", loss)
            return loss

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.05)

        def train_dataloader(self) -> Any:
            generator = torch.Generator().manual_seed(0)
            x = torch.randn(128, 16, generator=generator)
            data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
            return torch.utils.data.DataLoader(data, batch_size=32)

    return Regression()


def fit(root: str, plugin: RetryingCheckpointIO, max_epochs: int,
        ckpt_path: str | None = None) -> tuple[Any, Any]:
    import lightning.pytorch as pl
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    model = make_model()
    trainer = pl.Trainer(
        default_root_dir=root, max_epochs=max_epochs, accelerator="cpu", devices=1,
        plugins=[plugin], logger=CSVLogger(f"{root}/logs"), log_every_n_steps=1,
        enable_progress_bar=False, enable_model_summary=False,
        callbacks=[ModelCheckpoint(dirpath=f"{root}/checkpoints", save_last=True)])
    trainer.fit(model, ckpt_path=ckpt_path)
    return trainer, model


def run(root: str, plugin: RetryingCheckpointIO) -> dict[str, Any]:
    import torch

    first, _ = fit(root, plugin, max_epochs=2)
    resumed, model = fit(root, plugin, max_epochs=3, ckpt_path=f"{root}/checkpoints/last.ckpt")
    saved = plugin.load_checkpoint(f"{root}/checkpoints/last.ckpt")
    intact = all(torch.equal(saved["state_dict"][name], value)
                 for name, value in model.state_dict().items())
    print(f"trained to step {first.global_step}, resumed to step {resumed.global_step}; "
          f"last checkpoint intact: {intact}")
    return {"first_step": first.global_step, "resumed_step": resumed.global_step,
            "intact": intact}


def _with_fault_endpoint(root: str) -> dict[str, Any]:
    import fsspec.config

    from retryfs.testing import S3Fault, S3FaultEndpoint

    bucket = root.split("://", 1)[1].split("/", 1)[0]
    with S3FaultEndpoint() as endpoint:
        endpoint.create_bucket(bucket)
        # Lightning opens its locations with url_to_fs(url) and no options: s3fs (under
        # retry::) is configured through fsspec's FSSPEC_S3_* variables
        saved_env = dict(os.environ)
        saved_conf = {k: dict(v) for k, v in fsspec.config.conf.items()}
        os.environ.update({"FSSPEC_S3_ENDPOINT_URL": endpoint.url, "FSSPEC_S3_KEY": "testing",
                           "FSSPEC_S3_SECRET": "testing",
                           "AWS_DEFAULT_REGION": endpoint.region,
                           "FSSPEC_RETRY_INITIAL_DELAY": "0.01"})
        fsspec.config.set_conf_env(fsspec.config.conf)
        try:
            for op in ("PutObject", "GetObject", "HeadObject", "ListObjectsV2"):
                endpoint.add_fault(S3Fault.slow_down(op=op, times=2))
            fs, _ = retryfs.from_uri(endpoint.uri(bucket, retry_initial_delay=0.01))
            result = run(root, RetryingCheckpointIO(fs))
        finally:
            os.environ.clear()
            os.environ.update(saved_env)
            fsspec.config.conf.clear()
            fsspec.config.conf.update(saved_conf)
        result["faults"] = len(endpoint.injected)
        print(f"faults the endpoint injected: {result['faults']}")
    return result


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default="retry::s3://lightning-example/exp",
                        help="the experiment directory, a retry:: URL")
    parser.add_argument("--fault-endpoint", action="store_true",
                        help="run against an embedded S3 server with injected faults")
    args = parser.parse_args(argv)
    if args.fault_endpoint:
        return _with_fault_endpoint(args.root)
    return run(args.root, RetryingCheckpointIO())


if __name__ == "__main__":
    sys.exit(0 if main()["intact"] else 1)

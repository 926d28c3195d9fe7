"""Lightning on ``retry::`` URLs: ``default_root_dir``, ``ModelCheckpoint(dirpath=...)``, resume,
the CSV logger, with and without `RetryingCheckpointIO`, under injected faults.

Lightning opens every location with ``url_to_fs(url)`` and no storage options, so s3fs is
pointed at the endpoint through fsspec's ``FSSPEC_S3_*`` variables, as a user would configure
it. The plugin writes through retryfs's pyarrow face (`from_uri` of the endpoint).
"""

import os

import pytest
from _helpers import require

import retryfs
from retryfs.integrations.lightning import RetryingCheckpointIO, split_location
from retryfs.testing import S3Fault

torch = require("torch")
pl = require("lightning.pytorch")


class TinyModel(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(32, 2)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch[0]).sum()
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        data = torch.utils.data.TensorDataset(torch.randn(64, 32, generator=generator))
        return torch.utils.data.DataLoader(data, batch_size=16)


@pytest.fixture
def s3_env(s3_fault_endpoint, monkeypatch, tmp_path):
    """s3fs configured from the environment (what Lightning's url_to_fs reads), a fresh working
    directory (nothing may be created in it), fsspec's configuration restored afterwards."""
    import fsspec.config
    import s3fs

    saved = {k: dict(v) for k, v in fsspec.config.conf.items()}
    for name, value in {"FSSPEC_S3_ENDPOINT_URL": s3_fault_endpoint.url,
                        "FSSPEC_S3_KEY": "testing", "FSSPEC_S3_SECRET": "testing",
                        "AWS_DEFAULT_REGION": s3_fault_endpoint.region,
                        "FSSPEC_RETRY_INITIAL_DELAY": "0.001",
                        "FSSPEC_RETRY_MAX_DELAY": "0.01"}.items():
        monkeypatch.setenv(name, value)
    fsspec.config.set_conf_env(fsspec.config.conf)
    s3fs.S3FileSystem.clear_instance_cache()
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    yield cwd
    fsspec.config.conf.clear()
    fsspec.config.conf.update(saved)
    s3fs.S3FileSystem.clear_instance_cache()
    from retryfs.fsspec.filesystem import RetryFileSystem

    RetryFileSystem.clear_instance_cache()


def _plugin(endpoint, bucket):
    fs, _ = retryfs.from_uri(endpoint.uri(bucket, retry_initial_delay=0.001,
                                          retry_max_delay=0.01, retry_budget="false"))
    return RetryingCheckpointIO(fs)


def _fit(root, *, plugins=(), max_epochs=2, ckpt_path=None, model=None):
    from lightning.pytorch.callbacks import ModelCheckpoint
    from lightning.pytorch.loggers import CSVLogger

    model = model or TinyModel()
    trainer = pl.Trainer(
        default_root_dir=root, max_epochs=max_epochs, accelerator="cpu", devices=1,
        logger=CSVLogger(f"{root}/logs", name="run"), enable_progress_bar=False,
        enable_model_summary=False, plugins=list(plugins), log_every_n_steps=1,
        callbacks=[ModelCheckpoint(dirpath=f"{root}/ckpts", save_last=True, save_top_k=1,
                                   monitor="loss")])
    trainer.fit(model, ckpt_path=ckpt_path)
    return trainer, model


def _weights_in(endpoint, bucket, key):
    import io

    data = endpoint.get_object(bucket, key)
    return torch.load(io.BytesIO(data), weights_only=False)


@pytest.mark.parametrize("with_plugin", [True, False], ids=["plugin", "fsspec"])
def test_fit_and_resume_on_a_retry_url_under_faults(with_plugin, s3_env, s3_fault_endpoint,
                                                    s3_fault_bucket):
    root = f"retry::s3://{s3_fault_bucket}/exp"
    plugins = [_plugin(s3_fault_endpoint, s3_fault_bucket)] if with_plugin else []
    for fault in (S3Fault.slow_down(op="PutObject", times=3),
                  S3Fault.internal_error(op="HeadObject", times=2),
                  S3Fault.slow_down(op="ListObjectsV2", times=2)):
        s3_fault_endpoint.add_fault(fault)
    trainer, model = _fit(root, plugins=plugins)
    assert len(s3_fault_endpoint.injected) == 7
    keys = s3_fault_endpoint.keys(s3_fault_bucket, "exp/")
    assert "exp/ckpts/last.ckpt" in keys
    assert any(k.startswith("exp/logs/run/") and k.endswith("metrics.csv") for k in keys), keys
    saved = _weights_in(s3_fault_endpoint, s3_fault_bucket, "exp/ckpts/last.ckpt")
    assert saved["global_step"] == trainer.global_step == 8
    for name, value in model.state_dict().items():
        assert torch.equal(saved["state_dict"][name], value)
    # resume from the URL, through a GET that fails twice
    s3_fault_endpoint.add_fault(S3Fault.slow_down(op="GetObject", times=2))
    resumed, _ = _fit(root, plugins=plugins, max_epochs=3, ckpt_path=f"{root}/ckpts/last.ckpt")
    assert resumed.global_step == 12
    after = _weights_in(s3_fault_endpoint, s3_fault_bucket, "exp/ckpts/last.ckpt")
    assert after["global_step"] == 12 and after["epoch"] == 2
    assert os.listdir(s3_env) == []  # nothing local named retry::s3:/...


def test_the_plugin_uploads_a_large_checkpoint_in_parts_and_resends_only_the_failed_one(
        s3_fault_endpoint, s3_fault_bucket):
    plugin = _plugin(s3_fault_endpoint, s3_fault_bucket)
    state = {"w": torch.randn(24 * 2**20 // 4, generator=torch.Generator().manual_seed(1))}
    s3_fault_endpoint.add_fault(S3Fault.slow_down(op="UploadPart", times=1))
    plugin.save_checkpoint(state, f"retry::s3://{s3_fault_bucket}/big/model.ckpt")
    parts = s3_fault_endpoint.requests(op="UploadPart")
    sent = sum(record.request_bytes for record in parts)
    stored = len(s3_fault_endpoint.get_object(s3_fault_bucket, "big/model.ckpt"))
    failed = [record for record in parts if record.fault is not None]
    assert len(failed) == 1 and len(parts) >= 3  # parts, one of them sent twice
    # the failed part again, nothing else (request bytes carry the SDK's chunk signatures)
    assert stored <= sent - failed[0].request_bytes <= stored * 1.001
    loaded = plugin.load_checkpoint(f"s3://{s3_fault_bucket}/big/model.ckpt")
    assert torch.equal(loaded["w"], state["w"])


def test_a_checkpoint_that_cannot_be_serialised_commits_nothing(s3_fault_endpoint,
                                                                s3_fault_bucket):
    plugin = _plugin(s3_fault_endpoint, s3_fault_bucket)
    s3_fault_endpoint.put_object(s3_fault_bucket, "bad.ckpt", b"the last good checkpoint")
    s3_fault_endpoint.reset_record()
    with pytest.raises(Exception):  # noqa: B017 - pickle's own error, whatever its type
        plugin.save_checkpoint({"f": lambda: None}, f"s3://{s3_fault_bucket}/bad.ckpt")
    assert s3_fault_endpoint.get_object(s3_fault_bucket, "bad.ckpt") == \
        b"the last good checkpoint"
    assert not s3_fault_endpoint.requests(["PutObject", "CompleteMultipartUpload"])


def test_a_save_that_fails_in_the_middle_commits_nothing(s3_fault_endpoint, s3_fault_bucket,
                                                         monkeypatch):
    """The checkpoint streams into its upload: parts are on their way when ``torch.save``
    fails, and the upload is given up, not committed (pyarrow's stream would store them)."""
    plugin = _plugin(s3_fault_endpoint, s3_fault_bucket)

    def save_then_fail(obj, stream, *args, **kwargs):
        stream.write(b"x" * (12 * 2**20))  # more than a part: one is sent
        raise RuntimeError("torch.save failed in the middle")

    monkeypatch.setattr(torch, "save", save_then_fail)
    s3_fault_endpoint.reset_record()
    with pytest.raises(RuntimeError, match="in the middle"):
        plugin.save_checkpoint({"a": 1}, f"s3://{s3_fault_bucket}/half.ckpt")
    assert s3_fault_endpoint.requests(["CreateMultipartUpload"])
    assert not s3_fault_endpoint.requests(["PutObject", "CompleteMultipartUpload"])
    assert "half.ckpt" not in s3_fault_endpoint.keys(s3_fault_bucket)


def test_an_upload_that_fails_is_made_again_by_torch_save_and_no_spool_is_kept(
        s3_fault_endpoint, s3_fault_bucket, monkeypatch):
    """A part that fails all of the write client's 3 attempts breaks the upload: the plugin
    runs ``torch.save`` again into a fresh one, with no replay spool (nothing in a temporary
    file, nothing held beyond the parts in flight)."""
    from retryfs.datapath import streams

    spools, saves = [], []
    original_spool, original_save = streams.replay_spool, torch.save
    monkeypatch.setattr(streams, "replay_spool",
                        lambda memory: spools.append(memory) or original_spool(memory))
    monkeypatch.setattr(torch, "save", lambda *a, **k: saves.append(1) or original_save(*a, **k))
    plugin = _plugin(s3_fault_endpoint, s3_fault_bucket)
    state = {"w": torch.randn(12 * 2**20 // 4, generator=torch.Generator().manual_seed(2))}
    fault = s3_fault_endpoint.add_fault(S3Fault.slow_down(op="UploadPart", times=3,
                                                          query={"partNumber": "1"}))
    plugin.save_checkpoint(state, f"s3://{s3_fault_bucket}/again.ckpt")
    assert s3_fault_endpoint.fired(fault) == 3 and len(saves) == 2 and spools == []
    completes = s3_fault_endpoint.requests("CompleteMultipartUpload")
    assert [r.status for r in completes] == [200]  # the broken upload never completed
    # what it cost, past the 3 refused tries of part 1: the parts the broken upload had got
    # through, and the whole checkpoint once more (signatures add under 0.1 %)
    stored = len(s3_fault_endpoint.get_object(s3_fault_bucket, "again.ckpt"))
    parts = s3_fault_endpoint.requests(op="UploadPart")
    assert sum(r.fault is not None for r in parts) == 3
    accepted = sum(r.request_bytes for r in parts if r.fault is None)
    assert stored <= accepted <= 2 * stored * 1.001
    loaded = plugin.load_checkpoint(f"s3://{s3_fault_bucket}/again.ckpt")
    assert torch.equal(loaded["w"], state["w"])


def test_remove_and_missing_checkpoints(s3_fault_endpoint, s3_fault_bucket):
    plugin = _plugin(s3_fault_endpoint, s3_fault_bucket)
    url = f"retry::s3://{s3_fault_bucket}/x/a.ckpt"
    plugin.save_checkpoint({"a": torch.ones(3)}, url)
    s3_fault_endpoint.add_fault(S3Fault.slow_down(op="DeleteObject", times=1))
    plugin.remove_checkpoint(url)
    # (pyarrow's S3 keeps the parent "directory" as an empty x/ marker after a delete)
    assert "x/a.ckpt" not in s3_fault_endpoint.keys(s3_fault_bucket, "x/")
    plugin.remove_checkpoint(url)  # absent: done
    with pytest.raises(FileNotFoundError, match="checkpoint not found"):
        plugin.load_checkpoint(url)
    with pytest.raises(TypeError, match="storage_options"):
        plugin.save_checkpoint({}, url, storage_options={"x": 1})


def test_a_path_on_a_given_object_store_makes_no_directory(s3_fault_endpoint, s3_fault_bucket):
    # a path without a scheme on the S3 filesystem given: no "x/y/" directory marker, one object
    plugin = _plugin(s3_fault_endpoint, s3_fault_bucket)
    s3_fault_endpoint.reset_record()
    plugin.save_checkpoint({"a": torch.ones(3)}, f"{s3_fault_bucket}/x/y/a.ckpt")
    assert [r.key for r in s3_fault_endpoint.requests(op="PutObject")] == []  # no marker
    assert s3_fault_endpoint.keys(s3_fault_bucket, "x/") == ["x/y/a.ckpt"]


def test_a_checkpoint_named_like_a_compressed_file_is_stored_as_torch_saved_it(
        s3_fault_endpoint, s3_fault_bucket):
    """pyarrow's ``open_output_stream`` compresses by the name's suffix; a checkpoint is
    stored as ``torch.save`` wrote it, whatever its name, and loads back."""
    plugin = _plugin(s3_fault_endpoint, s3_fault_bucket)
    plugin.save_checkpoint({"a": torch.arange(5)}, f"s3://{s3_fault_bucket}/m.ckpt.gz")
    assert s3_fault_endpoint.get_object(s3_fault_bucket, "m.ckpt.gz")[:2] == b"PK"  # a zip
    loaded = plugin.load_checkpoint(f"s3://{s3_fault_bucket}/m.ckpt.gz")
    assert torch.equal(loaded["a"], torch.arange(5))


def test_local_checkpoints_and_locations(tmp_path):
    plugin = RetryingCheckpointIO(policy=retryfs.RetryPolicy(max_attempts=2))
    target = tmp_path / "d" / "m.ckpt"
    plugin.save_checkpoint({"a": torch.arange(4)}, f"retry::file://{target}")
    assert torch.equal(plugin.load_checkpoint(str(target))["a"], torch.arange(4))
    with pytest.raises(Exception):  # noqa: B017 - pickle's own error, whatever its type
        plugin.save_checkpoint({"a": torch.zeros(4), "f": lambda: None}, str(target))
    # written beside and renamed: the last good checkpoint stays, no temporary is left
    assert torch.equal(plugin.load_checkpoint(str(target))["a"], torch.arange(4))
    assert os.listdir(target.parent) == ["m.ckpt"]
    assert split_location("retry::s3://b/k/x") == ("s3", "b", "b/k/x")
    assert split_location("file:///a/b") == ("", "", "/a/b")
    with pytest.raises(ValueError, match="empty"):
        split_location("retry::")


def test_the_example_trains_resumes_and_checks_its_checkpoints(monkeypatch, tmp_path):
    import importlib.util
    from pathlib import Path

    monkeypatch.chdir(tmp_path)
    path = Path(__file__).resolve().parents[2] / "examples" / "lightning_checkpoint.py"
    spec = importlib.util.spec_from_file_location("lightning_checkpoint", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    result = example.main(["--fault-endpoint"])
    assert result["intact"] and result["resumed_step"] > result["first_step"] > 0
    assert result["faults"] > 0
    assert os.listdir(tmp_path) == []

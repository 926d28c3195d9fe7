"""Pickles made by retryfs 0.1.0 (tests/data/make_pickles.py, run before the package was laid
out in subpackages) load with this package, into wrappers that work: a Ray job's saved
wrapper or settings must survive an upgrade."""

import importlib
import pickle
import sys
import warnings
from pathlib import Path

import pyarrow.fs as pafs
import pytest

import retryfs

DATA = Path(__file__).resolve().parents[1] / "data" / "pickles-0.1.0.pkl"


def _load() -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        return pickle.loads(DATA.read_bytes())


def test_the_pickle_names_the_old_modules():
    raw = DATA.read_bytes()
    for old in (b"retryfs.policy", b"retryfs.classify", b"retryfs.budget", b"retryfs.arrow"):
        assert old in raw  # else this test proves nothing about the move


def test_settings_of_0_1_0_load_equal_to_settings_made_now():
    loaded = _load()
    assert loaded["policy"] == retryfs.RetryPolicy(max_attempts=5)
    config = loaded["config"]
    assert isinstance(config, retryfs.WrapperConfig)
    assert config.policy == retryfs.RetryPolicy(max_attempts=7, initial_delay=0.25)
    assert config.per_operation["write"] == retryfs.RetryPolicy(max_attempts=2, initial_delay=0.25)
    assert (config.client_attempts, config.retryable_messages, config.spool_memory) == (
        1, ("flaky",), 1 << 20)
    assert isinstance(config.budget, retryfs.RetryBudget)
    assert config.rate_limit == retryfs.RateLimit(mode="on")


def test_wrappers_of_0_1_0_load_and_work(tmp_path):
    loaded = _load()
    local = loaded["arrow_local"]
    assert isinstance(local, retryfs.RetryingFileSystem)
    assert local.policy.max_attempts == 4
    with local.open_output_stream(str(tmp_path / "a.bin")) as out:
        out.write(b"after the move")
    assert (tmp_path / "a.bin").read_bytes() == b"after the move"
    s3 = loaded["arrow_s3"]
    assert isinstance(s3.unwrap(), pafs.S3FileSystem)
    assert s3.retry_config == loaded["config"]
    memory = loaded["fsspec_memory"]
    assert isinstance(memory, retryfs.RetryFileSystem) and memory.policy.max_attempts == 6
    memory.pipe("bkt/k", b"1")
    assert memory.cat("bkt/k") == b"1"
    error = loaded["error"]
    assert type(error) is retryfs.CommitNotVisibleError and "ckpt/model.pt" in str(error)


def test_an_old_module_name_warns_with_the_new_one():
    sys.modules.pop("retryfs.policy", None)
    with pytest.warns(DeprecationWarning, match=r"retryfs\.core\.policy"):
        old = importlib.import_module("retryfs.policy")
    assert old.RetryPolicy is retryfs.RetryPolicy

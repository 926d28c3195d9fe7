"""Writes ``pickles-0.1.0.pkl``: wrappers and settings as the 0.1.0 layout pickled them.

Run once from the commit before the package was laid out in subpackages (module paths such as
``retryfs.policy`` and ``retryfs.arrow`` are inside the pickle). tests/core/test_pickles.py
loads it with the current package: a user's pickles (Ray's object store, a saved job) must keep
loading across the move.
"""

import pickle
import sys
from pathlib import Path

import fsspec
import pyarrow.fs as pafs

import retryfs
from retryfs import RateLimit, RetryBudget, RetryPolicy, WrapperConfig


def objects() -> dict:
    s3 = pafs.S3FileSystem(endpoint_override="127.0.0.1:9", region="us-east-1",
                           access_key="k", secret_key="s", scheme="http")
    config = WrapperConfig(policy=RetryPolicy(max_attempts=7, initial_delay=0.25),
                           per_operation={"write": {"max_attempts": 2}},
                           budget=RetryBudget(), rate_limit=RateLimit(mode="on"),
                           timeout={"read": 5.0}, native_attempts=1,
                           retryable_messages=("flaky",), spool_memory=1 << 20)
    return {
        "policy": RetryPolicy(max_attempts=5),
        "config": config,
        "arrow_local": retryfs.RetryingFileSystem(pafs.LocalFileSystem(), RetryPolicy(max_attempts=4)),
        "arrow_s3": retryfs.RetryingFileSystem(s3, config=config),
        "fsspec_memory": fsspec.filesystem("retry", target_protocol="memory",
                                           policy=RetryPolicy(max_attempts=6)),
        "error": retryfs.CommitNotVisibleError("ckpt/model.pt"),
    }


if __name__ == "__main__":
    out = Path(__file__).with_name(f"pickles-{retryfs.__version__}.pkl")
    out.write_bytes(pickle.dumps(objects(), protocol=4))
    print(out, out.stat().st_size, file=sys.stderr)

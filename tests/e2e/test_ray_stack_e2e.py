"""The rest of the Ray stack through retryfs, against the S3 fault endpoint, on two Ray nodes.

One `ray.cluster_utils.Cluster` of two nodes on this machine (1 CPU each) serves the module:

- Ray Data: ``write_parquet(..., filesystem=fs)`` and ``read_parquet(..., filesystem=fs)``
  with 5 % of the table's requests failing (plus two that always do), every row back;
- Ray Train with ``CheckpointUploadMode.ASYNC``: commits that fail in the background upload,
  every reported checkpoint intact;
- TorchTrainer with one worker per node (``STRICT_SPREAD``): each worker's storage filesystem
  is the wrapper Ray unpickled there (same policy, ``client_attempts`` kept), with stats and a
  failed-commit record of its own process; every checkpoint intact under faults on both nodes.
"""

from __future__ import annotations

import json

import pytest
import ray_helpers as h

import retryfs
from retryfs.testing.s3 import S3Fault

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(240)]

pytest.importorskip("ray.train.torch")
pytest.importorskip("ray.data")
pytest.importorskip("torch")

BUCKET = "ray-stack"
POLICY = retryfs.RetryPolicy(max_attempts=20, initial_delay=0.01, multiplier=2, max_delay=0.05,
                             jitter=False)


@pytest.fixture(scope="module")
def cluster():
    import ray

    if ray.is_initialized():  # another module's Ray: this one is a cluster of two nodes
        ray.shutdown()
    with h.two_node_cluster() as two_nodes:
        yield two_nodes


@pytest.fixture
def ep(cluster, s3_fault_endpoint):
    s3_fault_endpoint.create_bucket(BUCKET)
    return s3_fault_endpoint


def wrapped(ep):
    # retryfs the only retry layer, writes included (client_write_attempts=1): the faults below
    # are then retried, and counted, by each worker's own wrapper, not inside the SDK
    return retryfs.RetryingFileSystem(h.native_s3(ep), POLICY, client_attempts=1,
                                      client_write_attempts=1)


def every_rank_intact(ep, result, ranks=(0, 1)):
    """For each reported checkpoint: each rank's model file stored and matching its sha256."""
    found = []
    for checkpoint, metrics in result.best_checkpoints:
        key = checkpoint.path.partition("/")[2]
        for rank in ranks:
            model = ep.get_object(BUCKET, f"{key}/{h.rank_file(rank)}")
            digest = ep.get_object(BUCKET, f"{key}/{h.rank_file(rank)}.sha256").decode()
            found.append(h.sha256(model) == digest)
        found.append(h.sha256(ep.get_object(BUCKET, f"{key}/{h.rank_file(0)}"))
                     == metrics["sha256"])  # what rank 0 reported through Ray
    return found


def test_ray_data_parquet_round_trip_under_faults(ep):
    import ray.data

    fs = wrapped(ep)
    rows = 3000
    table = f"{BUCKET}/data/table"
    ep.add_fault(S3Fault.internal_error(path=f"{table}/*", probability=0.05, seed=5))
    ep.add_fault(S3Fault.internal_error(op="PutObject", path=f"{table}/*", nth=1, times=1))
    ep.add_fault(S3Fault.reset(op="GetObject", path=f"{table}/*", nth=1, times=1))
    ds = ray.data.range(rows, override_num_blocks=6).map_batches(
        lambda batch: {"id": batch["id"], "double": batch["id"] * 2})
    ds.write_parquet(table, filesystem=fs)
    written = [k for k in ep.keys(BUCKET, "data/table/") if k.endswith(".parquet")]
    assert written
    back = ray.data.read_parquet(table, filesystem=fs).take_all()
    assert sorted(r["id"] for r in back) == list(range(rows))  # every row, once
    assert all(r["double"] == 2 * r["id"] for r in back)
    assert len(ep.injected) >= 2, ep.injected  # the faults fired (and were retried)
    assert {r.op for r in ep.injected} & {"PutObject", "GetObject"}


def test_async_checkpoint_upload_under_failed_commits(ep):
    fs = wrapped(ep)
    commit = S3Fault.error_in_200(op="CompleteMultipartUpload",
                                  path=f"{BUCKET}/exp/async/checkpoint_*/model-rank0.pt",
                                  nth=2, times=3)  # the 2nd checkpoint's, 3 times in a row
    ep.add_fault(commit)
    result = h.fit(fs, "async", epochs=2, bucket=BUCKET, **{"async": True})
    assert result.error is None
    assert [m["epoch"] for _, m in result.best_checkpoints] == [0, 1]
    assert all(every_rank_intact(ep, result))
    assert ep.fired(commit) == 3


def test_two_nodes_one_worker_each_wrapper_per_process(ep):
    fs = wrapped(ep)
    plan = [S3Fault.error_in_200(op="CompleteMultipartUpload",
                                 path=f"{BUCKET}/exp/nodes/checkpoint_*/model-rank1.pt",
                                 nth=1, times=2),
            S3Fault.internal_error(op="UploadPart",
                                   path=f"{BUCKET}/exp/nodes/checkpoint_*/model-rank0.pt",
                                   nth=1, times=1)]
    for fault in plan:
        ep.add_fault(fault)
    result = h.fit(fs, "nodes", epochs=2, bucket=BUCKET, loop=h.cluster_train_loop,
                   scaling={"placement_strategy": "STRICT_SPREAD"}, every_rank=True,
                   s3=h.s3_options(ep))
    assert result.error is None
    assert len(result.best_checkpoints) == 2 and all(every_rank_intact(ep, result))
    assert [ep.fired(f) for f in plan] == [2, 1]

    state = {rank: json.loads(ep.get_object(BUCKET, f"workers/rank-{rank}.json"))
             for rank in (0, 1)}
    assert state[0]["node"] != state[1]["node"]  # one worker per node
    for rank in (0, 1):  # each configured from the pickled wrapper
        assert state[rank]["type"] == "RetryingFileSystem"
        assert state[rank]["policy"] == repr(POLICY)
        assert state[rank]["client_attempts"] == 1
        assert state[rank]["failed_commits"] == []  # every commit landed in the end
    # stats are per process: each worker counts its own retries, the driver none of them
    assert state[1]["stats"]["retries"] >= 2 and state[0]["stats"]["retries"] >= 1
    assert state[0]["stats"]["calls"] > 0 and state[1]["stats"]["calls"] > 0
    assert fs.stats.snapshot()["retries"] == 0

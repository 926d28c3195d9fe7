"""Ray Train end to end: TorchTrainer on CPU, checkpoints to S3 through faults.

Real Ray (2 workers, gloo DDP), real torch, the real S3 server (moto behind the fault endpoint,
on loopback in this process; the plan is server-side, so it applies to every Ray worker). The
training function (``ray_helpers.train_loop``) is plain Ray Train: a checkpoint per epoch from
rank 0 (``model.pt``, 12.5 MiB, a two-part multipart upload, plus its sha256). Every scenario
checks that ``fit()`` succeeded, that every reported checkpoint is stored byte-identical (the
endpoint's own copy is hashed against the sha256 the worker reported through Ray) and that a
restore through the filesystem returns the same bytes.

One local Ray (``num_cpus=2``) serves the module. The wrapper is built with ``client_attempts=1``
(what ``from_uri`` does): the inner ``S3FileSystem`` makes one attempt per request on the workers
too, except the requests of write streams (``client_write_attempts``, 3: the SDK re-sends a
failed part alone); retryfs is the only other retry layer below Ray's own, and the request
counts asserted here are exact.
"""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest
import ray_helpers as h
from _helpers import require

import retryfs
from retryfs.testing.s3 import S3Fault

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(180)]

require("ray.train.torch")
require("torch")

BUCKET = "ray-e2e"
MODEL = f"{BUCKET}/exp/*/checkpoint_*/{h.MODEL_FILE}"
CHECKPOINT_FILES = f"{BUCKET}/exp/*/checkpoint_*/*"
# Tiny delays: the workers sleep for real (no_sleep is per process). 20 attempts per operation.
POLICY = retryfs.RetryPolicy(max_attempts=20, initial_delay=0.01, multiplier=2, max_delay=0.05,
                             jitter=False)
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def ray_cluster():
    import ray

    if ray.is_initialized():  # another module's Ray: ours needs the settings of ray_init
        ray.shutdown()
    with h.ray_session():  # nothing of Ray's is left in the temporary directory
        yield


@pytest.fixture
def ep(ray_cluster, s3_fault_endpoint):
    """The session's fault endpoint, reset, with the bucket the runs write to."""
    s3_fault_endpoint.create_bucket(BUCKET)
    return s3_fault_endpoint


def wrapped(ep, **kwargs):
    return retryfs.RetryingFileSystem(h.native_s3(ep), kwargs.pop("policy", POLICY),
                                      client_attempts=kwargs.pop("client_attempts", 1), **kwargs)


def assert_all_intact(ep, outcome, epochs=3):
    """fit() succeeded, one checkpoint per epoch, each stored byte-identical and restorable."""
    assert outcome.ok, outcome.fit
    assert [m["epoch"] for m in outcome.reported] == list(range(epochs))
    assert outcome.intact == [True] * epochs, f"missing: {outcome.missing}"
    for (checkpoint, metrics) in outcome.result.best_checkpoints:
        assert h.restore_hash(checkpoint) == metrics["sha256"]
    assert h.restore_hash(outcome.result.checkpoint) == outcome.reported[-1]["sha256"]


def fired(ep, op):
    return sum(1 for r in ep.injected if r.op == op)


# -- the scenarios -------------------------------------------------------------------------------


def test_failed_parts(ep):
    """Every part upload of model.pt fails once (500 InternalError), the second part twice."""
    ep.add_fault(S3Fault.internal_error(op="UploadPart", path=MODEL, nth=1, times=4))
    ep.add_fault(S3Fault.internal_error(op="UploadPart", path=MODEL, query={"partNumber": 2},
                                        times=2))
    outcome = h.run_and_inspect(ep, wrapped(ep), "failed-parts")
    assert_all_intact(ep, outcome)
    assert fired(ep, "UploadPart") == 6


def test_failed_commits_native_loses_silently_retryfs_does_not(ep):
    """3 failed CompleteMultipartUpload (200 with an <Error> body) on one checkpoint.

    Native S3FileSystem: fit() reports success and a checkpoint has no model.pt (pyarrow's
    copy_files ignores the failed close). retryfs: the commit is retried, all three land.
    """
    plan = dict(path=MODEL, nth=2, times=3)  # the 2nd checkpoint's model.pt
    ep.add_fault(S3Fault.error_in_200(**plan))
    native = h.run_and_inspect(ep, h.native_s3(ep), "commits-native")
    assert native.ok, native.fit  # reported as a success...
    assert len(native.reported) == 3
    assert native.missing == [native.paths[1]]  # ...while checkpoint 2 is not there
    assert native.intact == [True, False, True]

    ep.reset()
    ep.create_bucket(BUCKET)
    ep.add_fault(S3Fault.error_in_200(**plan))
    outcome = h.run_and_inspect(ep, wrapped(ep), "commits-retryfs")
    assert_all_intact(ep, outcome)
    assert fired(ep, "CompleteMultipartUpload") == 3


def test_throttle_storm(ep):
    """12 consecutive 503 SlowDown on one upload (the native filesystem fails the run)."""
    ep.add_fault(S3Fault.slow_down(op="UploadPart", path=MODEL, times=12))
    outcome = h.run_and_inspect(ep, wrapped(ep), "throttle")
    assert_all_intact(ep, outcome)
    assert fired(ep, "UploadPart") == 12


def test_connection_resets(ep):
    """TCP resets on a quarter of all checkpoint and metadata requests, workers and controller."""
    ep.add_fault(S3Fault.reset(
        op=("UploadPart", "CompleteMultipartUpload", "CreateMultipartUpload", "HeadObject",
            "ListObjectsV2"),
        path=f"{BUCKET}/exp*", probability=0.25, seed=4))
    outcome = h.run_and_inspect(ep, wrapped(ep), "resets")
    assert_all_intact(ep, outcome)
    assert len(ep.injected) >= 5


def test_fault_during_restore(ep):
    """Restoring (Result.checkpoint.as_directory) through resets, 500s and a truncated body."""
    outcome = h.run_and_inspect(ep, wrapped(ep), "restore", epochs=2)
    assert_all_intact(ep, outcome, epochs=2)
    want = outcome.reported[-1]["sha256"]
    plan = [S3Fault.reset(op="GetObject", path=MODEL, times=2),
            S3Fault.internal_error(op=("GetObject", "HeadObject"), path=MODEL, nth=1, times=2),
            S3Fault.truncate(op="GetObject", path=MODEL, times=1)]
    for fault in plan:
        ep.add_fault(fault)
    assert h.restore_hash(outcome.result.checkpoint) == want
    assert len(ep.injected) == 5

    # The native filesystem, same faults, same stored checkpoint: the restore raises.
    import ray.train

    ep.reset_record()
    ep.clear_faults()
    for fault in plan:
        ep.add_fault(fault)
    native = ray.train.Checkpoint(outcome.result.checkpoint.path, filesystem=h.native_s3(ep))
    with pytest.raises(OSError):
        h.restore_hash(native)


def test_resumed_run(ep):
    """A run stops after 2 checkpoints; started again with the same name it resumes from the
    last one (the controller reads its checkpoint snapshot, the workers download the
    checkpoint) through faults on every read, and finishes."""
    fs = wrapped(ep)
    first = h.run_and_inspect(ep, fs, "resumed", epochs=2)
    assert_all_intact(ep, first, epochs=2)
    ep.reset_record()
    ep.add_fault(S3Fault.reset(op=("GetObject", "HeadObject", "ListObjectsV2"),
                               path=f"{BUCKET}/exp/resumed*", probability=0.3, seed=2))
    ep.add_fault(S3Fault.internal_error(op="GetObject", path=MODEL, times=2))
    second = h.run_and_inspect(ep, fs, "resumed", epochs=3)
    print("TIMES", first.seconds, second.seconds)
    assert_all_intact(ep, second)
    assert [m["resumed_from"] for m in second.reported] == [0, 0, 2]
    assert second.paths[:2] == first.paths
    assert fired(ep, "GetObject") >= 2


def test_s3fs_inner(ep):
    """fsspec's s3fs as the inner filesystem: failed PutObject, throttling, resets, restore."""
    ep.add_fault(S3Fault.internal_error(op="PutObject", path=MODEL, times=3))
    ep.add_fault(S3Fault.slow_down(op="PutObject", path=CHECKPOINT_FILES, nth=4, times=4))
    ep.add_fault(S3Fault.reset(op="HeadObject", path=f"{BUCKET}/exp*", nth=3, times=2))
    fs = retryfs.RetryingFileSystem(h.s3fs_filesystem(ep), POLICY)
    outcome = h.run_and_inspect(ep, fs, "s3fs")
    assert_all_intact(ep, outcome)
    assert fired(ep, "PutObject") == 7


# -- composing with Ray's own upload retry -------------------------------------------------------


@pytest.mark.parametrize("client_attempts", [1, None], ids=["native-1", "native-default"])
def test_giveup_under_rays_upload_retry(ep, client_attempts):
    """A commit that never succeeds. The layers multiply, exactly: Ray's upload retry (3
    attempts, on "AWS Error ..." texts) x retryfs (max_attempts=2) x the SDK's own attempts per
    request of a write stream: 3 either way (with client_attempts=1, as from_uri builds it, the
    write client keeps client_write_attempts=3 so that a failed part is re-sent alone; without
    it, 3 is the SDK default a pickled S3FileSystem has on a Ray worker). The original
    error, with retryfs's notes, reaches the user through fit(); no checkpoint is reported."""
    from ray.train import WorkerGroupError

    ep.add_fault(S3Fault.error_in_200(path=MODEL))  # every commit of model.pt
    policy = retryfs.RetryPolicy(max_attempts=2, initial_delay=0.01, jitter=False)
    storage = wrapped(ep, policy=policy, client_attempts=client_attempts)
    outcome = h.run_and_inspect(ep, storage, f"giveup-{client_attempts}")
    assert isinstance(outcome.error, WorkerGroupError)
    assert outcome.reported == []
    ray_attempts, sdk = 3, 3
    assert fired(ep, "CompleteMultipartUpload") == ray_attempts * policy.max_attempts * sdk
    assert "AWS Error INTERNAL_FAILURE during CompleteMultipartUpload" in str(outcome.error)
    worker_error = outcome.error.worker_failures[0]
    assert type(worker_error) is OSError
    notes = "\n".join(getattr(worker_error, "__notes__", []))
    # copy_files onto retryfs retries each file as a whole (operation copy_files)
    assert re.search(r"retryfs: copy_files .*model\.pt' gave up after 2 attempt", notes), notes
    assert "copy_files reported success but 1 object(s) were not committed" in notes


def test_deadline_bounds_a_giveup_under_ray(ep):
    """The recommended setting under Ray: a deadline. A commit that never succeeds, with
    max_attempts=100: each of Ray's 3 upload attempts gives up when retryfs's next sleep would
    end past the deadline (at most 1 + deadline / delay close attempts each), not after 100."""
    ep.add_fault(S3Fault.error_in_200(path=MODEL))
    policy = retryfs.RetryPolicy(max_attempts=100, initial_delay=0.2, multiplier=1,
                                 max_delay=0.2, jitter=False, deadline=1.0)
    outcome = h.run_and_inspect(ep, wrapped(ep, policy=policy), "deadline")
    assert outcome.reported == [] and outcome.error is not None
    # the deadline counts the first commit's own time too: on a loaded machine a slow first
    # commit may leave no room for a second one within the 1 s; each close attempt is up to 3
    # CompleteMultipartUpload (client_write_attempts)
    assert 3 <= fired(ep, "CompleteMultipartUpload") <= 3 * (1 + 5) * 3
    notes = "\n".join(getattr(outcome.error.worker_failures[0], "__notes__", []))
    assert "(deadline reached)" in notes, notes


# -- the examples --------------------------------------------------------------------------------


def load_example(name):
    import ray.cloudpickle

    spec = importlib.util.spec_from_file_location(name, EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    ray.cloudpickle.register_pickle_by_value(module)  # the workers cannot import examples/
    return module


@pytest.mark.parametrize("name", ["ray_train_torch", "ray_train_lightning"])
def test_example_runs_against_the_fault_endpoint(ray_cluster, name, capsys):
    """The examples as CI runs them: their own embedded fault endpoint, retry_* in the URI."""
    if name == "ray_train_lightning":
        require("lightning")
    example = load_example(name)
    result = example.main([
        "--fault-endpoint", "--epochs", "2",
        "s3://ray-example/experiments?retry_max_attempts=20&retry_initial_delay=0.01"
        "&retry_max_delay=0.05"])
    assert result.error is None
    out = capsys.readouterr().out
    assert "checkpoints intact: 2/2" in out, out
    assert re.search(r"faults the endpoint injected: [1-9]", out), out

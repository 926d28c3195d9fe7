"""The wrapper as an object: pickling, equality, fsspec inner filesystems, bad arguments."""

import multiprocessing
import pickle

import fsspec
import pyarrow.fs as pafs
import pytest
from _helpers import FAST, sha256

try:
    from ray import cloudpickle  # what Ray uses to ship the filesystem to workers
except ImportError:  # make test-fast installs no Ray: the same library, not vendored
    import cloudpickle

from retryfs import ErrorClassifier, RetryingFileSystem, RetryPolicy


def _configured(inner=None):
    return RetryingFileSystem(
        inner if inner is not None else pafs.LocalFileSystem(),
        RetryPolicy(max_attempts=7, initial_delay=0.25, max_delay=9, deadline=60),
        retryable_messages=["flaky"],
        per_operation={"write": {"max_attempts": 12}},
    )


@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps], ids=["pickle", "cloudpickle"])
def test_round_trip_keeps_type_policy_classifier_and_inner(dumps):
    fs = _configured(pafs.S3FileSystem(region="eu-west-3", anonymous=True))
    fs.stats.record_success("get_file_info", 1)
    copy = pickle.loads(dumps(fs))
    assert type(copy) is RetryingFileSystem
    assert copy.policy == fs.policy and copy.policy.max_attempts == 7
    assert copy.classifier == ErrorClassifier(retryable_messages=["flaky"])
    assert copy.retry_handler.policy_for("write").max_attempts == 12
    assert isinstance(copy.unwrap(), pafs.S3FileSystem)
    assert copy.unwrap().region == "eu-west-3"
    assert copy == fs
    assert copy.stats.snapshot()["calls"] == 0  # stats are per process, not configuration


def test_equality_follows_configuration():
    assert _configured() == _configured()
    assert hash(_configured().retry_handler) == hash(_configured().retry_handler)
    assert _configured() != RetryingFileSystem(pafs.LocalFileSystem(), FAST)
    assert _configured() != _configured(pafs._MockFileSystem())


def test_pyarrow_pickling_of_the_handler_alone_keeps_it():
    # PyFileSystem.__reduce__ would rebuild a plain PyFileSystem around the handler
    handler = _configured().retry_handler
    assert pickle.loads(pickle.dumps(handler)) == handler


def test_attributes_of_the_inner_filesystem_are_reachable():
    fs = RetryingFileSystem(pafs.S3FileSystem(region="ap-south-1", anonymous=True))
    assert fs.region == "ap-south-1"
    assert fs.type_name == "py::retry::s3"
    with pytest.raises(AttributeError):
        fs.no_such_attribute  # noqa: B018


@pytest.mark.parametrize("protocol", ["memory", "file"])
def test_fsspec_filesystems_work_on_the_pyarrow_face(protocol, tmp_path):
    inner = fsspec.filesystem(protocol)
    fs = RetryingFileSystem(inner, FAST)
    root = f"/retryfs-test-{tmp_path.name}" if protocol == "memory" else str(tmp_path)
    fs.create_dir(f"{root}/dir")
    data = b"payload" * 1000
    with fs.open_output_stream(f"{root}/dir/a.bin") as out:
        out.write(data)
    assert fs.get_file_info(f"{root}/dir/a.bin").size == len(data)
    with fs.open_input_file(f"{root}/dir/a.bin") as f:
        assert sha256(f.read()) == sha256(data)
    infos = fs.get_file_info(pafs.FileSelector(root, recursive=True))
    assert sorted(i.base_name for i in infos) == ["a.bin", "dir"]
    fs.delete_dir(f"{root}/dir")
    assert fs.get_file_info(f"{root}/dir").type == pafs.FileType.NotFound
    assert fs.unwrap() is inner


@pytest.mark.parametrize(("kwargs", "error", "name"), [
    ({"policy": {"max_attempts": 3}}, TypeError, "policy"),
    ({"classifier": "strict"}, TypeError, "classifier"),
    ({"retryable_messages": "AWS Error"}, TypeError, "retryable_messages"),
    ({"per_operation": {"upload": {"max_attempts": 3}}}, ValueError, "upload"),
    ({"spool_memory": -1}, ValueError, "spool_memory"),
])
def test_bad_arguments_are_named(kwargs, error, name):
    kwargs = dict(kwargs)  # the parameter is shared by every run in this process: no pop on it
    policy = kwargs.pop("policy", None)
    with pytest.raises(error, match=name):
        RetryingFileSystem(pafs.LocalFileSystem(), policy, **kwargs)


def test_wrapping_something_else_is_a_type_error():
    with pytest.raises(TypeError, match="pyarrow.fs.FileSystem or an fsspec"):
        RetryingFileSystem("s3://bucket")


def _child_writes(fs_bytes, path, queue):
    fs = pickle.loads(fs_bytes)
    with fs.open_output_stream(path) as out:
        out.write(b"from a child process")
    queue.put((type(fs).__name__, fs.policy.max_attempts, fs.stats.snapshot()["calls"]))


def test_a_pickled_wrapper_works_in_another_process(tmp_path):
    fs = _configured()
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    path = str(tmp_path / "child.txt")
    proc = ctx.Process(target=_child_writes, args=(cloudpickle.dumps(fs), path, queue))
    proc.start()
    result = queue.get(timeout=60)
    proc.join(timeout=60)
    assert result == ("RetryingFileSystem", 7, 4)  # open, write, close, verify in the child
    assert (tmp_path / "child.txt").read_bytes() == b"from a child process"
    assert fs.stats.snapshot()["calls"] == 0  # the parent's counters are its own


def test_wrapping_the_fsspec_retry_face_does_not_double_the_retries():
    from retryfs import RetryFileSystem

    memory = fsspec.filesystem("memory")
    face = RetryFileSystem(fs=memory, max_attempts=3, initial_delay=0.001, jitter=False)
    fs = RetryingFileSystem(face)
    assert fs.unwrap() is memory
    assert fs.policy.max_attempts == 3
    assert RetryingFileSystem(face, FAST).policy == FAST

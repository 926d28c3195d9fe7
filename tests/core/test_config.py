"""One settings value: `WrapperConfig`, its merge, its checks, and both faces handing it on whole."""

import math
import pickle

import cloudpickle
import fsspec
import pyarrow.fs as pafs
import pytest
from _helpers import FAST
from hypothesis import given
from hypothesis import strategies as st

import retryfs
from retryfs import (
    ErrorClassifier,
    RateLimit,
    RetryBudget,
    RetryFileSystem,
    RetryingFileSystem,
    RetryPolicy,
    RetryStats,
    WrapperConfig,
)
from retryfs.config import OPTIONS
from retryfs.core.engine import Retrier
from retryfs.testing import FaultyFileSystem, S3Fault

pytestmark = pytest.mark.usefixtures("clean_retryfs_env")

# A setting of every option that differs from its default.
EVERY_OPTION = dict(
    policy=RetryPolicy(max_attempts=5, initial_delay=0.001, max_delay=0.002, jitter=False),
    per_operation={"write": RetryPolicy(max_attempts=9, initial_delay=0.001, max_delay=0.002)},
    classifier=ErrorClassifier(permanent_messages=("never again",)),
    retryable_messages=("flaky backend",),
    verify_writes=False,
    spool_memory=1024,
    budget=RetryBudget(capacity=40),
    rate_limit=RateLimit(mode="on", throttles=5),
    timeout={"metadata": 7.0},
    client_attempts=2,
    client_write_attempts=4,
    one_part_client="auto",
    file_client="auto",
    write_timeout=5.0,
    min_throughput=1000.0,
)


def every_option_config():
    return WrapperConfig(**EVERY_OPTION)


# -- drift bug 3: one list of options, carried whole by every face and every conversion ------

def test_every_option_is_a_field_and_a_keyword_of_both_faces(tmp_path):
    assert set(EVERY_OPTION) | {"stats"} == set(OPTIONS)
    config = every_option_config()
    stats = RetryStats()
    arrow = RetryingFileSystem(pafs.LocalFileSystem(), stats=stats, **EVERY_OPTION)
    assert arrow.retry_config == config and arrow.stats is stats
    face = RetryFileSystem(fs=fsspec.filesystem("memory"), stats=stats, skip_instance_cache=True,
                           **EVERY_OPTION)
    assert face.retry_config == config and face.stats is stats
    uri_fs, _ = retryfs.from_uri(str(tmp_path), **EVERY_OPTION)
    assert uri_fs.retry_config == config
    uri_fs, _ = retryfs.from_uri(str(tmp_path), config=config)
    assert uri_fs.retry_config == config


def test_converting_between_faces_and_pickling_keep_every_option():
    config = every_option_config()
    arrow = RetryingFileSystem(pafs.LocalFileSystem(), config=config)
    face = RetryFileSystem.from_arrow(arrow, skip_instance_cache=True)
    assert face.retry_config == config and face.stats is arrow.stats
    back = face.to_arrow()
    assert back.retry_config == config and back.stats is arrow.stats
    # the attributes each face had before tell the same story
    assert back.retry_handler.client_attempts == 2 and face.client_attempts == 2
    assert back.retry_handler.verify_writes is False and back.retry_handler.spool_memory == 1024
    assert back.classifier.retryable_messages == ("flaky backend",)
    for clone in (pickle.loads(pickle.dumps(arrow)), cloudpickle.loads(cloudpickle.dumps(face))):
        assert clone.retry_config == config
        assert clone.stats is not arrow.stats  # counters are per process


def test_pickled_fsspec_face_does_not_reread_the_environment(monkeypatch):
    face = RetryFileSystem(fs=fsspec.filesystem("memory"), max_attempts=3,
                           skip_instance_cache=True)
    monkeypatch.setenv("RETRYFS_VERIFY_WRITES", "false")  # a worker's environment
    clone = pickle.loads(pickle.dumps(face))
    assert clone.retry_config == face.retry_config and clone.verify_writes is True


def test_config_equality_hash_pickle_and_replace():
    config = every_option_config()
    assert config == every_option_config() and hash(config) == hash(every_option_config())
    with_stats = config.replace(stats=RetryStats())
    assert with_stats == config  # stats are state, not configuration
    clone = pickle.loads(pickle.dumps(with_stats))
    assert clone == config and clone.stats is None
    assert config.replace(spool_memory="2KiB").spool_memory == 2048
    assert config.policy_for("pipe_file").max_attempts == 9  # fsspec name, write group
    assert config.policy_for("open_output_stream").max_attempts == 9  # pyarrow name
    assert config.policy_for("info").max_attempts == 5
    with pytest.raises(TypeError, match="did you mean 'verify_writes'"):
        config.replace(verify_write=True)


# -- drift bug 1: the fsspec face ignored client_attempts --------------------------------------

def _head_requests(endpoint, fs, bucket):
    endpoint.reset_record()
    endpoint.add_fault(S3Fault.internal_error(op="HeadObject"))  # every HeadObject fails
    with pytest.raises(OSError, match="HTTP status 500"):
        fs.info(f"{bucket}/key")
    endpoint.clear_faults()
    return len(endpoint.requests(op="HeadObject"))


@pytest.mark.parametrize("dumps", [None, pickle.dumps, cloudpickle.dumps],
                         ids=["local", "pickle", "cloudpickle"])
def test_fsspec_face_honours_client_attempts(s3_fault_endpoint, s3_fault_bucket, dumps):
    policy = RetryPolicy(max_attempts=2, initial_delay=0.001, max_delay=0.002, jitter=False)
    fs = RetryFileSystem(fs=s3_fault_endpoint.pyarrow_fs(max_attempts=3), policy=policy,
                         budget=False, client_attempts=1, skip_instance_cache=True)
    if dumps is not None:
        fs = pickle.loads(dumps(fs))
    assert fs.client_attempts == 1
    # two retryfs attempts, one request each (the SDK's three attempts would make six)
    assert _head_requests(s3_fault_endpoint, fs, s3_fault_bucket) == 2


# -- drift bug 2: retryfs.copy dropped the settings of the fsspec face it was given ----------

def test_copy_keeps_every_setting_of_an_fsspec_face(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f.bin").write_bytes(b"x" * 100)
    faulty = FaultyFileSystem(pafs.LocalFileSystem())
    face = RetryFileSystem(fs=faulty, skip_instance_cache=True,
                           **{**EVERY_OPTION, "client_attempts": None})
    from retryfs.transfer.copier import _wrap

    wrapped, _, _ = _wrap((face, str(tmp_path / "src")), None, None, "src")
    assert wrapped.retry_config == face.retry_config  # classifier, budget, timeouts...
    # behaviour: only the face's retryable_messages make this error transient
    fault = faulty.inject("get_file_info", RuntimeError("flaky backend"), times=1)
    result = retryfs.copy((face, str(tmp_path / "src")), str(tmp_path / "dst"), recursive=True)
    assert fault.fired == 1 and result.ok and len(result.copied) == 1
    assert (tmp_path / "dst" / "f.bin").read_bytes() == b"x" * 100


def test_copy_takes_a_config_for_the_locations_it_wraps(tmp_path):
    (tmp_path / "f.bin").write_bytes(b"y" * 10)
    faulty = FaultyFileSystem(pafs.LocalFileSystem())
    fault = faulty.inject("open_input_stream", RuntimeError("flaky backend"), times=1)
    config = WrapperConfig(policy=FAST, retryable_messages=("flaky backend",))
    result = retryfs.copy((faulty, str(tmp_path / "f.bin")), str(tmp_path / "g.bin"),
                          config=config)
    assert fault.fired == 1 and result.ok
    assert (tmp_path / "g.bin").read_bytes() == b"y" * 10


# -- the layered merge --------------------------------------------------------------------------

def test_layers_defaults_environment_code_url(monkeypatch, tmp_path):
    monkeypatch.setenv("RETRYFS_MAX_ATTEMPTS", "6")
    monkeypatch.setenv("RETRYFS_SPOOL_MEMORY", "1KiB")
    monkeypatch.setenv("RETRYFS_RETRYABLE_MESSAGES", "from env")
    fs, _ = retryfs.from_uri(f"{tmp_path}")
    assert fs.policy.max_attempts == 6 and fs.retry_config.spool_memory == 1024
    assert fs.retry_config.client_attempts == 1  # from_uri's own default
    fs, _ = retryfs.from_uri(f"file://{tmp_path}?retry_spool_memory=2KiB&"
                             "retry_retryable_messages=from%20url",
                             spool_memory=4096, retryable_messages=["from code"])
    assert fs.retry_config.spool_memory == 2048  # URL beats code beats environment
    assert fs.retry_config.retryable_messages == ("from env", "from code", "from url")
    # the pyarrow constructor is code only: the environment does not reach it
    assert RetryingFileSystem(pafs.LocalFileSystem()).policy.max_attempts == 10


# -- defect 2 of issue 12: numbers at the edges -------------------------------------------------

@pytest.mark.parametrize("fields, named", [
    ({"max_attempts": 10**19}, "max_attempts"),
    ({"initial_delay": 10**19, "max_delay": 10**19}, "initial_delay"),
    ({"initial_delay": 10**19}, "initial_delay"),
    ({"initial_delay": 1e12, "max_delay": 1e12}, "initial_delay"),
    ({"max_delay": 1e300}, "max_delay"),
    ({"multiplier": 10**400}, "multiplier"),
    ({"deadline": 1e300}, "deadline"),
    ({"throttle_delay": 1e6}, "throttle_delay"),
    ({"throttle_delay": -1}, "throttle_delay"),
    ({"max_attempts": 0}, "max_attempts"),
    ({"initial_delay": math.nan}, "initial_delay"),
    ({"max_delay": math.inf}, "max_delay"),
])
def test_every_policy_field_has_a_range_checked_at_construction(fields, named):
    with pytest.raises(ValueError, match=rf"RetryPolicy\.{named} must be .* in [\[(]") as info:
        RetryPolicy(**fields)
    assert "]" in str(info.value)  # the range, with its upper bound


@pytest.mark.parametrize("query, named", [
    ("retry_max_attempts=10000000000000000000", "retry_max_attempts"),
    ("retry_initial_delay=1e12&retry_max_delay=1e12", "retry_initial_delay"),
    ("retry_write_max_delay=1e400", "retry_write_max_delay"),
    ("retry_client_attempts=10000000000000000000", "retry_client_attempts"),
])
def test_huge_numbers_in_a_url_are_value_errors_naming_the_parameter(query, named, tmp_path):
    with pytest.raises(ValueError, match=named):
        retryfs.from_uri(f"file://{tmp_path}?{query}")


@given(max_attempts=st.integers(1, 10**6), initial_delay=st.floats(0, 86_400),
       multiplier=st.floats(1, 100), extra=st.floats(0, 86_400),
       throttle_delay=st.floats(0, 86_400), retry=st.integers(1, 10**6),
       throttled=st.booleans())
def test_the_schedule_never_overflows(max_attempts, initial_delay, multiplier, extra,
                                      throttle_delay, retry, throttled):
    max_delay = min(86_400.0, initial_delay + extra)
    policy = RetryPolicy(max_attempts=max_attempts, initial_delay=initial_delay,
                         multiplier=multiplier, max_delay=max_delay, jitter=False,
                         throttle_delay=throttle_delay)
    delay = policy.delay(retry, throttled=throttled)
    assert math.isfinite(delay) and 0 <= delay <= max_delay


def test_a_failing_wait_never_hides_the_original_error():
    original = ConnectionResetError("reset by peer")
    calls = []

    def fail():
        calls.append(1)
        raise original

    def broken_sleep(seconds):
        raise OverflowError("timestamp out of range for platform time_t")

    stats = RetryStats()
    retrier = Retrier(lambda op: FAST, ErrorClassifier(), stats, sleep=broken_sleep)
    with pytest.raises(ConnectionResetError) as info:
        retrier.call("get_file_info", "bucket/key", fail)
    assert info.value is original and len(calls) == 1
    assert any("wait before the next attempt failed (OverflowError" in note
               for note in info.value.__notes__)
    snapshot = stats.snapshot()
    assert snapshot["calls"] == 1 and snapshot["attempts"] == 1 and snapshot["giveups"] == 1


# -- defect 3 of issue 12: parsing that accepted nonsense --------------------------------------

@pytest.mark.parametrize("text, value", [("false", False), ("FALSE", False), ("0", False),
                                         ("No", False), ("true", True), ("1", True),
                                         ("YES", True)])
def test_booleans_parse_exactly(text, value, tmp_path):
    assert RetryingFileSystem(pafs.LocalFileSystem(),
                              verify_writes=text).retry_handler.verify_writes is value
    fs, _ = retryfs.from_uri(f"file://{tmp_path}?retry_verify_writes={text}")
    assert fs.retry_handler.verify_writes is value
    fs, _ = retryfs.from_uri(f"file://{tmp_path}?retry_jitter={text}")
    assert fs.policy.jitter is value


@pytest.mark.parametrize("text", ["x", "on", "off", "", "2", "truee", "nope"])
def test_anything_else_is_a_value_error_naming_the_option(text, tmp_path):
    with pytest.raises(ValueError, match="verify_writes"):
        RetryingFileSystem(pafs.LocalFileSystem(), verify_writes=text)
    with pytest.raises(ValueError, match="retry_budget"):
        retryfs.from_uri(f"file://{tmp_path}?retry_budget={text}")
    with pytest.raises(ValueError, match="jitter"):
        RetryFileSystem(fs=fsspec.filesystem("memory"), jitter=text, skip_instance_cache=True)


@pytest.mark.parametrize("option, value", [
    ("stats", "x"), ("classifier", "x"), ("policy", {"max_attempts": 3}), ("budget", 3),
    ("timeout", "soon"), ("retryable_messages", "one text"), ("per_operation", ["write"]),
    ("verify_writes", 1), ("spool_memory", 1.5), ("client_attempts", 3.0),
    ("client_attempts", True),
])
def test_a_wrong_type_is_a_type_error_at_construction(option, value):
    with pytest.raises(TypeError, match=option):
        RetryingFileSystem(pafs.LocalFileSystem(), **{option: value})
    with pytest.raises(TypeError, match=option):
        WrapperConfig(**{option: value})


def test_stats_of_a_wrong_type_fails_at_construction_on_the_fsspec_face():
    with pytest.raises(TypeError, match="stats"):
        RetryFileSystem(fs=fsspec.filesystem("memory"), stats="x", skip_instance_cache=True)


@pytest.mark.parametrize("name, suggested", [
    ("Retry_Max_Attempts", "retry_max_attempts"),
    ("RETRY_MAX_DELAY", "retry_max_delay"),
    ("retry-max-attempts", "retry_max_attempts"),
    ("retry_max_attempt", "retry_max_attempts"),
    ("retry_verify_write", "retry_verify_writes"),
    ("rety_max_attempts", "retry_max_attempts"),
])
def test_a_retry_parameter_in_another_case_or_misspelt_is_an_error(name, suggested, tmp_path):
    with pytest.raises(ValueError) as info:
        retryfs.from_uri(f"s3://bucket/key?{name}=3&region=us-east-1")
    assert repr(suggested) in str(info.value) and repr(name) in str(info.value)


def test_backend_parameters_still_pass_through():
    fs, path = retryfs.from_uri("gs://bucket/key?retry_limit_seconds=5")
    assert path == "bucket/key"  # pyarrow's GCS took its own retry_limit_seconds


def test_a_misspelt_protocol_option_suggests_the_right_one():
    with pytest.raises(ValueError, match="did you mean 'max_attempts'"):
        RetryFileSystem(fs=fsspec.filesystem("memory"), Max_Attempts=3,
                        skip_instance_cache=True)
    with pytest.raises(TypeError, match="did you mean 'verify_writes'"):
        RetryingFileSystem(pafs.LocalFileSystem(), verify_write=False)


def test_the_command_hands_its_config_to_every_wrapper(tmp_path):
    from retryfs.cli import main

    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "f.bin").write_bytes(b"z" * 10)
    stats = RetryStats()
    config = WrapperConfig(policy=FAST, stats=stats)
    assert main(["ls", str(tmp_path / "src")], config=config) == 0
    listed = stats.snapshot()["calls"]
    assert listed >= 1  # the listing went through the given config's wrapper
    assert main(["cp", "-q", str(tmp_path / "src" / "f.bin"), str(tmp_path / "g.bin")],
                config=config) == 0
    assert stats.snapshot()["calls"] > listed and (tmp_path / "g.bin").read_bytes() == b"z" * 10

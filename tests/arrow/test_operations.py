"""Each pyarrow FileSystemHandler operation is retried on transient errors and fails fast,
unchanged, on permanent ones (attempts counted on both sides of the wrapper)."""

import pyarrow.fs as pafs
import pytest
from _helpers import FAST

from retryfs import RetryingFileSystem, RetryPolicy
from retryfs.testing import FaultyFileSystem, errors


@pytest.fixture
def faulty():
    mock = pafs._MockFileSystem()
    mock.create_dir("d/sub")
    for name in ("d/f", "d/sub/g"):
        with mock.open_output_stream(name) as out:
            out.write(b"hello world")
    return FaultyFileSystem(mock)


def _read_all(fs, op):
    with getattr(fs, op)("d/f") as f:
        return f.read()


# operation name -> what a caller does on the pyarrow face
OPERATIONS = {
    "get_file_info": lambda fs: fs.get_file_info("d/f"),
    "get_file_info_selector": lambda fs: fs.get_file_info(pafs.FileSelector("d", recursive=True)),
    "create_dir": lambda fs: fs.create_dir("new/dir"),
    "delete_dir": lambda fs: fs.delete_dir("d/sub"),
    "delete_dir_contents": lambda fs: fs.delete_dir_contents("d"),
    "delete_root_dir_contents": lambda fs: fs.delete_dir_contents("/", accept_root_dir=True),
    "delete_file": lambda fs: fs.delete_file("d/f"),
    "move": lambda fs: fs.move("d/f", "d/moved"),
    "copy_file": lambda fs: fs.copy_file("d/f", "d/copy"),
    "open_input_stream": lambda fs: _read_all(fs, "open_input_stream"),
    "open_input_file": lambda fs: _read_all(fs, "open_input_file"),
    "open_output_stream": lambda fs: fs.open_output_stream("d/out").close(),
    "open_append_stream": lambda fs: fs.open_append_stream("d/f").close(),
    "normalize_path": lambda fs: fs.normalize_path("d/f"),
}


def test_every_handler_method_is_covered():
    handler_methods = {name for name in dir(pafs.FileSystemHandler) if not name.startswith("_")}
    assert handler_methods - set(OPERATIONS) == {"get_type_name"}  # no I/O, nothing to retry
    assert len(handler_methods) == 15


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_transient_errors_are_retried(faulty, operation):
    fs = RetryingFileSystem(faulty, FAST)
    faulty.inject(operation, errors.network(), times=2)
    OPERATIONS[operation](fs)
    assert faulty.injected[operation] == 2
    assert faulty.calls[operation] == 3
    by_op = fs.stats.snapshot()["by_operation"][operation]
    assert (by_op["calls"], by_op["attempts"], by_op["retries"], by_op["giveups"]) == (1, 3, 2, 0)


@pytest.mark.parametrize("operation", sorted(OPERATIONS))
def test_permanent_errors_fail_fast_unchanged(faulty, operation):
    fs = RetryingFileSystem(faulty, FAST)
    faulty.inject(operation, errors.access_denied(), times=None)
    with pytest.raises(OSError) as info:
        OPERATIONS[operation](fs)
    assert type(info.value) is OSError
    assert str(info.value) == "AWS Error ACCESS_DENIED during PutObject operation: Access Denied"
    assert faulty.calls[operation] == 1
    assert fs.stats.snapshot()["by_operation"][operation]["attempts"] == 1


def test_not_found_is_raised_after_one_attempt_with_its_type(faulty):
    fs = RetryingFileSystem(faulty, FAST)
    with pytest.raises(FileNotFoundError):
        fs.open_input_stream("d/missing")
    assert faulty.calls["open_input_stream"] == 1


def test_exhaustion_raises_the_last_original_error_with_a_note(faulty):
    fs = RetryingFileSystem(faulty, FAST)
    faulty.inject("get_file_info", errors.unavailable(), times=None)
    with pytest.raises(OSError, match=r"HTTP status 503") as info:
        fs.get_file_info("d/f")
    assert faulty.calls["get_file_info"] == FAST.max_attempts
    assert any("gave up after 4 attempt(s)" in note for note in info.value.__notes__)
    snap = fs.stats.snapshot()
    assert (snap["attempts"], snap["retries"], snap["giveups"]) == (4, 3, 1)


def test_deadline_bounds_total_time_and_never_sleeps_past_it(faulty):
    policy = RetryPolicy(max_attempts=100, initial_delay=0.05, multiplier=1, max_delay=0.05,
                         jitter=False, deadline=0.12)
    fs = RetryingFileSystem(faulty, policy)
    now = [0.0]  # an injected clock: the attempts take no time, the sleeps advance it
    retrier = fs.retry_handler.retrier
    retrier.clock = lambda: now[0]
    retrier.sleep = lambda seconds: now.__setitem__(0, now[0] + seconds)
    faulty.inject("get_file_info", errors.network(), times=None)
    with pytest.raises(OSError) as info:
        fs.get_file_info("d/f")
    assert faulty.calls["get_file_info"] == 3  # sleeps at 0.05, 0.10; a third would end at 0.15
    assert now[0] == pytest.approx(0.10)
    assert any("deadline reached" in note for note in info.value.__notes__)


def test_throttling_uses_the_longer_schedule(faulty):
    slept = []
    fs = RetryingFileSystem(faulty, RetryPolicy(max_attempts=4, initial_delay=0.001,
                                                max_delay=1, jitter=False, throttle_delay=0.008))
    fs.retry_handler.retrier.sleep = slept.append
    faulty.inject("get_file_info", errors.throttle(), times=3)
    fs.get_file_info("d/f")
    # a request's first two throttles are isolated (the transient 0.001, 0.002); its third is
    # not (the throttle schedule at a third retry, 0.008 * 2 ** 2)
    assert slept == [0.001, 0.002, 0.032]
    assert faulty.calls["get_file_info"] == 4


def test_per_operation_policy_overrides_the_group(faulty):
    fs = RetryingFileSystem(faulty, FAST, per_operation={"metadata": {"max_attempts": 2},
                                                         "delete_file": {"max_attempts": 6}})
    faulty.inject("get_file_info", errors.network(), times=None)
    faulty.inject("delete_file", errors.network(), times=5)
    with pytest.raises(OSError):
        fs.get_file_info("d/f")
    assert faulty.calls["get_file_info"] == 2
    fs.delete_file("d/f")
    assert faulty.calls["delete_file"] == 6


def test_retried_delete_that_finds_nothing_is_success(faulty):
    fs = RetryingFileSystem(faulty, FAST)
    # the first attempt deletes, then its answer is lost: the retry finds nothing
    faulty.inject("delete_file", ConnectionResetError("reset after the delete was applied"),
                  applied=True)
    fs.delete_file("d/f")
    assert faulty.injected["delete_file"] == 1
    assert fs.get_file_info("d/f").type == pafs.FileType.NotFound
    assert fs.stats.snapshot()["by_operation"]["delete_file"]["attempts"] == 2


def test_retried_move_whose_source_is_gone_and_destination_present_is_success(faulty):
    fs = RetryingFileSystem(faulty, FAST)
    faulty.inject("move", ConnectionResetError("reset after the move was applied"),
                  applied=True)
    fs.move("d/f", "d/moved")
    assert faulty.injected["move"] == 1
    assert fs.get_file_info("d/moved").type == pafs.FileType.File
    assert fs.stats.snapshot()["by_operation"]["move"]["attempts"] == 2


def test_unknown_errors_are_not_retried(faulty):
    fs = RetryingFileSystem(faulty, FAST)
    faulty.inject("get_file_info", RuntimeError("a bug, not an outage"), times=None)
    with pytest.raises(RuntimeError, match="a bug"):
        fs.get_file_info("d/f")
    assert faulty.calls["get_file_info"] == 1

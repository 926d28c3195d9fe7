"""README promises that had no test able to fail: each test here breaks when its promise does.

- a permanent error is raised after one attempt, unchanged: same object, no retry note;
- on give-up the *last* original exception is raised (each attempt fails differently here);
- appends are not replayable, on both faces: only the open is retried;
- the default retry budget has the documented numbers;
- per-attempt timeouts still apply in test mode (``no_sleep``);
- values of secret options given to ``from_uri(storage_options=...)`` are registered;
- inside an fsspec ``transaction`` the commit is retried, not replayed.
"""

from __future__ import annotations

import email.utils

import fsspec
import pyarrow.fs as pafs
import pytest
from _helpers import FAST

import retryfs
from retryfs import RetryBudget, RetryingFileSystem
from retryfs.core.engine import _parse_retry_after
from retryfs.testing import FaultyFileSystem, errors
from retryfs.uri import redact


class _Made:
    """An error factory that remembers every exception it made (to check identity)."""

    def __init__(self, factory):
        self.factory, self.made = factory, []

    def __call__(self) -> BaseException:
        error = self.factory()
        self.made.append(error)
        return error


# -- permanent errors: one attempt, unchanged ------------------------------------------------------

@pytest.mark.parametrize("factory", [errors.access_denied(), errors.not_found("d/f"),
                                     lambda: PermissionError(13, "Permission denied")])
def test_a_permanent_error_is_the_very_exception_with_no_retry_note(tmp_path, factory):
    faulty = FaultyFileSystem(pafs.LocalFileSystem())
    made = _Made(factory)
    faulty.inject("get_file_info", made, times=None)
    fs = RetryingFileSystem(faulty, FAST)
    with pytest.raises(OSError) as raised:
        fs.get_file_info(str(tmp_path / "f"))
    assert faulty.injected["get_file_info"] == 1  # one attempt
    assert raised.value is made.made[0]  # the backend's own exception object
    assert getattr(raised.value, "__notes__", []) == []  # nothing added: unchanged
    snap = fs.stats.snapshot()
    assert (snap["attempts"], snap["retries"], snap["giveups"]) == (1, 0, 0)


def test_a_permanent_error_on_the_fsspec_face_is_unchanged():
    memory = fsspec.filesystem("memory", skip_instance_cache=True)
    fs = retryfs.RetryFileSystem(fs=memory, policy=FAST, skip_instance_cache=True)
    with pytest.raises(FileNotFoundError) as raised:
        fs.info("/nothing/here")
    assert getattr(raised.value, "__notes__", []) == []
    assert fs.stats.snapshot()["attempts"] == 1


# -- give-up: the last original exception ----------------------------------------------------------

def test_give_up_raises_the_last_attempts_exception_with_its_type(tmp_path):
    faulty = FaultyFileSystem(pafs.LocalFileSystem())
    kinds = [errors.network("HeadObject"), errors.unavailable(), errors.throttle("HeadObject"),
             errors.reset()]  # four attempts, four different transient errors
    made = [_Made(kind) for kind in kinds]
    for factory in made:
        faulty.inject("get_file_info", factory, times=1)
    fs = RetryingFileSystem(faulty, FAST)  # max_attempts=4
    with pytest.raises(OSError) as raised:
        fs.get_file_info(str(tmp_path / "f"))
    assert [len(m.made) for m in made] == [1, 1, 1, 1]  # every fault fired, in order
    assert raised.value is made[-1].made[0]  # the last one, not the first
    assert type(raised.value) is ConnectionResetError
    assert [note for note in raised.value.__notes__ if "gave up after 4 attempt(s)" in note]
    for earlier in made[:-1]:  # the earlier errors got no give-up note
        assert getattr(earlier.made[0], "__notes__", []) == []


def test_give_up_on_the_deadline_raises_the_last_exception_too(tmp_path):
    faulty = FaultyFileSystem(pafs.LocalFileSystem())
    first, second = _Made(errors.network("HeadObject")), _Made(errors.reset())
    faulty.inject("get_file_info", first, times=1)
    faulty.inject("get_file_info", second, times=None)
    fs = RetryingFileSystem(faulty, FAST.replace(max_attempts=50, deadline=0.5))
    now = [0.0]
    fs.retry_handler.retrier.clock = lambda: now[0]
    fs.retry_handler.retrier.sleep = lambda seconds: now.__setitem__(0, now[0] + 0.2)
    with pytest.raises(ConnectionResetError) as raised:
        fs.get_file_info(str(tmp_path / "f"))
    assert raised.value is second.made[-1]
    assert any("deadline reached" in note for note in raised.value.__notes__)


# -- appends: only the open is retried -------------------------------------------------------------

def test_an_append_that_fails_mid_stream_is_raised_not_replayed(tmp_path):
    path = tmp_path / "log.txt"
    path.write_bytes(b"start;")
    faulty = FaultyFileSystem(pafs.LocalFileSystem())
    fs = RetryingFileSystem(faulty, FAST)
    faulty.inject("open_append_stream", errors.network(), times=1)  # the open: retried
    faulty.inject("write", errors.network(), skip=1, times=1)  # the 2nd write: raised
    with pytest.raises(OSError, match="NETWORK_CONNECTION"):
        with fs.open_append_stream(str(path)) as out:
            out.write(b"one;")
            out.write(b"two;")
    assert (faulty.injected["open_append_stream"], faulty.injected["write"]) == (1, 1)
    assert faulty.calls["open_append_stream"] == 2  # one retry of the open, no reopen after
    assert path.read_bytes() == b"start;one;"  # nothing appended twice, nothing replayed
    assert fs.stats.snapshot()["bytes_replayed"] == 0


def test_an_append_on_the_fsspec_face_retries_the_open_only(tmp_path):
    local = fsspec.filesystem("file")
    path = str(tmp_path / "log.txt")
    local.pipe_file(path, b"start;")
    calls = {"open": 0}
    original = local._open

    def flaky_open(p, mode="rb", **kwargs):
        if "a" in mode:
            calls["open"] += 1
            if calls["open"] == 1:
                raise ConnectionResetError(104, "Connection reset by peer")
        return original(p, mode=mode, **kwargs)

    local._open = flaky_open
    fs = retryfs.RetryFileSystem(fs=local, policy=FAST, skip_instance_cache=True)
    with fs.open(path, "ab") as f:
        f.write(b"more")
    assert calls["open"] == 2
    assert open(path, "rb").read() == b"start;more"
    assert fs.stats.snapshot()["by_operation"]["open_append_stream"]["retries"] == 1
    assert type(f).__name__ not in ("RetryWriteFile",)  # not a replaying writer


# -- the budget's defaults, as documented ----------------------------------------------------------

def test_the_default_budget_has_the_documented_numbers():
    budget = RetryBudget()
    assert (budget.capacity, budget.retry_cost, budget.throttle_cost, budget.timeout_cost,
            budget.success_refund) == (500, 5, 5, 10, 1)
    assert budget.max_retries == 100
    fs = RetryingFileSystem(FaultyFileSystem(pafs.LocalFileSystem()))
    assert fs.retry_handler.budget == budget  # on by default, with those numbers
    assert fs.retry_budget.capacity == 500


# -- per-attempt timeouts in test mode -------------------------------------------------------------

def test_per_attempt_timeouts_still_apply_in_test_mode(tmp_path):
    (tmp_path / "f").write_bytes(b"x")
    faulty = FaultyFileSystem(pafs.LocalFileSystem())
    faulty.inject("get_file_info", stall=30, times=1)  # a black-holed first attempt
    fs = RetryingFileSystem(faulty, FAST, timeout=0.2)
    try:
        with retryfs.no_sleep():
            info = fs.get_file_info(str(tmp_path / "f"))
    finally:
        faulty.release()
    assert info.type == pafs.FileType.File
    assert faulty.injected["get_file_info"] == 1
    snap = fs.stats.snapshot()
    assert (snap["timeouts"], snap["retries"], snap["sleep_seconds"]) == (1, 1, 0)


# -- secrets from storage_options ------------------------------------------------------------------

def test_from_uri_registers_secret_storage_options():
    secret = "qZ9xJ8zQxj0Q1zXj9Zstorage"
    assert redact(f"refused: {secret}") == f"refused: {secret}"  # not known yet
    fs, _ = retryfs.from_uri("memory://bucket/x", storage_options={
        "client_kwargs": {"aws_secret_access_key": secret}, "skip_instance_cache": True})
    assert redact(f"refused: {secret}") == "refused: ***"  # a nested option, by its name
    assert secret not in repr(fs)


# -- fsspec transactions: the commit is retried ----------------------------------------------------

def test_the_commit_inside_a_transaction_is_retried(tmp_path):
    local = fsspec.filesystem("file")
    fs = retryfs.RetryFileSystem(fs=local, policy=FAST, skip_instance_cache=True)
    target = str(tmp_path / "a.bin")
    failures = {"left": 2}
    with fs.transaction:
        with fs.open(target, "wb") as f:
            f.write(b"payload")
        assert not local.exists(target)  # nothing visible before the commit
        inner = f._last_inner.file  # the backend's file, committed at the transaction's end
        original = inner.commit

        def flaky_commit():
            if failures["left"]:
                failures["left"] -= 1
                raise ConnectionResetError(104, "Connection reset by peer")
            return original()

        inner.commit = flaky_commit
    assert failures["left"] == 0  # both faults fired
    assert local.cat_file(target) == b"payload"
    snap = fs.stats.snapshot()["by_operation"]["commit"]
    assert (snap["attempts"], snap["retries"]) == (3, 2)
    assert fs.stats.snapshot()["bytes_replayed"] == 0  # retried, not replayed


# -- Retry-After, as the server words it (mutants of the parser survived without these) ------------

@pytest.mark.parametrize(("value", "seconds"), [
    ("7", 7.0), (" 2.5 ", 2.5), ("-3", 0.0),  # a negative wait is no wait
    ("Wed, 21 Oct 2015 07:28:10 GMT", 10.0),  # an HTTP date, against the injected now
    ("Wed, 21 Oct 2015 07:27:00 GMT", 0.0),  # a date already past
    ("nan", None), ("inf", None), ("", None), ("soon", None),
])
def test_retry_after_values(value, seconds):
    now = email.utils.parsedate_to_datetime("Wed, 21 Oct 2015 07:28:00 GMT").timestamp()
    assert _parse_retry_after(value, now=now) == seconds


# -- seeking a resumable reader (mutants of seek and of the size probe survived) -------------------

def test_seek_on_a_resumable_reader(tmp_path):
    data = bytes(range(256)) * 40
    path = str(tmp_path / "blob")
    with open(path, "wb") as f:
        f.write(data)
    local = fsspec.filesystem("file")  # LocalFileOpener has no size: the tell/seek probe
    fs = retryfs.RetryFileSystem(fs=local, policy=FAST, skip_instance_cache=True)
    with fs.open(path, "rb") as f:
        assert f.size == len(data)
        assert f.seek(100) == 100
        assert f.seek(28, 1) == 128 and f.read(4) == data[128:132]
        assert f.seek(-10, 1) == 122 and f.read(2) == data[122:124]
        assert f.seek(-6, 2) == len(data) - 6 and f.read() == data[-6:]
        with pytest.raises(ValueError, match="negative seek position -1"):
            f.seek(-1)
        with pytest.raises(ValueError, match="invalid whence 7"):
            f.seek(0, 7)
        assert f.tell() == len(data)  # a refused seek moved nothing
    stream = RetryingFileSystem(pafs.LocalFileSystem(), FAST).open_input_stream(path)
    with pytest.raises(OSError):  # a stream is not seekable (pyarrow refuses before us)
        stream.seek(3)


def test_classifiers_compare_by_type_and_configuration():
    """Wrappers compare equal by their classifiers (pickled to Ray workers and back)."""

    class Stricter(retryfs.ErrorClassifier):
        pass

    base = retryfs.ErrorClassifier(retryable_messages=["Flaky"])
    assert base == retryfs.ErrorClassifier(retryable_messages=["Flaky"])
    assert hash(base) == hash(retryfs.ErrorClassifier(retryable_messages=["Flaky"]))
    assert base != retryfs.ErrorClassifier(retryable_messages=["Other"])
    assert hash(base) != hash(retryfs.ErrorClassifier(retryable_messages=["Other"]))
    assert Stricter(retryable_messages=["Flaky"]) != base  # a subclass may decide otherwise

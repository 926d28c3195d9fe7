"""The retry loop outcome by outcome, as a caller, a hook and the counters see it.

Mostly the async driver (`Retrier.acall`, the fsspec face's async calls), whose arguments,
per-attempt timeout, backoff waits, reconciliation and published deadline had no test that a
changed line would fail (mutation testing found them), and the reconciliation check that gives
up (`Retrier._reconciled`): the give-up event its hooks get and the note on its error.
Time is an injected clock and an injected sleep: nothing waits.
"""

from __future__ import annotations

import asyncio

import pytest
from _helpers import FAST, Clock, retry_events

from retryfs import RetryPolicy, no_sleep
from retryfs.core.classify import ErrorClassifier
from retryfs.core.engine import Retrier, operation_end
from retryfs.core.stats import RetryEvent, RetryStats
from retryfs.core.timeouts import AttemptTimeoutError

BACKOFF = RetryPolicy(max_attempts=3, initial_delay=0.5, multiplier=2, max_delay=10,
                      jitter=False)


def retrier(policy: RetryPolicy = FAST, clock: Clock | None = None,
            timeouts: dict[str, float] | None = None) -> Retrier:
    clock = clock or Clock()
    return Retrier(lambda _op: policy, ErrorClassifier(), RetryStats(), sleep=clock.sleep,
                   clock=clock, timeouts=timeouts, async_sleep=clock.async_sleep)


def reset() -> ConnectionResetError:
    return ConnectionResetError(104, "Connection reset by peer")


# -- acall: each attempt gets the call's arguments ---------------------------------------------

@pytest.mark.parametrize("timeouts", [None, {"cat_file": 30.0}], ids=["untimed", "timed"])
def test_acall_gives_every_attempt_the_positional_and_keyword_arguments(timeouts):
    r = retrier(timeouts=timeouts)
    seen = []

    async def cat_file(path, start, *, end):
        seen.append((path, start, end))
        if len(seen) == 1:
            raise reset()
        return b"data"

    assert asyncio.run(r.acall("cat_file", "b/k", cat_file, "b/k", 0, end=4)) == b"data"
    assert seen == [("b/k", 0, 4)] * 2
    snap = r.stats.snapshot()["by_operation"]["cat_file"]
    assert (snap["calls"], snap["attempts"], snap["recovered"]) == (1, 2, 1)


def test_acall_counts_a_first_try_success_under_its_operation():
    r = retrier()

    async def info():
        return {"size": 1}

    assert asyncio.run(r.acall("info", "b/k", info)) == {"size": 1}
    assert r.stats.snapshot()["by_operation"]["info"]["calls"] == 1


def test_acall_abandons_a_hung_attempt_with_a_timeout_naming_the_operation_and_path():
    r = retrier(timeouts={"info": 0.05})
    retries, _ = retry_events(r.stats)
    attempts = []

    async def info():
        attempts.append(1)
        if len(attempts) == 1:
            await asyncio.sleep(10)  # hung: the timeout cancels it long before
            return "late"
        return "fresh"

    assert asyncio.run(r.acall("info", "b/k", info)) == "fresh"
    [event] = retries
    assert isinstance(event.error, AttemptTimeoutError) and event.timed_out
    assert (event.error.operation, event.error.path, event.error.seconds) == ("info", "b/k", 0.05)
    assert r.stats.snapshot()["timeouts"] == 1


# -- acall: give-up, backoff waits, a failed wait ------------------------------------------------

def test_acall_gives_up_with_the_last_error_its_event_and_its_note():
    r = retrier()
    _, giveups = retry_events(r.stats)
    made = []

    async def info():
        made.append(reset())
        raise made[-1]

    with pytest.raises(ConnectionResetError) as raised:
        asyncio.run(r.acall("info", "b/k", info))
    assert len(made) == 4 and raised.value is made[-1]
    assert giveups == [RetryEvent("info", "b/k", 4, 4, made[-1], 0.0, False, gave_up=True,
                                  reason="no attempts left")]
    assert raised.value.__notes__ == [  # the injected clock: waits of 1 + 2 + 4 ms since the start
        "retryfs: info 'b/k' gave up after 4 attempt(s) in 0.01s (no attempts left)"]
    snap = r.stats.snapshot()
    assert (snap["calls"], snap["attempts"], snap["retries"], snap["giveups"]) == (1, 4, 3, 1)


def test_acall_waits_each_backoff_with_the_async_sleep():
    clock = Clock()
    r = retrier(BACKOFF, clock)
    attempts = []

    async def info():
        attempts.append(clock.now)
        if len(attempts) < 3:
            raise reset()
        return "ok"

    assert asyncio.run(r.acall("info", "b/k", info)) == "ok"
    assert clock.slept == [0.5, 1.0]
    assert attempts == [100.0, 100.5, 101.5]


def test_acall_does_not_wait_a_zero_delay_nor_in_test_mode():
    for policy, mode in ((BACKOFF.replace(initial_delay=0.0, max_delay=0.0), None),
                         (BACKOFF.replace(initial_delay=60.0, max_delay=60.0), no_sleep)):
        clock = Clock()
        r = retrier(policy, clock)
        attempts = []

        async def info(attempts=attempts):
            attempts.append(1)
            if len(attempts) < 3:
                raise reset()
            return "ok"

        if mode is None:
            assert asyncio.run(r.acall("info", "b/k", info)) == "ok"
        else:
            with mode():
                assert asyncio.run(r.acall("info", "b/k", info)) == "ok"
        assert clock.slept == [] and len(attempts) == 3


def test_acall_a_failed_backoff_wait_raises_the_storage_error_not_the_waits():
    async def broken_sleep(seconds):
        raise RuntimeError("event loop is closing")

    r = Retrier(lambda _op: BACKOFF, ErrorClassifier(), RetryStats(), clock=Clock(),
                async_sleep=broken_sleep)
    _, giveups = retry_events(r.stats)
    made = []

    async def info():
        made.append(reset())
        raise made[-1]

    with pytest.raises(ConnectionResetError) as raised:
        asyncio.run(r.acall("info", "b/k", info))
    assert len(made) == 1 and raised.value is made[0]
    assert raised.value.__notes__ == [
        "retryfs: info 'b/k' gave up after 1 attempt(s): the wait before the next attempt "
        "failed (RuntimeError: event loop is closing)"]
    assert [e.reason for e in giveups] == ["the wait before the next attempt failed "
                                           "(RuntimeError)"]


# -- acall: reconciliation, the published deadline -----------------------------------------------

def test_acall_reconciles_with_the_error_the_retry_raised():
    r = retrier()
    checked = []
    gone = FileNotFoundError("b/k")

    async def rm_file():
        if not checked:
            checked.append("applied, answer lost")
            raise reset()
        raise gone

    def deleted_already(error):
        checked.append(error)
        return isinstance(error, FileNotFoundError)

    assert asyncio.run(r.acall("rm_file", "b/k", rm_file, reconcile=deleted_already)) is None
    assert checked == ["applied, answer lost", gone]
    snap = r.stats.snapshot()["by_operation"]["rm_file"]
    assert (snap["calls"], snap["attempts"], snap["recovered"], snap["giveups"]) == (1, 2, 1, 0)


def test_acall_publishes_its_deadline_to_nested_calls_and_withdraws_it():
    clock = Clock()
    r = retrier(BACKOFF.replace(deadline=2.0), clock)
    seen = []

    async def info():
        seen.append(operation_end(clock))
        if len(seen) == 1:
            raise reset()
        return "ok"

    async def main():
        result = await r.acall("info", "b/k", info)
        return result, operation_end(clock)

    assert asyncio.run(main()) == ("ok", None)  # withdrawn once the call is over
    assert seen == [None, 102.0]  # the retry's nested calls end by started + deadline


# -- the reconciliation check that gives up ------------------------------------------------------

@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_reconciliation_check_that_fails_is_a_give_up_event_of_the_operation(driver):
    policies = {"move": FAST.replace(max_attempts=5)}
    r = Retrier(lambda op: policies.get(op, FAST), ErrorClassifier(), RetryStats(),
                sleep=Clock().sleep, clock=Clock(), async_sleep=Clock().async_sleep)
    retries, giveups = retry_events(r.stats)
    check_error = PermissionError(13, "Permission denied")
    attempts = []

    def move():
        attempts.append(1)
        raise reset() if len(attempts) == 1 else FileNotFoundError("src")

    def moved_already(error):
        raise check_error

    with pytest.raises(PermissionError) as raised:
        if driver == "sync":
            r.call("move", "src", move, reconcile=moved_already)
        else:
            async def amove():
                move()
            asyncio.run(r.acall("move", "src", amove, reconcile=moved_already))
    assert raised.value is check_error and len(attempts) == 2
    assert giveups == [RetryEvent("move", "src", 2, 5, check_error, 0.0, False, gave_up=True,
                                  reason="the check of its outcome failed")]
    assert raised.value.__notes__ == [
        "retryfs: move 'src': attempt 2 raised FileNotFoundError, and checking whether an "
        "earlier attempt had done the work failed"]
    assert len(retries) == 1
    snap = r.stats.snapshot()["by_operation"]["move"]
    assert (snap["calls"], snap["attempts"], snap["retries"], snap["giveups"]) == (1, 2, 1, 1)

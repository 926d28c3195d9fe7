"""`retryfs/core/engine.py` piece by piece: test mode, Retry-After lookup, the timeout test, each
decision of a failed attempt (events, notes, counters, budget tokens) and the deadline edge.

Written against mutmut's survivors (issue 16): each test fails on a changed line that the
loop-level tests let through. Time is an injected clock and an injected sleep: nothing waits.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from _helpers import Clock, retry_events

from retryfs import RetryBudget, RetryPolicy
from retryfs.core import engine as engine_module
from retryfs.core.budget import TokenBucket
from retryfs.core.classify import ErrorClassifier
from retryfs.core.engine import (
    Retrier,
    _header,
    _headers_of,
    _is_timeout,
    no_sleep,
    operation_end,
    retry_after_of,
    sleeping_disabled,
)
from retryfs.core.stats import RetryEvent, RetryStats

POLICY = RetryPolicy(max_attempts=3, initial_delay=0.5, multiplier=2, max_delay=10,
                     jitter=False, throttle_delay=1.5, fast_throttle_retries=1)


def make(policy: RetryPolicy = POLICY, clock: Clock | None = None,
         budget: TokenBucket | None = None) -> tuple[Retrier, Clock]:
    clock = clock or Clock()
    return Retrier(lambda _op: policy, ErrorClassifier(), RetryStats(), sleep=clock.sleep,
                   clock=clock, budget=budget, async_sleep=clock.async_sleep), clock


def reset() -> ConnectionResetError:
    return ConnectionResetError(104, "Connection reset by peer")


def throttle() -> OSError:
    return OSError("AWS Error SLOW_DOWN during HeadObject operation: Please reduce your rate.")


def failing(errors: list[BaseException], then: object = "ok"):
    """A callable that raises ``errors`` in turn, then returns ``then``; counts its calls."""
    calls: list[int] = []

    def fn():
        calls.append(1)
        if len(calls) <= len(errors):
            raise errors[len(calls) - 1]
        return then
    return fn, calls


def counters(r: Retrier, operation: str = "op") -> tuple[int, ...]:
    snap = r.stats.snapshot()["by_operation"][operation]
    return (snap["calls"], snap["attempts"], snap["retries"], snap["giveups"], snap["recovered"])


# -- test mode -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("value", "disabled"), [
    ("1", True), ("true", True), ("TRUE", True), ("Yes", True), ("on", True),
    ("0", False), ("", False), ("no", False), ("false", False)])
def test_the_environment_variable_turns_test_mode_on(monkeypatch, value, disabled):
    monkeypatch.setenv("RETRYFS_NO_SLEEP", value)
    assert sleeping_disabled() is disabled


def test_no_sleep_nests_and_ends(monkeypatch):
    monkeypatch.delenv("RETRYFS_NO_SLEEP", raising=False)
    assert not sleeping_disabled()
    with no_sleep():
        with no_sleep():
            assert sleeping_disabled()
        assert sleeping_disabled()  # the outer one still holds
    assert not sleeping_disabled()
    with pytest.raises(KeyError), no_sleep():
        raise KeyError("x")
    assert not sleeping_disabled()  # ended by an exception too


def test_the_default_sleep_waits_only_a_positive_delay_outside_test_mode(monkeypatch):
    monkeypatch.delenv("RETRYFS_NO_SLEEP", raising=False)
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    engine_module._sleep(0.25)
    engine_module._sleep(0.0)
    engine_module._sleep(-1.0)
    with no_sleep():
        engine_module._sleep(5.0)
    assert slept == [0.25]


def test_operation_end_is_published_for_its_own_clock_only():
    clock, other = Clock(), Clock()
    r, _ = make(POLICY.replace(deadline=5.0), clock)
    seen = []

    def fn():
        seen.append((operation_end(clock), operation_end(other)))
        if len(seen) == 1:
            raise reset()
        return "ok"

    assert r.call("op", "p", fn) == "ok"
    assert seen == [(None, None), (105.0, None)]


# -- Retry-After: where it is found --------------------------------------------------------------

class _Headers:
    def __init__(self, pairs):
        self.pairs = pairs

    def items(self):
        return list(self.pairs)


class _Broken:
    def items(self):
        raise TypeError("not a mapping")


def test_header_lookup():
    assert _header(object(), "retry-after") is None  # no items()
    assert _header(type("H", (), {"items": 3})(), "retry-after") is None  # items not callable
    assert _header(_Broken(), "retry-after") is None
    assert _header({"Retry-After": 7}, "retry-after") == "7"  # case-insensitive, as text
    assert _header({"retry-after": None, "b": "2"}, "retry-after", "b") == "2"  # None skipped
    # the first *name* asked for wins, whatever the headers' order
    assert _header(_Headers([("b", "2"), ("a", "1")]), "a", "b") == "1"
    assert _header({"a": "1"}, "z") is None


class _Error(Exception):
    pass


def _with(**attributes) -> _Error:
    error = _Error("x")
    for name, value in attributes.items():
        setattr(error, name, value)
    return error


class _Response:
    def __init__(self, headers=None):
        if headers is not None:
            self.headers = headers


def test_headers_of_each_client_shape():
    assert _headers_of(_with(response={"ResponseMetadata": {"HTTPHeaders": {"a": "1"}}})) == {
        "a": "1"}
    assert _headers_of(_with(response={"Error": {}})) is None  # no ResponseMetadata
    assert _headers_of(_with(response=_Response({"b": "2"}), headers={"c": "3"})) == {"b": "2"}
    # a response without headers: the error's own (aiohttp keeps them on the error)
    assert _headers_of(_with(response=_Response(), headers={"c": "3"})) == {"c": "3"}
    assert _headers_of(_with(headers={"c": "3"})) == {"c": "3"}
    assert _headers_of(_Error("plain")) is None


@pytest.mark.parametrize(("attributes", "seconds"), [
    ({"retry_after": 0}, 0.0),  # zero is a value: no header looked at
    ({"retry_after": 2}, 2.0),
    ({"retry_after": True, "headers": {"retry-after": "4"}}, 4.0),  # a bool is no number
    ({"retry_after": -1, "headers": {"retry-after": "4"}}, 4.0),  # negative: ignored
    ({"retry_after": "9", "headers": {"retry-after": "4"}}, 4.0),  # text attribute: ignored
    ({"headers": {"retry-after-ms": "1500", "retry-after": "9"}}, 1.5),
    ({"headers": {"x-ms-retry-after-ms": "250"}}, 0.25),
    ({"headers": {"retry-after-ms": "-20"}}, 0.0),
    ({"headers": {"retry-after-ms": "soon", "retry-after": "3"}}, 3.0),  # bad millis: seconds
    ({"headers": {"retry-after": "later"}}, None),
    ({"headers": {}}, None),
])
def test_retry_after_of(attributes, seconds):
    assert retry_after_of(_with(**attributes)) == seconds
    if seconds is not None:
        assert type(retry_after_of(_with(**attributes))) is float


def test_retry_after_goes_on_down_the_chain():
    outer = _with(headers={"retry-after": "never"})  # unreadable: the cause is asked next
    outer.__cause__ = _with(headers={"retry-after": "6"})
    assert retry_after_of(outer) == 6.0
    bare = _Error("no headers")
    bare.__cause__ = _with(headers={"retry-after": "5"})
    assert retry_after_of(bare) == 5.0


@pytest.mark.parametrize("name", ["ReadTimeoutError", "ConnectTimeoutError", "ReadTimeout",
                                  "ConnectTimeout", "ServerTimeoutError", "DeadlineExceeded"])
def test_timeouts_are_known_by_the_clients_class_names(name):
    assert _is_timeout(type(name, (Exception,), {})("slow"))
    wrapped = OSError("wrapped")
    wrapped.__cause__ = type(name, (Exception,), {})("slow")
    assert _is_timeout(wrapped)


def test_a_timeout_error_anywhere_in_the_chain_is_a_timeout():
    assert _is_timeout(TimeoutError("t"))
    wrapped = OSError("wrapped")
    wrapped.__context__ = TimeoutError("t")
    assert _is_timeout(wrapped)
    assert not _is_timeout(OSError("other"))
    assert not _is_timeout(reset())


# -- each decision of a failed attempt -----------------------------------------------------------

def test_a_permanent_error_is_one_attempt_no_event_and_a_failure():
    r, clock = make()
    retries, giveups = retry_events(r.stats)
    error = FileNotFoundError("p")
    fn, calls = failing([error])
    with pytest.raises(FileNotFoundError) as raised:
        r.call("op", "p", fn)
    assert raised.value is error and len(calls) == 1 and not hasattr(error, "__notes__")
    assert retries == giveups == [] and clock.slept == []
    assert counters(r) == (1, 1, 0, 0, 0)


def test_a_retry_event_has_every_field():
    r, clock = make()
    retries, _ = retry_events(r.stats)
    first, second = reset(), throttle()
    fn, _ = failing([first, second])
    assert r.call("op", "p", fn) == "ok"
    assert retries == [
        RetryEvent("op", "p", 1, 3, first, 0.5, False, retry_after=None, timed_out=False),
        RetryEvent("op", "p", 2, 3, second, 3.0, True, retry_after=None, timed_out=False)]
    assert clock.slept == [0.5, 3.0]  # the throttle schedule: 0.5 * 3 * 2
    assert counters(r) == (1, 3, 2, 0, 1)
    snap = r.stats.snapshot()
    assert (snap["throttled"], snap["sleep_seconds"]) == (1, 3.5)


def test_a_timed_out_attempt_is_flagged_on_its_event():
    r, _ = make()
    retries, _ = retry_events(r.stats)
    fn, _ = failing([TimeoutError("slow")])
    r.call("op", "p", fn)
    assert [e.timed_out for e in retries] == [True]
    assert r.stats.snapshot()["timeouts"] == 1


@pytest.mark.parametrize(("server", "delay"), [(2.0, 2.0), (0.1, 0.5), (60.0, 10.0)])
def test_retry_after_raises_the_delay_within_max_delay(server, delay):
    r, clock = make()
    retries, _ = retry_events(r.stats)
    error = reset()
    error.retry_after = server  # type: ignore[attr-defined]
    fn, _ = failing([error])
    r.call("op", "p", fn)
    assert [(e.retry_after, e.delay) for e in retries] == [(server, delay)]
    assert clock.slept == [delay]


def test_the_give_up_event_note_and_counters_when_attempts_run_out():
    r, clock = make()
    retries, giveups = retry_events(r.stats)
    errors = [reset(), reset(), TimeoutError("slow")]
    fn, calls = failing(errors)
    with pytest.raises(TimeoutError) as raised:
        r.call("op", "b/k", fn)
    assert raised.value is errors[-1] and len(calls) == 3
    assert giveups == [RetryEvent("op", "b/k", 3, 3, errors[-1], 0.0, False, gave_up=True,
                                  retry_after=None, reason="no attempts left", timed_out=True)]
    assert type(giveups[0].delay) is float  # 0.0, not a False that compares equal
    assert raised.value.__notes__ == [
        "retryfs: op 'b/k' gave up after 3 attempt(s) in 1.50s (no attempts left)"]
    assert len(retries) == 2 and clock.slept == [0.5, 1.0]
    assert counters(r) == (1, 3, 2, 1, 0)


def test_the_deadline_gives_up_when_the_wait_would_end_past_it_not_when_it_ends_on_it():
    # started at 100, deadline 1.5: the first wait (0.5) ends at 100.5, the second (1.0) at
    # 101.5, on the deadline itself: allowed; the third would be past it
    policy = POLICY.replace(max_attempts=10, deadline=1.5)
    r, clock = make(policy)
    _, giveups = retry_events(r.stats)
    fn, calls = failing([reset()] * 10)
    with pytest.raises(ConnectionResetError) as raised:
        r.call("op", "p", fn)
    assert len(calls) == 3 and clock.slept == [0.5, 1.0]
    assert [(e.attempt, e.max_attempts, e.reason) for e in giveups] == [
        (3, 10, "deadline reached")]
    assert raised.value.__notes__ == [
        "retryfs: op 'p' gave up after 3 attempt(s) in 1.50s (deadline reached)"]


def test_the_deadline_is_the_enclosing_operations_when_that_ends_first():
    clock = Clock()
    outer, _ = make(POLICY.replace(deadline=1.0), clock)
    inner, _ = make(POLICY.replace(max_attempts=10, deadline=30.0), clock)
    inner_calls: list[int] = []
    outer_calls: list[int] = []

    def nested():
        inner_calls.append(1)
        raise reset()

    def fn():
        outer_calls.append(1)
        if len(outer_calls) == 1:
            raise reset()
        return inner.call("inner", "p", nested)

    with pytest.raises(ConnectionResetError):
        outer.call("outer", "p", fn)
    # outer ends at 101.0; its one wait took 0.5; the inner call's first wait (0.5) ends on
    # 101.0 (allowed), its second (1.0) would end past it
    assert len(inner_calls) == 2

    clock2 = Clock()
    outer2, _ = make(POLICY.replace(deadline=30.0), clock2)
    inner2, _ = make(POLICY.replace(max_attempts=10, deadline=1.0), clock2)
    seen = []

    def nested2():
        seen.append(operation_end(clock2))
        if len(seen) == 2:
            raise reset()
        return "ok"

    def fn2():
        if not seen:
            seen.append(None)
            raise reset()
        return inner2.call("inner", "p", nested2)

    assert outer2.call("outer", "p", fn2) == "ok"
    # the outer end (130) during the inner call's first attempt; its own (started at 100.5,
    # plus 1.0) during its retry, the earlier of the two
    assert seen == [None, 130.0, 101.5]


# -- the retry budget ----------------------------------------------------------------------------

def bucket(capacity: int = 100, **config) -> TokenBucket:
    return TokenBucket(RetryBudget(capacity=capacity, **config), "test-endpoint")


def test_each_retry_takes_its_cost_and_a_recovery_gives_the_last_one_back():
    b = bucket(retry_cost=5, throttle_cost=7, timeout_cost=11, success_refund=1)
    r, _ = make(POLICY.replace(max_attempts=5), budget=b)
    fn, _ = failing([TimeoutError("t"), throttle(), reset()])  # the last one is refunded
    assert r.call("op", "p", fn) == "ok"
    assert b.available == 100 - 11 - 7 - 5 + 5


def test_a_first_try_success_gives_back_the_refund_when_the_bucket_is_not_full():
    b = bucket(success_refund=2)
    r, _ = make(budget=b)
    b.acquire(10)
    assert r.call("op", "p", lambda: "ok") == "ok"
    assert b.available == 92
    r.first_try_succeeded("op")
    assert b.available == 94
    assert r.stats.snapshot()["by_operation"]["op"]["calls"] == 2
    b.available = 100
    r.first_try_succeeded("op")
    assert b.available == 100


def test_an_empty_budget_gives_up_with_a_note_naming_the_endpoint():
    b = bucket(capacity=5, retry_cost=5)
    r, clock = make(POLICY.replace(max_attempts=5), budget=b)
    retries, giveups = retry_events(r.stats)
    fn, calls = failing([reset()] * 5)
    with pytest.raises(ConnectionResetError) as raised:
        r.call("op", "p", fn)
    assert len(calls) == 2 and len(retries) == 1 and clock.slept == [0.5]
    assert [(e.attempt, e.reason, e.delay, type(e.delay)) for e in giveups] == [
        (2, "retry budget exhausted", 0.0, float)]
    assert raised.value.__notes__ == [
        "retryfs: op 'p' gave up after 2 attempt(s) in 0.50s (retry budget of test-endpoint "
        "exhausted: too many retries without a success in this process)"]
    assert b.available == 0 and b.denied == 1
    assert r.stats.snapshot()["budget_exhausted"] == 1


def test_no_budget_is_taken_when_the_attempts_ran_out():
    b = bucket(retry_cost=5)
    r, _ = make(POLICY.replace(max_attempts=2), budget=b)
    fn, _ = failing([reset()] * 2)
    with pytest.raises(ConnectionResetError):
        r.call("op", "p", fn)
    assert (b.available, b.denied) == (95, 0)


def test_test_mode_takes_no_budget_and_counts_no_sleep(monkeypatch):
    monkeypatch.delenv("RETRYFS_NO_SLEEP", raising=False)
    b = bucket(capacity=5, retry_cost=5)
    r, clock = make(POLICY.replace(max_attempts=4), budget=b)
    fn, calls = failing([reset()] * 3)
    with no_sleep():
        assert r.call("op", "p", fn) == "ok"
    assert len(calls) == 4 and b.available == 5
    b.acquire(3)  # not full: a recovered call in test mode gives nothing back either
    fn, _ = failing([reset()])
    with no_sleep():
        assert r.call("op", "p", fn) == "ok"
    assert b.available == 2
    assert r.stats.snapshot()["sleep_seconds"] == 0.0
    assert clock.slept == [0.5, 1.0, 2.0, 0.5]  # an injected sleep is still called (it decides)


# -- a failed backoff wait, the sync driver ------------------------------------------------------

def test_a_failed_wait_raises_the_storage_error_with_its_note_and_counts_a_give_up():
    clock = Clock()

    def broken(seconds):
        raise RuntimeError("interrupted")

    policies = {"op": POLICY.replace(max_attempts=7)}  # the operation's own policy
    r = Retrier(lambda op: policies.get(op, POLICY), ErrorClassifier(), RetryStats(),
                sleep=broken, clock=clock)
    _, giveups = retry_events(r.stats)
    error = reset()
    fn, calls = failing([error])
    with pytest.raises(ConnectionResetError) as raised:
        r.call("op", "b/k", fn)
    assert raised.value is error and len(calls) == 1
    assert giveups == [RetryEvent("op", "b/k", 1, 7, error, 0.0, False, gave_up=True,
                                  reason="the wait before the next attempt failed "
                                         "(RuntimeError)")]
    assert type(giveups[0].delay) is float  # 0.0, not a False that compares equal
    assert raised.value.__notes__ == [
        "retryfs: op 'b/k' gave up after 1 attempt(s): the wait before the next attempt "
        "failed (RuntimeError: interrupted)"]
    assert counters(r) == (1, 1, 1, 1, 0)


def test_a_keyboard_interrupt_in_the_wait_goes_through():
    def interrupted(seconds):
        raise KeyboardInterrupt

    r = Retrier(lambda _op: POLICY, ErrorClassifier(), RetryStats(), sleep=interrupted,
                clock=Clock())
    fn, _ = failing([reset()])
    with pytest.raises(KeyboardInterrupt):
        r.call("op", "p", fn)


# -- reconciliation, both drivers ----------------------------------------------------------------

@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_reconciled_retry_is_a_recovered_call_returning_none(driver):
    b = bucket(retry_cost=5, success_refund=1)
    r, _ = make(budget=b)
    gone = FileNotFoundError("p")
    fn, calls = failing([reset(), gone])
    checked = []

    def check(error):
        checked.append(error)
        return "yes"  # truthy: bool() of it

    if driver == "sync":
        assert r.call("op", "p", fn, reconcile=check) is None
    else:
        async def afn():
            return fn()
        assert asyncio.run(r.acall("op", "p", afn, reconcile=check)) is None
    assert checked == [gone] and len(calls) == 2
    assert counters(r) == (1, 2, 1, 0, 1)
    assert b.available == 100  # the retry's 5 tokens back


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_an_unreconciled_retry_goes_on_retrying(driver):
    r, _ = make()
    fn, calls = failing([reset(), reset()])
    checked = []

    def check(error):
        checked.append(error)
        return 0

    if driver == "sync":
        assert r.call("op", "p", fn, reconcile=check) == "ok"
    else:
        async def afn():
            return fn()
        assert asyncio.run(r.acall("op", "p", afn, reconcile=check)) == "ok"
    assert len(checked) == 1 and len(calls) == 3
    assert counters(r) == (1, 3, 2, 0, 1)


def test_an_async_check_is_awaited():
    r, _ = make()
    fn, _ = failing([reset(), FileNotFoundError("p")])

    async def check(error):
        return isinstance(error, FileNotFoundError)

    async def afn():
        return fn()

    assert asyncio.run(r.acall("op", "p", afn, reconcile=check)) is None
    assert counters(r) == (1, 2, 1, 0, 1)


def test_the_async_give_up_counts_and_notes_like_the_sync_one():
    r, clock = make()
    _, giveups = retry_events(r.stats)
    errors = [reset(), reset(), reset()]
    fn, _ = failing(errors)

    async def afn():
        return fn()

    with pytest.raises(ConnectionResetError) as raised:
        asyncio.run(r.acall("op", "b/k", afn))
    assert raised.value is errors[-1]
    assert [(e.attempt, e.reason) for e in giveups] == [(3, "no attempts left")]
    assert raised.value.__notes__ == [
        "retryfs: op 'b/k' gave up after 3 attempt(s) in 1.50s (no attempts left)"]
    assert counters(r) == (1, 3, 2, 1, 0)
    assert clock.slept == [0.5, 1.0]


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_failed_check_gives_up_with_a_float_delay_and_counts_the_call(driver):
    r, _ = make()
    _, giveups = retry_events(r.stats)
    check_error = PermissionError(13, "Permission denied")
    fn, _ = failing([reset(), FileNotFoundError("p")])

    def check(error):
        raise check_error

    with pytest.raises(PermissionError):
        if driver == "sync":
            r.call("op", "p", fn, reconcile=check)
        else:
            async def afn():
                return fn()
            asyncio.run(r.acall("op", "p", afn, reconcile=check))
    [event] = giveups
    assert (event.delay, type(event.delay), event.throttled) == (0.0, float, False)
    assert counters(r) == (1, 2, 1, 1, 0)


def test_a_throttled_give_up_says_so_with_the_servers_retry_after():
    r, _ = make(POLICY.replace(max_attempts=2))
    _, giveups = retry_events(r.stats)
    errors = [throttle(), throttle()]
    errors[-1].retry_after = 4  # type: ignore[attr-defined]
    fn, _ = failing(errors)
    with pytest.raises(OSError):
        r.call("op", "p", fn)
    assert [(e.throttled, e.retry_after, e.timed_out, e.delay) for e in giveups] == [
        (True, 4.0, False, 0.0)]


def test_the_deadline_is_the_operations_own_policys():
    clock = Clock()
    policies = {"op": POLICY.replace(deadline=4.0)}
    r = Retrier(lambda op: policies.get(op, POLICY), ErrorClassifier(), RetryStats(),
                sleep=clock.sleep, clock=clock)
    seen = []

    def fn():
        seen.append(operation_end(clock))
        if len(seen) == 1:
            raise reset()
        return "ok"

    assert r.call("op", "p", fn) == "ok"
    assert seen == [None, 104.0]


def test_an_error_a_request_retried_in_place_gave_up_on_ends_the_enclosing_call():
    """One retry layer: the enclosing call (a stream's write) gives up at once on an error
    that a request inside its attempt, retried in place, already gave up on; an unmarked one
    of the same kind is retried as ever. Both face the same policy; the sync and async
    drivers share the decision."""
    retrier, _ = make()
    inner_attempts = []

    def part() -> None:
        inner_attempts.append(1)
        raise ConnectionResetError(104, "Connection reset by peer")

    def write() -> None:
        try:
            retrier.call("upload_part", "b/k", part)
        except Exception as error:
            engine_module.gave_up_inside(error)
            raise

    with pytest.raises(ConnectionResetError) as raised:
        retrier.call("write", "b/k", write)
    assert len(inner_attempts) == POLICY.max_attempts  # not max_attempts squared
    by_op = retrier.stats.snapshot()["by_operation"]
    assert (by_op["write"]["attempts"], by_op["write"]["giveups"]) == (1, 1)
    assert any("gave up" in note for note in raised.value.__notes__)

    unmarked = []

    def flaky() -> None:
        unmarked.append(1)
        raise ConnectionResetError(104, "Connection reset by peer")

    with pytest.raises(ConnectionResetError):
        retrier.call("write", "b/k", flaky)
    assert len(unmarked) == POLICY.max_attempts

    async def marked() -> None:
        raise engine_module.gave_up_inside(ConnectionResetError(104, "reset"))

    async_retrier, _ = make()
    with pytest.raises(ConnectionResetError):
        asyncio.run(async_retrier.acall("write", "b/k", marked))
    assert async_retrier.stats.snapshot()["by_operation"]["write"]["attempts"] == 1

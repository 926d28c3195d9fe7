"""The retry loop every operation goes through.

The happy path is one call and one counter. On failure: classify, stop on a permanent error,
compute the delay (the longer throttle schedule for throttling that persists or comes in a
storm, at least the server's Retry-After when the error carries one), stop if retries, the
deadline or the endpoint's retry budget ran out, sleep, try again. On give-up the last original exception is raised (same object,
same type, same message) with a note of the attempts made.

The same loop exists for coroutines (:meth:`Retrier.acall`, the fsspec async face), with a
per-attempt timeout applied on the event loop.

The deadline clock starts with the first attempt, and the deadline bounds the whole
user-visible operation: a retried call publishes its end (:func:`operation_end`) to the calls it
makes in turn (a stream's reopen and replay inside a write retry, on this thread or on a timed
attempt's worker), and those give up by the same end. No attempt starts past the end, so an
operation takes at most ``deadline`` plus one attempt.

Test mode (:func:`no_sleep`, or ``RETRYFS_NO_SLEEP=1`` in the environment) skips every backoff
sleep and sets the retry budget aside; attempts, classification, logs and counters are as usual.
"""

from __future__ import annotations

import asyncio
import contextvars
import email.utils
import inspect
import math
import os
import threading
import time
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from .budget import TokenBucket
from .classify import Classifier, Decision, exception_chain
from .policy import RetryPolicy
from .ratelimit import RateLimiter
from .stats import RetryEvent, RetryStats
from .timeouts import AttemptTimeoutError, wait_for_attempt

__all__ = ["AttemptTimeoutError", "Lane", "Retrier", "gave_up_inside", "holding", "no_sleep",
           "operation_end", "retry_after_of", "sleeping_disabled"]

T = TypeVar("T")

_no_sleep_depth = 0
_no_sleep_lock = threading.Lock()
_TRUE = ("1", "true", "yes", "on")


def sleeping_disabled() -> bool:
    """True inside :func:`no_sleep` or when ``RETRYFS_NO_SLEEP=1`` is set (test mode)."""
    return _no_sleep_depth > 0 or os.environ.get("RETRYFS_NO_SLEEP", "").lower() in _TRUE


@contextmanager
def no_sleep() -> Iterator[None]:
    """Test mode: retries happen at once, without waiting out the backoff schedule.

    Attempts, classification, logs, hooks and counters behave as usual; only the sleeps are
    skipped (``sleep_seconds`` stays 0) and the process-wide retry budget is set aside, so that
    faults injected on purpose in one test never drain the budget of the next. Process-wide
    (every thread), nestable. ``RETRYFS_NO_SLEEP=1`` in the environment does the same for a
    whole test run.
    """
    global _no_sleep_depth
    with _no_sleep_lock:
        _no_sleep_depth += 1
    try:
        yield
    finally:
        with _no_sleep_lock:
            _no_sleep_depth -= 1


#: The end of the outermost retried operation under way in this context: ``(clock, end)``.
#: Calls nested in its attempts give up by that end too. Context variables follow threads that
#: run with a copied context (timed attempts do) and coroutines.
_operation_end: contextvars.ContextVar[tuple[Callable[[], float], float] | None] = \
    contextvars.ContextVar("retryfs_operation_end", default=None)


_GAVE_UP_INSIDE = "__retryfs_gave_up_inside__"


def gave_up_inside(error: BaseException) -> BaseException:
    """Mark ``error`` as one a request retried in place has given up on: an enclosing retried
    operation gives up on it too, rather than try that request's attempts over again (one
    retry layer: ``max_attempts`` bounds each request). Returns ``error``."""
    try:
        setattr(error, _GAVE_UP_INSIDE, True)
    except AttributeError:  # an exception type without a __dict__: retried as before
        pass
    return error


def operation_end(clock: Callable[[], float]) -> float | None:
    """When the enclosing operation's deadline passes, on ``clock`` (``None``: no bound)."""
    outer = _operation_end.get()
    return outer[1] if outer is not None and outer[0] is clock else None


def _sleep(seconds: float) -> None:
    if seconds > 0 and not sleeping_disabled():
        time.sleep(seconds)


# -- Retry-After ---------------------------------------------------------------------------------

def _header(headers: Any, *names: str) -> str | None:
    """The first of ``names`` in a headers object (dict, CaseInsensitiveDict, CIMultiDict...)."""
    items = getattr(headers, "items", None)
    if not callable(items):
        return None
    try:
        found = {str(k).lower(): v for k, v in items()}
    except Exception:  # noqa: BLE001 - not a headers object after all
        return None
    for name in names:
        value = found.get(name)
        if value is not None:
            return str(value)
    return None


def _headers_of(exc: BaseException) -> Any:
    response = getattr(exc, "response", None)
    if isinstance(response, Mapping):  # botocore ClientError: lower-cased header names
        return response.get("ResponseMetadata", {}).get("HTTPHeaders")
    if response is not None:  # requests, azure-core, google-api-core (requests response)
        headers = getattr(response, "headers", None)
        if headers is not None:
            return headers
    return getattr(exc, "headers", None)  # aiohttp ClientResponseError


def _parse_retry_after(value: str, now: float | None = None) -> float | None:
    value = value.strip()
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if seconds != seconds or seconds == math.inf:  # nan / inf
        return None
    return max(0.0, seconds)


def retry_after_of(error: BaseException) -> float | None:
    """Seconds a server asked to wait before retrying, if ``error`` (or its cause) says so.

    Looks at a ``retry_after`` attribute (seconds), then at the response headers the HTTP
    libraries keep: botocore's ``ClientError.response["ResponseMetadata"]["HTTPHeaders"]``,
    ``error.response.headers`` (requests, azure-core, google-api-core) and ``error.headers``
    (aiohttp). ``retry-after-ms`` / ``x-ms-retry-after-ms`` (milliseconds) win over
    ``Retry-After`` (seconds or an HTTP date).
    """
    for link in exception_chain(error):
        own = getattr(link, "retry_after", None)
        if isinstance(own, (int, float)) and not isinstance(own, bool) and own >= 0:
            return float(own)
        headers = _headers_of(link)
        if headers is None:
            continue
        millis = _header(headers, "retry-after-ms", "x-ms-retry-after-ms")
        if millis is not None:
            try:
                return max(0.0, float(millis) / 1000.0)
            except ValueError:
                pass
        value = _header(headers, "retry-after")
        if value is not None:
            parsed = _parse_retry_after(value)
            if parsed is not None:
                return parsed
    return None


def _is_timeout(error: BaseException) -> bool:
    for link in exception_chain(error):
        if isinstance(link, TimeoutError):
            return True
        name = type(link).__name__
        if name in ("ReadTimeoutError", "ConnectTimeoutError", "ReadTimeout", "ConnectTimeout",
                    "ServerTimeoutError", "DeadlineExceeded"):
            return True
    return False


# -- the loop ------------------------------------------------------------------------------------

@dataclass
class _Step:
    """What to do after a failed attempt."""

    delay: float | None  # None: give up
    cost: int = 0  # budget tokens taken for this retry


class Retrier:
    """Runs callables under a policy, a classifier, a stats sink and a retry budget.

    ``policy_for(operation)`` picks the policy of an operation (per-operation overrides);
    ``reconcile(exc)``, given per call, turns an error seen on a *retry* into success when the
    first attempt may already have done the work (a delete that now finds nothing).
    ``budget`` is the endpoint's :class:`~retryfs.core.budget.TokenBucket` (``None``: unlimited);
    ``limiter`` its :class:`~retryfs.core.ratelimit.RateLimiter` (``None``: no pacing), told of every
    throttle and success and asked before every attempt.
    ``timeouts`` maps operation names to per-attempt timeouts in seconds; the sync faces apply
    them where an attempt can be abandoned safely, :meth:`acall` applies them itself.
    """

    def __init__(
        self,
        policy_for: Callable[[str], RetryPolicy],
        classifier: Classifier,
        stats: RetryStats,
        sleep: Callable[[float], None] = _sleep,
        clock: Callable[[], float] = time.monotonic,
        *,
        budget: TokenBucket | None = None,
        timeouts: Mapping[str, float] | None = None,
        async_sleep: Callable[[float], Awaitable[None]] | None = None,
        limiter: RateLimiter | None = None,
    ) -> None:
        self.policy_for = policy_for
        self.classifier = classifier
        self.stats = stats
        self.sleep = sleep
        self.clock = clock
        self.budget = budget
        self.timeouts: dict[str, float] = dict(timeouts or {})
        self.async_sleep = async_sleep
        self.limiter = limiter

    # -- sync ------------------------------------------------------------------------------------
    def call(
        self,
        operation: str,
        path: str,
        fn: Callable[..., T],
        *args: Any,
        reconcile: Callable[[BaseException], bool] | None = None,
        **kwargs: Any,
    ) -> T:
        started = self.clock()  # the deadline counts the first attempt too
        if self.limiter is not None:
            self.pace(operation, started)
        try:
            result = fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - every failure is classified
            first_error = exc
        else:
            self.first_try_succeeded(operation)
            return result
        # Retried outside the except block: a later attempt's error must not get this one as
        # its __context__ (classification walks the context; a throttle would stick).
        return self.recover(operation, path, fn, args, kwargs, first_error, reconcile, started)

    def first_try_succeeded(self, operation: str) -> None:
        """The happy path's bookkeeping: one counter (and budget tokens back unless full).

        For callers that make the first attempt themselves (a face's fast path) and call
        :meth:`recover` when it fails.
        """
        self.stats.record_first_try(operation)
        budget = self.budget
        if budget is not None and budget.available < budget.capacity:
            budget.release(budget.config.success_refund)
        limiter = self.limiter
        if limiter is not None and limiter.engaged:
            limiter.succeeded(self.clock())

    def pace(self, operation: str, started: float) -> None:
        """Wait for the rate limiter's token before an attempt (at once while it is
        disengaged); never past the operation's end, never in test mode."""
        for wait in self._pacing(operation, started):
            self.sleep(wait)

    async def apace(self, operation: str, started: float) -> None:
        """`pace` for the async face: the waits are awaited."""
        for wait in self._pacing(operation, started):
            await (self.async_sleep or asyncio.sleep)(wait)

    def _pacing(self, operation: str, started: float) -> Iterator[float]:
        """The waits before an attempt may go (the driver sleeps or awaits each one)."""
        limiter = self.limiter
        assert limiter is not None
        end: float | None = None
        waited = 0.0
        try:
            while True:
                now = self.clock()
                wait = limiter.before_send(now)
                if wait <= 0 or sleeping_disabled():
                    return
                end = self._pace_end(operation, started) if end is None else end
                if now >= end:  # the limiter never holds an operation past its end
                    return
                wait = min(wait, end - now)
                yield wait
                waited += wait
        finally:
            if waited:
                limiter.note_wait(waited)

    def _pace_end(self, operation: str, started: float) -> float:
        end = self._end(self.policy_for(operation), started)
        return math.inf if end is None else end

    def _end(self, policy: RetryPolicy, started: float) -> float | None:
        """When an operation that started at ``started`` must be done: its own deadline or the
        enclosing operation's end, whichever comes first (``None``: unbounded)."""
        own = None if policy.deadline is None else started + policy.deadline
        outer = operation_end(self.clock)
        if outer is None or (own is not None and own < outer):
            return own
        return outer

    def _step(self, operation: str, path: str, error: BaseException, attempt: int,
              started: float, end: float | None) -> _Step:
        policy = self.policy_for(operation)
        decision = self.classifier.classify(error)
        if decision is Decision.FAIL:
            return _Step(None)
        throttled = decision is Decision.THROTTLE
        limiter = self.limiter
        if throttled and limiter is not None:
            limiter.throttled(self.clock())
        delay = policy.delay(attempt, throttled=throttled and policy.throttle_schedule(
            attempt, storm=limiter is not None and limiter.engaged))
        retry_after = retry_after_of(error)
        if retry_after is not None:
            delay = max(delay, min(retry_after, policy.max_delay))
        timed_out = _is_timeout(error)
        reason = ""
        if getattr(error, _GAVE_UP_INSIDE, False):
            reason = "a request retried in place inside this attempt gave up"
        elif attempt >= policy.max_attempts:
            reason = "no attempts left"
        elif end is not None and self.clock() + delay > end:
            reason = "deadline reached"
        cost = 0
        budget = self.budget
        if not reason and budget is not None and not sleeping_disabled():
            cost = budget.config.cost(throttled=throttled, timed_out=timed_out)
            if not budget.acquire(cost):
                reason = "retry budget exhausted"  # (nothing taken: a give-up costs nothing)
        if reason:
            self.stats.record_giveup(RetryEvent(
                operation, path, attempt, policy.max_attempts, error, 0.0, throttled,
                gave_up=True, retry_after=retry_after, reason=reason, timed_out=timed_out))
            _note(error, operation, path, attempt, self.clock() - started, reason, budget,
                  self.stats.redact)
            return _Step(None)
        self.stats.record_retry(
            RetryEvent(operation, path, attempt, policy.max_attempts, error, delay, throttled,
                       retry_after=retry_after, timed_out=timed_out),
            slept=0.0 if sleeping_disabled() else delay)
        return _Step(delay, cost)

    def _succeeded(self, operation: str, attempts: int, last_cost: int) -> None:
        self.stats.record_success(operation, attempts)
        limiter = self.limiter
        if limiter is not None and limiter.engaged:
            limiter.succeeded(self.clock())
        budget = self.budget
        if budget is not None:  # botocore: a recovered call gives back its last retry's cost
            # (release() returns at once, without a lock, while the bucket is full; a call
            # that succeeded first time never comes here: `first_try_succeeded` refunds it)
            budget.release(last_cost)

    def _wait_failed(self, operation: str, path: str, attempt: int, error: BaseException,
                     wait_error: BaseException) -> None:
        """The backoff sleep itself failed: the storage error is what the caller gets."""
        reason = f"the wait before the next attempt failed ({type(wait_error).__name__})"
        self.stats.record_giveup(RetryEvent(
            operation, path, attempt, self.policy_for(operation).max_attempts, error, 0.0,
            gave_up=True, reason=reason))
        self.stats.record_failure(operation, attempt)
        if hasattr(error, "add_note"):
            error.add_note(self.stats.redact(
                f"retryfs: {operation} {path!r} gave up after {attempt} attempt(s): the wait "
                f"before the next attempt failed ({type(wait_error).__name__}: {wait_error})"))

    def recover(self, operation: str, path: str, fn: Callable[..., T], args: tuple[Any, ...],
                kwargs: dict[str, Any], error: Exception,
                reconcile: Callable[[BaseException], bool] | None, started: float) -> T:
        """Go on after a first attempt ``fn(*args, **kwargs)``, begun at ``started`` on this
        retrier's clock, failed with ``error``. Call it outside the ``except`` block that
        caught ``error``. The sync driver of the loop: `_Call` makes every decision.
        """
        call = _Call(self, operation, path, reconcile, started)
        token = call.publish_end()
        try:
            while True:
                call.waited(_waited(self.sleep, call.after(error)), error)
                if self.limiter is not None:
                    self.pace(operation, started)
                try:
                    result = fn(*args, **kwargs)
                except Exception as exc:  # noqa: BLE001
                    error = exc
                else:
                    call.succeeded()
                    return result
                # (outside the except block, so that the check's own errors are not chained
                # to this one: classification walks __context__, and a not-found would stick)
                if call.reconciled(error):
                    return None  # type: ignore[return-value]
        finally:
            call.withdraw_end(token)

    def _reconciled(self, operation: str, path: str, attempt: int,
                    reconcile: Callable[[BaseException], bool], error: BaseException) -> bool:
        """Whether a retry's ``error`` shows the work done; a check that fails ends the call.

        The checks retry through this engine themselves (as calls of their own); when one gives
        up, the outcome of ``operation`` is unknown: its error is raised as it came (the check's
        original exception, type kept) and ``operation`` is counted as given up, so the counters
        stay whole (attempts == calls + retries).
        """
        try:
            return bool(reconcile(error))
        except Exception as check_error:
            self._check_failed(operation, path, attempt, error, check_error)
            raise

    async def _areconciled(self, operation: str, path: str, attempt: int,
                           reconcile: Callable[[BaseException], Any],
                           error: BaseException) -> bool:
        """`_reconciled` for :meth:`acall`: ``reconcile`` may be a coroutine function."""
        try:
            outcome = reconcile(error)
            return bool(await outcome if inspect.isawaitable(outcome) else outcome)
        except Exception as check_error:
            self._check_failed(operation, path, attempt, error, check_error)
            raise

    def _check_failed(self, operation: str, path: str, attempt: int, error: BaseException,
                      check_error: Exception) -> None:
        """The bookkeeping of a check that gave up: ``operation`` is counted as given up."""
        policy = self.policy_for(operation)
        self.stats.record_giveup(RetryEvent(
            operation, path, attempt, policy.max_attempts, check_error, 0.0,
            gave_up=True, reason="the check of its outcome failed"))
        self.stats.record_failure(operation, attempt)
        if hasattr(check_error, "add_note"):
            check_error.add_note(self.stats.redact(
                f"retryfs: {operation} {path!r}: attempt {attempt} raised "
                f"{type(error).__name__}, and checking whether an earlier attempt had "
                "done the work failed"))

    # -- async -----------------------------------------------------------------------------------
    async def acall(
        self,
        operation: str,
        path: str,
        fn: Callable[..., Awaitable[T]],
        *args: Any,
        reconcile: Callable[[BaseException], Any] | None = None,
        **kwargs: Any,
    ) -> T:
        """``await fn(*args, **kwargs)`` under the same retry loop, for coroutine functions.

        Each attempt is bounded by ``timeouts[operation]`` (the attempt is cancelled and an
        :class:`~retryfs.AttemptTimeoutError`, a retryable ``TimeoutError``, raised);
        backoff waits with ``asyncio.sleep`` and never blocks the event loop. ``reconcile``
        may be a coroutine function (a check that awaits the filesystem).
        """
        timeout = self.timeouts.get(operation)

        def attempt() -> Awaitable[T]:
            if timeout is None:
                return fn(*args, **kwargs)
            return wait_for_attempt(fn(*args, **kwargs), timeout, operation, path)

        started = self.clock()  # the deadline counts the first attempt too
        if self.limiter is not None:
            await self.apace(operation, started)
        try:
            result = await attempt()
        except Exception as exc:  # noqa: BLE001 - every failure is classified
            error: Exception = exc
        else:
            self.first_try_succeeded(operation)
            return result
        # the async driver of the same loop: only the attempt and the sleep are awaited
        call = _Call(self, operation, path, reconcile, started)
        token = call.publish_end()
        try:
            while True:
                delay = call.after(error)
                wait_error: Exception | None = None
                if delay > 0 and not sleeping_disabled():
                    try:
                        await (self.async_sleep or asyncio.sleep)(delay)
                    except Exception as failed:  # noqa: BLE001 - the storage error is raised
                        wait_error = failed
                call.waited(wait_error, error)
                if self.limiter is not None:
                    await self.apace(operation, started)
                try:
                    result = await attempt()
                except Exception as exc:  # noqa: BLE001
                    error = exc
                else:
                    call.succeeded()
                    return result
                if await call.areconciled(error):
                    return None  # type: ignore[return-value]
        finally:
            call.withdraw_end(token)


class _Call:
    """One call's way through the retry loop once its first attempt failed: every decision,
    shared by the sync driver (`Retrier.recover`) and the async one (`Retrier.acall`), which
    only attempt and sleep."""

    __slots__ = ("retrier", "operation", "path", "reconcile", "started", "end", "attempt",
                 "cost")

    def __init__(self, retrier: Retrier, operation: str, path: str,
                 reconcile: Callable[[BaseException], Any] | None, started: float) -> None:
        self.retrier = retrier
        self.operation = operation
        self.path = path
        self.reconcile = reconcile
        self.started = started
        self.end = retrier._end(retrier.policy_for(operation), started)
        self.attempt = 1
        self.cost = 0

    def publish_end(self) -> contextvars.Token[Any] | None:
        """The retries' nested calls (a reopen, a replay) give up by this call's end."""
        if self.end is None:
            return None
        return _operation_end.set((self.retrier.clock, self.end))

    def withdraw_end(self, token: contextvars.Token[Any] | None) -> None:
        if token is not None:
            _operation_end.reset(token)

    def after(self, error: Exception) -> float:
        """Seconds to wait before the next attempt; raises ``error`` when the call gives up."""
        retrier = self.retrier
        step = retrier._step(self.operation, self.path, error, self.attempt, self.started,
                             self.end)
        if step.delay is None:
            retrier.stats.record_failure(self.operation, self.attempt)
            raise error
        self.cost = step.cost
        return step.delay

    def waited(self, wait_error: Exception | None, error: Exception) -> None:
        """After the wait: on to the next attempt, or ``error`` raised if the wait failed."""
        if wait_error is not None:  # never hide the storage error behind the sleep's
            self.retrier._wait_failed(self.operation, self.path, self.attempt, error,
                                      wait_error)
            raise error
        self.attempt += 1

    def reconciled(self, error: BaseException) -> bool:
        """Whether a retry's error shows an earlier attempt did the work (then: success)."""
        if self.reconcile is not None and self.retrier._reconciled(
                self.operation, self.path, self.attempt, self.reconcile, error):
            self.succeeded()
            return True
        return False

    async def areconciled(self, error: BaseException) -> bool:
        """`reconciled` for the async driver (the check may be a coroutine function)."""
        if self.reconcile is not None and await self.retrier._areconciled(
                self.operation, self.path, self.attempt, self.reconcile, error):
            self.succeeded()
            return True
        return False

    def succeeded(self) -> None:
        self.retrier._succeeded(self.operation, self.attempt, self.cost)


class Lane(Protocol):
    """Something a call holds that another could use while it sleeps out a backoff (a lane of
    a threaded tree copy): given back before the sleep, taken again after it."""

    def release(self) -> None: ...
    def acquire(self) -> None: ...


_held_lane: contextvars.ContextVar[Lane | None] = contextvars.ContextVar(
    "retryfs_held_lane", default=None)


@contextmanager
def holding(lane: Lane) -> Iterator[None]:
    """The retries of the calls made inside give ``lane`` back while they sleep."""
    token = _held_lane.set(lane)
    try:
        yield
    finally:
        _held_lane.reset(token)


def _waited(sleep: Callable[[float], None], seconds: float) -> Exception | None:
    """Sleep (the lane held, if any, given back meanwhile); the exception the sleep raised, if
    any (``KeyboardInterrupt`` goes through)."""
    lane = _held_lane.get()
    if lane is not None and seconds > 0 and not sleeping_disabled():
        lane.release()
    else:
        lane = None
    try:
        sleep(seconds)
    except Exception as exc:  # noqa: BLE001 - reported by the caller with the storage error
        return exc
    finally:
        if lane is not None:
            lane.acquire()
    return None


def _note(error: BaseException, operation: str, path: str, attempts: int, elapsed: float,
          reason: str, budget: TokenBucket | None, redact: Callable[[str], str]) -> None:
    if reason == "retry budget exhausted" and budget is not None:
        reason = (f"retry budget of {budget.endpoint} exhausted: too many retries without a "
                  "success in this process")
    note = (f"retryfs: {operation} {path!r} gave up after {attempts} attempt(s) "
            f"in {elapsed:.2f}s ({reason})")
    if hasattr(error, "add_note"):
        error.add_note(redact(note))

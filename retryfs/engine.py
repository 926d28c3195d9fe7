"""The retry loop every operation goes through.

The happy path is one call and one counter. On failure: classify, stop on a permanent error,
compute the delay, stop if retries or the deadline ran out, sleep, try again. On give-up the
last original exception is raised (same object, same type, same message) with a note of the
attempts made.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, TypeVar

from .classify import Decision, ErrorClassifier
from .policy import RetryPolicy
from .stats import RetryEvent, RetryStats

__all__ = ["Retrier", "no_sleep", "sleeping_disabled"]

T = TypeVar("T")

_no_sleep_depth = 0
_no_sleep_lock = threading.Lock()


def sleeping_disabled() -> bool:
    """True inside :func:`no_sleep` or when ``RETRYFS_NO_SLEEP=1`` is set (test mode)."""
    return _no_sleep_depth > 0 or os.environ.get("RETRYFS_NO_SLEEP", "") in ("1", "true", "yes")


@contextmanager
def no_sleep() -> Iterator[None]:
    """Test mode: retries happen at once, without waiting out the backoff schedule.

    Attempts, classification and counters behave as usual; only the sleeps are skipped.
    """
    global _no_sleep_depth
    with _no_sleep_lock:
        _no_sleep_depth += 1
    try:
        yield
    finally:
        with _no_sleep_lock:
            _no_sleep_depth -= 1


def _sleep(seconds: float) -> None:
    if seconds > 0 and not sleeping_disabled():
        time.sleep(seconds)


class Retrier:
    """Runs callables under a policy, a classifier and a stats sink.

    ``policy_for(operation)`` picks the policy of an operation (per-operation overrides);
    ``reconcile(exc)``, given per call, turns an error seen on a *retry* into success when the
    first attempt may already have done the work (a delete that now finds nothing).
    """

    def __init__(
        self,
        policy_for: Callable[[str], RetryPolicy],
        classifier: ErrorClassifier,
        stats: RetryStats,
        sleep: Callable[[float], None] = _sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.policy_for = policy_for
        self.classifier = classifier
        self.stats = stats
        self.sleep = sleep
        self.clock = clock

    def call(
        self,
        operation: str,
        path: str,
        fn: Callable[..., T],
        *args: Any,
        reconcile: Callable[[BaseException], bool] | None = None,
        **kwargs: Any,
    ) -> T:
        try:
            result = fn(*args, **kwargs)
        except Exception as first_error:  # noqa: BLE001 - every failure is classified
            return self._retry(operation, path, fn, args, kwargs, first_error, reconcile)
        self.stats.record_success(operation, 1)
        return result

    def decide(self, operation: str, path: str, error: BaseException, attempt: int,
               started: float) -> tuple[float | None, bool]:
        """``(delay before the next attempt or None to give up, whether error is retryable)``.

        Logs and counts retries and give-ups.
        """
        policy = self.policy_for(operation)
        decision = self.classifier.classify(error)
        if decision is Decision.FAIL:
            return None, False
        throttled = decision is Decision.THROTTLE
        delay = policy.delay(attempt, throttled=throttled)
        out_of_time = (policy.deadline is not None
                       and self.clock() - started + delay > policy.deadline)
        if attempt >= policy.max_attempts or out_of_time:
            self.stats.record_giveup(RetryEvent(operation, path, attempt, policy.max_attempts,
                                                error, 0.0, throttled, gave_up=True))
            _note(error, operation, path, attempt, self.clock() - started, out_of_time)
            return None, True
        self.stats.record_retry(RetryEvent(operation, path, attempt, policy.max_attempts,
                                           error, delay, throttled))
        return delay, True

    def _retry(self, operation: str, path: str, fn: Callable[..., T], args: tuple[Any, ...],
               kwargs: dict[str, Any], error: Exception,
               reconcile: Callable[[BaseException], bool] | None) -> T:
        started = self.clock()
        attempt = 1
        while True:
            delay, retryable = self.decide(operation, path, error, attempt, started)
            if delay is None:
                self.stats.record_failure(operation, attempt, gave_up=retryable)
                raise error
            self.sleep(delay)
            attempt += 1
            try:
                result = fn(*args, **kwargs)
            except Exception as exc:  # noqa: BLE001
                if reconcile is not None and reconcile(exc):
                    self.stats.record_success(operation, attempt)
                    return None  # type: ignore[return-value]
                error = exc
                continue
            self.stats.record_success(operation, attempt)
            return result


def _note(error: BaseException, operation: str, path: str, attempts: int, elapsed: float,
          out_of_time: bool) -> None:
    reason = "deadline reached" if out_of_time else "no attempts left"
    note = (f"retryfs: {operation} {path!r} gave up after {attempts} attempt(s) "
            f"in {elapsed:.2f}s ({reason})")
    if hasattr(error, "add_note"):
        error.add_note(note)

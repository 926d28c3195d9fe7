"""What happened: counters, retry events, log lines and caller hooks.

Counters live in one process (stats never travel by pickle: a wrapper unpickled on a Ray worker
starts at zero). They are exact under concurrency: every update takes one short lock.
"""

from __future__ import annotations

import logging
import threading
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["RetryEvent", "RetryStats", "logger"]

logger = logging.getLogger("retryfs")

_COUNTERS = ("calls", "attempts", "retries", "giveups", "recovered", "sleep_seconds",
             "bytes_replayed")


@dataclass(frozen=True)
class RetryEvent:
    """One failed attempt that will be retried (or, with ``gave_up``, the final failure)."""

    operation: str
    path: str
    attempt: int
    max_attempts: int
    error: BaseException
    delay: float
    throttled: bool = False
    gave_up: bool = False

    @property
    def error_class(self) -> str:
        return type(self.error).__name__


def _short(error: BaseException, limit: int = 200) -> str:
    text = " ".join(str(error).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


@dataclass
class _Counters:
    calls: int = 0
    attempts: int = 0
    retries: int = 0
    giveups: int = 0
    recovered: int = 0
    sleep_seconds: float = 0.0
    bytes_replayed: int = 0
    errors: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: getattr(self, name) for name in _COUNTERS}
        out["errors"] = dict(self.errors)
        return out


class RetryStats:
    """Thread-safe counters per operation, plus hooks called on every retry and give-up.

    ``snapshot()`` returns ``calls``, ``attempts``, ``retries`` (attempts beyond the first),
    ``giveups``, ``recovered`` (calls that succeeded after a retry), ``sleep_seconds``,
    ``bytes_replayed``, ``errors`` (retries by error class) and ``by_operation``.
    """

    def __init__(self, redact: Callable[[str], str] | None = None) -> None:
        self._lock = threading.Lock()
        self._by_op: dict[str, _Counters] = defaultdict(_Counters)
        self._on_retry: list[Callable[[RetryEvent], None]] = []
        self._on_giveup: list[Callable[[RetryEvent], None]] = []
        self._redact = redact or (lambda text: text)

    # -- hooks ------------------------------------------------------------------------------
    def on_retry(self, callback: Callable[[RetryEvent], None]) -> Callable[[RetryEvent], None]:
        """Call ``callback(event)`` before every retry sleep (usable as a decorator)."""
        self._on_retry.append(callback)
        return callback

    def on_giveup(self, callback: Callable[[RetryEvent], None]) -> Callable[[RetryEvent], None]:
        """Call ``callback(event)`` when an operation finally fails after retries."""
        self._on_giveup.append(callback)
        return callback

    # -- recording (called by the engine) -----------------------------------------------------
    def record_success(self, operation: str, attempts: int) -> None:
        with self._lock:
            counters = self._by_op[operation]
            counters.calls += 1
            counters.attempts += attempts
            if attempts > 1:
                counters.retries += attempts - 1
                counters.recovered += 1

    def record_failure(self, operation: str, attempts: int, gave_up: bool) -> None:
        """A call that raised: ``gave_up`` when it was retryable but retries ran out."""
        with self._lock:
            counters = self._by_op[operation]
            counters.calls += 1
            counters.attempts += attempts
            counters.retries += attempts - 1
            if gave_up:
                counters.giveups += 1

    def record_retry(self, event: RetryEvent) -> None:
        with self._lock:
            counters = self._by_op[event.operation]
            counters.sleep_seconds += event.delay
            counters.errors[event.error_class] += 1
        logger.warning(
            "retryfs: %s %r failed (attempt %d/%d): %s: %s; retrying in %.2fs%s",
            event.operation, self._redact(event.path), event.attempt, event.max_attempts,
            event.error_class, self._redact(_short(event.error)), event.delay,
            " (throttled)" if event.throttled else "",
        )
        for callback in self._on_retry:
            callback(event)

    def record_giveup(self, event: RetryEvent) -> None:
        logger.error(
            "retryfs: %s %r gave up after %d attempt(s): %s: %s",
            event.operation, self._redact(event.path), event.attempt, event.error_class,
            self._redact(_short(event.error)),
        )
        for callback in self._on_giveup:
            callback(event)

    def record_replay(self, operation: str, nbytes: int) -> None:
        with self._lock:
            self._by_op[operation].bytes_replayed += nbytes

    # -- reading ----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Totals and ``by_operation``: plain dicts, safe to keep or serialise."""
        with self._lock:
            by_op = {op: c.as_dict() for op, c in self._by_op.items()}
        totals: dict[str, Any] = {name: 0 for name in _COUNTERS}
        errors: dict[str, int] = defaultdict(int)
        for counters in by_op.values():
            for name in _COUNTERS:
                totals[name] += counters[name]
            for cls, count in counters["errors"].items():
                errors[cls] += count
        totals["errors"] = dict(errors)
        totals["by_operation"] = by_op
        return totals

    def reset(self) -> None:
        with self._lock:
            self._by_op.clear()

    def __repr__(self) -> str:
        snap = self.snapshot()
        return (f"RetryStats(calls={snap['calls']}, attempts={snap['attempts']}, "
                f"retries={snap['retries']}, giveups={snap['giveups']})")

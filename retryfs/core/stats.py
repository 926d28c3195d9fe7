"""What happened: counters, retry events, log lines and caller hooks.

Counters live in one process (stats never travel by pickle: a wrapper unpickled on a Ray worker
starts at zero). They are exact under concurrency: every update takes one short lock, except the
happy path's, a call that returned on its first attempt, which is one atomic ``next()`` of an
``itertools.count`` (the cost of a lock there would be a third of a wrapped metadata call). Retries
and give-ups are counted as they happen (a scrape during an outage sees them climb); calls and
attempts when a call ends, so that once no call is in flight ``attempts == calls + retries``.

Log lines (logger ``retryfs``)::

    WARNING retryfs: get_file_info 'bucket/ckpt' failed (attempt 1 of 10): OSError[SLOW_DOWN]:
            AWS Error SLOW_DOWN during HeadObject operation: ...; retrying in 2.00s (throttled)
    ERROR   retryfs: get_file_info 'bucket/ckpt' gave up after 10 attempt(s) (no attempts left):
            OSError[SLOW_DOWN]: AWS Error SLOW_DOWN during HeadObject operation: ...

Paths and messages are redacted before they are logged (keys, tokens, signatures, passwords,
URL userinfo); metrics carry operation names and error classes only, never paths.
"""

from __future__ import annotations

import errno as errno_module
import itertools
import logging
import re
import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .classify import http_status_of, provider_code_of
from .redact import basic_redact, redact, redact_and_truncate

__all__ = ["RetryEvent", "RetryStats", "all_stats", "basic_redact", "error_kind", "logger"]

logger = logging.getLogger("retryfs")

#: The counters of every operation (and of the totals), in snapshot order.
COUNTERS = ("calls", "attempts", "retries", "giveups", "recovered", "sleep_seconds",
            "bytes_replayed", "throttled", "timeouts", "budget_exhausted")
_COUNTERS = COUNTERS  # the name the first version used

def default_redact(text: str) -> str:
    """The project's one redactor (`retryfs.core.redact.redact`)."""
    return redact(text)


# -- error classes -------------------------------------------------------------------------------

_AWS_ERROR = re.compile(r"AWS Error ([A-Z][A-Z_]+)")
_HTTP_STATUS = re.compile(r"HTTP status (\d{3})")
#: The code of an S3 XML error body quoted in an error's text (obstore's, for one).
_XML_CODE = re.compile(r"<Code>(\w{1,64})</Code>")


def error_kind(error: BaseException) -> str:
    """A short, bounded name for an error: its class, and what it says when that is all it is.

    pyarrow's S3 errors are all ``OSError``; the AWS error name tells them apart:
    ``OSError[SLOW_DOWN]``, ``OSError[NETWORK_CONNECTION]``. Provider codes
    (``ClientError[SlowDown]``), the code of an S3 error body quoted in the text (obstore's
    ``GenericError[SlowDown]``), HTTP statuses (``HttpResponseError[503]``) and errno names
    (``OSError[ECONNRESET]``) likewise. Used as the error label of counters and metrics.
    """
    name = type(error).__name__
    detail: str | None = None
    text = str(error)
    found = _AWS_ERROR.search(text)
    if found:
        detail = found.group(1)
        if detail == "UNKNOWN":
            status = _HTTP_STATUS.search(text)
            detail = f"HTTP {status.group(1)}" if status else detail
    if detail is None:
        code = provider_code_of(error)  # botocore's Error.Code, azure-core's error_code
        if code is not None and code.isidentifier() and len(code) <= 64:
            detail = code
    if detail is None:
        quoted = _XML_CODE.search(text)
        detail = quoted.group(1) if quoted else None
    if detail is None:
        http_status = http_status_of(error)
        if http_status is not None:
            detail = f"HTTP {http_status}"
    if detail is None and type(error) is OSError:
        number = getattr(error, "errno", None)
        if isinstance(number, int) and number in errno_module.errorcode:
            detail = errno_module.errorcode[number]
    return f"{name}[{detail}]" if detail else name


@dataclass(frozen=True)
class RetryEvent:
    """One failed attempt that will be retried (or, with ``gave_up``, the final failure).

    ``delay`` is the wait before the next attempt (0 on a give-up); ``retry_after`` the
    server's Retry-After when the error carried one; ``reason`` why a give-up happened
    (``"no attempts left"``, ``"deadline reached"``, ``"retry budget exhausted"``).
    """

    operation: str
    path: str
    attempt: int
    max_attempts: int
    error: BaseException
    delay: float
    throttled: bool = False
    gave_up: bool = False
    retry_after: float | None = None
    reason: str = ""
    timed_out: bool = False
    error_class: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        if not self.error_class:
            object.__setattr__(self, "error_class", error_kind(self.error))


def _short(error: BaseException, redact: Callable[[str], str], limit: int = 200) -> str:
    """The error's text for a log line, on one line: redacted whole, then cut."""
    return redact_and_truncate(error, limit, lambda text: " ".join(redact(text).split()))


def _value_of(counter: itertools.count[int]) -> int:
    """How far ``counter`` has counted (``itertools.count`` has no read method; its repr is
    ``count(n)``)."""
    return int(repr(counter)[6:-1])


class _Counters:
    __slots__ = (*COUNTERS, "errors", "first_tries")

    def __init__(self) -> None:
        # calls that returned on their first attempt (the happy path): next() of a count is
        # atomic, so no lock is taken for them
        self.first_tries = itertools.count()
        self.calls = self.attempts = self.retries = self.giveups = self.recovered = 0
        self.sleep_seconds = 0.0
        self.bytes_replayed = self.throttled = self.timeouts = self.budget_exhausted = 0
        self.errors: dict[str, list[int]] = {}  # error class -> [retries, giveups]

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {name: getattr(self, name) for name in COUNTERS}
        first_tries = _value_of(self.first_tries)
        out["calls"] += first_tries
        out["attempts"] += first_tries
        out["errors"] = {cls: counts[0] for cls, counts in self.errors.items() if counts[0]}
        out["by_error"] = {cls: {"retries": counts[0], "giveups": counts[1]}
                           for cls, counts in self.errors.items()}
        return out


_registry_lock = threading.Lock()
_all_stats: weakref.WeakSet[RetryStats] = weakref.WeakSet()


_on_created: list[Callable[[RetryStats], None]] = []


def on_stats_created(callback: Callable[[RetryStats], None]) -> None:
    """Call ``callback(stats)`` for every `RetryStats` created from now on (exporters)."""
    with _registry_lock:
        if callback not in _on_created:
            _on_created.append(callback)


def all_stats() -> list[RetryStats]:
    """Every live RetryStats in this process (what the exporters export by default)."""
    with _registry_lock:
        return list(_all_stats)


class RetryStats:
    """Thread-safe counters per operation and error class, plus hooks on retry and give-up.

    ``snapshot()`` returns the totals ``calls``, ``attempts``, ``retries`` (attempts beyond the
    first), ``giveups``, ``recovered`` (calls that succeeded after a retry), ``sleep_seconds``
    (backoff actually waited), ``bytes_replayed`` (bytes written again into a fresh upload),
    ``throttled`` (retries of throttling errors), ``timeouts`` (retries after a per-attempt
    timeout), ``budget_exhausted`` (give-ups because the retry budget was empty), ``errors``
    (retries by error class), ``by_error`` (``{class: {"retries", "giveups"}}``) and
    ``by_operation`` (all of the above per filesystem method).

    ``redact`` hides secrets in the paths and messages that are logged; by default the
    project's redactor.
    """

    def __init__(self, redact: Callable[[str], str] | None = None) -> None:
        self._lock = threading.Lock()
        self._by_op: dict[str, _Counters] = {}
        self._on_retry: list[Callable[[RetryEvent], None]] = []
        self._on_giveup: list[Callable[[RetryEvent], None]] = []
        self._redact = redact or default_redact
        self._generation = 0  # bumped by reset(), so exporters can tell a reset from a lull
        with _registry_lock:
            _all_stats.add(self)
            created = tuple(_on_created)
        for callback in created:  # the Ray exporter starts itself this way (exporters.py)
            try:
                callback(self)
            except Exception:  # noqa: BLE001 - telemetry never breaks I/O
                logger.debug("retryfs: a RetryStats creation hook failed", exc_info=True)

    # -- hooks ------------------------------------------------------------------------------
    def on_retry(self, callback: Callable[[RetryEvent], None]) -> Callable[[RetryEvent], None]:
        """Call ``callback(event)`` before every retry sleep (usable as a decorator).

        Callbacks run on the thread that retries, outside any lock; an exception they raise is
        logged and otherwise ignored (telemetry never breaks I/O).
        """
        self._on_retry.append(callback)
        return callback

    def on_giveup(self, callback: Callable[[RetryEvent], None]) -> Callable[[RetryEvent], None]:
        """Call ``callback(event)`` when an operation finally fails after retries."""
        self._on_giveup.append(callback)
        return callback

    def remove_hook(self, callback: Callable[[RetryEvent], None]) -> None:
        """Stop calling ``callback`` (registered with on_retry or on_giveup)."""
        for hooks in (self._on_retry, self._on_giveup):
            while callback in hooks:
                hooks.remove(callback)

    def _run_hooks(self, hooks: list[Callable[[RetryEvent], None]], event: RetryEvent) -> None:
        for callback in list(hooks):
            try:
                callback(event)
            except Exception:  # noqa: BLE001 - a telemetry hook must not fail the I/O
                logger.warning("retryfs: %s hook %r raised; ignored", event.operation, callback,
                               exc_info=True)

    # -- recording (called by the engine) -----------------------------------------------------
    def _counters(self, operation: str) -> _Counters:
        counters = self._by_op.get(operation)
        if counters is None:
            counters = self._by_op[operation] = _Counters()
        return counters

    def record_first_try(self, operation: str) -> None:
        """A call that returned on its first attempt: the happy path's one counter."""
        counters = self._by_op.get(operation)
        if counters is None:
            with self._lock:
                counters = self._counters(operation)
        next(counters.first_tries)

    def record_success(self, operation: str, attempts: int) -> None:
        """A call that returned after ``attempts`` attempts (its retries were counted live)."""
        with self._lock:
            counters = self._by_op.get(operation)
            if counters is None:
                counters = self._by_op[operation] = _Counters()
            counters.calls += 1
            counters.attempts += attempts
            if attempts > 1:
                counters.recovered += 1

    def record_failure(self, operation: str, attempts: int) -> None:
        """A call that raised after ``attempts`` attempts (a give-up was counted live, by
        `record_giveup`)."""
        with self._lock:
            counters = self._counters(operation)
            counters.calls += 1
            counters.attempts += attempts

    def record_retry(self, event: RetryEvent, slept: float | None = None) -> None:
        """A failed attempt that will be retried after ``event.delay`` seconds.

        ``slept`` is what will really be waited (0 in test mode); ``event.delay`` by default.
        """
        with self._lock:
            counters = self._counters(event.operation)
            counters.retries += 1
            counters.sleep_seconds += event.delay if slept is None else slept
            counters.throttled += event.throttled
            counters.timeouts += event.timed_out
            per_error = counters.errors.get(event.error_class)
            if per_error is None:
                per_error = counters.errors[event.error_class] = [0, 0]
            per_error[0] += 1
        if logger.isEnabledFor(logging.WARNING):
            notes = [note for flag, note in (
                (event.throttled, "throttled"),
                (event.retry_after is not None,
                 f"Retry-After {event.retry_after:g}s" if event.retry_after is not None else ""),
            ) if flag]
            logger.warning(
                "retryfs: %s %r failed (attempt %d of %d): %s: %s; retrying in %.2fs%s",
                event.operation, self._redact(event.path), event.attempt, event.max_attempts,
                event.error_class, _short(event.error, self._redact), event.delay,
                f" ({', '.join(notes)})" if notes else "",
            )
        if self._on_retry:
            self._run_hooks(self._on_retry, event)

    def record_giveup(self, event: RetryEvent) -> None:
        """A retryable failure that will not be retried again: out of attempts, time or budget."""
        with self._lock:
            counters = self._counters(event.operation)
            counters.giveups += 1
            if event.reason == "retry budget exhausted":
                counters.budget_exhausted += 1
            per_error = counters.errors.get(event.error_class)
            if per_error is None:
                per_error = counters.errors[event.error_class] = [0, 0]
            per_error[1] += 1
        logger.error(
            "retryfs: %s %r gave up after %d attempt(s)%s: %s: %s",
            event.operation, self._redact(event.path), event.attempt,
            f" ({event.reason})" if event.reason else "", event.error_class,
            _short(event.error, self._redact),
        )
        if self._on_giveup:
            self._run_hooks(self._on_giveup, event)

    def record_replay(self, operation: str, nbytes: int) -> None:
        with self._lock:
            self._counters(operation).bytes_replayed += nbytes

    def redact(self, text: str) -> str:
        """``text`` with secrets hidden, the way log lines are."""
        return self._redact(text)

    # -- reading ----------------------------------------------------------------------------
    def snapshot(self) -> dict[str, Any]:
        """Totals and ``by_operation``: plain dicts, safe to keep or serialise."""
        with self._lock:
            by_op = {op: c.as_dict() for op, c in self._by_op.items()}
        totals: dict[str, Any] = {name: 0 for name in COUNTERS}
        totals["sleep_seconds"] = 0.0
        errors: dict[str, int] = {}
        by_error: dict[str, dict[str, int]] = {}
        for counters in by_op.values():
            for name in COUNTERS:
                totals[name] += counters[name]
            for cls, counts in counters["by_error"].items():
                mine = by_error.setdefault(cls, {"retries": 0, "giveups": 0})
                mine["retries"] += counts["retries"]
                mine["giveups"] += counts["giveups"]
                if counts["retries"]:
                    errors[cls] = errors.get(cls, 0) + counts["retries"]
        totals["errors"] = errors
        totals["by_error"] = by_error
        totals["by_operation"] = by_op
        return totals

    def reset(self) -> None:
        """Zero every counter (hooks stay registered)."""
        with self._lock:
            self._by_op.clear()
            self._generation += 1

    def _export(self) -> tuple[int, dict[str, dict[str, Any]]]:
        """``(generation, by_operation)`` read together, for exporters that push deltas."""
        with self._lock:
            return self._generation, {op: c.as_dict() for op, c in self._by_op.items()}

    def __repr__(self) -> str:
        snap = self.snapshot()
        return (f"RetryStats(calls={snap['calls']}, attempts={snap['attempts']}, "
                f"retries={snap['retries']}, giveups={snap['giveups']})")

"""How long to keep trying and how long to wait: `RetryPolicy` and per-operation overrides.

A policy is one immutable, validated value (in the spirit of ``urllib3.util.Retry``): it is
safe to share between threads and to pickle to Ray workers. The delay schedule itself comes
from the ``backoff`` package (exponential, capped, full jitter).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import backoff

__all__ = ["RetryPolicy", "OPERATION_GROUPS", "GROUPS", "group_of", "resolve_overrides"]

#: Which policy group each pyarrow ``FileSystemHandler`` method belongs to.
OPERATION_GROUPS: dict[str, str] = {
    "get_file_info": "metadata",
    "get_file_info_selector": "metadata",
    "create_dir": "metadata",
    "normalize_path": "metadata",
    "open_input_stream": "read",
    "open_input_file": "read",
    "read": "read",
    "open_output_stream": "write",
    "open_append_stream": "write",
    "write": "write",
    "flush": "write",
    "close": "write",
    "delete_dir": "delete",
    "delete_dir_contents": "delete",
    "delete_root_dir_contents": "delete",
    "delete_file": "delete",
    "move": "move",
    "copy_file": "move",
}

#: The groups a per-operation override can name (besides a method name itself).
GROUPS: tuple[str, ...] = ("metadata", "read", "write", "delete", "move")


def group_of(operation: str) -> str | None:
    """The policy group of a filesystem method name (``None`` if it has none)."""
    return OPERATION_GROUPS.get(operation)


def _check_number(name: str, value: Any, *, low: float, low_inclusive: bool = True,
                  integer: bool = False) -> None:
    kind = "an int" if integer else "a number"
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise TypeError(f"RetryPolicy.{name} must be {kind}, got {type(value).__name__} {value!r}")
    if not math.isfinite(value) or value < low or (value == low and not low_inclusive):
        bound = f">= {low}" if low_inclusive else f"> {low}"
        raise ValueError(f"RetryPolicy.{name} must be a finite number {bound}, got {value!r}")


@dataclass(frozen=True)
class RetryPolicy:
    """When to retry a failed storage operation and how long to wait in between.

    - ``max_attempts``: attempts in all, the first included (1 disables retries).
    - ``initial_delay`` / ``multiplier`` / ``max_delay``: the exponential schedule in seconds:
      ``initial_delay * multiplier ** (retry - 1)``, capped at ``max_delay``.
    - ``jitter``: full jitter (a uniform draw in ``[0, delay]``) so that many workers hit by the
      same outage do not retry in lock step; turn it off for deterministic tests.
    - ``deadline``: bounds one operation's total time, sleeps included (``None``: no bound).
      No sleep is started that would end past it.
    - ``throttle_factor``: throttling errors (SlowDown, 429) wait this many times longer.
    """

    max_attempts: int = 10
    initial_delay: float = 1.0
    multiplier: float = 2.0
    max_delay: float = 32.0
    jitter: bool = True
    deadline: float | None = None
    throttle_factor: float = 2.0

    def __post_init__(self) -> None:
        _check_number("max_attempts", self.max_attempts, low=1, integer=True)
        _check_number("initial_delay", self.initial_delay, low=0)
        _check_number("multiplier", self.multiplier, low=1)
        _check_number("max_delay", self.max_delay, low=0)
        _check_number("throttle_factor", self.throttle_factor, low=1)
        if not isinstance(self.jitter, bool):
            raise TypeError(f"RetryPolicy.jitter must be a bool, got {self.jitter!r}")
        if self.deadline is not None:
            _check_number("deadline", self.deadline, low=0, low_inclusive=False)
        if self.max_delay < self.initial_delay:
            raise ValueError(
                f"RetryPolicy.max_delay ({self.max_delay!r}) must be >= "
                f"initial_delay ({self.initial_delay!r})"
            )

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    def replace(self, **changes: Any) -> RetryPolicy:
        """A copy with some fields changed (validated like a new policy)."""
        unknown = set(changes) - set(self.field_names())
        if unknown:
            raise ValueError(
                f"unknown RetryPolicy field(s) {sorted(unknown)}; "
                f"valid: {', '.join(self.field_names())}"
            )
        return dataclasses.replace(self, **changes)

    @classmethod
    def no_retries(cls) -> RetryPolicy:
        return cls(max_attempts=1)

    def delay(self, retry: int, *, throttled: bool = False,
              rng: random.Random | None = None) -> float:
        """Seconds to sleep before retry number ``retry`` (1 for the first retry)."""
        if retry < 1:
            raise ValueError(f"retry must be >= 1, got {retry}")
        factor = self.initial_delay * (self.throttle_factor if throttled else 1.0)
        schedule = backoff.expo(base=self.multiplier, factor=factor, max_value=self.max_delay)
        next(schedule)  # backoff generators are primed with one send(None)
        for _ in range(min(retry, 64) - 1):
            next(schedule)
        value = min(float(next(schedule)), self.max_delay)
        if self.jitter:
            return (rng or random).uniform(0.0, value)
        return value


def resolve_overrides(
    policy: RetryPolicy, per_operation: Mapping[str, RetryPolicy | Mapping[str, Any]] | None
) -> dict[str, RetryPolicy]:
    """Turn ``{"write": {"max_attempts": 20}, "get_file_info": RetryPolicy(...)}`` into policies.

    Keys are group names (``metadata``, ``read``, ``write``, ``delete``, ``move``) or method
    names; a mapping value overrides fields of the base ``policy``.
    """
    resolved: dict[str, RetryPolicy] = {}
    for key, value in (per_operation or {}).items():
        if key not in GROUPS and key not in OPERATION_GROUPS:
            raise ValueError(
                f"per_operation key {key!r} is neither a group ({', '.join(GROUPS)}) "
                f"nor an operation ({', '.join(sorted(OPERATION_GROUPS))})"
            )
        if isinstance(value, RetryPolicy):
            resolved[key] = value
        elif isinstance(value, Mapping):
            resolved[key] = policy.replace(**dict(value))
        else:
            raise TypeError(
                f"per_operation[{key!r}] must be a RetryPolicy or a mapping of its fields, "
                f"got {type(value).__name__}"
            )
    return resolved

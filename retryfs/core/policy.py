"""How long to keep trying and how long to wait: `RetryPolicy` and per-operation overrides.

A policy is one immutable, validated value (in the spirit of ``urllib3.util.Retry``): it is
safe to share between threads and to pickle to Ray workers. It holds two delay schedules, one
per kind of failure: a fast one for transient failures (a reset, a 500, a timeout), a slow one
for throttling that persists (SlowDown, 429). Each schedule comes from the ``backoff`` package
(exponential, capped, full jitter).
"""

from __future__ import annotations

import dataclasses
import math
import random
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import backoff

__all__ = ["ALL_OPERATION_GROUPS", "FSSPEC_GROUPS", "GROUPS", "LIMITS", "OPERATION_GROUPS",
           "RetryPolicy", "resolve_overrides"]

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
    "copy_files": "write",  # one file of a pyarrow.fs.copy_files onto a retryfs destination
    "upload_part": "write",  # one part of an fsspec (s3fs) upload, retried in place
    "commit": "write",  # the commit request of an fsspec (s3fs) upload, retried in place
    "start_upload": "write",  # the CreateMultipartUpload of an fsspec (s3fs) upload, in place
    "verify": "metadata",  # the read-after-write check after a commit
    "delete_dir": "delete",
    "delete_dir_contents": "delete",
    "delete_root_dir_contents": "delete",
    "delete_file": "delete",
    "move": "move",
    "copy_file": "move",
}

#: The policy group of each operation of the fsspec face (its method names without the leading
#: underscore), besides the pyarrow names of `OPERATION_GROUPS`.
FSSPEC_GROUPS: dict[str, str] = {
    **{name: "metadata" for name in (
        "ls", "listdir", "info", "stat", "exists", "lexists", "isdir", "isfile", "size",
        "sizes", "checksum", "ukey", "created", "modified", "find", "glob", "walk", "du",
        "disk_usage", "expand_path", "mkdir", "makedir", "makedirs", "mkdirs", "sign", "tree")},
    **{name: "read" for name in (
        "cat_file", "cat", "cat_ranges", "get_file", "get", "download", "head", "tail",
        "read_block", "read_text", "read_bytes", "open_input_file", "open_input_stream",
        "read")},
    **{name: "write" for name in (
        "pipe_file", "pipe", "put_file", "put", "upload", "touch", "write_text", "write_bytes",
        "open_output_stream", "open_append_stream", "write", "flush", "close", "commit")},
    **{name: "delete" for name in ("rm_file", "rm", "delete", "rmdir")},
    **{name: "move" for name in ("cp_file", "copy", "cp", "mv", "move", "rename", "mv_file")},
}

#: Every operation name of either face with its group.
ALL_OPERATION_GROUPS: dict[str, str] = {**OPERATION_GROUPS, **FSSPEC_GROUPS}

#: The groups a per-operation override can name (besides a method name itself).
GROUPS: tuple[str, ...] = ("metadata", "read", "write", "delete", "move")

#: The documented range of each numeric field: ``(low, high, low_inclusive)``. The upper bounds
#: keep every delay and deadline a number ``time.sleep`` and the clock can take (a day of
#: waiting, a million attempts), so the schedule can never overflow.
LIMITS: dict[str, tuple[float, float, bool]] = {
    "max_attempts": (1, 1_000_000, True),
    "initial_delay": (0, 86_400, True),
    "multiplier": (1, 100, True),
    "max_delay": (0, 86_400, True),
    "deadline": (0, 31_536_000, False),
    "throttle_delay": (0, 86_400, True),
    "throttle_factor": (1, 100, True),
    "fast_throttle_retries": (0, 1_000_000, True),
}

#: The fields that are whole numbers.
_INTEGERS = ("max_attempts", "fast_throttle_retries")


def describe_range(name: str) -> str:
    """``name``'s documented range as text (``an int in [1, 1000000]``...)."""
    low, high, inclusive = LIMITS[name]
    kind = "an int" if name in _INTEGERS else "a number"
    return f"{kind} in {'[' if inclusive else '('}{low:g}, {high:g}]"


def _check_number(name: str, value: Any) -> None:
    integer = name in _INTEGERS
    if isinstance(value, bool) or not isinstance(value, int if integer else (int, float)):
        raise TypeError(f"RetryPolicy.{name} must be {describe_range(name)}, got "
                        f"{type(value).__name__} {value!r}")
    low, high, inclusive = LIMITS[name]
    # compared as exact numbers first: float(10**400) itself would overflow
    if not (low < value <= high or (inclusive and value == low)) or (
            isinstance(value, float) and not math.isfinite(value)):
        raise ValueError(f"RetryPolicy.{name} must be {describe_range(name)}, got {value!r}")


@dataclass(frozen=True)
class RetryPolicy:
    """When to retry a failed storage operation and how long to wait in between.

    Two schedules, chosen by the kind of failure:

    - transient (a reset, a 500, a timeout, a truncated body): the first retry waits
      ``initial_delay`` (0.1 s), each next one ``multiplier`` times longer. A transient fault
      says nothing about the server's load, so the retry goes out almost at once (object_store
      starts at 100 ms; botocore's standard mode at 50 ms).
    - throttling (SlowDown, 429, ``ServerBusy``) that persists: ``throttle_delay`` (1 s)
      times ``multiplier`` to the power of the retry's number less one, and never less than
      the server's ``Retry-After``. Throttling that persists means the server wants less
      traffic: retrying in 100 ms would make the storm worse (botocore keeps 1 s for
      throttling; AWS asks for exponential backoff from about a second).
    - an isolated throttle: a request's first ``fast_throttle_retries`` (2) retries after a
      throttle go on the transient schedule while the endpoint is not in a throttle storm
      (its rate limiter is not engaged). A lone SlowDown among successes costs a wait of at
      most 100 ms, not of up to a second: the AWS CRT (under s3torchconnector) retries every
      error on a 25 ms scale, object_store from 100 ms. Two, because a retry that meets a
      second random SlowDown is no sign of a storm either (at 5 % of requests throttled, one
      retry in twenty meets one: 4 in 8 DCP loads of a 200 MiB state_dict, measured on
      moto), and the rate limiter, not this count, is what recognises a storm. The
      request's next throttle, and every throttle during a storm, waits the throttle
      schedule; ``Retry-After`` is always honoured.

    Fields:

    - ``max_attempts``: attempts in all, the first included (1 disables retries); 1 to 10**6.
    - ``initial_delay`` / ``multiplier`` / ``max_delay``: the transient schedule in seconds:
      ``initial_delay * multiplier ** (retry - 1)``, capped at ``max_delay`` (delays 0 to
      86400 s, one day; multiplier 1 to 100).
    - ``throttle_delay``: the throttle schedule's first delay (0 to 86400 s); it grows by the
      same ``multiplier`` and stops at the same ``max_delay``.
    - ``fast_throttle_retries``: how many of a request's first retries may follow a throttle
      on the transient schedule outside a storm (0 to 10**6; 0: every throttle waits the
      throttle schedule).
    - ``jitter``: full jitter (a uniform draw in ``[0, delay]``) so that many workers hit by the
      same outage do not retry in lock step; turn it off for deterministic tests.
    - ``deadline``: bounds one operation's total time, sleeps included (``None``: no bound;
      else more than 0, at most a year). No sleep is started that would end past it.
    - ``throttle_factor``: deprecated (1 to 100): the throttle schedule as ``initial_delay``
      times this factor, its meaning before ``throttle_delay``; given, it sets
      ``throttle_delay`` and warns.

    A value out of its range is a ``ValueError`` naming the field and the range.

    Example::

        RetryPolicy(max_attempts=8, initial_delay=0.05, throttle_delay=2.0, deadline=600)
    """

    max_attempts: int = 10
    initial_delay: float = 0.1
    multiplier: float = 2.0
    max_delay: float = 32.0
    jitter: bool = True
    deadline: float | None = None
    throttle_delay: float = 1.0
    throttle_factor: float | None = None
    fast_throttle_retries: int = 2

    def __post_init__(self) -> None:
        for name in ("max_attempts", "initial_delay", "multiplier", "max_delay",
                     "throttle_delay", "fast_throttle_retries"):
            _check_number(name, getattr(self, name))
        if not isinstance(self.jitter, bool):
            raise TypeError(f"RetryPolicy.jitter must be a bool, got {self.jitter!r}")
        if self.deadline is not None:
            _check_number("deadline", self.deadline)
        if self.max_delay < self.initial_delay:
            raise ValueError(
                f"RetryPolicy.max_delay ({self.max_delay!r}) must be >= "
                f"initial_delay ({self.initial_delay!r})"
            )
        if self.throttle_factor is not None:
            _check_number("throttle_factor", self.throttle_factor)
            warnings.warn("RetryPolicy.throttle_factor is deprecated: set throttle_delay (the "
                          "throttle schedule's first delay, in seconds) instead",
                          DeprecationWarning, stacklevel=3)
            # the old meaning, kept: throttles wait `throttle_factor` times the transient delay
            object.__setattr__(self, "throttle_delay", self.initial_delay * self.throttle_factor)
            object.__setattr__(self, "throttle_factor", None)

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

    def throttle_schedule(self, retry: int, *, storm: bool = False) -> bool:
        """Whether retry number ``retry`` after a throttle waits the throttle schedule: past
        the request's ``fast_throttle_retries``, or at once during a ``storm`` (the endpoint's
        rate limiter engaged)."""
        return storm or retry > self.fast_throttle_retries

    def delay(self, retry: int, *, throttled: bool = False,
              rng: random.Random | None = None) -> float:
        """Seconds to sleep before retry number ``retry`` (1 for the first retry), on the
        throttle schedule when ``throttled``, else on the transient one."""
        if retry < 1:
            raise ValueError(f"retry must be >= 1, got {retry}")
        first = self.throttle_delay if throttled else self.initial_delay
        schedule = backoff.expo(base=self.multiplier, factor=first, max_value=self.max_delay)
        next(schedule)  # backoff generators are primed with one send(None)
        for _ in range(min(retry, 64) - 1):
            next(schedule)
        try:
            value = min(float(next(schedule)), self.max_delay)
        except OverflowError:  # base ** retry past a float: the cap applies
            value = float(self.max_delay)
        if self.jitter:
            return (rng or random).uniform(0.0, value)
        return value


def resolve_overrides(
    policy: RetryPolicy, per_operation: Mapping[str, RetryPolicy | Mapping[str, Any]] | None,
    *, check: bool = True,
) -> dict[str, RetryPolicy]:
    """Turn ``{"write": {"max_attempts": 20}, "get_file_info": RetryPolicy(...)}`` into policies.

    Keys are group names (``metadata``, ``read``, ``write``, ``delete``, ``move``) or method
    names; a mapping value overrides fields of the base ``policy``. ``check``: keys must be
    groups or pyarrow operation names (the settings check other faces' names themselves).
    """
    resolved: dict[str, RetryPolicy] = {}
    for key, value in (per_operation or {}).items():
        if check and key not in GROUPS and key not in OPERATION_GROUPS:
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

"""A wrapper's settings: one frozen `WrapperConfig`, the options it holds, and how they merge.

Every option of a retryfs wrapper is written here once: its type, default, range and
``RETRYFS_*`` / ``retry_*`` name (`PARAMETERS`). Both faces (`retryfs.RetryingFileSystem`,
the fsspec ``retry`` protocol), `retryfs.from_uri`, the ``retryfs`` command and `retryfs.copy`
take a `WrapperConfig` and hand it on whole; converting between faces, pickling to a Ray
worker and comparing two wrappers are all about this one value.

Layers, lowest first (`merge`): built-in defaults, ``RETRYFS_*`` environment variables, code
(keyword arguments), URL parameters / protocol options. A value is checked once, when the
`WrapperConfig` is built: a wrong type is a ``TypeError``, a value out of range or a string that
does not parse a ``ValueError`` naming the option.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import os
import re
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, cast

from retryfs.core.budget import RetryBudget, normalize_budget
from retryfs.core.classify import ErrorClassifier
from retryfs.core.policy import ALL_OPERATION_GROUPS, GROUPS, RetryPolicy, resolve_overrides
from retryfs.core.ratelimit import RateLimit, normalize_rate_limit
from retryfs.core.stats import RetryStats
from retryfs.core.timeouts import (
    DEFAULT_MIN_THROUGHPUT,
    DEFAULT_WRITE_TIMEOUT,
    TIMED_GROUPS,
    resolve_timeouts,
)

__all__ = [
    "BACKENDS",
    "CODE_ONLY",
    "Configured",
    "DEFAULT_SPOOL_MEMORY",
    "Default",
    "Layer",
    "OPTIONS",
    "PARAMETERS",
    "Parameter",
    "RENAMED",
    "WrapperConfig",
    "config_from_env",
    "config_from_options",
    "config_from_query",
    "default",
    "given",
    "merge",
    "renamed",
]

#: Bytes of a write kept in memory for replay before the spool spills to a temporary file.
DEFAULT_SPOOL_MEMORY = 32 * 1024 * 1024
#: The most attempts the storage client may make inside one retryfs attempt.
CLIENT_ATTEMPTS_MAX = 100
BACKENDS = ("auto", "arrow", "fsspec")
#: What may carry the small files of a ``copy_files`` to and from pyarrow's S3
#: (`retryfs.arrow.obstore_small`): pyarrow's own client, obstore, or obstore where it can.
ONE_PART_CLIENTS = ("arrow", "obstore", "auto")
OnePartClient = Literal["arrow", "obstore", "auto"]
#: What reads the files the fsspec face opens on s3fs (`retryfs.fsspec.native`): s3fs's own
#: files, pyarrow's S3 client with s3fs's settings, or pyarrow's where the settings carry over.
FILE_CLIENTS = ("fsspec", "arrow", "auto")
FileClient = Literal["fsspec", "arrow", "auto"]
_PREFIX = "retry_"
_ENV_PREFIX = "RETRYFS_"

#: The options of a wrapper, in the order of `WrapperConfig`'s fields.
OPTIONS: tuple[str, ...] = ("policy", "per_operation", "classifier", "retryable_messages",
                            "verify_writes", "spool_memory", "budget", "rate_limit", "timeout",
                            "client_attempts", "client_write_attempts", "one_part_client",
                            "file_client", "write_timeout", "min_throughput", "stats")

#: Options renamed since 0.1.0 (keyword, ``retry_*`` URL parameter, ``RETRYFS_*`` variable,
#: protocol option): the old spelling still works, with a ``DeprecationWarning`` naming the new.
RENAMED: dict[str, str] = {"native_attempts": "client_attempts",
                           "native_write_attempts": "client_write_attempts"}


def renamed(options: Mapping[str, Any], *, warn: bool = True,
            shown: Callable[[str], str] = repr) -> dict[str, Any]:
    """``options`` with each old spelling of `RENAMED` under its new name (a
    ``DeprecationWarning`` names both; the two spellings at once are a ``TypeError``)."""
    out = dict(options)
    for old, new in RENAMED.items():
        if old not in out:
            continue
        if new in out:
            raise TypeError(f"{shown(old)} and {shown(new)} are one option: give {shown(new)}")
        if warn:
            warn_renamed(old, shown)
        out[new] = out.pop(old)
    return out


def warn_renamed(old: str, shown: Callable[[str], str] = repr) -> None:
    """The ``DeprecationWarning`` of an old spelling of `RENAMED`, naming the new one."""
    warnings.warn(f"{shown(old)} is deprecated: it is now {shown(RENAMED[old])}",
                  DeprecationWarning, stacklevel=4)


# -- one wrapper's settings ----------------------------------------------------------------------

def _type_error(name: str, expected: str, value: Any) -> TypeError:
    return TypeError(f"{name} must be {expected}, got {type(value).__name__} {value!r}")


@dataclass(frozen=True, eq=False)
class WrapperConfig:
    """Every setting of one retryfs wrapper, checked, immutable, shared by both faces.

    - ``policy``: the base `RetryPolicy`; ``per_operation``: ``{group or operation: policy}``
      (a mapping of fields is applied over ``policy``).
    - ``classifier`` and ``retryable_messages`` (extra texts that mean transient).
    - ``verify_writes`` (bool), ``spool_memory`` (bytes >= 0), ``budget`` (a `RetryBudget`,
      True for the default one, False/None for none), ``rate_limit`` (a `RateLimit`, or its
      mode ``"auto"``, ``"on"``, ``"off"``; True/False), ``timeout`` (seconds per attempt of the
      read and metadata operations, or ``{group or operation: seconds}``), ``client_attempts``
      (1 to 100, or None: leave the client's own retries alone), ``client_write_attempts``
      (the same for the requests of write streams; None: 3 when ``client_attempts`` is set, so
      that the SDK re-sends a failed part alone), ``one_part_client`` (``"arrow"``,
      ``"obstore"`` or ``"auto"``: the client that carries the small files of a
      ``copy_files`` to and from pyarrow's S3, see `retryfs.arrow.obstore_small`),
      ``file_client`` (``"fsspec"``, ``"arrow"`` or ``"auto"``: what reads and writes the files
      the fsspec face opens on s3fs, see `retryfs.fsspec.native`).
    - ``write_timeout`` (seconds, or None: writes untimed) and ``min_throughput`` (bytes/s):
      each write, flush or commit attempt of an output stream may take ``write_timeout`` plus
      its bytes in flight at ``min_throughput`` (both faces; the async face's writers are not
      replayed: a timed-out one is discarded and the timeout raised).
    - ``stats``: the `RetryStats` to count into. It is state, not configuration: it takes no
      part in equality and does not travel by pickle (a worker counts afresh).

    Bools also take exactly ``true``/``false``, ``1``/``0``, ``yes``/``no`` (any case), sizes
    ``32MiB``-style strings. `policy_for` picks an operation's policy.

    A `WrapperConfig` is complete: handed to a face or to `retryfs.from_uri` as ``config=``, the
    environment does not fill it in again (URL parameters and protocol options still apply).
    """

    policy: RetryPolicy = field(default_factory=RetryPolicy)
    per_operation: Mapping[str, RetryPolicy | Mapping[str, object]] = field(default_factory=dict)
    classifier: ErrorClassifier = field(default_factory=ErrorClassifier)
    retryable_messages: Sequence[str] = ()
    verify_writes: bool = True
    spool_memory: int | str = DEFAULT_SPOOL_MEMORY
    budget: RetryBudget | bool | None = True
    rate_limit: RateLimit | str | bool = "auto"
    timeout: float | Mapping[str, float] | None = None
    client_attempts: int | None = None
    client_write_attempts: int | None = None
    one_part_client: OnePartClient = "arrow"
    file_client: FileClient = "fsspec"
    write_timeout: float | None = DEFAULT_WRITE_TIMEOUT
    min_throughput: float = DEFAULT_MIN_THROUGHPUT
    stats: RetryStats | None = None

    def __post_init__(self) -> None:
        def put(name: str, value: Any) -> None:
            object.__setattr__(self, name, value)

        if not isinstance(self.policy, RetryPolicy):
            raise _type_error("policy", "a RetryPolicy", self.policy)
        if not isinstance(self.per_operation, Mapping):
            raise _type_error("per_operation", "a mapping of group or operation to a "
                              "RetryPolicy (or a mapping of its fields)", self.per_operation)
        for key in self.per_operation:
            if not isinstance(key, str) or not key:
                raise _type_error("per_operation key", "a group or operation name", key)
        # names are checked by the face that uses them (`check_operation_names`): the fsspec
        # face's are fsspec's methods and its inner filesystem's own (s3fs's ``get_tags``)
        put("per_operation", resolve_overrides(self.policy, self.per_operation, check=False))
        if not isinstance(self.classifier, ErrorClassifier):
            raise _type_error("classifier", "an ErrorClassifier", self.classifier)
        messages = self.retryable_messages
        if isinstance(messages, (str, bytes)) or not isinstance(messages, Iterable):
            raise _type_error("retryable_messages", "a sequence of strings (not a string)",
                              messages)
        messages = tuple(messages)
        for text in messages:
            if not isinstance(text, str):
                raise _type_error("retryable_messages item", "a string", text)
        put("retryable_messages", tuple(dict.fromkeys(messages)))
        put("verify_writes", _checked("verify_writes", _bool, self.verify_writes))
        put("spool_memory", _checked("spool_memory", _size, self.spool_memory))
        budget = self.budget
        if isinstance(budget, str):
            budget = _checked("budget", _bool, budget)
        put("budget", normalize_budget(budget))
        put("rate_limit", _checked("rate_limit", normalize_rate_limit, self.rate_limit))
        put("timeout", _timeout_spec(self.timeout))
        put("client_attempts", _checked("client_attempts", _client_attempts,
                                        self.client_attempts))
        put("client_write_attempts", _checked("client_write_attempts", _client_attempts,
                                              self.client_write_attempts))
        put("one_part_client", _checked("one_part_client", _one_part_client,
                                        self.one_part_client))
        put("file_client", _checked("file_client", _file_client, self.file_client))
        put("write_timeout", _checked("write_timeout", _seconds_or_none, self.write_timeout))
        put("min_throughput", _checked("min_throughput", _throughput, self.min_throughput))
        if self.stats is not None and not isinstance(self.stats, RetryStats):
            raise _type_error("stats", "a RetryStats (or None)", self.stats)
        effective = self.classifier
        if messages:
            effective = effective.with_messages(
                m for m in self.retryable_messages if m not in effective.retryable_messages)
        put("_effective_classifier", effective)

    # -- use -------------------------------------------------------------------------------------
    @property
    def effective_classifier(self) -> ErrorClassifier:
        """``classifier`` with ``retryable_messages`` added: what decides."""
        return cast("ErrorClassifier", self.__dict__["_effective_classifier"])

    def policy_for(self, operation: str,
                   groups: Mapping[str, str] = ALL_OPERATION_GROUPS) -> RetryPolicy:
        """The policy of an operation: its own override, else its group's, else ``policy``."""
        overrides = self.per_operation
        if overrides:
            found = overrides.get(operation)
            if found is not None:
                return cast(RetryPolicy, found)  # resolved in __post_init__
            group = groups.get(operation)
            if group is not None and group in overrides:
                return cast(RetryPolicy, overrides[group])
        return self.policy

    def timeouts_for(self, operation_groups: Mapping[str, str]) -> dict[str, float]:
        """``{operation: seconds}`` for the operations of one face (its names and groups)."""
        return resolve_timeouts(cast("Mapping[str, float]", self.timeout) or None,
                               operation_groups, strict=False)

    def replace(self, **changes: Any) -> WrapperConfig:
        """A copy with some options changed (checked like a new one)."""
        changes = renamed(changes)
        _check_names(changes, "WrapperConfig option")
        return dataclasses.replace(self, **changes)

    def options(self) -> dict[str, Any]:
        """The options as keyword arguments (``WrapperConfig(**c.options()) == c``)."""
        return {name: getattr(self, name) for name in OPTIONS}

    # -- identity --------------------------------------------------------------------------------
    def _key(self) -> tuple[Any, ...]:
        return (self.policy, tuple(sorted(self.per_operation.items())), self.classifier,
                self.retryable_messages, self.verify_writes, self.spool_memory, self.budget,
                self.rate_limit,
                tuple(sorted(cast("Mapping[str, float]", self.timeout).items())),
                self.client_attempts,
                self.client_write_attempts, self.one_part_client, self.file_client,
                self.write_timeout,
                self.min_throughput)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, WrapperConfig):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled without ``stats``: counters are per process."""
        options = self.options()
        del options["stats"]
        return (_rebuild_config, (options,))


class Configured:
    """What both faces show of their settings (``retry_config``), read-only."""

    retry_config: WrapperConfig

    @property
    def policy(self) -> RetryPolicy:
        return self.retry_config.policy

    @property
    def per_operation(self) -> Mapping[str, RetryPolicy]:
        return cast(Mapping[str, RetryPolicy], self.retry_config.per_operation)  # resolved

    @property
    def classifier(self) -> ErrorClassifier:
        return self.retry_config.effective_classifier

    @property
    def stats(self) -> RetryStats:
        stats = self.retry_config.stats
        assert stats is not None  # a face sets one when it is built
        return stats

    @property
    def verify_writes(self) -> bool:
        return self.retry_config.verify_writes

    @property
    def spool_memory(self) -> int:
        return cast(int, self.retry_config.spool_memory)  # parsed

    @property
    def budget(self) -> RetryBudget | None:
        return cast("RetryBudget | None", self.retry_config.budget)  # normalized

    @property
    def client_attempts(self) -> int | None:
        return self.retry_config.client_attempts

    @property
    def client_write_attempts(self) -> int | None:
        return self.retry_config.client_write_attempts

    @property
    def one_part_client(self) -> OnePartClient:
        return self.retry_config.one_part_client

    @property
    def file_client(self) -> FileClient:
        return self.retry_config.file_client


def _rebuild_config(options: dict[str, Any]) -> WrapperConfig:
    return WrapperConfig(**renamed(options, warn=False))  # a pickle of 0.1.0 has old names


_dataclass_init = WrapperConfig.__init__


@functools.wraps(_dataclass_init)
def _init_accepting_old_names(self: WrapperConfig, *args: Any, **options: Any) -> None:
    _dataclass_init(self, *args, **renamed(options))


WrapperConfig.__init__ = _init_accepting_old_names  # type: ignore[method-assign]
_FIELDS = {f.name: f for f in dataclasses.fields(WrapperConfig)}
#: The options only code can give (objects: no URL parameter, no environment variable), whose
#: signature default is None: "not given", the default built when needed.
CODE_ONLY = frozenset({"policy", "per_operation", "classifier", "stats"})


class Default:
    """The default of an option in a public signature (``verify_writes: bool = default(...)``).

    It shows as the value it stands for (``help()``, an IDE) and marks the option as not given,
    so that ``config=``, the ``RETRYFS_*`` environment and URL parameters still apply beneath
    what the code gave (an explicit default in the signature could not tell them apart)."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def __repr__(self) -> str:
        return repr(self.value)


def default(name: str) -> Any:
    """`WrapperConfig`'s default of option ``name``, as a `Default` (typed to fit the
    signature's annotation of the option)."""
    return Default(_FIELDS[name].default)


def given(values: Mapping[str, Any]) -> dict[str, Any]:
    """The options among ``values`` (a signature's arguments) that the caller gave: neither a
    `Default` nor None for the options built when absent (policy, per_operation, classifier,
    stats)."""
    return {name: value for name, value in values.items() if name in _FIELDS
            and not isinstance(value, Default) and not (value is None and name in CODE_ONLY)}


def _checked(name: str, parse: Callable[[Any], Any], value: Any) -> Any:
    try:
        return parse(value)
    except (TypeError, ValueError) as exc:
        raise type(exc)(f"{name}: {exc}") from None


def checked_size(name: str, value: Any) -> int:
    """A size in bytes (an int >= 0, or a string such as ``32MiB``); an error names ``name``."""
    return cast(int, _checked(name, _size, value))


def _timeout_spec(value: Any) -> dict[str, float]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        spec = dict(value)
    elif isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _type_error("timeout", "seconds (a number), a mapping of group or operation to "
                          "seconds, or None", value)
    else:
        spec = {group: value for group in TIMED_GROUPS}
    resolve_timeouts(spec, ALL_OPERATION_GROUPS)  # checks names, groups and seconds
    return {key: float(seconds) for key, seconds in spec.items()}


def _check_names(given: Mapping[str, Any], what: str) -> None:
    unknown = [name for name in given if name not in OPTIONS]
    if unknown:
        name = unknown[0]
        close = difflib.get_close_matches(str(name), OPTIONS, n=1, cutoff=0.75)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise TypeError(f"unknown {what} {name!r}{hint}; valid: {', '.join(OPTIONS)}")


def check_operation_names(config: WrapperConfig,
                          is_operation: Callable[[str], bool] | None = None,
                          describe: str = "",
                          names: Mapping[str, str] = ALL_OPERATION_GROUPS) -> None:
    """Every ``per_operation`` key names a group or an operation of ``names`` (the face's;
    ``is_operation``: more)."""
    for key in config.per_operation:
        if key in GROUPS or key in names or (is_operation is not None and is_operation(key)):
            continue
        raise ValueError(
            f"per_operation key {key!r} is neither a group ({', '.join(GROUPS)}) nor an "
            f"operation ({', '.join(sorted(names))}){describe}")


# -- parsing option values (URL parameters, environment variables, protocol options) --------

def _int(value: Any, low: int = 1, high: int | None = None) -> int:
    bound = f">= {low}" if high is None else f"in [{low}, {high}]"
    if isinstance(value, (bool, float)) or not isinstance(value, (int, str)):
        raise TypeError(f"expected an integer {bound}, got {type(value).__name__} {value!r}")
    if isinstance(value, int):
        number = value
    else:
        try:
            number = int(str(value).strip())
        except ValueError:
            raise ValueError(f"expected an integer {bound}, got {value!r}") from None
    if number < low or (high is not None and number > high):
        raise ValueError(f"expected an integer {bound}, got {value!r}")
    return number


def _float(value: Any, low: float = 0.0, inclusive: bool = True) -> float:
    bound = f">= {low:g}" if inclusive else f"> {low:g}"
    if isinstance(value, bool):
        raise ValueError(f"expected a number {bound}, got {value!r}")
    try:
        number = float(value if isinstance(value, (int, float)) else str(value).strip())
    except (ValueError, OverflowError):
        raise ValueError(f"expected a number {bound}, got {value!r}") from None
    if not math.isfinite(number) or number < low or (number == low and not inclusive):
        raise ValueError(f"expected a finite number {bound}, got {value!r}")
    return number


_TRUE = frozenset({"1", "true", "yes"})
_FALSE = frozenset({"0", "false", "no"})


def _bool(value: Any) -> bool:
    """A bool, or exactly true/false, 1/0, yes/no in any case (anything else: ValueError)."""
    if isinstance(value, bool):
        return value
    if not isinstance(value, str):
        raise TypeError(f"expected a bool (or true/false, 1/0, yes/no), got "
                        f"{type(value).__name__} {value!r}")
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"expected true/false, 1/0 or yes/no (any case), got {value!r}")


_NONE = {"", "none", "null", "off"}


def _seconds_or_none(value: Any) -> float | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in _NONE):
        return None
    return _float(value, 0.0, inclusive=False)


def _throughput(value: Any) -> float:
    """Bytes per second > 0."""
    return _float(value, 0.0, inclusive=False)


_SIZE = re.compile(r"(?i)^\s*(\d+)\s*(b|k|kb|kib|m|mb|mib|g|gb|gib)?\s*$")
_UNITS = {None: 1, "b": 1, "k": 1024, "kib": 1024, "kb": 1000, "m": 1024**2, "mib": 1024**2,
          "mb": 1000**2, "g": 1024**3, "gib": 1024**3, "gb": 1000**3}


def _size(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        raise TypeError(f"expected a size in bytes (an int, or a string such as 32MiB), got "
                        f"{type(value).__name__} {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"expected a size in bytes >= 0, got {value!r}")
        return value
    match = _SIZE.match(str(value))
    if match is None:
        raise ValueError(f"expected a size in bytes (e.g. 33554432, 32MiB, 500MB), got {value!r}")
    unit = match.group(2).lower() if match.group(2) else None
    return int(match.group(1)) * _UNITS[unit]


def _client_attempts(value: Any) -> int | None:
    """1 to 100 attempts of the storage client, or None (``none``): its own setting."""
    if value is None or (isinstance(value, str) and value.strip().lower() in _NONE):
        return None
    return _int(value, high=CLIENT_ATTEMPTS_MAX)


def _choice(value: Any, choices: tuple[str, ...]) -> str:
    """One of ``choices``, in any case (``pyarrow`` is ``arrow``)."""
    text = str(value).strip().lower()
    text = "arrow" if text == "pyarrow" else text
    if text not in choices:
        raise ValueError(f"expected one of {', '.join(choices)}, got {value!r}")
    return text


def _one_part_client(value: Any) -> str:
    return _choice(value, ONE_PART_CLIENTS)


def _file_client(value: Any) -> str:
    return _choice(value, FILE_CLIENTS)


def _backend(value: Any) -> str:
    return _choice(value, BACKENDS)


def _messages(value: Any) -> tuple[str, ...]:
    """Texts separated by ``|`` in a string; a list or tuple of texts is taken as it is."""
    if isinstance(value, (list, tuple)):
        return tuple(str(item) for item in value)
    return tuple(part for part in str(value).split("|") if part)


def _rate_limit(value: Any) -> Any:
    """A `RateLimit` as it is, else its mode (``auto``, ``on``, ``off``, or a bool)."""
    if isinstance(value, RateLimit):
        return value
    return normalize_rate_limit(value).mode


def _budget(value: Any) -> Any:
    """A `RetryBudget` or a mapping of its fields as they are, else a bool."""
    if isinstance(value, (RetryBudget, Mapping)):
        return value
    return _bool(value)


def _timeout(value: Any) -> Any:
    """Seconds (``none``: no timeout), or ``{group or operation: seconds}`` as it is."""
    if isinstance(value, Mapping):
        return dict(value)
    return _seconds_or_none(value)


@dataclass(frozen=True)
class Parameter:
    """One ``retry_*`` URL parameter (the bare name is what the ``retry`` protocol takes)."""

    name: str  # bare: "max_attempts", "write_max_attempts", "backend"
    parse: Callable[[Any], Any]
    default: str
    example: str
    help: str
    repeatable: bool = False

    @property
    def url_name(self) -> str:
        return _PREFIX + self.name

    @property
    def env_name(self) -> str:
        return _ENV_PREFIX + self.name.upper()


_POLICY_PARSERS: dict[str, tuple[Callable[[Any], Any], str, str]] = {
    # field: (parser, example value, help)
    "max_attempts": (_int, "8", "attempts in all, the first included (1 disables retries)"),
    "initial_delay": (_float, "0.05", "seconds before the first retry of a transient failure "
                                      "(reset, 500, timeout)"),
    "multiplier": (lambda v: _float(v, 1.0), "3", "each retry waits this many times longer"),
    "max_delay": (_float, "30", "cap on one wait, in seconds"),
    "jitter": (_bool, "false", "full jitter on every wait (true/false)"),
    "deadline": (_seconds_or_none, "120", "bound on one operation's total time, sleeps "
                                          "included, in seconds (`none`: no bound)"),
    "throttle_delay": (_float, "2", "seconds before the first retry of a throttling error "
                                    "(SlowDown, 429; never less than its Retry-After)"),
    "fast_throttle_retries": (lambda v: _int(v, 0), "0", "retries after a throttle that "
                              "go on the transient schedule outside a throttle storm "
                              "(0: every throttle waits throttle_delay)"),
    "throttle_factor": (lambda v: _float(v, 1.0), "4", "deprecated: use throttle_delay "
                                                       "(throttles waited this many times "
                                                       "longer than initial_delay)"),
}
_DEFAULT_POLICY = RetryPolicy()


def _shown_default(field_name: str) -> str:
    value = getattr(_DEFAULT_POLICY, field_name)
    if value is None:
        return "none"
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def _build_parameters() -> dict[str, Parameter]:
    params: dict[str, Parameter] = {}
    for name, (parse, example, text) in _POLICY_PARSERS.items():
        params[name] = Parameter(name, parse, _shown_default(name), example, text)
    for group in GROUPS:
        for name, (parse, example, _text) in _POLICY_PARSERS.items():
            bare = f"{group}_{name}"
            params[bare] = Parameter(bare, parse, f"`retry_{name}`", example,
                                     f"{name} of the {group} operations only")
    params["backend"] = Parameter(
        "backend", _backend, "auto", "fsspec",
        "`arrow`: pyarrow's filesystem for the scheme; `fsspec`: the fsspec one (s3fs, gcsfs, "
        "adlfs...); `auto`: pyarrow for s3, gs/gcs, abfs/abfss, file, local paths, mock, hdfs, "
        "fsspec for the rest (memory, http/https, az, ...)")
    params["verify_writes"] = Parameter(
        "verify_writes", _bool, "true", "false",
        "check after each commit that the object holds the bytes written (one metadata call)")
    params["spool_memory"] = Parameter(
        "spool_memory", _size, "32MiB", "128MiB",
        "bytes of a write kept in memory for replay before the spool spills to a temporary file")
    params["client_attempts"] = Parameter(
        "client_attempts", _client_attempts, "1", "3",
        "attempts the storage client makes inside one retryfs attempt (pyarrow's S3FileSystem "
        "only; kept after pickling); 1 makes retryfs the only retry layer")
    params["client_write_attempts"] = Parameter(
        "client_write_attempts", _client_attempts, "3 (with client_attempts)", "1",
        "attempts the storage client makes per request of a write stream (pyarrow's "
        "S3FileSystem only): the SDK re-sends a failed part alone instead of failing the "
        "stream; every request of an upload is tried up to this x the write policy's attempts")
    params["one_part_client"] = Parameter(
        "one_part_client", _one_part_client, "auto (from_uri), arrow", "arrow",
        "what carries the small files of a copy_files to and from pyarrow's S3 (under 5 MiB "
        "up, up to 1 MiB down): `obstore` (one PutObject or GetObject each, at a sixth of the "
        "AWS SDK's CPU), `arrow` (pyarrow's client), `auto` (obstore when it is installed and "
        "the client's settings carry over)")
    params["file_client"] = Parameter(
        "file_client", _file_client, "auto (retry:: URLs), fsspec", "fsspec",
        "what reads and writes the files the fsspec face opens on s3fs: `arrow` (pyarrow's S3 "
        "client with s3fs's settings: reads 4 ranged GETs in flight, writes parts in parallel, "
        "a failed part re-sent by the client), `fsspec` (s3fs's own files), "
        "`auto` (arrow when s3fs's settings carry over: a key and secret or anon, an endpoint "
        "or a region)")
    params["retryable_messages"] = Parameter(
        "retryable_messages", _messages, "(none)", "Connection%20closed%7CAWS%20Error%20UNKNOWN",
        "extra error texts that mean transient, separated by `|` (or repeat the parameter)",
        repeatable=True)
    params["budget"] = Parameter(
        "budget", _budget, "true", "false",
        "the per-endpoint retry budget (token bucket) that stops retry storms in an outage")
    params["rate_limit"] = Parameter(
        "rate_limit", _rate_limit, "auto", "on",
        "client-side rate limiting per endpoint under throttling: `auto` (engaged after 10 "
        "throttles in 5 s that are a tenth of the requests sent), `on` (at the first "
        "throttle), `off`")
    params["timeout"] = Parameter(
        "timeout", _timeout, "none", "30",
        "per-attempt timeout in seconds of read and metadata operations (an attempt that "
        "takes longer is abandoned and retried)")
    for group in TIMED_GROUPS:
        params[f"{group}_timeout"] = Parameter(
            f"{group}_timeout", _seconds_or_none, "`retry_timeout`", "10",
            f"per-attempt timeout of the {group} operations only")
    params["write_timeout"] = Parameter(
        "write_timeout", _seconds_or_none, f"{DEFAULT_WRITE_TIMEOUT:g}", "120",
        "floor of the per-attempt timeout of a write, flush or commit in seconds, plus the "
        "bytes in flight at `retry_min_throughput` (`none`: untimed)")
    params["min_throughput"] = Parameter(
        "min_throughput", _throughput, f"{DEFAULT_MIN_THROUGHPUT:g}", "262144",
        "bytes per second below which an upload attempt counts as stalled")
    return params


#: Every ``retry_*`` parameter, by bare name (``max_attempts`` for ``retry_max_attempts``).
PARAMETERS: dict[str, Parameter] = _build_parameters()
_URL_ONLY = frozenset({"backend"})  # meaningless for the retry protocol's options


def _bare(name: str) -> str:
    return name


@dataclass
class Layer:
    """One layer of parsed settings (the environment's, a URL's, a protocol's options)."""

    policy: dict[str, Any] = field(default_factory=dict)  # RetryPolicy field -> value
    per_group: dict[str, dict[str, Any]] = field(default_factory=dict)  # group -> fields
    options: dict[str, Any] = field(default_factory=dict)  # backend, verify_writes, ...
    timeouts: dict[str, Any] = field(default_factory=dict)  # "" (all) / group -> s
    describe: Callable[[str], str] = _bare  # a bare name as the user wrote it

    def update(self, other: Layer) -> Layer:
        """``self`` overridden by ``other`` (field by field), in place; returns ``self``."""
        self.policy.update(other.policy)
        for group, fields in other.per_group.items():
            self.per_group.setdefault(group, {}).update(fields)
        self.options.update(other.options)
        self.timeouts.update(other.timeouts)
        return self

    def make_policy(self, base: RetryPolicy | None = None) -> RetryPolicy:
        """``base`` (default: ``RetryPolicy()``) with this layer's fields."""
        return _validated(base or RetryPolicy(), self.policy, self.describe)

    def per_operation(self, policy: RetryPolicy) -> dict[str, RetryPolicy]:
        """``{group: policy}`` for the per-group fields, each over ``policy``."""
        return {group: _validated(policy, fields, _in_group(self.describe, group))
                for group, fields in self.per_group.items() if fields}

    def timeout(self) -> Any:
        """The ``timeout`` option of this layer (``None``: no timeouts)."""
        everywhere = self.timeouts.get("")
        groups = {g: s for g, s in self.timeouts.items() if g and s is not None}
        if isinstance(everywhere, Mapping):
            return {**everywhere, **groups}
        if not groups:
            return everywhere
        if everywhere is not None:
            for group in TIMED_GROUPS:
                groups.setdefault(group, everywhere)
        return groups


def _in_group(describe: Callable[[str], str], group: str) -> Callable[[str], str]:
    """How a field of ``group`` is named in a layer (``retry_write_max_attempts``...)."""
    def name(field_name: str) -> str:
        return describe(f"{group}_{field_name}")
    return name


def _validated(base: RetryPolicy, fields: Mapping[str, Any],
               describe: Callable[[str], str]) -> RetryPolicy:
    try:
        return base.replace(**fields)
    except (TypeError, ValueError) as exc:
        names = [describe(name) for name in fields if f".{name}" in str(exc)] or [
            describe(name) for name in fields]
        raise ValueError(f"{', '.join(names)}: {exc}") from None


def _did_you_mean(bare: str, describe: Callable[[str], str], *, url: bool) -> str:
    names = [name for name in PARAMETERS if url or name not in _URL_ONLY]
    close = difflib.get_close_matches(bare.lower(), names, n=1, cutoff=0.75)
    return f" (did you mean {describe(close[0])!r}?)" if close else ""


def _valid_list(describe: Callable[[str], str], *, url: bool) -> str:
    names = [describe(name) for name in PARAMETERS if url or name not in _URL_ONLY]
    return ", ".join(names)


def _parse_into(config: Layer, items: Iterable[tuple[str, Any]], *,
                describe: Callable[[str], str], url: bool, what: str) -> Layer:
    seen: set[str] = set()
    for bare, raw in items:
        if bare in RENAMED:
            warn_renamed(bare, describe)
            bare = RENAMED[bare]
        param = PARAMETERS.get(bare)
        if param is None or (not url and bare in _URL_ONLY):
            raise ValueError(f"unknown {what} {describe(bare)!r}"
                             f"{_did_you_mean(bare, describe, url=url)}; valid: "
                             f"{_valid_list(describe, url=url)}")
        if bare in seen and not param.repeatable:
            raise ValueError(f"{what} {describe(bare)!r} is given more than once")
        seen.add(bare)
        try:
            value = param.parse(raw)
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{what} {describe(bare)}: {exc}") from None
        if bare in _POLICY_PARSERS:
            config.policy[bare] = value
        elif bare in ("timeout", "read_timeout", "metadata_timeout"):
            config.timeouts["" if bare == "timeout" else bare[: -len("_timeout")]] = value
        elif bare in _SCALARS:
            config.options[bare] = value
        elif bare in PARAMETERS and "_" in bare and bare.split("_", 1)[0] in GROUPS:
            group, name = bare.split("_", 1)
            config.per_group.setdefault(group, {})[name] = value
        elif param.repeatable:
            config.options[bare] = tuple(config.options.get(bare, ())) + tuple(value)
        else:
            config.options[bare] = value
    return config


def _url_name(bare: str) -> str:
    return _PREFIX + bare


def _env_name(bare: str) -> str:
    return _ENV_PREFIX + bare.upper()


def config_from_query(pairs: Iterable[tuple[str, str]]) -> Layer:
    """Parse ``retry_*`` URL parameters (names with their prefix, values decoded)."""
    items = []
    for name, value in pairs:
        if not name.startswith(_PREFIX):
            raise ValueError(f"not a retry parameter: {name!r}")
        items.append((name[len(_PREFIX):], value))
    layer = Layer(describe=_url_name)
    return _parse_into(layer, items, describe=_url_name, url=True, what="URL parameter")


def config_from_env(environ: Mapping[str, str] | None = None, *, url: bool = True
                    ) -> Layer:
    """The ``RETRYFS_*`` defaults in ``environ`` (default: ``os.environ``).

    Variables that are not parameters (``RETRYFS_NO_SLEEP``...) are ignored; a parameter's
    variable with a bad value is a ``ValueError`` naming the variable.
    """
    environ = os.environ if environ is None else environ
    items = []
    for name, value in environ.items():
        if not name.startswith(_ENV_PREFIX):
            continue
        bare = name[len(_ENV_PREFIX):].lower()
        if (bare in PARAMETERS or bare in RENAMED) and (url or bare not in _URL_ONLY):
            items.append((bare, value))
    return _parse_into(Layer(describe=_env_name), sorted(items), describe=_env_name,
                       url=url, what="environment variable")


def config_from_options(options: Mapping[str, Any]) -> Layer:
    """Parse the ``retry`` protocol's options (bare names, typed or string values)."""
    return _parse_into(Layer(), options.items(), describe=lambda n: n, url=False,
                       what="retry option")




# -- the layered merge ---------------------------------------------------------------------------

_SCALARS = ("verify_writes", "spool_memory", "budget", "rate_limit", "client_attempts",
            "client_write_attempts", "one_part_client", "file_client", "write_timeout",
            "min_throughput")


def merge(*, code: Mapping[str, Any] | None = None, top: Layer | None = None,
          env: Layer | None = None, defaults: Mapping[str, Any] | None = None) -> WrapperConfig:
    """One `WrapperConfig` from the layers, lowest first: ``defaults`` (code-typed options that
    differ from the built-in defaults, e.g. ``from_uri``'s ``client_attempts=1``), ``env``
    (``RETRYFS_*``), ``code`` (keyword arguments: the options of `OPTIONS`), ``top`` (URL
    parameters or protocol options).

    A whole ``policy`` from code replaces the environment's policy fields; the fields of
    ``top`` apply over it. Per-group fields apply over the entry below them. Error texts
    (``retryable_messages``) add up across layers. A timeout from ``top`` is merged group by
    group over the environment's; otherwise code's timeout replaces the environment's.
    """
    code = dict(code or {})
    _check_names(code, "option")
    env = env or Layer()
    top = top or Layer()
    chosen: dict[str, Any] = dict(defaults or {})

    base = code.pop("policy", None)
    if base is None:
        base = env.make_policy()
    elif not isinstance(base, RetryPolicy):
        raise _type_error("policy", "a RetryPolicy", base)
    policy = top.make_policy(base)
    per_operation: dict[str, Any] = dict(env.per_operation(policy))
    given = code.pop("per_operation", None)
    if given is not None:
        if not isinstance(given, Mapping):
            raise _type_error("per_operation", "a mapping", given)
        per_operation.update(resolve_overrides(policy, given, check=False))
    for group, fields in top.per_group.items():
        per_operation[group] = _validated(per_operation.get(group, policy), fields,
                                          _in_group(top.describe, group))

    for name in _SCALARS:
        if name in top.options:
            chosen[name] = top.options[name]
        elif name in code:
            chosen[name] = code.pop(name)
        elif name in env.options:
            chosen[name] = env.options[name]
        code.pop(name, None)
    messages = code.pop("retryable_messages", ())
    if isinstance(messages, (str, bytes)):
        raise _type_error("retryable_messages", "a sequence of strings (not a string)",
                          messages)
    chosen["retryable_messages"] = (*env.options.get("retryable_messages", ()),
                                    *messages, *top.options.get("retryable_messages", ()))
    if top.timeouts:
        timeout = Layer(timeouts=dict(env.timeouts)).update(top).timeout()
    elif "timeout" in code:
        timeout = code.pop("timeout")
    else:
        timeout = env.timeout()
    code.pop("timeout", None)
    chosen.update(code)  # classifier, stats
    return WrapperConfig(policy=policy, per_operation=per_operation, timeout=timeout, **chosen)


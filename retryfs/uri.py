"""Configuration by URL: `from_uri`, the ``retry_*`` parameters, ``RETRYFS_*`` defaults, redaction.

::

    fs, path = retryfs.from_uri("s3://bucket/ckpt?retry_max_attempts=8&region=us-east-1")

``retry_*`` query parameters configure the retry policy and the wrapper; every other query
parameter goes to the backend unchanged (pyarrow's own ``FileSystem.from_uri`` reads ``region``,
``endpoint_override``, ``scheme``... for S3). Environment variables named like the parameters
(``RETRYFS_MAX_ATTEMPTS`` for ``retry_max_attempts``) set defaults for a whole process or
cluster; a URL parameter beats its variable. An unknown ``retry_*`` parameter, or a value that
does not parse, is a ``ValueError`` that names it and lists the valid ones.

Secrets (keys, tokens, SAS signatures, passwords, URL userinfo) never reach a ``repr``, a log
line, an exception note or a metric: :func:`redact` hides them in any text and is what the
loggers, notes and reprs of retryfs use. Values retryfs learns are secret (a password in a URL,
``secret=`` options) are remembered with :func:`register_secret` and hidden wherever they occur.
"""

from __future__ import annotations

import math
import os
import re
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote, unquote_plus, urlsplit

from .locations import check_location, check_object_path
from .policy import GROUPS, RetryPolicy, resolve_overrides
from .timeouts import TIMED_GROUPS

__all__ = [
    "BACKENDS",
    "PARAMETERS",
    "Parameter",
    "RetryConfig",
    "config_from_env",
    "config_from_options",
    "config_from_query",
    "from_uri",
    "redact",
    "register_secret",
    "split_retry_params",
]

#: Schemes that pyarrow opens natively (``pyarrow.fs.FileSystem.from_uri``); the others go to
#: fsspec. ``retry_backend=fsspec`` sends a pyarrow scheme (``s3``, ``gs``...) to fsspec too.
ARROW_SCHEMES = frozenset({"s3", "gs", "gcs", "abfs", "abfss", "file", "mock", "hdfs", "viewfs"})
BACKENDS = ("auto", "arrow", "fsspec")
#: Backend query parameters that happen to start with ``retry_`` and are passed through.
BACKEND_RETRY_PARAMS = frozenset({"retry_limit_seconds"})  # pyarrow GCS
_PREFIX = "retry_"
_ENV_PREFIX = "RETRYFS_"

# -- secrets -----------------------------------------------------------------------------------

_MASK = "***"
_MIN_SECRET = 4  # shorter registered values would mask ordinary words
_secrets: set[str] = set()
_secrets_pattern: re.Pattern[str] | None = None
_secrets_lock = threading.Lock()

#: Names whose values are secrets: query parameters, options, headers, connection strings.
_SECRET_NAME = (
    r"[\w.-]*(?:secret|passw(?:or)?d|pwd|token|credential|signature|api[_-]?key|"
    r"access[_-]?key|account[_-]?key|private[_-]?key|shared[_-]?key|sas|auth)[\w.-]*"
    r"|sig|key"
)
_NAME_VALUE = re.compile(
    r"(?i)(?<![\w./-])(?P<q1>[\"']?)(?P<name>" + _SECRET_NAME + r")(?P=q1)(?P<sep>\s*[=:]\s*)"
    r"(?P<q2>[\"']?)(?P<value>(?:bearer\s+|basic\s+)?[^\s\"'&;,)}\]]+)"
)
_USERINFO = re.compile(r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#@\s'\"]+)@")
# user:password@ with an unencoded '/' in the password (AWS secret keys have them)
_USERINFO_SLASH = re.compile(
    r"(?P<scheme>\b[A-Za-z][A-Za-z0-9+.-]*://)(?P<userinfo>[^/?#@\s'\":]+:[^?#@\s'\"]*)@")
_AWS_KEY_ID = re.compile(r"\b(?:AKIA|ASIA)[A-Z0-9]{16}\b")
_BEARER = re.compile(r"(?i)\b(bearer)\s+[A-Za-z0-9._~+/=-]{8,}")
# abfs://container@account...: the container is not a secret (a password after ':' is).
_CONTAINER_SCHEMES = ("abfs://", "abfss://", "az://", "adl://", "wasb://", "wasbs://")


def register_secret(value: Any) -> None:
    """Remember ``value`` as a secret: :func:`redact` hides it wherever it appears.

    Values shorter than 4 characters are ignored (they would mask ordinary text).
    """
    global _secrets_pattern
    if value is None:
        return
    text = str(value)
    candidates = {text, quote(text, safe=""), quote(text, safe="/")}
    with _secrets_lock:
        added = False
        for candidate in candidates:
            if len(candidate) >= _MIN_SECRET and candidate not in _secrets:
                _secrets.add(candidate)
                added = True
        if added:
            ordered = sorted(_secrets, key=len, reverse=True)  # longest first
            _secrets_pattern = re.compile("|".join(re.escape(s) for s in ordered))


def _userinfo(match: re.Match[str]) -> str:
    scheme, userinfo = match.group("scheme"), match.group("userinfo")
    if scheme.lower() in _CONTAINER_SCHEMES and ":" not in userinfo:
        return match.group(0)
    if scheme.lower() in _CONTAINER_SCHEMES:
        return f"{scheme}{userinfo.split(':', 1)[0]}:{_MASK}@"
    return f"{scheme}{_MASK}@"


def _name_value(match: re.Match[str]) -> str:
    value = match.group("value")
    if value == _MASK:
        return match.group(0)
    start, end = match.span("value")
    whole_start = match.start(0)
    text = match.group(0)
    return text[: start - whole_start] + _MASK + text[end - whole_start:]


def redact(text: Any) -> str:
    """``text`` with secrets replaced by ``***``.

    Hides URL userinfo (``s3://KEY:SECRET@bucket`` → ``s3://***@bucket``), values of secret
    names in query strings, options, headers and connection strings (``secret``, ``token``,
    ``password``, ``sig``, ``key``, ``X-Amz-Signature``, ``AccountKey``, ``sas_token``,
    ``Authorization: Bearer``...), AWS access key ids, and every value passed to
    :func:`register_secret`. Paths and ordinary words are left alone.
    """
    text = str(text)
    pattern = _secrets_pattern
    if pattern is not None:
        text = pattern.sub(_MASK, text)
    if "@" in text:
        text = _USERINFO.sub(_userinfo, text)
        text = _USERINFO_SLASH.sub(_userinfo, text)
    text = _NAME_VALUE.sub(_name_value, text)
    text = _BEARER.sub(lambda m: f"{m.group(1)} {_MASK}", text)
    return _AWS_KEY_ID.sub(_MASK, text)


def _register_option_secrets(options: Mapping[str, Any] | None) -> None:
    """Remember the values of secret-looking options (``secret``, ``key``, ``token``...)."""
    for name, value in (options or {}).items():
        if isinstance(value, Mapping):
            _register_option_secrets(value)
        elif isinstance(value, str) and re.fullmatch(_SECRET_NAME, str(name),
                                                     flags=re.IGNORECASE):
            register_secret(value)


# -- parameters --------------------------------------------------------------------------------

def _int(value: Any, low: int = 1) -> int:
    if isinstance(value, bool):
        raise ValueError(f"expected an integer >= {low}, got {value!r}")
    if isinstance(value, int):
        number = value
    else:
        try:
            number = int(str(value).strip())
        except ValueError:
            raise ValueError(f"expected an integer >= {low}, got {value!r}") from None
    if number < low:
        raise ValueError(f"expected an integer >= {low}, got {value!r}")
    return number


def _float(value: Any, low: float = 0.0, inclusive: bool = True) -> float:
    bound = f">= {low:g}" if inclusive else f"> {low:g}"
    if isinstance(value, bool):
        raise ValueError(f"expected a number {bound}, got {value!r}")
    try:
        number = float(value if isinstance(value, (int, float)) else str(value).strip())
    except ValueError:
        raise ValueError(f"expected a number {bound}, got {value!r}") from None
    if not math.isfinite(number) or number < low or (number == low and not inclusive):
        raise ValueError(f"expected a finite number {bound}, got {value!r}")
    return number


_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"expected true/false (1/0, yes/no, on/off), got {value!r}")


_NONE = {"", "none", "null", "off"}


def _seconds_or_none(value: Any) -> float | None:
    if value is None or (isinstance(value, str) and value.strip().lower() in _NONE):
        return None
    return _float(value, 0.0, inclusive=False)


_SIZE = re.compile(r"(?i)^\s*(\d+)\s*(b|k|kb|kib|m|mb|mib|g|gb|gib)?\s*$")
_UNITS = {None: 1, "b": 1, "k": 1024, "kib": 1024, "kb": 1000, "m": 1024**2, "mib": 1024**2,
          "mb": 1000**2, "g": 1024**3, "gib": 1024**3, "gb": 1000**3}


def _size(value: Any) -> int:
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"expected a size in bytes >= 0, got {value!r}")
        return value
    match = _SIZE.match(str(value))
    if match is None:
        raise ValueError(f"expected a size in bytes (e.g. 33554432, 32MiB, 500MB), got {value!r}")
    unit = match.group(2).lower() if match.group(2) else None
    return int(match.group(1)) * _UNITS[unit]


def _backend(value: Any) -> str:
    text = str(value).strip().lower()
    text = "arrow" if text == "pyarrow" else text
    if text not in BACKENDS:
        raise ValueError(f"expected one of {', '.join(BACKENDS)}, got {value!r}")
    return text


def _messages(value: Any) -> tuple[str, ...]:
    values = [value] if isinstance(value, str) else list(value)
    out: list[str] = []
    for item in values:
        out.extend(part for part in str(item).split("|") if part)
    return tuple(out)


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
    "initial_delay": (_float, "0.5", "seconds before the first retry"),
    "multiplier": (lambda v: _float(v, 1.0), "3", "each retry waits this many times longer"),
    "max_delay": (_float, "30", "cap on one wait, in seconds"),
    "jitter": (_bool, "false", "full jitter on every wait (true/false)"),
    "deadline": (_seconds_or_none, "120", "bound on one operation's total time, sleeps "
                                          "included, in seconds (`none`: no bound)"),
    "throttle_factor": (lambda v: _float(v, 1.0), "4", "throttling errors (SlowDown, 429) "
                                                       "wait this many times longer"),
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
    params["native_attempts"] = Parameter(
        "native_attempts", _int, "1", "3",
        "attempts the native client makes inside one retryfs attempt (pyarrow's S3FileSystem "
        "only; kept after pickling); 1 makes retryfs the only retry layer")
    params["retryable_messages"] = Parameter(
        "retryable_messages", _messages, "(none)", "Connection%20closed%7CAWS%20Error%20UNKNOWN",
        "extra error texts that mean transient, separated by `|` (or repeat the parameter)",
        repeatable=True)
    params["budget"] = Parameter(
        "budget", _bool, "true", "false",
        "the per-endpoint retry budget (token bucket) that stops retry storms in an outage")
    params["timeout"] = Parameter(
        "timeout", _seconds_or_none, "none", "30",
        "per-attempt timeout in seconds of read and metadata operations (an attempt that "
        "takes longer is abandoned and retried)")
    for group in TIMED_GROUPS:
        params[f"{group}_timeout"] = Parameter(
            f"{group}_timeout", _seconds_or_none, "`retry_timeout`", "10",
            f"per-attempt timeout of the {group} operations only")
    return params


#: Every ``retry_*`` parameter, by bare name (``max_attempts`` for ``retry_max_attempts``).
PARAMETERS: dict[str, Parameter] = _build_parameters()
_URL_ONLY = frozenset({"backend"})  # meaningless for the retry protocol's options


@dataclass
class RetryConfig:
    """Parsed retry settings, before they are applied to a wrapper."""

    policy: dict[str, Any] = field(default_factory=dict)  # RetryPolicy field -> value
    per_group: dict[str, dict[str, Any]] = field(default_factory=dict)  # group -> fields
    options: dict[str, Any] = field(default_factory=dict)  # backend, verify_writes, ...
    timeouts: dict[str, float | None] = field(default_factory=dict)  # "" (all) / group -> s

    def update(self, other: RetryConfig) -> RetryConfig:
        """``self`` overridden by ``other`` (field by field), in place; returns ``self``."""
        self.policy.update(other.policy)
        for group, fields in other.per_group.items():
            self.per_group.setdefault(group, {}).update(fields)
        self.options.update(other.options)
        self.timeouts.update(other.timeouts)
        return self

    def make_policy(self, base: RetryPolicy | None = None, *, describe: Callable[[str], str]
                    = lambda name: name) -> RetryPolicy:
        """``base`` (default: ``RetryPolicy()``) with this config's fields."""
        return _validated(base or RetryPolicy(), self.policy, describe)

    def per_operation(self, policy: RetryPolicy, *, describe: Callable[[str], str]
                      = lambda name: name) -> dict[str, RetryPolicy]:
        """``{group: policy}`` for the per-group fields, each over ``policy``."""
        return {group: _validated(policy, fields, lambda n, g=group: describe(f"{g}_{n}"))
                for group, fields in self.per_group.items() if fields}

    def timeout(self) -> float | dict[str, float] | None:
        """The ``timeout`` argument of the wrappers (``None``: no timeouts)."""
        everywhere = self.timeouts.get("")
        groups = {g: s for g, s in self.timeouts.items() if g and s is not None}
        if not groups:
            return everywhere
        if everywhere is not None:
            for group in TIMED_GROUPS:
                groups.setdefault(group, everywhere)
        return groups


def _validated(base: RetryPolicy, fields: Mapping[str, Any],
               describe: Callable[[str], str]) -> RetryPolicy:
    try:
        return base.replace(**fields)
    except (TypeError, ValueError) as exc:
        names = [describe(name) for name in fields if f".{name}" in str(exc)] or [
            describe(name) for name in fields]
        raise ValueError(f"{', '.join(names)}: {exc}") from None


def _valid_list(describe: Callable[[str], str], *, url: bool) -> str:
    names = [describe(name) for name in PARAMETERS if url or name not in _URL_ONLY]
    return ", ".join(names)


def _parse_into(config: RetryConfig, items: Iterable[tuple[str, Any]], *,
                describe: Callable[[str], str], url: bool, what: str) -> RetryConfig:
    seen: set[str] = set()
    for bare, raw in items:
        param = PARAMETERS.get(bare)
        if param is None or (not url and bare in _URL_ONLY):
            raise ValueError(f"unknown {what} {describe(bare)!r}; valid: "
                             f"{_valid_list(describe, url=url)}")
        if bare in seen and not param.repeatable:
            raise ValueError(f"{what} {describe(bare)!r} is given more than once")
        seen.add(bare)
        try:
            value = param.parse(raw)
        except ValueError as exc:
            raise ValueError(f"{what} {describe(bare)}: {exc}") from None
        if bare in _POLICY_PARSERS:
            config.policy[bare] = value
        elif bare in ("timeout", "read_timeout", "metadata_timeout"):
            config.timeouts["" if bare == "timeout" else bare[: -len("_timeout")]] = value
        elif bare in PARAMETERS and "_" in bare and bare.split("_", 1)[0] in GROUPS:
            group, name = bare.split("_", 1)
            config.per_group.setdefault(group, {})[name] = value
        elif param.repeatable:
            config.options[bare] = tuple(config.options.get(bare, ())) + tuple(value)
        else:
            config.options[bare] = value
    return config


def config_from_query(pairs: Iterable[tuple[str, str]]) -> RetryConfig:
    """Parse ``retry_*`` URL parameters (names with their prefix, values decoded)."""
    items = []
    for name, value in pairs:
        if not name.startswith(_PREFIX):
            raise ValueError(f"not a retry parameter: {name!r}")
        items.append((name[len(_PREFIX):], value))
    return _parse_into(RetryConfig(), items, describe=lambda n: _PREFIX + n, url=True,
                       what="URL parameter")


def config_from_env(environ: Mapping[str, str] | None = None, *, url: bool = True
                    ) -> RetryConfig:
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
        if bare in PARAMETERS and (url or bare not in _URL_ONLY):
            items.append((bare, value))
    return _parse_into(RetryConfig(), sorted(items), describe=lambda n: _ENV_PREFIX + n.upper(),
                       url=url, what="environment variable")


def config_from_options(options: Mapping[str, Any]) -> RetryConfig:
    """Parse the ``retry`` protocol's options (bare names, typed or string values)."""
    return _parse_into(RetryConfig(), options.items(), describe=lambda n: n, url=False,
                       what="retry option")


# -- URLs --------------------------------------------------------------------------------------

def split_retry_params(uri: str) -> tuple[str, list[tuple[str, str]]]:
    """``(uri without its retry_* parameters, [(name, decoded value), ...])``.

    The other parameters stay exactly as written (same order, same encoding).
    """
    base, hash_sign, fragment = uri.partition("#")
    base, question, query = base.partition("?")
    if not question:
        return uri, []
    kept: list[str] = []
    retry: list[tuple[str, str]] = []
    for piece in query.split("&"):
        if not piece:
            continue
        raw_name, _, raw_value = piece.partition("=")
        name = unquote_plus(raw_name)
        if name.startswith(_PREFIX) and name not in BACKEND_RETRY_PARAMS:
            retry.append((name, unquote_plus(raw_value)))
        else:
            kept.append(piece)
    rest = base + ("?" + "&".join(kept) if kept else "")
    return rest + (hash_sign + fragment if hash_sign else ""), retry


def _scheme_of(uri: str) -> str:
    if re.match(r"^[A-Za-z]:[\\/]", uri):  # C:\ a Windows drive, not a scheme
        return ""
    match = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", uri)
    return match.group(1).lower() if match else ""


def _register_uri_secrets(uri: str) -> None:
    parts = urlsplit(uri)
    if parts.password:
        register_secret(unquote_plus(parts.password))
    if parts.username and parts.password:
        register_secret(unquote_plus(parts.username))
    for piece in parts.query.split("&"):
        name, _, value = piece.partition("=")
        if value and re.fullmatch(_SECRET_NAME, unquote_plus(name), flags=re.IGNORECASE):
            register_secret(unquote_plus(value))


def from_uri(uri: str, *, storage_options: Mapping[str, Any] | None = None,
             **kwargs: Any) -> tuple[Any, str]:
    """``(RetryingFileSystem, path)`` for a URI or a local path.

    ``retry_*`` query parameters (see :data:`PARAMETERS` and the README table) configure the
    wrapper; the other parameters go to the backend unchanged: to
    ``pyarrow.fs.FileSystem.from_uri`` for the pyarrow schemes (s3, gs/gcs, abfs/abfss, file,
    local paths, mock, hdfs), to ``fsspec.core.url_to_fs`` (inside the URL) for the others
    (memory, http/https, az, gcs with ``retry_backend=fsspec``...). ``storage_options`` are the
    fsspec filesystem's constructor options (fsspec backend only). ``kwargs`` are
    `RetryingFileSystem` arguments (``policy``, ``per_operation``, ``classifier``, ``stats``,
    ``timeout``...).

    Precedence, lowest first: built-in defaults, ``RETRYFS_*`` environment variables, ``kwargs``,
    URL parameters. Error texts (``retryable_messages``) add up. A leading ``retry::`` is
    accepted and ignored. An empty or blank location (``""``, ``"retry::"``, parameters only)
    or one with a NUL character is a ``ValueError``: never the current directory.
    """
    from .arrow import RetryingFileSystem

    if not isinstance(uri, str):
        uri = os.fspath(uri)
    uri = check_location(uri)  # "" is never the current directory
    _register_uri_secrets(uri)
    _register_option_secrets(storage_options)
    rest, retry_pairs = split_retry_params(uri)
    env = config_from_env()
    url = config_from_query(retry_pairs)
    code = dict(kwargs)

    def url_name(name: str) -> str:
        return _PREFIX + name

    def env_name(name: str) -> str:
        return _ENV_PREFIX + name.upper()

    base = code.pop("policy", None)
    if base is not None and not isinstance(base, RetryPolicy):
        raise TypeError(f"policy must be a RetryPolicy, got {type(base).__name__}")
    if base is None:
        base = env.make_policy(describe=env_name)
    policy = url.make_policy(base, describe=url_name)

    per_operation: dict[str, RetryPolicy] = dict(env.per_operation(policy, describe=env_name))
    per_operation.update(resolve_overrides(policy, code.pop("per_operation", None)))
    for group, fields in url.per_group.items():
        per_operation[group] = _validated(per_operation.get(group, policy), fields,
                                          lambda n, g=group: url_name(f"{g}_{n}"))

    wrapper: dict[str, Any] = {"policy": policy, "per_operation": per_operation or None}
    wrapper["native_attempts"] = 1  # retryfs is the only retry layer unless told otherwise
    for name in ("verify_writes", "spool_memory", "budget", "native_attempts"):
        if name in url.options:
            wrapper[name] = url.options[name]
        elif name in code:
            wrapper[name] = code.pop(name)
        elif name in env.options:
            wrapper[name] = env.options[name]
    messages = (*env.options.get("retryable_messages", ()),
                *_code_messages(code.pop("retryable_messages", ())),
                *url.options.get("retryable_messages", ()))
    if messages:
        wrapper["retryable_messages"] = tuple(dict.fromkeys(messages))
    if url.timeouts:
        timeout = RetryConfig(timeouts=dict(env.timeouts)).update(url).timeout()
    elif "timeout" in code:
        timeout = code.pop("timeout")
    else:
        timeout = env.timeout()
    if timeout is not None:
        wrapper["timeout"] = timeout
    wrapper.update(code)  # classifier, stats...

    backend = url.options.get("backend", env.options.get("backend", "auto"))
    inner, path = _open_backend(rest, backend, storage_options)
    return RetryingFileSystem(inner, **wrapper), check_object_path(inner, path)


def _code_messages(value: Any) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)):
        raise TypeError("retryable_messages must be a sequence of strings, not a string")
    return tuple(str(v) for v in value)


def _open_backend(uri: str, backend: str, storage_options: Mapping[str, Any] | None
                  ) -> tuple[Any, str]:
    scheme = _scheme_of(uri)
    if backend == "auto":
        backend = "arrow" if (scheme in ARROW_SCHEMES or not scheme) else "fsspec"
    if backend == "arrow":
        if storage_options:
            raise ValueError(
                "storage_options apply to the fsspec backend only: pyarrow filesystems take "
                "their options as query parameters (region, endpoint_override, scheme...); "
                "or add retry_backend=fsspec")
        import pyarrow.fs as pafs

        if not scheme:  # a local path
            path, _, query = uri.partition("?")
            if query:
                raise ValueError(f"query parameters {redact(query)!r} mean nothing for a local "
                                 "path (a local file name with '?' needs a file:// URI with %3F)")
            uri = os.path.abspath(os.path.expanduser(path))
        try:
            return pafs.FileSystem.from_uri(uri)
        except Exception as exc:
            shown = redact(str(exc))
            if shown == str(exc):
                raise
            try:  # pyarrow's message quotes the URI: raise the same error without its secrets
                clean = type(exc)(shown)
            except Exception:  # noqa: BLE001 - an exception type that takes other arguments
                clean = ValueError(shown)
            raise clean from None
    import fsspec.core

    return fsspec.core.url_to_fs(uri, **dict(storage_options or {}))

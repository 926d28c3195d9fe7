"""Redaction: the one place that hides secrets in text that leaves retryfs.

Everything retryfs writes out (log lines, exception notes, ``repr``, metric labels, CLI output)
goes through :func:`redact`; :func:`redact_and_truncate` is the way to shorten such text (a
secret is never cut in half before it is recognised). Values retryfs learns are secret (a
password in a URL, ``secret=`` options) are remembered with :func:`register_secret` and hidden
wherever they occur later.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any
from urllib.parse import quote

__all__ = ["SECRET_NAME", "basic_redact", "redact", "redact_and_truncate", "register_secret",
           "register_option_secrets", "registered_secrets", "reset_secrets"]

_MASK = "***"
_MIN_SECRET = 4  # shorter registered values would mask ordinary words
_secrets: set[str] = set()
_secrets_pattern: re.Pattern[str] | None = None
_secrets_lock = threading.Lock()

#: Names whose values are secrets: query parameters, options, headers, connection strings.
SECRET_NAME = (
    r"[\w.-]*(?:secret|passw(?:or)?d|pwd|token|credential|signature|api[_-]?key|"
    r"access[_-]?key|account[_-]?key|private[_-]?key|shared[_-]?key|sas|auth)[\w.-]*"
    r"|sig|key"
)
_NAME_VALUE = re.compile(
    r"(?i)(?<![\w./-])(?P<q1>[\"']?)(?P<name>" + SECRET_NAME + r")(?P=q1)(?P<sep>\s*[=:]\s*)"
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


def _mask_uri_secrets(text: Any) -> str:
    """Userinfo, secret names' values, bearer tokens, AWS key ids, registered values."""
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


def redact(text: Any) -> str:
    """``text`` with secrets replaced by ``***``.

    Hides URL userinfo (``s3://KEY:SECRET@bucket`` → ``s3://***@bucket``), values of secret
    names in query strings, options, headers and connection strings (``secret``, ``token``,
    ``password``, ``sig``, ``key``, ``X-Amz-Signature``, ``AccountKey``, ``sas_token``,
    ``Authorization: Bearer``...), AWS access key ids, and every value passed to
    :func:`register_secret`. Paths and ordinary words are left alone.
    """
    return _mask_uri_secrets(text)


#: The name `retryfs.core.stats` has always exported for the redactor.
basic_redact = redact


def redact_and_truncate(text: Any, limit: int,
                        redactor: Callable[[str], str] | None = None) -> str:
    """``text`` redacted whole, then cut to at most ``limit`` characters (``...`` marks a cut).

    The order is the point: cut first, a secret at the boundary is left half-shown
    (``s3://***:Zx9/sEc...``) where no pattern recognises it any more. ``redactor``: a
    caller's own (a ``RetryStats(redact=...)``) instead of :func:`redact`.
    """
    shown = (redactor or redact)(str(text))
    return shown if len(shown) <= limit else shown[: max(0, limit - 3)] + "..."


def registered_secrets() -> frozenset[str]:
    """The values :func:`register_secret` remembers now (tests save and restore them)."""
    with _secrets_lock:
        return frozenset(_secrets)


def reset_secrets(keep: Iterable[str] = ()) -> None:
    """Forget every registered secret except ``keep``: the registry is process-wide, so a
    test suite restores it between tests (one test's secret must not mask another's leak)."""
    global _secrets_pattern
    with _secrets_lock:
        _secrets.clear()
        _secrets.update(keep)
        ordered = sorted(_secrets, key=len, reverse=True)  # longest first
        _secrets_pattern = (re.compile("|".join(re.escape(s) for s in ordered))
                            if ordered else None)


def register_option_secrets(options: Mapping[str, Any] | None) -> None:
    """Remember the values of secret-looking options (``secret``, ``key``, ``token``...)."""
    for name, value in (options or {}).items():
        if isinstance(value, Mapping):
            register_option_secrets(value)
        elif isinstance(value, str) and re.fullmatch(SECRET_NAME, str(name),
                                                     flags=re.IGNORECASE):
            register_secret(value)

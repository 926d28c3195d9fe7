"""Configuration by URL: `from_uri` and the ``retry_*`` query parameters of a location.

::

    fs, path = retryfs.from_uri("s3://bucket/ckpt?retry_max_attempts=8&region=us-east-1")

``retry_*`` query parameters configure the retry policy and the wrapper; every other query
parameter goes to the backend unchanged (pyarrow's own ``FileSystem.from_uri`` reads ``region``,
``endpoint_override``, ``scheme``... for S3). Environment variables named like the parameters
(``RETRYFS_MAX_ATTEMPTS`` for ``retry_max_attempts``) set defaults for a whole process or
cluster; a URL parameter beats its variable. An unknown ``retry_*`` parameter, or a value that
does not parse, is a ``ValueError`` that names it and lists the valid ones.

The parameters themselves, their parsing and the layered merge live in `retryfs.config`;
secrets in the URL are remembered for `retryfs.redact`.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping, Sequence
from typing import Any, cast
from urllib.parse import unquote, unquote_plus, urlsplit, urlunsplit

import fsspec.core
import pyarrow.fs as pafs

from retryfs.arrow.filesystem import RetryingFileSystem
from retryfs.core.budget import RetryBudget
from retryfs.core.classify import ErrorClassifier
from retryfs.core.locations import check_location, check_object_path
from retryfs.core.policy import RetryPolicy
from retryfs.core.ratelimit import RateLimit
from retryfs.core.redact import SECRET_NAME, redact, register_option_secrets, register_secret
from retryfs.core.stats import RetryStats

from .config import (
    BACKENDS,
    PARAMETERS,
    FileClient,
    OnePartClient,
    Parameter,
    WrapperConfig,
    config_from_env,
    config_from_query,
    default,
    given,
    merge,
    renamed,
)

__all__ = [
    "BACKENDS",
    "PARAMETERS",
    "Parameter",
    "from_uri",
    "redact",
    "register_secret",
    "split_retry_params",
]

#: Schemes that pyarrow opens natively (``pyarrow.fs.FileSystem.from_uri``); the others go to
#: fsspec. ``retry_backend=fsspec`` sends a pyarrow scheme (``s3``, ``gs``...) to fsspec too.
ARROW_SCHEMES = frozenset({"s3", "gs", "gcs", "abfs", "abfss", "file", "mock", "hdfs", "viewfs"})
#: Backend query parameters that happen to start with ``retry_`` and are passed through.
BACKEND_RETRY_PARAMS = frozenset({"retry_limit_seconds"})  # pyarrow GCS
_PREFIX = "retry_"
_ENV_PREFIX = "RETRYFS_"

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
        if name in BACKEND_RETRY_PARAMS:
            kept.append(piece)
        elif name.startswith(_PREFIX):
            retry.append((name, unquote_plus(raw_value)))
        elif _looks_like_retry(name):
            raise ValueError(f"URL parameter {name!r} is not a retry parameter; did you mean "
                             f"{_closest(name)!r}? (retry_* names are lower case)")
        else:
            kept.append(piece)
    rest = base + ("?" + "&".join(kept) if kept else "")
    return rest + (hash_sign + fragment if hash_sign else ""), retry


_URL_NAMES = tuple(param.url_name for param in PARAMETERS.values())


def _closest(name: str) -> str:
    close = difflib.get_close_matches(name.lower(), _URL_NAMES, n=1, cutoff=0.0)
    return close[0] if close else _URL_NAMES[0]


def _looks_like_retry(name: str) -> bool:
    """``Retry_Max_Attempts``, ``retry-max-attempts``, ``rety_max_attempts``: meant for retryfs,
    never to be handed silently to the backend."""
    lowered = name.lower()
    if lowered.replace("-", "_").startswith(_PREFIX):
        return True
    return bool(difflib.get_close_matches(lowered, _URL_NAMES, n=1, cutoff=0.9))


def _scheme_of(uri: str) -> str:
    if re.match(r"^[A-Za-z]:[\\/]", uri):  # C:\ a Windows drive, not a scheme
        return ""
    match = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", uri)
    return match.group(1).lower() if match else ""


def _register_uri_secrets(uri: str) -> None:
    parts = urlsplit(uri)
    if parts.password:
        register_secret(unquote_plus(parts.password))
        register_secret(unquote(parts.password))  # userinfo keeps '+' (base64 account keys)
    if parts.username and parts.password:
        register_secret(unquote_plus(parts.username))
    for piece in parts.query.split("&"):
        name, _, value = piece.partition("=")
        if value and re.fullmatch(SECRET_NAME, unquote_plus(name), flags=re.IGNORECASE):
            register_secret(unquote_plus(value))


def from_uri(uri: str, *, storage_options: Mapping[str, Any] | None = None,
             config: WrapperConfig | None = None,
             policy: RetryPolicy | None = None,
             per_operation: Mapping[str, RetryPolicy | Mapping[str, object]] | None = None,
             classifier: ErrorClassifier | None = None,
             retryable_messages: Sequence[str] = default("retryable_messages"),
             verify_writes: bool = default("verify_writes"),
             spool_memory: int | str = default("spool_memory"),
             budget: RetryBudget | bool | None = default("budget"),
             rate_limit: RateLimit | str | bool = default("rate_limit"),
             timeout: float | Mapping[str, float] | None = default("timeout"),
             client_attempts: int | None = default("client_attempts"),
             client_write_attempts: int | None = default("client_write_attempts"),
             one_part_client: OnePartClient = default("one_part_client"),
             file_client: FileClient = default("file_client"),
             write_timeout: float | None = default("write_timeout"),
             min_throughput: float = default("min_throughput"),
             stats: RetryStats | None = None,
             **deprecated: Any) -> tuple[RetryingFileSystem, str]:
    """``(RetryingFileSystem, path)`` for a URI or a local path.

    ``retry_*`` query parameters (see :data:`PARAMETERS` and the README table) configure the
    wrapper; the other parameters go to the backend unchanged: to
    ``pyarrow.fs.FileSystem.from_uri`` for the pyarrow schemes (s3, gs/gcs, abfs/abfss, file,
    local paths, mock, hdfs), to ``fsspec.core.url_to_fs`` (inside the URL) for the others
    (memory, http/https, az, gcs with ``retry_backend=fsspec``...). ``storage_options`` are the
    fsspec filesystem's constructor options (fsspec backend only). ``config`` (a
    `WrapperConfig`) and the options (the fields of `WrapperConfig`, each described there)
    are the code's settings, an option given over ``config`` (a complete value: the
    environment does not fill it in). Not given, ``client_attempts`` is 1: retryfs is the only
    retry layer, and ``one_part_client`` is ``"auto"``: the small files of a ``copy_files`` to and
    from S3 go through obstore when it is installed and the client's settings carry over
    (`retryfs.arrow.obstore_small`). The spellings of 0.1.0 (``native_attempts``...) still work,
    with a ``DeprecationWarning``.

    Precedence, lowest first: built-in defaults, ``RETRYFS_*`` environment variables, code,
    URL parameters. Error texts (``retryable_messages``) add up. A leading ``retry::`` is
    accepted and ignored. An empty or blank location (``""``, ``"retry::"``, parameters only)
    or one with a NUL character is a ``ValueError``: never the current directory.
    """
    if not isinstance(uri, str):
        uri = os.fspath(uri)
    uri = check_location(uri)  # "" is never the current directory
    _register_uri_secrets(uri)
    register_option_secrets(storage_options)
    rest, retry_pairs = split_retry_params(uri)
    env = config_from_env()
    url = config_from_query(retry_pairs)
    kwargs = renamed({**deprecated, **given(locals())})
    code = {**config.options(), **kwargs} if config is not None else dict(kwargs)
    # retryfs is the only retry layer unless told otherwise; it chooses what sends small files
    wrapper = merge(code=code, top=url, env=env,
                    defaults={"client_attempts": 1, "one_part_client": "auto",
                              "file_client": "auto"})
    backend = url.options.get("backend", env.options.get("backend", "auto"))
    inner, path = _open_backend(rest, backend, storage_options)
    return RetryingFileSystem(inner, config=wrapper), check_object_path(inner, path)


_AZURE_SCHEMES = frozenset({"abfs", "abfss"})


def _arrow_from_uri(uri: str) -> tuple[Any, str]:
    """``pyarrow.fs.FileSystem.from_uri``, except that the account key of
    ``abfs[s]://account:key@...`` is used: pyarrow 26 parses the URI and drops the key (the
    filesystem then asks for a token instead). The key is percent-decoded (``%2F`` for ``/``,
    ``+`` kept); everything else is pyarrow's own parsing of the URI without the key."""
    parts = urlsplit(uri)
    if _scheme_of(uri) not in _AZURE_SCHEMES or parts.password is None:
        return cast("tuple[Any, str]", pafs.FileSystem.from_uri(uri))
    key = unquote(parts.password)
    userinfo, _, host = parts.netloc.rpartition("@")
    account = userinfo.split(":", 1)[0]
    if not account or not key:
        raise ValueError("abfs://account:key@...: both the account name and its key are "
                         "needed (or leave the key out to use the environment's credentials)")
    fs, path = pafs.FileSystem.from_uri(urlunsplit(parts._replace(netloc=f"{account}@{host}")))
    rebuild, (options,) = fs.__reduce__()
    return rebuild({**options, "account_key": key}), path


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
        if not scheme:  # a local path
            path, _, query = uri.partition("?")
            if query:
                raise ValueError(f"query parameters {redact(query)!r} mean nothing for a local "
                                 "path (a local file name with '?' needs a file:// URI with %3F)")
            uri = os.path.abspath(os.path.expanduser(path))
        try:
            return _arrow_from_uri(uri)
        except Exception as exc:
            shown = redact(str(exc))
            if shown == str(exc):
                raise
            try:  # pyarrow's message quotes the URI: raise the same error without its secrets
                clean = type(exc)(shown)
            except Exception:  # noqa: BLE001 - an exception type that takes other arguments
                clean = ValueError(shown)
            raise clean from None
    return cast("tuple[Any, str]", fsspec.core.url_to_fs(uri, **dict(storage_options or {})))

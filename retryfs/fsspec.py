"""The fsspec face: the ``retry`` protocol, a filesystem that retries every call of another.

::

    fs = fsspec.filesystem("retry", fs=inner, max_attempts=8)            # wrap an instance
    fs = fsspec.filesystem("retry", target_protocol="s3", target_options={...})
    with fsspec.open("retry::s3://bucket/key", "wb", retry={"max_attempts": 8}, s3={...}) as f:
        f.write(data)

How each method is retried. For every public method of ``AbstractFileSystem`` (and, when the
wrapped filesystem is async, every coroutine of ``AsyncFileSystem``): when the wrapped
filesystem implements the method itself, the call is delegated to it and retried as a whole;
when it inherits fsspec's generic implementation (``put``, ``get``, ``copy``, ``cat``,
``expand_path``... composed of smaller calls), that generic implementation runs on the wrapper,
so each smaller call (``put_file``, ``cat_file``, ``info``...) is retried on its own and a bulk
transfer that fails in its 900th file retries that file, not the 899 before it. Methods that only
the wrapped filesystem has (``s3fs``'s ``get_tags``, ``url``, ``_call_s3``...) are forwarded and
retried too. Generators (``walk``) are retried until they produce their first item.

Files: ``open(path, "rb")`` returns a file whose reads resume (a failed read reopens the file
and continues at the same offset); ``"wb"``/``"xb"`` a file that keeps what was written in a
bounded replay spool and, when a write, flush or close (the upload) fails, discards the broken
upload, opens a fresh one and replays into it: an fsspec buffered file whose upload failed at
close cannot be closed again, a fresh one can. After the commit the object's size is checked
(``verify_writes``). Appends (``"ab"``) and read-write modes: only the open is retried.

When the wrapped filesystem is async (s3fs, gcsfs, adlfs), the wrapper is an
``AsyncFileSystem`` too (class `AsyncRetryFileSystem`, chosen automatically): its coroutines
retry with ``asyncio.sleep`` on the event loop, never blocking it, and its blocking methods run
those coroutines on fsspec's IO loop, so a bulk ``put`` uploads concurrently with per-file
retries.

Operation names (for ``per_operation``, ``stats`` and log lines) are the fsspec method names
without the leading underscore (``info``, ``cat_file``, ``put_file``...), the pyarrow names for
opening files (``open_input_file``, ``open_output_stream``, ``open_append_stream``) and
``read``, ``write``, ``flush``, ``close`` for file I/O. Policy groups: `FSSPEC_GROUPS`.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from typing import Any

import fsspec
import pyarrow.fs as pafs
from fsspec.asyn import AsyncFileSystem, async_gen_wrapper, sync_wrapper
from fsspec.asyn import async_methods as _FSSPEC_ASYNC_METHODS
from fsspec.implementations.chained import ChainedFileSystem
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

from .arrow import RetryingFileSystem
from .budget import RetryBudget, bucket_for, normalize_budget
from .classify import ErrorClassifier, http_status_of
from .engine import Retrier
from .policy import GROUPS, OPERATION_GROUPS, RetryPolicy
from .stats import RetryStats
from .streams import DEFAULT_SPOOL_MEMORY, ReplayableOutputStream, ResumableInputFile
from .timeouts import TIMED_GROUPS, resolve_timeouts, timed
from .uri import (
    _register_option_secrets,
    config_from_env,
    config_from_options,
    redact,
)

__all__ = ["AsyncRetryFileSystem", "AsyncRetryReadFile", "FSSPEC_GROUPS", "FsspecHandler",
           "RetryFileSystem", "RetryReadFile", "RetryWriteFile"]

#: The policy group of each fsspec operation (the pyarrow names of `OPERATION_GROUPS` too).
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

# Methods of AbstractFileSystem that are not storage calls (configuration, paths, caches,
# transactions, serialisation): never retried, some answered by the wrapper itself.
_NOT_RETRIED = frozenset({
    "open", "invalidate_cache", "start_transaction", "end_transaction", "transaction",
    "to_json", "to_dict", "from_json", "from_dict", "get_mapper", "current",
    "clear_instance_cache", "unstrip_protocol", "fsid", "_get_pyarrow_filesystem",
})
# Generators: retried until they yield their first item.
_GENERATORS = frozenset({"walk"})
_TWO_PATHS = frozenset({"cp_file", "copy", "cp", "mv", "move", "rename", "put_file", "put",
                        "upload", "get_file", "get", "download", "mv_file"})
# The options of AbstractFileSystem/AsyncFileSystem itself (the rest are retry options).
_FSSPEC_OWN = frozenset({"use_listings_cache", "listings_expiry_time", "max_paths",
                         "asynchronous", "loop", "batch_size"})
_MISSING = object()


def _public_sync_methods() -> tuple[str, ...]:
    names = []
    for name, value in vars(AbstractFileSystem).items():
        if name.startswith("_") or name in _NOT_RETRIED:
            continue
        if inspect.isfunction(value):
            names.append(name)
    return tuple(sorted(names))


def _async_methods() -> tuple[str, ...]:
    names = set(_FSSPEC_ASYNC_METHODS)
    for name, value in vars(AsyncFileSystem).items():
        if name.startswith("_") and not name.startswith("__") and (
                inspect.iscoroutinefunction(value) or inspect.isasyncgenfunction(value)):
            names.add(name)
    names.discard("_process_limits")  # a helper of _cat_file, not an operation
    return tuple(sorted(names))


SYNC_METHODS = _public_sync_methods()
ASYNC_METHODS = _async_methods()


def _label(operation: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]) -> str:
    """The path(s) a call is about, for log lines and notes (redacted when logged)."""
    def one(value: Any) -> str:
        if isinstance(value, str):
            return value
        if isinstance(value, Mapping):
            value = list(value)
        if isinstance(value, (list, tuple)):
            if not value:
                return "[]"
            head = str(value[0])
            return head if len(value) == 1 else f"{head} (+{len(value) - 1} more)"
        return str(value)

    first = args[0] if args else next(
        (kwargs[k] for k in ("path", "path1", "lpath", "rpath", "url", "fn") if k in kwargs), "")
    if operation in _TWO_PATHS:
        second = args[1] if len(args) > 1 else next(
            (kwargs[k] for k in ("path2", "rpath", "lpath") if k in kwargs), _MISSING)
        if second is not _MISSING:
            return f"{one(first)} -> {one(second)}"
    return one(first)


def _gone(exc: BaseException) -> bool:
    """A retried delete that finds nothing: the first attempt did it."""
    return isinstance(exc, FileNotFoundError)


def _exists_now(exc: BaseException) -> bool:
    """A retried mkdir that finds the directory: the first attempt made it."""
    return isinstance(exc, FileExistsError)


_MKDIRS = frozenset({"mkdir", "makedirs", "makedir", "mkdirs"})
_RECONCILE: dict[str, Callable[[BaseException], bool]] = {
    "rm_file": _gone, "rm": _gone, "rmdir": _gone, "delete": _gone,
    "mkdir": _exists_now, "makedirs": _exists_now, "makedir": _exists_now,
    "mkdirs": _exists_now,
}


#: Every operation name of this face with its group (fsspec's names first, as in `_group_of`).
_FACE_GROUPS: dict[str, str] = {**OPERATION_GROUPS, **FSSPEC_GROUPS}


def _group_of(operation: str) -> str | None:
    return _FACE_GROUPS.get(operation)


def _strip_retry(path: Any) -> Any:
    if isinstance(path, str):
        for prefix in ("retry::", "retry://"):
            if path.startswith(prefix):
                return path[len(prefix):]
    return path


class _PerInstance:
    """A class attribute of fsspec's (``_strip_protocol``, ``_parent``, ``sep``,
    ``root_marker``) that, on a wrapper, is the wrapped filesystem's own."""

    def __init__(self, name: str, fallback: Any) -> None:
        self.name = name
        self.fallback = fallback

    def __get__(self, obj: Any, objtype: Any = None) -> Any:
        inner = None if obj is None else obj.__dict__.get("fs")
        if inner is None:
            fallback = self.fallback
            if isinstance(fallback, classmethod):
                return fallback.__get__(None, objtype if objtype is not None else type(obj))
            return fallback
        value = getattr(inner, self.name)
        if self.name == "_strip_protocol":
            def strip(path: Any) -> Any:
                if isinstance(path, list):
                    return [strip(p) for p in path]
                return value(_strip_retry(path))
            return strip
        return value


class RetryFileSystem(ChainedFileSystem):
    """An fsspec filesystem that retries every call of another one (protocol ``retry``).

    Give the filesystem to wrap as ``fs`` (an fsspec filesystem; a pyarrow one is adapted, a
    `retryfs.RetryingFileSystem` unwrapped with its configuration), or as ``target_protocol`` and
    ``target_options`` like ``simplecache``. Retry options: ``policy`` (a `RetryPolicy`), its
    fields by name (``max_attempts=8``, ``initial_delay=0.5``...), per-group fields
    (``write_max_attempts=20``; groups: metadata, read, write, delete, move), ``per_operation``
    (``{"write": {...}, "cat_file": RetryPolicy(...)}``), ``classifier``,
    ``retryable_messages``, ``stats``, ``verify_writes`` (default true), ``spool_memory``
    (bytes, default 32 MiB), ``budget`` (default true), ``timeout`` (seconds per attempt of
    read and metadata calls, or ``{group: seconds}``). Values may be strings, as they come from
    fsspec's configuration (``FSSPEC_RETRY_MAX_ATTEMPTS=8``); ``RETRYFS_*`` environment
    variables set the defaults. An unknown option is a ``ValueError`` that lists the valid ones.

    When ``fs`` is async (s3fs...), the instance is an `AsyncRetryFileSystem`.
    """

    protocol = "retry"
    cachable = True

    _strip_protocol = _PerInstance(  # type: ignore[assignment]
        "_strip_protocol", vars(AbstractFileSystem)["_strip_protocol"])
    _parent = _PerInstance("_parent", vars(AbstractFileSystem)["_parent"])  # type: ignore[assignment]
    sep = _PerInstance("sep", "/")  # type: ignore[assignment]
    root_marker = _PerInstance("root_marker", "")  # type: ignore[assignment]

    def __new__(cls, *args: Any, **kwargs: Any) -> RetryFileSystem:
        if cls is RetryFileSystem and _inner_is_async(kwargs.get("fs"),
                                                     kwargs.get("target_protocol")):
            cls = AsyncRetryFileSystem
        return object.__new__(cls)

    def __init__(
        self,
        fs: Any = None,
        target_protocol: str | None = None,
        target_options: Mapping[str, Any] | None = None,
        fo: str | None = None,
        *,
        policy: RetryPolicy | None = None,
        per_operation: Mapping[str, RetryPolicy | Mapping[str, Any]] | None = None,
        classifier: ErrorClassifier | None = None,
        stats: RetryStats | None = None,
        **options: Any,
    ) -> None:
        own = {k: options.pop(k) for k in list(options) if k in _FSSPEC_OWN}
        retry_options = dict(options)
        inner, inherited = _resolve_inner(fs, target_protocol, target_options, own)
        if getattr(inner, "async_impl", False) and not isinstance(self, AsyncRetryFileSystem):
            raise TypeError("an async filesystem needs AsyncRetryFileSystem (chosen "
                            "automatically by RetryFileSystem(...))")
        if isinstance(self, AsyncRetryFileSystem):
            wanted = own.get("asynchronous")
            if wanted is not None and bool(wanted) != bool(getattr(inner, "asynchronous", False)):
                raise ValueError("asynchronous must match the wrapped filesystem's "
                                 f"(asynchronous={getattr(inner, 'asynchronous', False)})")
            own["asynchronous"] = getattr(inner, "asynchronous", False)
            own.setdefault("loop", getattr(inner, "_loop", None))
        else:
            own.pop("asynchronous", None)
            own.pop("loop", None)
            own.pop("batch_size", None)
        super().__init__(**own)
        self.fs = inner
        self.target_protocol = target_protocol
        _register_option_secrets(target_options)
        _register_option_secrets(getattr(inner, "storage_options", None))
        self._configure(inherited, policy, per_operation, classifier, stats, retry_options)
        self._composed = self._find_composed()

    # -- configuration -------------------------------------------------------------------------
    def _configure(self, inherited: Mapping[str, Any], policy: RetryPolicy | None,
                   per_operation: Mapping[str, Any] | None, classifier: ErrorClassifier | None,
                   stats: RetryStats | None, options: Mapping[str, Any]) -> None:
        env = config_from_env(url=False)
        options = dict(options)
        structured: dict[str, Any] = {}  # values code gives as objects, not option strings
        if isinstance(options.get("budget"), (RetryBudget, Mapping)):
            structured["budget"] = options.pop("budget")
        if isinstance(options.get("timeout"), Mapping):
            structured["timeout"] = options.pop("timeout")
        if isinstance(options.get("retryable_messages"), (list, tuple)):
            structured["retryable_messages"] = tuple(
                str(m) for m in options.pop("retryable_messages"))
        given = config_from_options(options)
        if policy is None:
            policy = inherited.get("policy")
        if policy is not None and not isinstance(policy, RetryPolicy):
            raise TypeError(f"policy must be a RetryPolicy, got {type(policy).__name__}")
        base = policy if policy is not None else env.make_policy(
            describe=lambda n: "RETRYFS_" + n.upper())
        self.policy: RetryPolicy = given.make_policy(base)
        overrides: dict[str, RetryPolicy] = dict(env.per_operation(self.policy))
        inherited_per_op = inherited.get("per_operation") or {}
        overrides.update(self._resolve_overrides({**inherited_per_op, **(per_operation or {})}))
        for group, fields in given.per_group.items():
            overrides[group] = _replace(overrides.get(group, self.policy), fields, group)
        self.per_operation: dict[str, RetryPolicy] = overrides

        def pick(name: str, default: Any) -> Any:
            if name in structured:
                return structured[name]
            if name in given.options:
                return given.options[name]
            if name in inherited:
                return inherited[name]
            return env.options.get(name, default)

        self.verify_writes = bool(pick("verify_writes", True))
        spool = pick("spool_memory", DEFAULT_SPOOL_MEMORY)
        if isinstance(spool, bool) or not isinstance(spool, int) or spool < 0:
            raise ValueError(f"spool_memory must be an int >= 0 (bytes), got {spool!r}")
        self.spool_memory = spool
        budget = pick("budget", True)
        self.budget: RetryBudget | None = normalize_budget(budget)
        if classifier is None:
            classifier = inherited.get("classifier") or ErrorClassifier()
        if not isinstance(classifier, ErrorClassifier):
            raise TypeError(f"classifier must be an ErrorClassifier, got "
                            f"{type(classifier).__name__}")
        messages = (*env.options.get("retryable_messages", ()),
                    *given.options.get("retryable_messages", ()),
                    *structured.get("retryable_messages", ()))
        if messages:
            classifier = classifier.with_messages(dict.fromkeys(messages))
        self.classifier = classifier
        if "timeout" in structured:
            timeout_spec: Any = structured["timeout"]
        elif given.timeouts:
            timeout_spec = _merge_timeouts(env.timeout(), given.timeout())
        else:
            timeout_spec = inherited.get("timeout", env.timeout())
        self.timeout = timeout_spec
        self._timeouts = resolve_timeouts(timeout_spec, _FACE_GROUPS)
        if stats is None:
            stats = inherited.get("stats")
        self.stats: RetryStats = stats if stats is not None else RetryStats()
        bucket = bucket_for(self.fs, self.budget) if self.budget is not None else None
        self.retrier = Retrier(self._policy_for, classifier, self.stats, budget=bucket,
                               timeouts=self._timeouts)

    def _resolve_overrides(self, per_operation: Mapping[str, Any]) -> dict[str, RetryPolicy]:
        resolved: dict[str, RetryPolicy] = {}
        for key, value in per_operation.items():
            if key not in GROUPS and _group_of(key) is None and not callable(
                    getattr(self.fs, key, None)):
                raise ValueError(
                    f"per_operation key {key!r} is neither a group ({', '.join(GROUPS)}) nor an "
                    f"operation ({', '.join(sorted(FSSPEC_GROUPS))}) nor a method of "
                    f"{type(self.fs).__name__}")
            if isinstance(value, RetryPolicy):
                resolved[key] = value
            elif isinstance(value, Mapping):
                resolved[key] = self.policy.replace(**dict(value))
            else:
                raise TypeError(f"per_operation[{key!r}] must be a RetryPolicy or a mapping of "
                                f"its fields, got {type(value).__name__}")
        return resolved

    def _policy_for(self, operation: str) -> RetryPolicy:
        overrides = self.per_operation
        if overrides:
            found = overrides.get(operation)
            if found is not None:
                return found
            group = _group_of(operation)
            if group is not None and group in overrides:
                return overrides[group]
        return self.policy

    def _find_composed(self) -> frozenset[str]:
        """Methods the wrapped filesystem inherits from fsspec: run them on the wrapper."""
        inner_type = type(self.fs)
        inner_dict = vars(self.fs)
        composed = set()
        for name in SYNC_METHODS + ("_rm",):
            if name in inner_dict:
                continue
            if getattr(inner_type, name, None) is vars(AbstractFileSystem).get(name):
                composed.add(name)
        return frozenset(composed)

    # -- retrying ------------------------------------------------------------------------------
    def _call(self, operation: str, label: str, fn: Callable[..., Any], *args: Any,
              **kwargs: Any) -> Any:
        if args or kwargs:  # never through Retrier.call's own keywords (path=, fn=...)
            fn = functools.partial(fn, *args, **kwargs)
        seconds = self._timeouts.get(operation)
        if seconds is not None:
            fn = timed(fn, seconds, operation, label)
        return self.retrier.call(operation, label, fn,
                                 reconcile=self._reconciler(operation, args, kwargs))

    def _reconciler(self, operation: str, args: tuple[Any, ...],
                    kwargs: Mapping[str, Any]) -> Callable[[BaseException], bool] | None:
        """How a retry's error of ``operation`` can show an earlier attempt's work."""
        if operation not in _MKDIRS:
            return _RECONCILE.get(operation)
        path = args[0] if args else kwargs.get("path")

        def made_already(exc: BaseException) -> bool:
            # "exists" is this call's work only if what exists is a directory (checked
            # through the engine: a transient error in the check is retried too)
            return (_exists_now(exc) and isinstance(path, str)
                    and self._call("info", path, self.fs.info, path).get("type") == "directory")

        return made_already

    def _retry_iter(self, operation: str, label: str, fn: Callable[..., Any],
                    *args: Any, **kwargs: Any) -> Iterator[Any]:
        """Iterate ``fn(...)``, retrying it until it yields its first item."""
        def first() -> tuple[Iterator[Any], Any]:
            iterator = iter(fn(*args, **kwargs))
            return iterator, next(iterator, _MISSING)

        iterator, item = self.retrier.call(operation, label, first)
        if item is _MISSING:
            return
        yield item
        yield from iterator

    # -- paths (the wrapped filesystem's) --------------------------------------------------------
    def unstrip_protocol(self, name: str) -> str:
        return self.fs.unstrip_protocol(name)

    def invalidate_cache(self, path: str | None = None) -> None:
        self.fs.invalidate_cache(path)
        super().invalidate_cache(path)

    @property
    def fsid(self) -> str:
        return f"retry_{self.fs.fsid}"

    def _isfilestore(self) -> bool:
        return self.fs._isfilestore()

    # -- files ---------------------------------------------------------------------------------
    def _open(self, path: str, mode: str = "rb", block_size: int | None = None,
              autocommit: bool = True, cache_options: dict[str, Any] | None = None,
              **kwargs: Any) -> Any:
        inner_fs = self.fs
        open_kwargs = dict(kwargs)
        if block_size is not None:
            open_kwargs["block_size"] = block_size
        if cache_options is not None:
            open_kwargs["cache_options"] = cache_options
        if not autocommit:
            open_kwargs["autocommit"] = False

        def opener() -> Any:
            return inner_fs.open(path, mode, **open_kwargs)

        if mode == "rb":
            def reopen_read() -> _InnerFile:
                return _InnerFile(self._call("open_input_file", path, opener))

            first = reopen_read()
            return RetryReadFile(self, path, mode, first, reopen_read, self.retrier)
        if mode in ("wb", "xb"):
            writer: RetryWriteFile | None = None

            def reopen_write() -> _InnerFile:
                inner = _InnerFile(self._call("open_output_stream", path, opener))
                if writer is not None:
                    writer._last_inner = inner
                return inner

            first = reopen_write()
            writer = RetryWriteFile(
                self, path, mode, first, reopen_write, self.retrier,
                verify=self._landed if (self.verify_writes and autocommit) else None,
                spool_memory=self.spool_memory, autocommit=autocommit)
            return writer
        operation = "open_append_stream" if "a" in mode else "open"
        return self._call(operation, path, opener)

    def _landed(self, path: str, size: int) -> bool:
        """Whether ``path`` holds ``size`` bytes now (the read-after-write check)."""
        try:
            self.fs.invalidate_cache(path)
            info = self.fs.info(path)
        except FileNotFoundError:
            return False
        except NotImplementedError:  # a filesystem that cannot tell: trust the commit
            return True
        if info.get("type") not in (None, "file"):
            return False
        found = info.get("size")
        return found is None or int(found) == size

    # -- the pyarrow face ------------------------------------------------------------------------
    def to_arrow(self) -> RetryingFileSystem:
        """The same wrapping on the pyarrow face: a `retryfs.RetryingFileSystem` over the same
        filesystem with the same policy, classifier, stats and options (per-operation entries
        the pyarrow face has no name for are left out)."""
        per_operation = {k: v for k, v in self.per_operation.items()
                         if k in GROUPS or k in OPERATION_GROUPS}
        timeout = self.timeout
        if isinstance(timeout, Mapping):
            timeout = {k: v for k, v in timeout.items()
                       if k in TIMED_GROUPS or k in OPERATION_GROUPS} or None
        return RetryingFileSystem(
            self.fs, self.policy, classifier=self.classifier, per_operation=per_operation or None,
            stats=self.stats, verify_writes=self.verify_writes, spool_memory=self.spool_memory,
            budget=self.budget if self.budget is not None else False, timeout=timeout)

    @classmethod
    def from_arrow(cls, filesystem: Any, **options: Any) -> RetryFileSystem:
        """The fsspec face of a `retryfs.RetryingFileSystem` (its configuration kept, retries
        not doubled), or of any pyarrow filesystem (adapted with ``ArrowFSWrapper``)."""
        return cls(fs=filesystem, **options)

    def unwrap(self) -> Any:
        """The filesystem this one wraps."""
        return self.fs

    # -- identity --------------------------------------------------------------------------------
    def __reduce__(self) -> tuple[Any, ...]:
        from fsspec.spec import make_instance

        options = {k: v for k, v in self.storage_options.items() if k not in ("stats", "loop")}
        return make_instance, (type(self), self.storage_args, options)

    def __repr__(self) -> str:
        inner = type(self.fs)
        protocol = getattr(self.fs, "protocol", "?")
        protocol = protocol if isinstance(protocol, str) else protocol[0]
        return redact(f"{type(self).__name__}({inner.__module__}.{inner.__qualname__} "
                      f"protocol={protocol!r}, policy={self.policy!r})")

    __str__ = __repr__

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or "fs" not in self.__dict__:
            raise AttributeError(name)
        value = getattr(self.__dict__["fs"], name)
        if not inspect.ismethod(value):
            return value
        operation = name.lstrip("_")
        if inspect.iscoroutinefunction(value):
            async def retried_coroutine(*args: Any, **kwargs: Any) -> Any:
                return await self.retrier.acall(operation, _label(operation, args, kwargs),
                                                functools.partial(value, *args, **kwargs))
            retried_coroutine.__name__ = name
            retried_coroutine.__doc__ = value.__doc__
            return retried_coroutine
        if inspect.isgeneratorfunction(value) or inspect.isasyncgenfunction(value):
            return value

        def retried(*args: Any, **kwargs: Any) -> Any:
            return self._call(operation, _label(operation, args, kwargs), value, *args, **kwargs)

        retried.__name__ = name
        retried.__doc__ = value.__doc__
        return retried


def _replace(policy: RetryPolicy, fields: Mapping[str, Any], group: str) -> RetryPolicy:
    try:
        return policy.replace(**fields)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{', '.join(f'{group}_{k}' for k in fields)}: {exc}") from None


def _merge_timeouts(low: Any, high: Any) -> Any:
    if high is None:
        return low
    if low is None or not isinstance(high, Mapping):
        return high
    merged = dict(low) if isinstance(low, Mapping) else {g: low for g in TIMED_GROUPS}
    merged.update(high)
    return merged


def _inner_is_async(fs: Any, target_protocol: str | None) -> bool:
    if fs is not None:
        if isinstance(fs, pafs.FileSystem):
            return False
        return bool(getattr(fs, "async_impl", False))
    if target_protocol is not None:
        try:
            cls = fsspec.get_filesystem_class(target_protocol)
        except (ImportError, ValueError):
            return False  # __init__ raises the real error
        return bool(getattr(cls, "async_impl", False))
    return False


def _resolve_inner(fs: Any, target_protocol: str | None,
                   target_options: Mapping[str, Any] | None,
                   own: Mapping[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The fsspec filesystem to wrap, and the configuration it brings (from a pyarrow face)."""
    if fs is None and target_protocol is None:
        raise ValueError("RetryFileSystem needs the filesystem to wrap: fs=<instance> or "
                         "target_protocol=<protocol> (with target_options)")
    if fs is not None and target_protocol is not None:
        raise ValueError("give either fs or target_protocol, not both")
    inherited: dict[str, Any] = {}
    if fs is None:
        options = dict(target_options or {})
        for name in ("asynchronous", "loop"):
            if name in own:
                options.setdefault(name, own[name])
        fs = fsspec.filesystem(target_protocol, **options)
    elif target_options:
        raise ValueError("target_options apply with target_protocol only")
    if isinstance(fs, RetryingFileSystem):
        handler = fs.retry_handler
        inherited = {"policy": handler.policy, "classifier": handler.classifier,
                     "per_operation": dict(handler.per_operation),
                     "verify_writes": handler.verify_writes,
                     "spool_memory": handler.spool_memory, "stats": handler.stats,
                     "budget": handler.budget if handler.budget is not None else False,
                     "timeout": _group_timeouts(handler.timeouts)}
        fs = fs.unwrap()
    if isinstance(fs, RetryFileSystem):  # a retry wrapper of a retry wrapper: one layer
        inherited = {"policy": fs.policy, "classifier": fs.classifier,
                     "per_operation": dict(fs.per_operation), "verify_writes": fs.verify_writes,
                     "spool_memory": fs.spool_memory, "stats": fs.stats,
                     "budget": fs.budget if fs.budget is not None else False,
                     "timeout": fs.timeout}
        fs = fs.fs
    if isinstance(fs, pafs.FileSystem):
        from fsspec.implementations.arrow import ArrowFSWrapper

        fs = ArrowFSWrapper(fs)
    if not isinstance(fs, AbstractFileSystem):
        raise TypeError("RetryFileSystem wraps an fsspec filesystem (or a pyarrow one), got "
                        f"{type(fs).__module__}.{type(fs).__qualname__}")
    return fs, {k: v for k, v in inherited.items() if v is not None}


def _group_timeouts(timeouts: Mapping[str, float]) -> dict[str, float] | None:
    """The pyarrow face's resolved ``{operation: seconds}`` as ``{group: seconds}``."""
    groups = {OPERATION_GROUPS[op]: seconds for op, seconds in timeouts.items()
              if op in OPERATION_GROUPS}
    return groups or None


# -- fsspec filesystems on the pyarrow face ------------------------------------------------------

def _server_error_behind(exc: BaseException) -> bool:
    """A FileNotFoundError raised from a 5xx or 429 (fsspec's HTTP ``info`` does that)."""
    cause = exc.__cause__
    status = http_status_of(cause) if cause is not None else None
    return status is not None and (status >= 500 or status == 429)


_MTIME_KEYS = ("LastModified", "last_modified", "updated", "created")


class FsspecHandler(pafs.FSSpecHandler):
    """pyarrow's ``FSSpecHandler`` minus the checks that hide errors (used by `RetryingFileSystem`
    for fsspec filesystems).

    pyarrow's opens a file only after ``isfile`` and lists a directory only after ``isdir`` and
    ``exists``; fsspec's generic versions of those answer False on *any* error, so a transient
    failure became a FileNotFoundError, or an empty listing, that no retry could see. Here the
    checks are ``info`` calls whose errors go up, and a "not found" raised from a server error
    (fsspec's HTTP filesystem) is raised, not reported as NotFound.
    """

    @staticmethod
    def _create_file_info(path: str, info: dict[str, Any]) -> pafs.FileInfo:
        """pyarrow's, with the modification time under the other names fsspec backends use
        (s3fs ``LastModified``, gcsfs ``updated``; the memory filesystem, whose files are
        written once, only has ``created``)."""
        found = pafs.FSSpecHandler._create_file_info(path, info)
        if found.mtime is not None or found.type == pafs.FileType.NotFound:
            return found
        mtime = next((info[key] for key in _MTIME_KEYS if info.get(key) is not None), None)
        if mtime is None:
            return found
        return pafs.FileInfo(path, found.type, size=found.size, mtime=mtime)

    def _info_or_none(self, path: str) -> dict[str, Any] | None:
        try:
            return self.fs.info(path)
        except FileNotFoundError as exc:
            if _server_error_behind(exc):
                raise
            return None

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        infos = []
        for path in paths:
            info = self._info_or_none(path)
            infos.append(pafs.FileInfo(path, pafs.FileType.NotFound) if info is None
                         else self._create_file_info(path, info))
        return infos

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        info = self._info_or_none(selector.base_dir)
        if info is None:
            if selector.allow_not_found:
                return []
            raise FileNotFoundError(selector.base_dir)
        if info.get("type") != "directory":
            raise NotADirectoryError(selector.base_dir)
        found = self.fs.find(selector.base_dir, maxdepth=None if selector.recursive else 1,
                             withdirs=True, detail=True)
        base_dir = selector.base_dir.strip("/")
        return [self._create_file_info(path, entry) for path, entry in found.items()
                if path.strip("/") != base_dir]

    def _check_file(self, path: str) -> None:
        info = self._info_or_none(path)
        if info is None or info.get("type") != "file":
            raise FileNotFoundError(path)

    def open_input_stream(self, path: str) -> Any:
        import pyarrow as pa

        self._check_file(path)
        return pa.PythonFile(self.fs.open(path, mode="rb"), mode="r")

    def open_input_file(self, path: str) -> Any:
        import pyarrow as pa

        self._check_file(path)
        return pa.PythonFile(self.fs.open(path, mode="rb"), mode="r")


# -- the blocking methods ------------------------------------------------------------------------

def _make_sync(name: str) -> Callable[..., Any]:
    base = vars(AbstractFileSystem)[name]

    def method(self: RetryFileSystem, *args: Any, **kwargs: Any) -> Any:
        if name in self._composed:
            return base(self, *args, **kwargs)
        return self._call(name, _label(name, args, kwargs), getattr(self.fs, name),
                          *args, **kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = base.__doc__
    return method


def _make_sync_generator(name: str) -> Callable[..., Any]:
    base = vars(AbstractFileSystem)[name]

    def method(self: RetryFileSystem, *args: Any, **kwargs: Any) -> Iterator[Any]:
        if name in self._composed:
            yield from base(self, *args, **kwargs)
            return
        yield from self._retry_iter(name, _label(name, args, kwargs), getattr(self.fs, name),
                                    *args, **kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = base.__doc__
    return method


for _name in SYNC_METHODS:
    setattr(RetryFileSystem, _name,
            _make_sync_generator(_name) if _name in _GENERATORS else _make_sync(_name))


def _old_rm(self: RetryFileSystem, path: str) -> Any:
    """Delete one file (fsspec's old name for rm_file, which calls it)."""
    if "_rm" in self._composed:
        return AbstractFileSystem._rm(self, path)
    return self._call("rm_file", path, self.fs._rm, path)


RetryFileSystem._rm = _old_rm  # type: ignore[method-assign]


# -- the async face ------------------------------------------------------------------------------

class AsyncRetryFileSystem(RetryFileSystem, AsyncFileSystem):
    """`RetryFileSystem` over an async filesystem: its coroutines retry on the event loop.

    Backoff waits with ``asyncio.sleep`` (other tasks run meanwhile); blocking methods run the
    coroutines on fsspec's IO loop (``fs.loop``). ``asynchronous`` follows the wrapped
    filesystem's.
    """

    mirror_sync_methods = False  # done in __init__: the blocking methods are this class's own

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._composed_async = self._find_composed_async()
        for name in ASYNC_METHODS:
            coroutine = getattr(self, name)
            blocking = (async_gen_wrapper(coroutine, obj=self)
                        if inspect.isasyncgenfunction(coroutine)
                        else sync_wrapper(coroutine, obj=self))
            self.__dict__[name[1:]] = blocking

    def _find_composed_async(self) -> frozenset[str]:
        inner_type = type(self.fs)
        composed = set()
        for name in ASYNC_METHODS:
            mine = vars(AsyncFileSystem).get(name)
            if mine is not None and getattr(inner_type, name, None) is mine:
                composed.add(name)
        return frozenset(composed)

    async def _acall(self, operation: str, label: str, fn: Callable[..., Any], *args: Any,
                     **kwargs: Any) -> Any:
        if args or kwargs:  # never through Retrier.acall's own keywords (path=, fn=...)
            fn = functools.partial(fn, *args, **kwargs)
        return await self.retrier.acall(operation, label, fn,
                                        reconcile=_RECONCILE.get(operation))

    async def _retry_aiter(self, operation: str, label: str, fn: Callable[..., Any],
                           *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        holder: dict[str, Any] = {}

        async def first() -> Any:
            iterator = fn(*args, **kwargs).__aiter__()
            holder["iterator"] = iterator
            try:
                return await iterator.__anext__()
            except StopAsyncIteration:
                return _MISSING

        item = await self.retrier.acall(operation, label, first)
        if item is _MISSING:
            return
        yield item
        async for item in holder["iterator"]:
            yield item

    async def open_async(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        path = self._strip_protocol(path)
        if mode == "rb":
            reader = AsyncRetryReadFile(self, path, mode, kwargs)
            await reader._first_open()
            return reader
        operation = "open_append_stream" if "a" in mode else "open_output_stream"
        return await self._acall(operation, path, self.fs.open_async, path, mode, **kwargs)


def _make_async(name: str) -> Callable[..., Any]:
    base = vars(AsyncFileSystem).get(name)
    operation = name[1:]

    async def method(self: AsyncRetryFileSystem, *args: Any, **kwargs: Any) -> Any:
        if name in self._composed_async:
            return await base(self, *args, **kwargs)  # type: ignore[misc]
        return await self._acall(operation, _label(operation, args, kwargs),
                                 getattr(self.fs, name), *args, **kwargs)

    method.__name__ = method.__qualname__ = name
    return method


def _make_async_generator(name: str) -> Callable[..., Any]:
    base = vars(AsyncFileSystem).get(name)
    operation = name[1:]

    async def method(self: AsyncRetryFileSystem, *args: Any, **kwargs: Any
                     ) -> AsyncIterator[Any]:
        if name in self._composed_async:
            async for item in base(self, *args, **kwargs):  # type: ignore[misc]
                yield item
            return
        async for item in self._retry_aiter(operation, _label(operation, args, kwargs),
                                            getattr(self.fs, name), *args, **kwargs):
            yield item

    method.__name__ = method.__qualname__ = name
    return method


for _name in ASYNC_METHODS:
    _base = vars(AsyncFileSystem).get(_name)
    setattr(AsyncRetryFileSystem, _name,
            _make_async_generator(_name) if inspect.isasyncgenfunction(_base)
            else _make_async(_name))
del _name, _base


# -- files ---------------------------------------------------------------------------------------

class _InnerFile:
    """An fsspec file as the retrying streams see it: ``discard`` drops it, never commits it.

    fsspec's buffered files commit on ``close`` (and on garbage collection), so a broken upload
    is discarded (s3fs aborts the multipart upload) and marked closed; a local file that cannot
    be discarded (``autocommit``) is closed, the replay rewrites it from the start.
    """

    __slots__ = ("file",)

    def __init__(self, file: Any) -> None:
        self.file = file

    def __getattr__(self, name: str) -> Any:
        return getattr(self.file, name)

    def read(self, *args: Any) -> Any:
        return self.file.read(*args)

    def write(self, data: Any) -> Any:
        return self.file.write(data)

    def flush(self) -> Any:
        return self.file.flush()

    def close(self) -> Any:
        return self.file.close()

    def discard(self) -> None:
        file = self.file
        mode = getattr(file, "mode", "rb")
        try:
            if "r" in mode and "+" not in mode:
                file.close()
            elif isinstance(file, AbstractBufferedFile):
                try:
                    file.discard()
                finally:
                    file.closed = True  # its __del__ must not commit the broken upload
            else:
                try:
                    file.discard()
                except Exception:  # noqa: BLE001 - autocommit local file: close it
                    file.close()
        except Exception:  # noqa: BLE001 - the file is broken already; its error was handled
            pass


class RetryReadFile(ResumableInputFile):
    """A file open for reading whose reads resume after a failure (see `ResumableInputFile`).

    Quacks like an fsspec file: ``size``, ``path``, ``fs``, ``mode``, ``loc``, ``info()``,
    ``readline``, iteration, ``seek``/``tell``, context manager.
    """

    def __init__(self, fs: RetryFileSystem, path: str, mode: str, inner: _InnerFile,
                 reopen: Callable[[], _InnerFile], retrier: Retrier) -> None:
        seekable = bool(getattr(inner, "seekable", lambda: False)())
        super().__init__(path, inner, reopen, retrier, seekable=seekable)
        self.fs = fs
        self.mode = mode
        self._details = getattr(inner.file, "details", None)

    @property
    def size(self) -> int:  # type: ignore[override]
        return self._length()

    def _length(self) -> int:
        if self._size is None:
            self._size = ResumableInputFile.size(self)
        return self._size

    @property
    def loc(self) -> int:
        return self.tell()

    def _end(self) -> int:
        return self._length()

    def readline(self, size: int | None = -1) -> bytes:
        if size is not None and size >= 0:
            return super().readline(size)
        if self.closed:
            raise ValueError("I/O operation on closed file")
        with self._lock:
            line = self._retrier.call("read", self.path, self._attempt, _readline)
            self._pos += len(line)
            self._inner_pos = self._pos
        return line

    def info(self) -> dict[str, Any]:
        if self._details is not None:
            return dict(self._details)
        return self.fs.info(self.path)

    @property
    def details(self) -> dict[str, Any]:
        return self.info()

    def __reduce__(self) -> tuple[Any, ...]:
        return _reopen_read, (self.fs, self.path, self.mode, self.tell())

    def __repr__(self) -> str:
        return redact(f"<RetryReadFile {self.path!r} at {self._pos}>")


def _readline(inner: Any) -> bytes:
    line = inner.readline()
    return bytes(line) if not isinstance(line, bytes) else line


def _reopen_read(fs: RetryFileSystem, path: str, mode: str, position: int) -> RetryReadFile:
    file = fs.open(path, mode)
    file.seek(position)
    return file


class RetryWriteFile(ReplayableOutputStream):
    """A file open for writing that replays into a fresh upload when one fails (see
    `ReplayableOutputStream`). Quacks like an fsspec file: ``path``, ``fs``, ``mode``, ``loc``,
    ``commit()``/``discard()`` (transactions), context manager."""

    def __init__(self, fs: RetryFileSystem, path: str, mode: str, inner: _InnerFile,
                 reopen: Callable[[], _InnerFile], retrier: Retrier, *,
                 verify: Callable[[str, int], bool] | None, spool_memory: int,
                 autocommit: bool) -> None:
        super().__init__(path, inner, reopen, retrier, verify=verify, spool_memory=spool_memory)
        self.fs = fs
        self.mode = mode
        self.autocommit = autocommit
        self._last_inner = inner

    @property
    def loc(self) -> int:
        return self.tell()

    def commit(self) -> None:
        """Commit a file written inside a transaction (``autocommit=False``)."""
        inner = self._last_inner
        self._retrier.call("commit", self.path, inner.file.commit)

    def discard(self) -> None:
        """Throw the file away without committing it."""
        if not self.closed:
            self._failed = True  # close() now discards instead of committing
            self.close()
        else:
            inner = self._last_inner
            if hasattr(inner.file, "discard"):
                inner.file.discard()

    def __reduce__(self) -> tuple[Any, ...]:
        raise RuntimeError("Pickling a writeable file is not supported")

    def __repr__(self) -> str:
        return redact(f"<RetryWriteFile {self.path!r} {self.tell()} bytes written>")


class AsyncRetryReadFile:
    """The async reader of `AsyncRetryFileSystem.open_async`: reads resume after a failure.

    A failed read reopens the stream and skips to the same offset (async streams cannot seek).
    """

    def __init__(self, fs: AsyncRetryFileSystem, path: str, mode: str,
                 kwargs: Mapping[str, Any]) -> None:
        self.fs = fs
        self.path = path
        self.mode = mode
        self._kwargs = dict(kwargs)
        self._inner: Any = None
        self.loc = 0
        self.closed = False
        self._lock = asyncio.Lock()

    @property
    def size(self) -> int | None:
        return getattr(self._inner, "size", None)

    def tell(self) -> int:
        return self.loc

    async def _first_open(self) -> None:
        await self.fs.retrier.acall("open_input_file", self.path, self._reopen)

    async def _reopen(self) -> None:
        inner = await self.fs.fs.open_async(self.path, self.mode, **self._kwargs)
        try:
            remaining = self.loc
            while remaining:
                chunk = await inner.read(min(remaining, 8 * 1024 * 1024))
                if not chunk:
                    raise OSError(f"{self.path!r} ended before offset {self.loc} on reopen")
                remaining -= len(chunk)
        except BaseException:
            await _aclose_quietly(inner)
            raise
        self._inner = inner

    async def read(self, length: int = -1) -> bytes:
        if self.closed:
            raise ValueError("I/O operation on closed file")

        async def attempt() -> bytes:
            if self._inner is None:
                await self._reopen()
            try:
                return await self._inner.read(length)
            except BaseException:
                inner, self._inner = self._inner, None
                await _aclose_quietly(inner)
                raise

        async with self._lock:
            data = await self.fs.retrier.acall("read", self.path, attempt)
            self.loc += len(data)
        return data

    async def close(self) -> None:
        if not self.closed:
            self.closed = True
            inner, self._inner = self._inner, None
            if inner is not None:
                await _aclose_quietly(inner)

    async def __aenter__(self) -> AsyncRetryReadFile:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()


async def _aclose_quietly(file: Any) -> None:
    try:
        result = file.close()
        if inspect.isawaitable(result):
            await result
    except Exception:  # noqa: BLE001 - a broken stream
        pass


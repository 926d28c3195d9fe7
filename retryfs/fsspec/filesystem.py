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
(``verify_writes``). Appends (``"ab"``) and read-write modes: only the open is retried. On
s3fs, files opened ``"rb"`` and ``"wb"`` go through pyarrow's S3 client where s3fs's settings
carry over (``file_client``, `retryfs.fsspec.native`).

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

import functools
import inspect
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any, cast

import pyarrow.fs as pafs
from fsspec.asyn import AsyncFileSystem, async_gen_wrapper, sync_wrapper
from fsspec.implementations.arrow import ArrowFSWrapper
from fsspec.implementations.chained import ChainedFileSystem
from fsspec.spec import AbstractFileSystem

from retryfs.arrow.filesystem import RetryingFileSystem, RetryingHandler, ensure_copy_files_guard
from retryfs.clients import with_client_attempts
from retryfs.config import (
    CODE_ONLY,
    Configured,
    FileClient,
    OnePartClient,
    WrapperConfig,
    check_operation_names,
    config_from_env,
    config_from_options,
    default,
    given,
    merge,
)
from retryfs.core.budget import RetryBudget, bucket_for
from retryfs.core.classify import ErrorClassifier
from retryfs.core.engine import Retrier
from retryfs.core.policy import ALL_OPERATION_GROUPS, FSSPEC_GROUPS, RetryPolicy
from retryfs.core.proof import (
    UNKNOWN,
    Verdict,
    WriteDigest,
    arrow_state,
    fsspec_state,
    is_new,
    read_md5,
    state_before,
    verdict,
)
from retryfs.core.ratelimit import RateLimit, RateLimiter, limiter_for
from retryfs.core.redact import redact, register_option_secrets
from retryfs.core.stats import RetryStats
from retryfs.core.timeouts import timed, write_attempt_timeout, writes_locally
from retryfs.errors import CommitNotVisibleError
from retryfs.patches import s3fs_one_try
from retryfs.patches.s3fs_parts import retry_parts_in_place, with_parts_in_flight

from .files import (
    AsyncRetryReadFile,
    AsyncTimedWriteFile,
    InnerFile,
    PartsInBackground,
    RetryReadFile,
    RetryWriteFile,
    defuse_half_open,
    fsspec_errors,
)
from .inner import call_label, inner_arguments, inner_is_async, inner_path, resolve_inner
from .native import arrow_twin
from .reconcile import async_reconciler, sync_reconciler

__all__ = ["AsyncRetryFileSystem", "AsyncRetryReadFile", "FSSPEC_GROUPS",
           "RetryFileSystem", "RetryReadFile", "RetryWriteFile"]

# Methods of AbstractFileSystem that are not storage calls (configuration, paths, caches,
# transactions, serialisation): never retried, some answered by the wrapper itself.
_NOT_RETRIED = frozenset({
    "open", "invalidate_cache", "start_transaction", "end_transaction", "transaction",
    "to_json", "to_dict", "from_json", "from_dict", "get_mapper", "current",
    "clear_instance_cache", "unstrip_protocol", "fsid", "_get_pyarrow_filesystem",
})
# Generators: retried until they yield their first item.
_GENERATORS = frozenset({"walk"})
# The options of AbstractFileSystem/AsyncFileSystem itself (the rest are retry options).
_FSSPEC_OWN = frozenset({"use_listings_cache", "listings_expiry_time", "max_paths",
                         "asynchronous", "loop", "batch_size"})
_MISSING = object()


#: The blocking methods of ``AbstractFileSystem`` the face retries (its public methods minus
#: `_NOT_RETRIED`; `tests/test_structure.py` checks the table against the installed fsspec).
SYNC_METHODS: tuple[str, ...] = (
    "cat", "cat_file", "cat_ranges", "checksum", "copy", "cp", "cp_file", "created", "delete",
    "disk_usage", "download", "du", "exists", "expand_path", "find", "get", "get_file", "glob",
    "head", "info", "isdir", "isfile", "lexists", "listdir", "ls", "makedir", "makedirs",
    "mkdir", "mkdirs", "modified", "move", "mv", "pipe", "pipe_file", "put", "put_file",
    "read_block", "read_bytes", "read_text", "rename", "rm", "rm_file", "rmdir", "sign", "size",
    "sizes", "stat", "tail", "touch", "tree", "ukey", "upload", "walk", "write_bytes",
    "write_text",
)
#: The coroutines of ``AsyncFileSystem`` the async face retries.
ASYNC_METHODS: tuple[str, ...] = (
    "_cat", "_cat_file", "_cat_ranges", "_copy", "_cp_file", "_du", "_exists", "_expand_path",
    "_find", "_get", "_get_file", "_glob", "_info", "_isdir", "_isfile", "_ls", "_makedirs",
    "_mkdir", "_mv_file", "_pipe", "_pipe_file", "_put", "_put_file", "_rm", "_rm_file",
    "_size", "_sizes", "_walk",
)


#: Every operation name of this face with its group.
FACE_GROUPS: dict[str, str] = ALL_OPERATION_GROUPS


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
                return value(inner_path(inner, path))
            return strip
        return value


class _CachedPerInstance(type(AbstractFileSystem)):  # type: ignore[misc]
    """fsspec's instance cache, except for a wrapper of a filesystem object: the cache keys the
    arguments by their ``str``, and two different objects can print alike (two retryfs wrappers
    of the same settings; an address reused after one was freed), so a cached wrapper would be
    handed back around the wrong filesystem, with the wrong counters.

    The URL a chained filesystem was opened with (``fo``, which ``url_to_fs`` passes) is not
    part of the key: the wrapper serves every path of the filesystem it wraps. Keyed by it,
    each checkpoint directory (``retry::s3://bucket/ckpt/step-100``, ``.../step-200``) built a
    wrapper of its own, with a client of its own: a session, its service model read again
    (80 ms of CPU per torch DCP save in a profile), connections opened again."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        kwargs.pop("fo", None)
        inner = kwargs.get("fs", args[0] if args else None)
        if inner is not None and not isinstance(inner, str):
            kwargs["skip_instance_cache"] = True
        return super().__call__(*args, **kwargs)


class RetryFileSystem(Configured, ChainedFileSystem,  # type: ignore[misc]
                      metaclass=_CachedPerInstance):
    """An fsspec filesystem that retries every call of another one (protocol ``retry``).

    Give the filesystem to wrap as ``fs`` (an fsspec filesystem; a pyarrow one is adapted, a
    `retryfs.RetryingFileSystem` unwrapped with its configuration), or as ``target_protocol`` and
    ``target_options`` like ``simplecache``. Retry options: ``policy`` (a `RetryPolicy`), its
    fields by name (``max_attempts=8``, ``initial_delay=0.5``...), per-group fields
    (``write_max_attempts=20``; groups: metadata, read, write, delete, move), ``per_operation``
    (``{"write": {...}, "cat_file": RetryPolicy(...)}``), ``classifier``,
    ``retryable_messages``, ``stats``, ``verify_writes`` (default true), ``spool_memory``
    (bytes, default 32 MiB), ``budget`` (default true), ``rate_limit`` (``auto``, ``on`` or
    ``off``; default ``auto``), ``timeout`` (seconds per attempt of read and metadata calls, or
    ``{group: seconds}``). Values may be strings, as they come from
    fsspec's configuration (``FSSPEC_RETRY_MAX_ATTEMPTS=8``); ``RETRYFS_*`` environment
    variables set the defaults. An unknown option is a ``ValueError`` that lists the valid ones.

    When ``fs`` is async (s3fs...), the instance is an `AsyncRetryFileSystem`.
    """

    protocol = "retry"
    cachable = True

    _strip_protocol = _PerInstance(
        "_strip_protocol", vars(AbstractFileSystem)["_strip_protocol"])
    _parent = _PerInstance("_parent", vars(AbstractFileSystem)["_parent"])
    sep = _PerInstance("sep", "/")
    root_marker = _PerInstance("root_marker", "")

    def __new__(cls, *args: Any, **kwargs: Any) -> RetryFileSystem:
        if cls is RetryFileSystem and inner_is_async(kwargs.get("fs"),
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
        **options: Any,
    ) -> None:
        """Wrap ``fs``, or the filesystem of ``target_protocol`` with ``target_options``.

        Each option is a field of `WrapperConfig` (which says what it does) and, where it has
        one, a ``retry_*`` URL parameter and ``RETRYFS_*`` variable. An option left at its
        default takes its value from ``config`` when given. The spellings of 0.1.0
        (``native_attempts``, ``native_write_attempts``) still work, with a
        ``DeprecationWarning``.

        ``options``: fsspec's own (``skip_instance_cache``, ``asynchronous``...) and the
        ``retry`` protocol's, by the bare names of the URL parameters (``max_attempts=8``,
        ``write_max_attempts``, strings as in a URL); they apply over the keywords above.
        """
        for name, value in given({k: v for k, v in locals().items()
                                  if k not in CODE_ONLY}).items():
            options.setdefault(name, value)
        own = {k: options.pop(k) for k in list(options) if k in _FSSPEC_OWN}
        retry_options = dict(options)
        inner, inherited = resolve_inner(fs, target_protocol, target_options, own)
        if config is not None:
            if not isinstance(config, WrapperConfig):
                raise TypeError(f"config must be a WrapperConfig, got {type(config).__name__}")
            inherited = config
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
        ensure_copy_files_guard()  # its streams report their commits to copy_files too
        self.fs = inner
        self.target_protocol = target_protocol
        register_option_secrets(target_options)
        register_option_secrets(getattr(inner, "storage_options", None))
        code = {name: value for name, value in (
            ("policy", policy), ("per_operation", per_operation), ("classifier", classifier),
            ("stats", stats)) if value is not None}
        self._configure(inherited, code, retry_options)
        self._composed = self._find_composed()

    # -- configuration -------------------------------------------------------------------------
    def _configure(self, base: WrapperConfig | None, code: Mapping[str, Any],
                   options: Mapping[str, Any]) -> None:
        """The settings: ``base`` (a wrapper's that is unwrapped, or ``config=``) under the
        code's arguments, over the ``RETRYFS_*`` environment, under the protocol's options."""
        explicit = base.options() if base is not None else {}
        if "per_operation" in code and "per_operation" in explicit:
            code = {**code, "per_operation": {**explicit["per_operation"],
                                              **code["per_operation"]}}
        # a client retryfs builds itself (target_protocol, retry:: URLs) gets one retry layer, as
        # from_uri's; a client handed in (fs=) keeps its own retries unless asked
        defaults = ({"client_attempts": 1, "file_client": "auto"}
                    if self.target_protocol is not None else None)
        config = merge(code={**explicit, **code}, top=config_from_options(options),
                       env=config_from_env(url=False), defaults=defaults)
        inner = self.fs
        check_operation_names(config, lambda key: callable(getattr(inner, key, None)),
                              f" nor a method of {type(inner).__name__}")
        if config.stats is None:
            config = config.replace(stats=RetryStats())
        self.retry_config: WrapperConfig = config
        if config.client_attempts is not None:  # s3fs, gcsfs, adlfs, or pyarrow's S3 and GCS
            if isinstance(inner, ArrowFSWrapper):
                self.fs = ArrowFSWrapper(with_client_attempts(inner.fs, config.client_attempts))
            else:
                self.fs = with_client_attempts(inner, config.client_attempts)
                s3fs_one_try.spare(self.fs)
        self._arrow_files = self._file_client(config)
        self._arrow_writes: RetryingHandler | None = None  # the writes' (_open_arrow_write)
        self._timeouts = config.timeouts_for(FACE_GROUPS)
        budget = cast("RetryBudget | None", config.budget)  # normalized
        bucket = bucket_for(self.fs, budget) if budget is not None else None
        self.retrier = Retrier(self._policy_for, config.effective_classifier, self.stats,
                               budget=bucket, timeouts=self._timeouts,
                               limiter=limiter_for(self.fs, cast(RateLimit, config.rate_limit)))

    def _file_client(self, config: WrapperConfig) -> Any:
        """pyarrow's S3 client that reads the files ``open`` returns (``file_client``), its
        own retries set as s3fs's are (``client_attempts``); ``None``: s3fs's own files."""
        if config.file_client == "fsspec":
            return None
        twin = arrow_twin(self.fs)
        if isinstance(twin, str):
            if config.file_client == "arrow":
                raise ValueError(f"file_client='arrow': s3fs's settings do not carry over to "
                                 f"pyarrow's S3 client: {twin}")
            return None
        if config.client_attempts is not None:
            twin = with_client_attempts(twin, config.client_attempts)
        return twin

    @property
    def rate_limiter(self) -> RateLimiter | None:
        """The live rate limiter of the wrapped endpoint in this process (None: ``"off"``)."""
        return self.retrier.limiter

    @property
    def timeout(self) -> Mapping[str, float] | None:
        return cast("Mapping[str, float]", self.retry_config.timeout) or None  # normalized


    def _policy_for(self, operation: str) -> RetryPolicy:
        return self.retry_config.policy_for(operation, FACE_GROUPS)

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
        proof = self._pipe_proof(operation, args, kwargs)
        if proof is None:
            return self.retrier.call(operation, label, fn,
                                     reconcile=self._reconciler(operation, args, kwargs))
        path, size, digest = proof
        before = UNKNOWN
        if digest.large:  # many bytes: the destination's state before proves the change
            before = state_before(self.retrier.call, path, self._state)
        unverified: list[Exception] = []
        attempt = fn

        def proven() -> Any:
            result = attempt()
            try:
                landed = self.retrier.call("verify", path, self._landed, path, size, digest,
                                           before)
            except Exception as exc:  # noqa: BLE001 - committed, unproven: raised after
                unverified.append(exc)
                return result
            if not landed:
                raise CommitNotVisibleError.written(path, size, landed)
            return result

        result = self.retrier.call(operation, label, proven)
        if unverified:
            raise unverified[0]
        return result

    def _pipe_proof(self, operation: str, args: tuple[Any, ...], kwargs: Mapping[str, Any]
                    ) -> tuple[str, int, WriteDigest] | None:
        """For a ``pipe_file`` of bytes (``verify_writes``): its path, size and digest, for the
        check after its commit that the object there is the new one (`retryfs.core.proof`)."""
        if operation != "pipe_file" or not self.verify_writes:
            return None
        path = args[0] if args else kwargs.get("path")
        value = args[1] if len(args) > 1 else kwargs.get("value")
        if not isinstance(path, str) or not isinstance(value, (bytes, bytearray, memoryview)):
            return None
        digest = WriteDigest()
        digest.update(value)
        return path, memoryview(value).nbytes, digest

    def _reconciler(self, operation: str, args: tuple[Any, ...],
                    kwargs: Mapping[str, Any]) -> Callable[[BaseException], Any] | None:
        """How a retry's error of ``operation`` can show an earlier attempt's work (its checks
        are ``info`` calls through the engine)."""
        return sync_reconciler(operation, args, kwargs,
                               lambda path: self._call("info", path, self.fs.info, path))

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
        return cast("str", self.fs.unstrip_protocol(name))

    def invalidate_cache(self, path: str | None = None) -> None:
        self.fs.invalidate_cache(path)
        super().invalidate_cache(path)

    @property
    def fsid(self) -> str:
        return f"retry_{self.fs.fsid}"

    def _isfilestore(self) -> bool:
        return bool(self.fs._isfilestore())

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
            try:
                return inner_fs.open(path, mode, **open_kwargs)
            except BaseException as error:
                if mode != "rb":
                    defuse_half_open(error)  # never an empty commit from a failed open
                raise

        if mode == "rb" and self._arrow_files is not None and not kwargs:
            return self._open_arrow_read(path)
        if (mode == "wb" and autocommit and block_size is None and not kwargs
                and self._arrow_files is not None):
            return self._open_arrow_write(path)
        if mode == "rb":
            def reopen_read() -> InnerFile:
                return InnerFile(self._call("open_input_file", path, opener))

            first = reopen_read()
            return RetryReadFile(self, path, mode, first, reopen_read, self.retrier)
        if mode in ("wb", "xb"):
            writer: RetryWriteFile | None = None
            per_attempt = None if writes_locally(inner_fs) else self._write_attempt_timeout

            def reopen_write() -> InnerFile:
                file = self._call("open_output_stream", path, opener)
                inner = InnerFile(retry_parts_in_place(file, self.retrier, path, per_attempt))
                if writer is not None:
                    writer._last_inner = inner
                return inner

            first = reopen_write()
            writer = RetryWriteFile(
                self, path, mode, first, reopen_write, self.retrier,
                verify=self._landed if (self.verify_writes and autocommit) else None,
                spool_memory=self.spool_memory, autocommit=autocommit,
                attempt_timeout=with_parts_in_flight(per_attempt, first.file),
                state_of=self._state)
            return writer
        operation = "open_append_stream" if "a" in mode else "open"
        return self._call(operation, path, opener)

    def _open_arrow_read(self, path: str) -> RetryReadFile:
        """``path`` opened for reading through pyarrow's client (``file_client``)."""
        reader = self._arrow_files

        def open_file() -> Any:
            with fsspec_errors():  # a refused HEAD: PermissionError, as s3fs raises it
                return reader.open_input_file(path)

        def reopen() -> Any:
            return self._call("open_input_file", path, open_file)

        return RetryReadFile(self, path, "rb", reopen(), reopen, self.retrier)

    def _open_arrow_write(self, path: str) -> RetryWriteFile:
        """``path`` opened for writing through pyarrow's client (``file_client``): each attempt
        a stream of the pyarrow face's write client (parts in parallel, a failed part re-sent
        by its own SDK attempts), replayed from the spool into a fresh one when it fails."""
        if self._arrow_writes is None:  # built on first use (a race builds two, both alike)
            # opened lazily, as s3fs's files are: a file closed within one part is one
            # PutObject (DCP's metadata, a logger's events), not three requests
            _, (options,) = self._arrow_files.__reduce__()
            lazy = pafs.S3FileSystem(**dict(options, allow_delayed_open=True))
            # only its streams are used, each attempt retried here (self._call): this face's
            # per_operation may name methods that only s3fs has, which the pyarrow face
            # refuses, and its copies' small-file client (obstore) is never needed
            self._arrow_writes = RetryingHandler(lazy, config=self.retry_config.replace(
                per_operation={}, one_part_client="arrow"))
        handler = self._arrow_writes

        def reopen() -> PartsInBackground:
            return PartsInBackground(
                self._call("open_output_stream", path, handler.open_attempt_output, path))

        first = reopen()
        return RetryWriteFile(
            self, path, "wb", first, reopen, self.retrier,
            verify=self._landed if self.verify_writes else None,
            spool_memory=self.spool_memory, autocommit=True,
            attempt_timeout=self._write_attempt_timeout,
            state_of=self._state, after_close=lambda: self.fs.invalidate_cache(path))

    def _write_attempt_timeout(self, operation: str, in_flight: int) -> float | None:
        """As on the pyarrow face: each write/flush/close attempt may take ``write_timeout``
        plus its bytes in flight at ``min_throughput`` (``None``: writes untimed)."""
        config = self.retry_config
        if config.write_timeout is None:
            return None
        return write_attempt_timeout(config.write_timeout, config.min_throughput, in_flight)

    def _landed(self, path: str, size: int, digest: WriteDigest | None = None,
                before: Any = UNKNOWN) -> Verdict:
        """Whether ``path`` now holds the ``size`` bytes written (the read-after-write check):
        the new object, not an older one of the same size (`retryfs.core.proof.is_new`: the store's
        ETag or MD5 against the bytes' MD5, or a change since ``before``)."""
        try:
            after = self._state(path)
        except NotImplementedError:  # a filesystem that cannot tell: trust the commit
            return True
        if writes_locally(self.fs):  # a local write is in place or nowhere: its size says it
            return after is not None and (after.size is None or after.size == size)
        return is_new(after, size, digest, before,
                      lambda: read_md5(lambda: self.fs.cat_file(path)))

    def _state(self, path: str) -> Any:
        """``path``'s state (`retryfs.core.proof.ObjectState`; ``None``: no file): a pyarrow
        filesystem's own (S3's ETag) under fsspec's ``ArrowFSWrapper``, else ``info``'s."""
        if isinstance(self.fs, ArrowFSWrapper):
            return arrow_state(self.fs.fs, path)
        try:
            self.fs.invalidate_cache(path)
            return fsspec_state(self.fs.info(path))
        except FileNotFoundError:
            return None

    # -- the pyarrow face ------------------------------------------------------------------------
    def to_arrow(self) -> RetryingFileSystem:
        """The same wrapping on the pyarrow face: a `retryfs.RetryingFileSystem` over the same
        filesystem with the same settings (`retry_config`, stats included)."""
        return RetryingFileSystem(self)

    @classmethod
    def from_arrow(cls, filesystem: Any, **options: Any) -> RetryFileSystem:
        """The fsspec face of a `retryfs.RetryingFileSystem` (its configuration kept, retries
        not doubled), or of any pyarrow filesystem (adapted with ``ArrowFSWrapper``)."""
        return cls(fs=filesystem, **options)

    def unwrap(self) -> Any:
        """The filesystem this one wraps."""
        return self.fs

    # -- identity --------------------------------------------------------------------------------
    def __eq__(self, other: object) -> bool:
        """Equal when of the same class, over equal filesystems, with equal settings (not
        fsspec's token of the constructor's arguments: a copy made by pickling carries the
        settings, not the arguments they came from, and is still the same filesystem)."""
        if self is other:
            return True
        if type(other) is not type(self):
            return False
        assert isinstance(other, RetryFileSystem)
        return bool(self.fs == other.fs) and self.retry_config == other.retry_config

    def __hash__(self) -> int:
        return hash((type(self).__qualname__, self.fs, self.retry_config))

    def __reduce__(self) -> tuple[Any, ...]:
        # the settings travel whole (never re-read from a worker's environment), the counters
        # do not; the filesystem to wrap as it was given
        options = {k: v for k, v in self.storage_options.items()
                   if k in ("fs", "target_protocol", "target_options", "fo")
                   or k in _FSSPEC_OWN and k != "loop"}
        options["config"] = self.retry_config
        return _restore, (type(self), self.storage_args, options)

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
        inner = self.__dict__["fs"]
        if inspect.iscoroutinefunction(value):
            async def retried_coroutine(*args: Any, **kwargs: Any) -> Any:
                args, kwargs = inner_arguments(operation, inner, args, kwargs)
                return await self.retrier.acall(operation, call_label(operation, args, kwargs),
                                                functools.partial(value, *args, **kwargs))
            retried_coroutine.__name__ = name
            retried_coroutine.__doc__ = value.__doc__
            return retried_coroutine
        if inspect.isgeneratorfunction(value) or inspect.isasyncgenfunction(value):
            return value

        def retried(*args: Any, **kwargs: Any) -> Any:
            args, kwargs = inner_arguments(operation, inner, args, kwargs)
            return self._call(operation, call_label(operation, args, kwargs), value, *args, **kwargs)

        retried.__name__ = name
        retried.__doc__ = value.__doc__
        return retried


def _restore(cls: type[RetryFileSystem], args: tuple[Any, ...],
             options: dict[str, Any]) -> RetryFileSystem:
    """An unpickled (or deep-copied) wrapper: the instance of fsspec's cache equal to it when
    there is one (the original, in the same process), else a new one kept out of the cache
    (its arguments differ from the original's: cached, it would be a twin)."""
    fresh = cls(*args, **options, skip_instance_cache=True)
    for cached in list(cls._cache.values()):
        if cached == fresh:
            return cast("RetryFileSystem", cached)
    return fresh


# -- the blocking methods ------------------------------------------------------------------------

#: fsspec's generic probes answer False on *any* error; on this face only "not found" is False.
_PROBES: dict[str, Callable[[dict[str, Any]], bool]] = {
    "exists": lambda info: True, "lexists": lambda info: True,
    "isdir": lambda info: info.get("type") == "directory",
    "isfile": lambda info: info.get("type") == "file",
}


def _probe(self: RetryFileSystem, name: str, path: Any, **kwargs: Any) -> bool:
    """``exists``/``isdir``/``isfile`` from a retried ``info``: False when it is not found; an
    error that outlived the retries (or a permanent one) is raised, never read as "absent"
    (fsspec's ``find(withdirs=True)`` would silently drop a directory, ``exists`` would let a
    caller overwrite what it could not see)."""
    try:
        info = self.info(path, **kwargs)
    except FileNotFoundError:
        return False
    return _PROBES[name](info)


def _make_sync(name: str) -> Callable[..., Any]:
    base = vars(AbstractFileSystem)[name]

    def method(self: RetryFileSystem, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = inner_arguments(name, self.fs, args, kwargs)
        if name in self._composed:
            if name in _PROBES and len(args) == 1:
                return _probe(self, name, args[0], **kwargs)
            return base(self, *args, **kwargs)
        return self._call(name, call_label(name, args, kwargs), getattr(self.fs, name),
                          *args, **kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = base.__doc__
    return method


def _omit_only_missing(error: BaseException) -> None:
    """``walk``'s default ``on_error`` on this face: a directory gone meanwhile is omitted, as
    fsspec does; any other error (retries given up, access denied) is raised, never turned
    into a silently shorter listing (fsspec's own default omits every ``OSError``)."""
    if not isinstance(error, FileNotFoundError):
        raise error


def _make_sync_generator(name: str) -> Callable[..., Any]:
    base = vars(AbstractFileSystem)[name]

    def method(self: RetryFileSystem, *args: Any, **kwargs: Any) -> Iterator[Any]:
        args, kwargs = inner_arguments(name, self.fs, args, kwargs)
        if name == "walk" and "on_error" not in kwargs and len(args) < 4:
            kwargs["on_error"] = _omit_only_missing
        if name in self._composed:
            yield from base(self, *args, **kwargs)
            return
        yield from self._retry_iter(name, call_label(name, args, kwargs), getattr(self.fs, name),
                                    *args, **kwargs)

    method.__name__ = method.__qualname__ = name
    method.__doc__ = base.__doc__
    return method


for _name in SYNC_METHODS:
    setattr(RetryFileSystem, _name,
            _make_sync_generator(_name) if _name in _GENERATORS else _make_sync(_name))


def _old_rm(self: RetryFileSystem, path: str) -> Any:
    """Delete one file (fsspec's old name for rm_file, which calls it)."""
    path = inner_path(self.fs, path)
    if "_rm" in self._composed:
        return AbstractFileSystem._rm(self, path)
    return self._call("rm_file", path, self.fs._rm, path)


RetryFileSystem._rm = _old_rm


# -- the async face ------------------------------------------------------------------------------

class AsyncRetryFileSystem(RetryFileSystem, AsyncFileSystem):  # type: ignore[misc]
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
        # the instance's own coroutine, not its class's: fsspec's AsyncFileSystemWrapper sets
        # each one on the instance (its class keeps AsyncFileSystem's no-op _mkdir)
        # (adlfs's `_walk` is a plain generator of its own, not fsspec's coroutine: the generic
        # one runs on the wrapper instead)
        composed = set()
        for name in ASYNC_METHODS:
            mine = vars(AsyncFileSystem).get(name)
            theirs = getattr(self.fs, name, None)
            if mine is not None and (getattr(theirs, "__func__", None) is mine or not (
                    inspect.iscoroutinefunction(theirs) or inspect.isasyncgenfunction(theirs))):
                composed.add(name)
        return frozenset(composed)

    async def _acall(self, operation: str, label: str, fn: Callable[..., Any], *args: Any,
                     **kwargs: Any) -> Any:
        if args or kwargs:  # never through Retrier.acall's own keywords (path=, fn=...)
            fn = functools.partial(fn, *args, **kwargs)
        reconcile = await async_reconciler(operation, args, kwargs, self._ainfo)
        proof = self._pipe_proof(operation, args, kwargs)
        if proof is None:
            return await self.retrier.acall(operation, label, fn, reconcile=reconcile)
        path, size, digest = proof
        before = UNKNOWN
        if digest.large:  # many bytes: the destination's state before proves the change
            before = await self._aproof_before(path)
        unverified: list[Exception] = []
        attempt = fn

        async def proven() -> Any:
            result = await attempt()
            try:
                landed = await self.retrier.acall(
                    "verify", path, functools.partial(self._alanded, path, size, digest,
                                                      before))
            except Exception as exc:  # noqa: BLE001 - committed, unproven: raised after
                unverified.append(exc)
                return result
            if not landed:
                raise CommitNotVisibleError.written(path, size, landed)
            return result

        result = await self.retrier.acall(operation, label, proven)
        if unverified:
            raise unverified[0]
        return result

    async def _astate(self, path: str) -> Any:
        self.fs.invalidate_cache(path)
        try:
            return fsspec_state(await self.fs._info(path))
        except FileNotFoundError:
            return None

    async def _aproof_before(self, path: str) -> Any:
        try:
            return await self.retrier.acall("verify", path,
                                            functools.partial(self._astate, path))
        except Exception:  # noqa: BLE001 - unknown: the size and the store prove it
            return UNKNOWN

    async def _alanded(self, path: str, size: int, digest: WriteDigest, before: Any
                       ) -> Verdict:
        """`RetryFileSystem._landed` on the event loop (one ``_info``, a read-back only where
        the store's ETag cannot be compared with the bytes' MD5)."""
        found = verdict(await self._astate(path), size, digest, before)
        if found is not None:
            return found
        data = await self.fs._cat_file(path)  # only the content can tell
        return read_md5(lambda: data) == digest.hexdigest

    async def _ainfo(self, path: str) -> Any:
        return await self._acall("info", path, self.fs._info, path)

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
        writer = await self._acall(operation, path, self.fs.open_async, path, mode, **kwargs)
        return AsyncTimedWriteFile(writer, path, self._write_attempt_timeout)


def _make_async(name: str) -> Callable[..., Any]:
    base = vars(AsyncFileSystem).get(name)
    operation = name[1:]

    async def method(self: AsyncRetryFileSystem, *args: Any, **kwargs: Any) -> Any:
        args, kwargs = inner_arguments(name, self.fs, args, kwargs)
        if name in self._composed_async:
            return await base(self, *args, **kwargs)
        return await self._acall(operation, call_label(operation, args, kwargs),
                                 getattr(self.fs, name), *args, **kwargs)

    method.__name__ = method.__qualname__ = name
    return method


def _make_async_generator(name: str) -> Callable[..., Any]:
    base = vars(AsyncFileSystem).get(name)
    operation = name[1:]

    async def method(self: AsyncRetryFileSystem, *args: Any, **kwargs: Any
                     ) -> AsyncIterator[Any]:
        args, kwargs = inner_arguments(name, self.fs, args, kwargs)
        if name in self._composed_async:
            async for item in base(self, *args, **kwargs):
                yield item
            return
        async for item in self._retry_aiter(operation, call_label(operation, args, kwargs),
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

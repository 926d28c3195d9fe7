"""The retry budget: a token bucket shared by every wrapper of one endpoint in a process.

In the spirit of botocore's standard retry quota (``botocore.retries.standard``) and gRPC's
retry throttling. Each retry takes tokens from the endpoint's bucket (``retry_cost``; a timed
out attempt costs ``timeout_cost``, a throttled one ``throttle_cost``); each success gives some
back (``success_refund`` for a call that succeeded at once, the cost of its last retry for a
call that recovered). While the endpoint is healthy the bucket stays full and the budget is
invisible. In a hard outage, where nothing succeeds, the bucket empties after
``capacity / retry_cost`` retries across the whole process, and from then on a failing call
fails after its one attempt instead of sleeping through its own schedule: N threads fail in
bounded time and stop multiplying the load on a struggling service. The first success refills
it.

:class:`RetryBudget` is the *configuration*: immutable, compared and pickled with the wrapper.
The bucket itself is per-process *state* (:class:`TokenBucket`), looked up with
:func:`bucket_for` by the endpoint's identity and never pickled: a wrapper unpickled on a Ray
worker shares the bucket of that worker's process.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, TypeVar, cast

import pyarrow.fs as pafs
from fsspec.implementations.arrow import ArrowFSWrapper

from .redact import redact

__all__ = ["RetryBudget", "TokenBucket", "bucket_for", "buckets", "endpoint_of",
           "reset_budgets"]


@dataclass(frozen=True)
class RetryBudget:
    """How large the per-endpoint retry budget is and what a retry costs (botocore's numbers).

    - ``capacity``: tokens in a full bucket (botocore: 500).
    - ``retry_cost``: tokens one retry of a transient error takes (botocore: 5).
    - ``throttle_cost``: tokens one retry of a throttling error takes (botocore: 5).
    - ``timeout_cost``: tokens one retry after a timeout takes (botocore: 10).
    - ``success_refund``: tokens a call that succeeded at its first attempt gives back
      (botocore: 1). A call that succeeded after retries gives back the cost of its last retry.
    """

    capacity: int = 500
    retry_cost: int = 5
    throttle_cost: int = 5
    timeout_cost: int = 10
    success_refund: int = 1

    def __post_init__(self) -> None:
        for name in ("capacity", "retry_cost", "throttle_cost", "timeout_cost"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"RetryBudget.{name} must be an int >= 1, got {value!r}")
        refund = self.success_refund
        if isinstance(refund, bool) or not isinstance(refund, int) or refund < 0:
            raise ValueError(f"RetryBudget.success_refund must be an int >= 0, got {refund!r}")

    @property
    def max_retries(self) -> int:
        """Retries the whole process may make against one endpoint while nothing succeeds."""
        return self.capacity // min(self.retry_cost, self.throttle_cost, self.timeout_cost)

    def cost(self, *, throttled: bool = False, timed_out: bool = False) -> int:
        if timed_out:
            return self.timeout_cost
        return self.throttle_cost if throttled else self.retry_cost


def normalize_budget(budget: RetryBudget | bool | None) -> RetryBudget | None:
    """``True`` → the default budget; ``False``/``None`` → no budget; a RetryBudget as is."""
    if budget is True:
        return RetryBudget()
    if budget is False or budget is None:
        return None
    if isinstance(budget, RetryBudget):
        return budget
    if isinstance(budget, Mapping):
        return RetryBudget(**dict(budget))
    raise TypeError(f"budget must be a RetryBudget, a mapping of its fields, True or False; "
                    f"got {type(budget).__name__}")


class TokenBucket:
    """The live budget of one endpoint in this process (thread-safe)."""

    def __init__(self, config: RetryBudget, endpoint: str) -> None:
        self.config = config
        self.endpoint = endpoint  # a readable, secret-free label for logs and metrics
        self.capacity = config.capacity
        self.available = config.capacity
        self.denied = 0  # retries refused because the bucket was empty
        self._lock = threading.Lock()

    def acquire(self, cost: int) -> bool:
        """Take ``cost`` tokens for a retry; False (and nothing taken) if there are not enough."""
        with self._lock:
            if cost > self.available:
                self.denied += 1
                return False
            self.available -= cost
            return True

    def release(self, amount: int) -> None:
        """Give ``amount`` tokens back after a success (never beyond capacity)."""
        if self.available >= self.capacity or amount <= 0:  # the common case: full, no lock
            return
        with self._lock:
            self.available = min(self.capacity, self.available + amount)

    def refill(self) -> None:
        with self._lock:
            self.available = self.capacity
            self.denied = 0

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"endpoint": self.endpoint, "available": self.available,
                    "capacity": self.capacity, "denied": self.denied}

    def __repr__(self) -> str:
        return (f"TokenBucket({self.endpoint!r}, available={self.available}/{self.capacity}, "
                f"denied={self.denied})")


# -- the per-process registry -----------------------------------------------------------------

V = TypeVar("V")


class PerEndpoint(Generic[V]):
    """One object per endpoint and configuration in this process (a retry budget's bucket, a
    rate limiter), made by ``make(config, label)`` on first use and shared by every wrapper of
    that endpoint with that configuration; it lives as long as one of them holds it."""

    def __init__(self, make: Callable[[Any, str], V]) -> None:
        self._make = make
        self._lock = threading.Lock()
        self._made: weakref.WeakValueDictionary[Hashable, Any] = weakref.WeakValueDictionary()

    def get(self, fs: Any, config: Hashable) -> V:
        """The object of ``fs``'s endpoint (`endpoint_of`) under ``config``."""
        key, label = endpoint_of(fs)
        with self._lock:
            made = self._made.get((key, config))
            if made is None:
                made = self._make(config, label)
                self._made[(key, config)] = made
            return made

    def values(self) -> list[V]:
        """Every live one (for exporters and inspection)."""
        with self._lock:
            return list(self._made.values())


_buckets: PerEndpoint[TokenBucket] = PerEndpoint(TokenBucket)

# Options that tell one endpoint of a native pyarrow filesystem from another (never secrets).
_ENDPOINT_OPTIONS = ("scheme", "endpoint_override", "region", "host", "port", "account_name",
                     "blob_storage_authority", "dfs_storage_authority")
# The same for fsspec filesystems' storage options (and their client_kwargs).
_FSSPEC_OPTIONS = ("endpoint_url", "region_name", "region", "host", "port", "account_name",
                   "account_url", "project", "endpoint", "client_kwargs")


def _freeze(value: Any) -> Hashable:
    if isinstance(value, Mapping):
        return tuple(sorted((str(k), _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple, set, frozenset)):
        return tuple(_freeze(v) for v in value)
    try:
        hash(value)
    except TypeError:
        return repr(value)
    return cast("Hashable", value)


def endpoint_of(fs: Any) -> tuple[Hashable, str]:
    """``(key, label)`` naming the service endpoint behind a filesystem.

    Native pyarrow filesystems: their type and endpoint options (scheme, endpoint override,
    region, host, port, account). fsspec filesystems: their protocol and endpoint-like storage
    options. A ``PyFileSystem`` of an unknown handler: the handler itself (so two fault
    injectors in one test suite never share a budget). A handler may name its endpoint with a
    ``retry_budget_key()`` method returning a hashable key.
    """
    if isinstance(fs, pafs.PyFileSystem):
        handler = fs.handler
        own = getattr(handler, "retry_budget_key", None)
        if callable(own):
            key = own()
            return ("handler", key), f"{fs.type_name}:{key}"
        wrapped = getattr(handler, "wrapped_filesystem", None)  # a retryfs handler
        if isinstance(wrapped, pafs.FileSystem):  # a wrapper of a wrapper: the endpoint behind
            return endpoint_of(wrapped)
        if isinstance(handler, pafs.FSSpecHandler):
            return endpoint_of(handler.fs)
        try:
            hash(handler)
            key = handler
        except TypeError:
            key = id(handler)
        return ("py", key), f"{fs.type_name}@{id(handler):x}"
    if isinstance(fs, pafs.FileSystem):
        options: dict[str, Any] = {}
        try:
            reduced = fs.__reduce__()
            args = reduced[1] if len(reduced) > 1 else ()
            if args and isinstance(args[0], Mapping):
                options = {k: args[0][k] for k in _ENDPOINT_OPTIONS if args[0].get(k)}
        except Exception:  # noqa: BLE001 - a filesystem that cannot say: its type alone
            pass
        key = (fs.type_name, _freeze(options))
        shown = ",".join(f"{k}={v}" for k, v in options.items())
        return key, redact(f"{fs.type_name}({shown})" if shown else fs.type_name)
    if isinstance(fs, ArrowFSWrapper):  # fsspec's adapter of a pyarrow filesystem
        return endpoint_of(fs.fs)
    protocol = getattr(fs, "protocol", None)
    if protocol is not None:  # fsspec
        storage = getattr(fs, "storage_options", {}) or {}
        options = {k: storage[k] for k in _FSSPEC_OPTIONS if storage.get(k)}
        client = options.pop("client_kwargs", None)
        if isinstance(client, Mapping):
            options.update({k: client[k] for k in _FSSPEC_OPTIONS if client.get(k)})
        name = protocol if isinstance(protocol, str) else protocol[0]
        key = ("fsspec", type(fs).__module__, type(fs).__qualname__, _freeze(options))
        shown = ",".join(f"{k}={v}" for k, v in options.items())
        return key, redact(f"{name}({shown})" if shown else name)
    return ("object", type(fs).__module__, type(fs).__qualname__), type(fs).__name__


def bucket_for(fs: Any, config: RetryBudget) -> TokenBucket:
    """The bucket of ``fs``'s endpoint under ``config``, created on first use.

    Wrappers of one endpoint with one budget configuration share a bucket; it lives as long as
    one of them does.
    """
    return _buckets.get(fs, config)


def buckets() -> list[TokenBucket]:
    """Every live bucket in this process (for exporters and inspection)."""
    return _buckets.values()


def reset_budgets() -> None:
    """Refill every bucket (for test suites that inject faults on purpose)."""
    for bucket in buckets():
        bucket.refill()

"""What `S3FaultEndpoint` and `HttpFaultProxy` share: the plan of faults and the record of
requests, and the questions a test asks of them."""

from __future__ import annotations

import fnmatch
import random
import threading
from collections import Counter
from collections.abc import Iterable
from typing import Any, Generic, Protocol, TypeVar

from ._wire import Armed


class _Recorded(Protocol):
    @property
    def op(self) -> str: ...
    @property
    def method(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def fault(self) -> Any: ...


class _Seeded(Protocol):
    @property
    def seed(self) -> int: ...


F = TypeVar("F", bound=_Seeded)
R = TypeVar("R", bound=_Recorded)


class PlanAndRecord(Generic[F, R]):
    """An endpoint's fault plan (rules in order, each with its counters) and its record of
    requests (appended by the endpoint under ``_lock``), with what a test asks of them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._plan: list[Armed] = []
        self._record: list[R] = []

    def add_fault(self, fault: F) -> F:
        """Append `fault` to the plan (after the rules already there); returns it."""
        with self._lock:
            self._plan.append(Armed(fault, random.Random(fault.seed)))
        return fault

    def clear_faults(self) -> None:
        with self._lock:
            self._plan.clear()

    @property
    def faults(self) -> tuple[F, ...]:
        with self._lock:
            return tuple(armed.fault for armed in self._plan)

    def fired(self, fault: F) -> int:
        """How many times `fault` fired since it was added."""
        with self._lock:
            return sum(armed.fired for armed in self._plan if armed.fault is fault)

    def requests(self, op: str | Iterable[str] | None = None, *, method: str | None = None,
                 path: str | None = None, faulted: bool | None = None) -> list[R]:
        """The recorded requests, oldest first, filtered by op(s), method, path glob, faulted."""
        ops = {op} if isinstance(op, str) else set(op) if op is not None else None
        with self._lock:
            records = list(self._record)
        return [r for r in records
                if (ops is None or r.op in ops)
                and (method is None or r.method == method.upper())
                and (path is None or fnmatch.fnmatchcase(r.path, path))
                and (faulted is None or (r.fault is not None) == faulted)]

    def counts(self) -> Counter[str]:
        """Requests per operation name."""
        return Counter(r.op for r in self.requests())

    @property
    def injected(self) -> list[R]:
        """The requests that got a fault."""
        return self.requests(faulted=True)

    def reset_record(self) -> None:
        with self._lock:
            self._record.clear()

"""What `S3FaultEndpoint` and `HttpFaultProxy` share: the matching half of a fault rule (one
plan language for `S3Fault` and `HttpFault`) and the questions a test asks of the record."""

from __future__ import annotations

import fnmatch
import re
import threading
from collections import Counter
from collections.abc import Iterable
from typing import Any, Generic, Protocol, TypeVar


def rule_matches(rule: Any, request: Any) -> bool:
    """Whether ``request`` is one ``rule`` applies to, firing aside: its ``op`` (one name or
    several, ``rule.ops``), ``method``, ``path`` (a glob or a compiled pattern), ``query``
    (``True``/``False``: present or absent; else the value) and ``when`` predicate, each
    checked only when set."""
    if rule.op is not None and request.op not in rule.ops:
        return False
    if rule.method is not None and request.method != rule.method.upper():
        return False
    if isinstance(rule.path, str) and not fnmatch.fnmatchcase(request.path, rule.path):
        return False
    if isinstance(rule.path, re.Pattern) and not rule.path.search(request.path):
        return False
    for name, want in (rule.query or {}).items():
        if isinstance(want, bool):
            if (name in request.query) != want:
                return False
        elif request.query.get(name) != str(want):
            return False
    return rule.when is None or bool(rule.when(request))


class _Recorded(Protocol):
    @property
    def op(self) -> str: ...
    @property
    def method(self) -> str: ...
    @property
    def path(self) -> str: ...
    @property
    def fault(self) -> Any: ...


R = TypeVar("R", bound=_Recorded)


class RequestLog(Generic[R]):
    """An endpoint's record of requests (``_record``, appended under ``_lock`` by the endpoint)
    and the questions tests ask of it."""

    _lock: threading.Lock
    _record: list[R]

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

"""What `S3Fault` and `HttpFault` share (one plan language): the fields of a rule, their
checks, the matching half and the constructors of the faults that need no dialect."""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

_Rule = TypeVar("_Rule", bound="FaultRule")


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


@dataclass(frozen=True, eq=False)
class FaultRule:
    """One rule of a fault plan: which requests it matches, when it fires, what it does (the
    fields are documented on `S3Fault`). A subclass names its ``KINDS`` and may check more."""

    KINDS: ClassVar[frozenset[str]] = frozenset()

    kind: str
    status: int = 500
    code: str | None = None
    message: str | None = None
    retry_after: float | None = None
    seconds: float = 0.0
    keep_bytes: int | None = None
    applied: bool = False
    op: str | Collection[str] | None = None
    method: str | None = None
    path: str | re.Pattern[str] | None = None
    query: Mapping[str, str | int | bool] | None = None
    when: Callable[[Any], bool] | None = None
    nth: int | None = None
    times: int | None = None
    probability: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in self.KINDS:
            raise ValueError(f"kind: {self.kind!r} is not one of {sorted(self.KINDS)}")
        if self.nth is not None and self.nth < 1:
            raise ValueError(f"nth: must be >= 1, got {self.nth}")
        if self.times is not None and self.times < 0:
            raise ValueError(f"times: must be >= 0, got {self.times}")
        if self.probability is not None and not 0.0 <= self.probability <= 1.0:
            raise ValueError(f"probability: must be in [0, 1], got {self.probability}")
        if self.seconds < 0:
            raise ValueError(f"seconds: must be >= 0, got {self.seconds}")
        if self.keep_bytes is not None and self.keep_bytes < 0:
            raise ValueError(f"keep_bytes: must be >= 0, got {self.keep_bytes}")

    @property
    def ops(self) -> frozenset[str]:
        if self.op is None:
            return frozenset()
        return frozenset([self.op] if isinstance(self.op, str) else self.op)

    def _effect(self) -> str:
        """What the rule does, for its repr."""
        return {"error": f"{self.status} {self.code or ''}".rstrip(),
                "stall": f"stall {self.seconds:g}s",
                "delay": f"delay {self.seconds:g}s"}.get(self.kind, self.kind)

    def __repr__(self) -> str:
        where = [f"{name}={value!r}" for name in ("op", "method", "path", "query", "nth",
                                                   "times", "probability")
                 if (value := getattr(self, name)) is not None]
        return f"{type(self).__name__}({', '.join([self._effect(), *where])})"

    def matches(self, request: Any) -> bool:
        """Whether `request` is one this rule applies to (firing aside)."""
        return rule_matches(self, request)

    # -- constructors: `match` takes the matching and firing fields above -------------------

    @classmethod
    def reset(cls: type[_Rule], **match: Any) -> _Rule:
        """The connection is reset (TCP RST) once the request is read, before any response."""
        return cls("reset", **match)

    @classmethod
    def truncate(cls: type[_Rule], keep_bytes: int | None = None, **match: Any) -> _Rule:
        """The store answers; the headers go out with the full Content-Length, then only
        `keep_bytes` of the body (default: half) and the connection closes. Needs a response
        with a body."""
        return cls("truncate", keep_bytes=keep_bytes, **match)

    @classmethod
    def stall(cls: type[_Rule], seconds: float = 30.0, **match: Any) -> _Rule:
        """No answer for `seconds` (bounded by the server's `max_stall`, cut short by `stop`),
        then the connection is reset: longer than the client's timeout, it sees a timeout."""
        return cls("stall", seconds=seconds, **match)

    @classmethod
    def delay(cls: type[_Rule], seconds: float, **match: Any) -> _Rule:
        """A slow but successful answer: wait `seconds` (bounded likewise), then serve."""
        return cls("delay", seconds=seconds, **match)

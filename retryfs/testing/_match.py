"""The matching half of a fault rule, shared by `S3Fault` and `HttpFault` (one plan language)."""

from __future__ import annotations

import fnmatch
import re
from typing import Any


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

"""What `retryfs demo` and its Ray part share: the bucket, the policy, the fault plan, tables."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TextIO

from retryfs.core.policy import RetryPolicy

__all__ = ["BUCKET", "POLICY", "print_table"]

BUCKET = "retryfs-demo"
#: What the wrapped filesystem and retryfs.copy retry with: the default schedule's shape, with
#: short delays so the demo does not wait long (0.1 s doubling up to 1 s, 6 attempts).
POLICY = RetryPolicy(max_attempts=6, initial_delay=0.1, multiplier=2.0, max_delay=1.0)


def _fresh(endpoint: Any, faults: list[Any]) -> None:
    """The next upload's fault plan, and an empty request record. Storage is kept: uploads go
    to prefixes of their own, and a plain copy_files that raised may still be finishing its
    other files in pyarrow's threads (its faults name its own prefix, so it cannot take them)."""
    endpoint.clear_faults()
    endpoint.reset_record()
    for fault in faults:
        endpoint.add_fault(fault)


def print_table(out: TextIO, header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, tuple("-" * w for w in widths), *rows]:
        print("  ".join(f"{c:<{w}}" for c, w in zip(row, widths, strict=True)).rstrip(),
              file=out)

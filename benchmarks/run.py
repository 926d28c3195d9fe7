"""Every benchmark in one run, its tables printed one after the other (``make bench``).

``--quick`` (``make bench-quick``): the same sections on small inputs, in under two minutes;
``--only NAME`` runs some sections. The run starts with the date and the machine, since the
figures are only comparable within one run.

Usage: python -m benchmarks.run [--quick] [--only overhead,s3,...]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import time
from collections.abc import Callable

import pyarrow

from benchmarks import (
    bench_faults,
    bench_granularity,
    bench_large,
    bench_overhead,
    bench_reads,
    bench_rss,
    bench_s3_upload,
    bench_torch,
)

SECTIONS: dict[str, Callable[[bool], list[str]]] = {
    "overhead": bench_overhead.run,
    "s3": bench_s3_upload.run,
    "granularity": bench_granularity.run,
    "faults": bench_faults.run,
    "large": bench_large.run,
    "rss": bench_rss.section,
    "reads": bench_reads.run,
    "torch": bench_torch.run,
}


def machine() -> str:
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    return (f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, "
            f"{platform.machine()} {os.cpu_count()} cores (load {load:.1f}), "
            f"Python {platform.python_version()}, pyarrow {pyarrow.__version__}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small inputs, under two minutes")
    parser.add_argument("--only", default="", help=f"comma-separated: {','.join(SECTIONS)}")
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.only.split(",") if name.strip()] or list(SECTIONS)
    unknown = [name for name in chosen if name not in SECTIONS]
    if unknown:
        parser.error(f"--only: unknown section(s) {unknown}; known: {list(SECTIONS)}")
    print(f"retryfs benchmarks ({'quick' if args.quick else 'full'}): {machine()}\n", flush=True)
    started = time.perf_counter()
    for name in chosen:
        section_started = time.perf_counter()
        tables = SECTIONS[name](args.quick)
        print("\n\n".join(tables), flush=True)
        print(f"[{name}: {time.perf_counter() - section_started:.0f} s]\n", flush=True)
    print(f"done in {time.perf_counter() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Every benchmark in one run, its tables printed one after the other (``make bench``).

``--quick`` (``make bench-quick``): the same sections on small inputs, in under two minutes;
``--only NAME`` runs some sections. The run starts with the date and the machine, since the
figures are only comparable within one run. A full run of every section is the record: its
output goes to `RESULTS` (what the documentation's performance page shows, without the date)
and, dated, to the end of `HISTORY`.

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
from pathlib import Path

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


RESULTS = Path(__file__).resolve().parent / "results" / "latest.txt"
HISTORY = Path(__file__).resolve().parent / "results" / "history.txt"


def machine() -> str:
    """The machine and the versions (the figures are only comparable within one run)."""
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{platform.machine()} {os.cpu_count()} cores, {memory:.0f} GiB "
            f"(load {load:.1f} at the start), Python {platform.python_version()}, "
            f"pyarrow {pyarrow.__version__}")


def _record(text: str) -> None:
    """A full run's output: the current results, and the history's dated entry."""
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(text)
    when = f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC"
    with HISTORY.open("a") as history:
        history.write(f"==== {when}\n{text}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small inputs, under two minutes")
    parser.add_argument("--only", default="", help=f"comma-separated: {','.join(SECTIONS)}")
    args = parser.parse_args(argv)
    chosen = [name.strip() for name in args.only.split(",") if name.strip()] or list(SECTIONS)
    unknown = [name for name in chosen if name not in SECTIONS]
    if unknown:
        parser.error(f"--only: unknown section(s) {unknown}; known: {list(SECTIONS)}")
    out = [f"retryfs benchmarks ({'quick' if args.quick else 'full'}): {machine()}\n"]
    print(out[0], flush=True)
    started = time.perf_counter()
    for name in chosen:
        section_started = time.perf_counter()
        tables = SECTIONS[name](args.quick)
        out += ["\n\n".join(tables), f"[{name}: {time.perf_counter() - section_started:.0f} s]\n"]
        print("\n".join(out[-2:]), flush=True)
    out.append(f"done in {time.perf_counter() - started:.0f} s")
    print(out[-1])
    if not args.quick and chosen == list(SECTIONS):
        _record("\n".join(out) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What every benchmark shares: the contenders, interleaved rounds, medians with their spread.

Figures are medians of rounds in which the contenders alternate (round 1: A B C D, round 2:
B C D A, ...), so that the noise of a shared machine hits them alike. A ratio is computed per
round against the baseline of the same round, and its median and spread are printed (the
interquartile range of the rounds, or their range when there are fewer than 4): the spread is
what a reader should allow for. Per-call figures are CPU time of the calling thread
(``time.thread_time``), which other processes on a shared machine disturb far less than the
wall clock; bulk transfers are wall-clock time.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import pyarrow.fs as pafs

import retryfs

MiB = 1 << 20

UNWRAPPED = "unwrapped"
FLOOR = "ProxyHandler floor"
RAY = "Ray Data wrapper"
RETRYFS = "retryfs"


class ProxyHandler(pafs.FileSystemHandler):
    """The thinnest possible Python-level wrapper: the floor any PyFileSystem pays."""

    def __init__(self, fs: pafs.FileSystem) -> None:
        self.fs = fs

    def __eq__(self, other): return isinstance(other, ProxyHandler) and self.fs == other.fs
    def __ne__(self, other): return not self == other
    def get_type_name(self): return "proxy::" + self.fs.type_name
    def normalize_path(self, path): return self.fs.normalize_path(path)
    def get_file_info(self, paths): return self.fs.get_file_info(paths)
    def get_file_info_selector(self, selector): return self.fs.get_file_info(selector)
    def create_dir(self, path, recursive): return self.fs.create_dir(path, recursive=recursive)
    def delete_dir(self, path): return self.fs.delete_dir(path)
    def delete_dir_contents(self, path, missing_dir_ok=False):
        return self.fs.delete_dir_contents(path, missing_dir_ok=missing_dir_ok)
    def delete_root_dir_contents(self): return self.fs.delete_dir_contents("", accept_root_dir=True)
    def delete_file(self, path): return self.fs.delete_file(path)
    def move(self, src, dest): return self.fs.move(src, dest)
    def copy_file(self, src, dest): return self.fs.copy_file(src, dest)
    def open_input_stream(self, path): return self.fs.open_input_stream(path)
    def open_input_file(self, path): return self.fs.open_input_file(path)
    def open_output_stream(self, path, metadata):
        return self.fs.open_output_stream(path, metadata=metadata)
    def open_append_stream(self, path, metadata):
        return self.fs.open_append_stream(path, metadata=metadata)


def ray_wrapper(fs: pafs.FileSystem) -> pafs.FileSystem | None:
    """Ray Data's ``RetryingPyFileSystem`` around ``fs`` with Ray's default retried errors."""
    try:
        from ray.data._internal.util import RetryingPyFileSystem
        from ray.data.context import DataContext
    except ImportError:
        return None
    return RetryingPyFileSystem.wrap(fs, retryable_errors=DataContext.get_current().retried_io_errors)


def four(fs: pafs.FileSystem, wrapped: pafs.FileSystem | None = None) -> dict[str, pafs.FileSystem]:
    """``fs`` unwrapped, under the bare proxy, under Ray Data's wrapper and under retryfs as
    ``retryfs.from_uri`` builds it (``client_attempts=1``: one retry layer; on S3 the output
    streams through the write client with 3 SDK attempts per request).

    ``wrapped`` is what the wrappers wrap (``fs`` unless given: e.g. an S3 client whose own
    retries are off for retryfs, on for the unwrapped baseline).
    """
    inner = fs if wrapped is None else wrapped
    found = {UNWRAPPED: fs, FLOOR: pafs.PyFileSystem(ProxyHandler(fs))}
    ray = ray_wrapper(fs)
    if ray is not None:
        found[RAY] = ray
    found[RETRYFS] = retryfs.RetryingFileSystem(inner, client_attempts=1)
    return found


def interleave(fns: dict[str, Callable[[], float]], rounds: int, warmup: bool = True
               ) -> dict[str, list[float]]:
    """Run each contender once per round, in turn (the order rotated round by round); a
    first untimed round warms caches up."""
    if warmup:
        for fn in fns.values():
            fn()
    results: dict[str, list[float]] = {name: [] for name in fns}
    names = list(fns)
    for round_no in range(rounds):
        # each round starts one contender further on, so that none always runs first (after
        # the previous round's clean-up) or last
        shift = round_no % len(names)
        for name in names[shift:] + names[:shift]:
            results[name].append(fns[name]())
    return results


@dataclass(frozen=True)
class Figure:
    """A median and the spread of the rounds it came from: the interquartile range (the
    middle half of the rounds) from 4 rounds on, else the range."""

    median: float
    low: float
    high: float

    @classmethod
    def of(cls, values: list[float]) -> Figure:
        if len(values) >= 4:
            low, _, high = statistics.quantiles(values, n=4, method="inclusive")
            return cls(statistics.median(values), low, high)
        return cls(statistics.median(values), min(values), max(values))

    def show(self, digits: int = 2) -> str:
        return f"{self.median:.{digits}f} ({self.low:.{digits}f}-{self.high:.{digits}f})"


def ratios(results: dict[str, list[float]], base: str, invert: bool = False
           ) -> dict[str, Figure]:
    """Per-round ratio of every contender to ``base`` (``invert``: base / contender, e.g. a
    throughput ratio from times), summarised as median and range."""
    out = {}
    for name, values in results.items():
        pairs = zip(values, results[base], strict=True)
        per_round = [b / v if invert else v / b for v, b in pairs]
        out[name] = Figure.of(per_round)
    return out


def section_main(run: Callable[[bool], list[str]], doc: str | None) -> None:
    """A section's own command line (``python -m benchmarks.bench_x [--quick]``): its tables."""
    parser = argparse.ArgumentParser(description=(doc or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small inputs, as make bench-quick")
    print("\n\n".join(run(parser.parse_args().quick)))


def table(title: str, header: list[str], rows: list[list[str]]) -> str:
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    lines = [title]
    for row in [header, *rows]:
        cells = [str(c).ljust(w) if i == 0 else str(c).rjust(w)
                 for i, (c, w) in enumerate(zip(row, widths, strict=True))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def timing_table(title: str, unit: str, results: dict[str, list[float]], base: str,
                 digits: int = 2, invert: bool = False, ratio_name: str = "ratio",
                 also: tuple[str, ...] = ()) -> str:
    """Medians (spread) per contender and their per-round ratio to ``base``; ``also``: more
    baselines, each a column of ratios (e.g. retryfs against the floor and Ray's wrapper)."""
    bases = [base, *(b for b in also if b in results)]
    rel = {b: ratios(results, b, invert=invert) for b in bases}
    rows = [[name, Figure.of(values).show(digits), *(rel[b][name].show(2) for b in bases)]
            for name, values in results.items()]
    header = ["", f"median {unit} (spread)", f"{ratio_name} (spread)",
              *(f"vs {b}" for b in bases[1:])]
    return table(title, header, rows)


class PeakRss:
    """The peak resident memory of this process from now on, above what it holds now (Linux:
    ``VmHWM``, reset by writing 5 to ``/proc/self/clear_refs``), so that one process can
    measure several clients in turn. ``mib()`` is None where that cannot be read."""

    def __init__(self) -> None:
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
            self.start: float | None = status_mib("VmRSS")
        except OSError:
            self.start = None

    def mib(self) -> float | None:
        if self.start is None:
            return None
        return status_mib("VmHWM") - self.start


def status_mib(field: str) -> float:
    """A memory figure of this process in MiB from ``/proc/self/status`` (``VmHWM``: its peak
    RSS; ``VmRSS``: now)."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith(field + ":")) / 1024


def scratch_root() -> str:
    """Where bulk files go: tmpfs (/dev/shm) when it has room, else the temp dir."""
    shm = "/dev/shm"
    if os.path.isdir(shm) and os.access(shm, os.W_OK):
        free = shutil.disk_usage(shm).free
        if free > 4 << 30:
            return shm
    return tempfile.gettempdir()


#: The AWS SDK's switch of request checksums, read when a client is made.
CHECKSUMS = "AWS_REQUEST_CHECKSUM_CALCULATION"


@contextmanager
def request_checksums_off() -> Iterator[None]:
    """The AWS SDK's request checksums off (``when_required``) for the clients made and the
    transfers run inside: pyarrow's SDK then sends uploads as the CRT and obstore do, without
    the ``aws-chunked`` CRC64NVME trailer that moto decodes and checks in Python."""
    before = os.environ.get(CHECKSUMS)
    os.environ[CHECKSUMS] = "when_required"
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(CHECKSUMS, None)
        else:
            os.environ[CHECKSUMS] = before


@contextmanager
def scratch(prefix: str, root: str | None = None) -> Iterator[str]:
    """A temporary directory, removed afterwards whatever happens."""
    path = tempfile.mkdtemp(prefix=f"retryfs-bench-{prefix}-", dir=root or scratch_root())
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@dataclass(frozen=True)
class Tree:
    """A checkpoint-shaped directory: a few big files (model, optimizer) and many small ones."""

    big_files: int
    big_mib: int
    small_files: int
    small_kib: int

    @property
    def nbytes(self) -> int:
        return self.big_files * self.big_mib * MiB + self.small_files * self.small_kib * 1024

    def describe(self) -> str:
        return (f"{self.big_files} x {self.big_mib} MiB + {self.small_files} x "
                f"{self.small_kib} KiB ({self.nbytes / MiB:.0f} MiB)")

    def make(self, root: str) -> str:
        os.makedirs(os.path.join(root, "shards"), exist_ok=True)
        for i in range(self.big_files):
            with open(os.path.join(root, f"model_{i}.pt"), "wb") as f:
                for _ in range(self.big_mib):
                    f.write(os.urandom(MiB))
        for i in range(self.small_files):
            with open(os.path.join(root, "shards", f"{i:05d}.bin"), "wb") as f:
                f.write(os.urandom(self.small_kib * 1024))
        return root

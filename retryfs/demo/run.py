"""`retryfs demo`: a checkpoint uploaded to S3 through injected faults, with and without retryfs.

Runs on an embedded default, no cloud account: ``retryfs.testing.S3FaultEndpoint`` serves moto's
S3 on a loopback port and injects faults into its HTTP answers, the same seeded plan for every
upload. Each scenario uploads the same synthetic checkpoint twice with
``pyarrow.fs.copy_files`` (the call Ray Train uploads checkpoints with): once with pyarrow's
``S3FileSystem`` as it is (its own default retries: 3 attempts per request), once with the same
filesystem wrapped in `RetryingFileSystem`. Then `retryfs.copy` (the ``retryfs cp`` command)
uploads it under all the faults at once, and once more to show that a second run sends nothing.
``--ray`` runs a short Ray Train job the same way.
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import logging
import os
import random
import re
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import pyarrow.fs as pafs

from retryfs.arrow.filesystem import RetryingFileSystem
from retryfs.core.stats import RetryEvent, RetryStats
from retryfs.transfer.copier import CopyError, copy

from . import ray as demo_ray
from .common import BUCKET, POLICY, _fresh, print_table

MiB = 1024 * 1024
#: pyarrow.fs.copy_files' chunk in Ray Train's checkpoint upload (64 MiB).
RAY_CHUNK = 64 * 1024 * 1024

#: The checkpoint: (file, share of the total size, or a fixed size in bytes).
FILES: list[tuple[str, float | int]] = [
    ("model.pt", 0.32),
    ("optimizer.pt", 0.24),
    ("shards/model-00001-of-00004.safetensors", 0.10),
    ("shards/model-00002-of-00004.safetensors", 0.10),
    ("shards/model-00003-of-00004.safetensors", 0.10),
    ("shards/model-00004-of-00004.safetensors", 0.10),
    ("tokenizer.json", 0.04),
    ("config.json", 2_048),
    ("trainer_state.json", 6_144),
    ("rng_state.pth", 14_336),
    ("scheduler.pt", 1_024),
]


# -- the checkpoint and the faults -----------------------------------------------------------------

def make_checkpoint(root: Path, size_mb: float = 200.0, seed: int = 0) -> dict[str, str]:
    """Write the synthetic checkpoint under ``root``; returns relative path -> sha256."""
    rng = random.Random(seed)
    total = int(size_mb * MiB)
    digests = {}
    for rel, share in FILES:
        size = share if isinstance(share, int) else max(1, int(total * share))
        data = rng.randbytes(size)
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        digests[rel] = hashlib.sha256(data).hexdigest()
    return digests


@dataclass(frozen=True)
class Scenario:
    title: str
    explanation: tuple[str, ...]
    #: fresh S3Fault rules for an upload to ``prefix`` (bucket/...): the same plan each time
    faults: Callable[[str], list[Any]]


def _commit_faults(prefix: str) -> list[Any]:
    from retryfs.testing.s3 import S3Fault

    return [S3Fault.error_in_200(op="CompleteMultipartUpload", path=f"{prefix}/model.pt",
                                 times=3)]


def _network_faults(prefix: str) -> list[Any]:
    from retryfs.testing.s3 import S3Fault

    return [
        S3Fault.reset(op="UploadPart", path=f"{prefix}/optimizer.pt", query={"partNumber": 1},
                      times=3),
        S3Fault.slow_down(op="CreateMultipartUpload",
                          path=f"{prefix}/shards/model-00002-of-00004.safetensors", times=3),
        S3Fault.internal_error(op="UploadPart", path=f"{prefix}/config.json", times=3),
    ]


SCENARIOS = [
    Scenario("1. commit of model.pt fails",
             ("The upload of model.pt is committed by a CompleteMultipartUpload request. S3 can "
              "answer it",
              "'200 OK' with an <Error> body; here it does so 3 times in a row, as many as "
              "pyarrow's own retries."),
             _commit_faults),
    Scenario("2. resets and throttling",
             ("Connection resets on the first part of optimizer.pt, 503 SlowDown when a shard's "
              "upload starts,",
              "500 InternalError on config.json: each 3 times in a row."),
             _network_faults),
]


# -- output helpers --------------------------------------------------------------------------------

def _mb(n: float) -> str:
    return f"{n / MiB:.1f} MiB"


def _reported(exc: BaseException | None) -> str:
    if exc is None:
        return "success"
    text = str(exc)
    code = re.search(r"AWS Error ([A-Z_]+(?: \(HTTP status \d+\))?)", text)
    detail = f"AWS Error {code.group(1)}" if code else text.splitlines()[0][:40]
    return f"raised {type(exc).__name__} ({detail})"


@contextlib.contextmanager
def _native_stderr() -> Iterator[list[str]]:
    """Capture what is written to file descriptor 2 meanwhile: pyarrow's C++ library logs
    there (``Error ignored when destroying file...``) and would garble the demo's table. What
    the caller of copy_files *saw* is what the demo shows. On an exception it is written back."""
    lines: list[str] = []
    try:
        saved = os.dup(2)
    except OSError:  # no fd 2 (an embedded interpreter): nothing to capture
        yield lines
        return
    with tempfile.TemporaryFile(mode="w+b") as capture:
        sys.stderr.flush()
        os.dup2(capture.fileno(), 2)
        failed = True
        try:
            yield lines
            failed = False
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            capture.seek(0)
            lines.extend(line for line in capture.read().decode(errors="replace").splitlines()
                         if line.strip())
            if failed and lines:
                print("\n".join(lines), file=sys.stderr)


@contextlib.contextmanager
def _quiet_retry_log() -> Iterator[None]:
    """The demo prints its own short retry lines; keep the library's WARNINGs off the screen."""
    logger = logging.getLogger("retryfs")
    saved = logger.propagate, logger.level
    handler = logging.NullHandler()
    logger.addHandler(handler)
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate, _ = saved


@dataclass
class Audit:
    identical: int
    expected: int
    missing: list[str]
    different: list[str]

    def text(self) -> str:
        """Short, for the table: ``10/11 (model.pt missing)``."""
        held = f"{self.identical}/{self.expected}"
        lost = self.missing + self.different
        if len(lost) == 1:
            held += f" ({Path(lost[0]).name} {'missing' if self.missing else 'differs'})"
        elif lost:
            held += f" ({len(self.missing)} missing, {len(self.different)} differ)" \
                if self.different else f" ({len(self.missing)} missing)"
        return held

    def details(self) -> str:
        """Long, with every file that did not land."""
        text = f"{self.identical}/{self.expected} files identical"
        if self.missing:
            text += "; missing: " + ", ".join(Path(m).name for m in self.missing)
        if self.different:
            text += "; different: " + ", ".join(Path(m).name for m in self.different)
        return text


def audit(endpoint: Any, prefix: str, digests: dict[str, str]) -> Audit:
    """What storage holds under ``prefix``, read from the store itself (not via a client)."""
    identical, missing, different = 0, [], []
    for rel, digest in digests.items():
        try:
            data = endpoint.get_object(BUCKET, f"{prefix}/{rel}")
        except KeyError:
            missing.append(rel)
            continue
        if hashlib.sha256(data).hexdigest() == digest:
            identical += 1
        else:
            different.append(rel)
    return Audit(identical, len(digests), missing, different)


class _RetryPrinter:
    """Prints a short line per retry (at most ``limit`` per upload)."""

    def __init__(self, out: TextIO, prefix: str, limit: int = 6) -> None:
        self.out, self.prefix, self.limit, self.count = out, prefix, limit, 0

    def __call__(self, event: RetryEvent) -> None:
        self.count += 1
        if self.count > self.limit:
            if self.count == self.limit + 1:
                print("      ... (more retries)", file=self.out)
            return
        path = event.path[len(self.prefix):].lstrip("/") if event.path.startswith(
            self.prefix) else event.path
        print(f"      retry: {event.operation} {path}: attempt {event.attempt} of "
              f"{event.max_attempts} failed with {event.error_class}, again in "
              f"{event.delay:.2f}s", file=self.out, flush=True)


# -- the demo --------------------------------------------------------------------------------------

def _copy_files(fs: pafs.FileSystem, src: Path, dst: str) -> str | None:
    """Upload ``src`` as Ray Train does; None on success, else what was raised (as text)."""
    try:
        pafs.copy_files(str(src), dst, destination_filesystem=fs, use_threads=True,
                        chunk_size=RAY_CHUNK)
    except Exception as exc:  # noqa: BLE001 - the demo shows what the caller saw
        reported = _reported(exc)
        del exc  # its traceback holds the other files' streams: let them go now
        gc.collect()
        return reported
    return None


def settle(endpoint: Any, quiet: float = 0.3, limit: float = 10.0) -> None:
    """Wait until no request has arrived for ``quiet`` seconds: when copy_files raises, the
    uploads of its other files go on in pyarrow's threads for a while."""
    deadline = time.monotonic() + limit
    seen = -1
    while time.monotonic() < deadline:
        count = len(endpoint.requests())
        if count == seen:
            return
        seen = count
        time.sleep(quiet)


def _mine(endpoint: Any, prefix: str, faulted: bool | None = None) -> list[Any]:
    """The recorded requests of the upload to ``prefix`` (bucket/...)."""
    key = prefix.split("/", 1)[1]
    return [r for r in endpoint.requests(faulted=faulted)
            if r.path.startswith(prefix + "/") or (r.path == BUCKET and str(
                r.query.get("prefix", "")).startswith(key))]


def run(out: TextIO = sys.stdout, size_mb: float = 200.0, ray: bool = False,
        seed: int = 0) -> int:
    """Run the demo, printing to ``out``; returns 0 when retryfs delivered every file."""
    try:
        from retryfs.testing.s3 import S3FaultEndpoint
    except ImportError as exc:
        raise ImportError("the demo needs moto's S3 server; in the retryfs checkout: "
                          f"pip install '.[demo]' ({exc})") from None
    started = time.monotonic()
    ok = True
    show_native = os.environ.get("RETRYFS_DEMO_STDERR") == "1"
    capture: contextlib.AbstractContextManager[list[str]] = (
        contextlib.nullcontext([]) if show_native else _native_stderr())
    with tempfile.TemporaryDirectory(prefix="retryfs-demo-") as tmp, \
            S3FaultEndpoint() as endpoint, _quiet_retry_log(), capture as native:
        endpoint.create_bucket(BUCKET)
        src = Path(tmp) / "checkpoint"
        digests = make_checkpoint(src, size_mb, seed)
        total = sum((src / rel).stat().st_size for rel in digests)
        biggest = sorted(digests, key=lambda rel: -(src / rel).stat().st_size)[:2]
        print("retryfs demo: what happens to a checkpoint upload when storage misbehaves\n",
              file=out)
        print(f"Storage     an S3 server (moto) on {endpoint.url}, with faults injected into its "
              "HTTP answers", file=out)
        print(f"Checkpoint  {len(digests)} files, {_mb(total)} ("
              + ", ".join(f"{Path(r).name} {_mb((src / r).stat().st_size)}" for r in biggest)
              + ", shards, small JSON files)", file=out)
        print("Upload      pyarrow.fs.copy_files(..., chunk_size=64 MiB), the call Ray Train "
              "uploads checkpoints with,", file=out)
        print("            once with pyarrow.fs.S3FileSystem as it comes (its own retries: 3 "
              "attempts per request),", file=out)
        print("            once with the same filesystem wrapped: "
              "retryfs.RetryingFileSystem(s3, policy)", file=out)
        print(f"            policy: {POLICY.max_attempts} attempts, waits from "
              f"{POLICY.initial_delay:g}s doubling up to {POLICY.max_delay:g}s (short, for the "
              "demo)\n", file=out)

        stats = RetryStats()
        rows: list[tuple[str, ...]] = []
        for scenario in SCENARIOS:
            print(f"Scenario {scenario.title}", file=out)
            for line in scenario.explanation:
                print(f"  {line}", file=out)
            for label in ("pyarrow (plain)", "retryfs"):
                prefix = f"{BUCKET}/s{scenario.title[0]}-" + (
                    "plain" if label.startswith("pyarrow") else "retryfs")
                _fresh(endpoint, scenario.faults(prefix))
                s3 = endpoint.pyarrow_fs(max_attempts=3)
                fs: pafs.FileSystem = s3
                printer = _RetryPrinter(out, prefix)
                if label == "retryfs":
                    fs = RetryingFileSystem(s3, POLICY, stats=stats)
                    stats.on_retry(printer)
                print(f"  uploading with {label} ...", file=out, flush=True)
                t0 = time.monotonic()
                error = _copy_files(fs, src, prefix)
                elapsed = time.monotonic() - t0
                stats.remove_hook(printer)
                held = audit(endpoint, prefix.split("/", 1)[1], digests)
                faults = len(_mine(endpoint, prefix, faulted=True))
                print(f"    copy_files {error or 'success'} after {elapsed:.1f}s "
                      f"({faults} requests failed on purpose)", file=out)
                print(f"    storage holds {held.details()}", file=out)
                rows.append((scenario.title, label, error or "success", held.text(),
                             f"{elapsed:.1f}s"))
                if label == "retryfs":
                    ok = ok and error is None and held.identical == held.expected
            print(file=out)

        _table(out, rows)
        ok = _standalone(out, endpoint, src, digests, stats) and ok
        _stats_table(out, stats)
        if ray:
            ok = demo_ray.run(out, endpoint) and ok
        settle(endpoint)  # what plain copy_files left running, before the endpoint stops
        print(f"\nDone in {time.monotonic() - started:.0f}s. retryfs delivered every file: "
              f"{'yes' if ok else 'NO'}.", file=out)
    if native:
        print(f"({len(native)} line(s) that pyarrow's C++ library wrote to stderr, such as "
              "'Error ignored when destroying file', were kept off the screen; "
              "RETRYFS_DEMO_STDERR=1 shows them.)", file=out)
    return 0 if ok else 1


def _table(out: TextIO, rows: list[tuple[str, ...]]) -> None:
    print("What each upload reported, and what storage holds:\n", file=out)
    print_table(out, ("scenario", "uploaded with", "copy_files reported", "storage holds",
                      "time"), rows)
    print("\nIn scenario 1 plain pyarrow reports success although model.pt never landed: "
          "copy_files ignores a failed", file=out)
    print("commit, so a checkpoint saved this way is silently incomplete. retryfs retries the "
          "commit (replaying the bytes", file=out)
    print("it kept), checks that every object landed, and would make copy_files raise if one "
          "never did.\n", file=out)


def _standalone(out: TextIO, endpoint: Any, src: Path, digests: dict[str, str],
                stats: RetryStats) -> bool:
    print("The same checkpoint with retryfs.copy (the `retryfs cp -r` command): 8 files at a "
          "time,", file=out)
    print("each retried as a whole until it landed, every object's size checked; the faults of "
          "both scenarios at once.", file=out)
    prefix = f"{BUCKET}/copy"
    _fresh(endpoint, _commit_faults(prefix) + _network_faults(prefix))
    fs = RetryingFileSystem(endpoint.pyarrow_fs(max_attempts=3), POLICY, stats=stats)
    printer = _RetryPrinter(out, prefix)
    stats.on_retry(printer)
    try:
        try:
            result = copy(str(src), (fs, prefix), recursive=True, workers=8)
        except CopyError as exc:
            result = exc.result
    finally:
        stats.remove_hook(printer)
    held = audit(endpoint, "copy", digests)
    print(f"    {result.summary()}", file=out)
    print(f"    storage holds {held.details()}", file=out)
    _fresh(endpoint, [])
    again = copy(str(src), (fs, prefix), recursive=True, workers=8)
    counts = Counter(r.op for r in _mine(endpoint, prefix))
    sent = sum(counts[op] for op in ("PutObject", "UploadPart", "CreateMultipartUpload"))
    print("Run again (a job restarted after a crash does this): files already there are "
          "skipped.", file=out)
    how = sorted({f.reason for f in again.skipped})
    print(f"    {again.summary()}", file=out)
    if how:
        print(f"    (skipped because: {', '.join(how)}: the local files' MD5s match S3's "
              "ETags)" if any("ETag" in h for h in how) else f"    (skipped: {', '.join(how)})",
              file=out)
    print(f"    requests: {', '.join(f'{n} {op}' for op, n in sorted(counts.items()))}; "
          f"uploads started: {sent}\n", file=out)
    return result.ok and held.identical == held.expected and not again.copied


def _stats_table(out: TextIO, stats: RetryStats) -> None:
    snap = stats.snapshot()
    print("Retry statistics of everything retryfs did above (fs.stats.snapshot()):\n", file=out)
    print(f"  {'operation':<20} {'retries':>7} {'recovered':>9} {'gave up':>7}  errors retried",
          file=out)
    for op, c in sorted(snap["by_operation"].items()):
        if not c["retries"] and not c["giveups"]:
            continue
        errors = ", ".join(f"{name} x{n['retries']}" for name, n in sorted(c["by_error"].items())
                           if n["retries"])
        print(f"  {op:<20} {c['retries']:>7} {c['recovered']:>9} {c['giveups']:>7}  {errors}",
              file=out)
    print(f"\n  total: {snap['calls']} calls, {snap['retries']} retries, {snap['giveups']} gave "
          f"up; {_mb(snap['bytes_replayed'])} sent again from the replay spool; "
          f"{snap['sleep_seconds']:.1f}s spent waiting between attempts", file=out)
    print("  ('copy_files' is one file of pyarrow.fs.copy_files onto retryfs, copied again from "
          "its source; 'close' is the commit of an upload, 'open_output_stream' its start, "
          "'write' a part, 'copy' a whole file of retryfs.copy)", file=out)

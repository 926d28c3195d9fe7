"""Ray Train under storage faults: the native S3FileSystem against RetryingFileSystem, honestly.

The same TorchTrainer job (2 CPU workers, gloo DDP, a 12.5 MiB ``model.pt`` checkpoint per
epoch, ``tests/ray_helpers.py``) runs against retryfs's S3 fault endpoint (moto on loopback)
under the same fault plan twice: once with ``RunConfig(storage_filesystem=S3FileSystem(...))``,
once with that same filesystem wrapped in ``RetryingFileSystem(..., client_attempts=1)`` (what
``retryfs.from_uri`` builds). The native one retries as a user's does on a Ray worker: the AWS
SDK's default, 3 attempts per request (pyarrow forgets any other ``retry_strategy`` when the
filesystem is pickled to the workers); with the wrapper, the SDK makes one attempt and retryfs
retries, 10 attempts per operation (the default count) on a schedule scaled down to
milliseconds. Both run under Ray's own upload retry (3 attempts on ``AWS Error ...`` texts).

For each run the table shows what ``fit()`` reported, how many checkpoints it reported, how
many of those storage really holds byte-identical (the endpoint's own copy hashed against the
sha256 the worker reported through Ray), and whether restoring the latest one
(``Result.checkpoint.as_directory()``) returns the same bytes.

    .venv/bin/python benchmarks/ray_train_comparison.py [--only throttle] [--markdown]

About 5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

import ray_helpers as h  # noqa: E402

import retryfs  # noqa: E402
from retryfs.testing.s3 import S3Fault, S3FaultEndpoint  # noqa: E402

BUCKET = "ray-compare"
MODEL = f"{BUCKET}/exp/*/checkpoint_*/{h.MODEL_FILE}"
POLICY = retryfs.RetryPolicy(max_attempts=10, initial_delay=0.01, multiplier=2, max_delay=0.1)


@dataclass
class Scenario:
    key: str
    title: str
    faults: Callable[[], list[S3Fault]] = list  # during training
    restore_faults: Callable[[], list[S3Fault]] = list  # during the restore afterwards
    resume: bool = False  # a clean 2-epoch run first, then the faulty run resumes it


SCENARIOS = [
    Scenario("parts", "500 on 6 part uploads of model.pt (4 in a row)", lambda: [
        S3Fault.internal_error(op="UploadPart", path=MODEL, nth=1, times=4),
        S3Fault.internal_error(op="UploadPart", path=MODEL, query={"partNumber": 2}, times=2)]),
    Scenario("commits", "3 failed commits of one model.pt", lambda: [
        S3Fault.error_in_200(path=MODEL, nth=2, times=3)]),
    Scenario("throttle", "12 consecutive 503 SlowDown on one upload", lambda: [
        S3Fault.slow_down(op="UploadPart", path=MODEL, times=12)]),
    Scenario("resets", "TCP resets on 25% of checkpoint requests", lambda: [
        S3Fault.reset(op=("UploadPart", "CompleteMultipartUpload", "CreateMultipartUpload",
                          "HeadObject", "ListObjectsV2"),
                      path=f"{BUCKET}/exp*", probability=0.25, seed=4)]),
    Scenario("restore", "restore through 2 resets, 2 x 500, a truncated body",
             restore_faults=lambda: [
                 S3Fault.reset(op="GetObject", path=MODEL, times=2),
                 S3Fault.internal_error(op=("GetObject", "HeadObject"), path=MODEL, times=2),
                 S3Fault.truncate(op="GetObject", path=MODEL, times=1)]),
    Scenario("resume", "resumed run, 4 x 500 on the checkpoint download", lambda: [
        S3Fault.internal_error(op="GetObject", path=MODEL, times=4)], resume=True),
    Scenario("giveup", "every commit of model.pt fails (outage)", lambda: [
        S3Fault.error_in_200(path=MODEL)]),
]


@dataclass
class Row:
    scenario: str
    filesystem: str
    fit: str
    reported: int
    intact: int
    missing: int
    restore: str
    faults: int
    seconds: float
    notes: list[str] = field(default_factory=list)


def short(error: BaseException | str, width: int = 60) -> str:
    text = error if isinstance(error, str) else f"{type(error).__name__}: {error}"
    line = " ".join(text.split())
    return line if len(line) <= width else line[: width - 3] + "..."


def worker_errors(error: BaseException) -> tuple[str, list[str]]:
    """Ray's error in a table cell (with each failed rank's exception type), and in full."""
    failures = getattr(error, "worker_failures", None) or {}
    if not failures:
        return short(error), [f"{type(error).__name__}: {error}"]
    ranks = ", ".join(f"rank {rank}: {type(e).__name__}" for rank, e in sorted(failures.items()))
    details = [f"rank {rank}: {type(e).__name__}: {e}"
               + "".join(f"\n    note: {n}" for n in getattr(e, "__notes__", []))
               for rank, e in sorted(failures.items())]
    return f"{type(error).__name__} ({ranks})", details


def run(endpoint: S3FaultEndpoint, scenario: Scenario, which: str, n: int) -> Row:
    endpoint.reset()
    endpoint.create_bucket(BUCKET)
    inner = h.native_s3(endpoint)  # pyarrow's default retries, as on any Ray worker
    fs = inner if which == "native" else retryfs.RetryingFileSystem(inner, POLICY,
                                                                     client_attempts=1)
    name = f"{scenario.key}-{which}-{n}"
    started = time.perf_counter()
    if scenario.resume:
        first = h.run_and_inspect(endpoint, fs, name, epochs=2, bucket=BUCKET)
        assert first.ok and first.n_intact == 2, first.fit
        endpoint.reset_record()
    for fault in scenario.faults():
        endpoint.add_fault(fault)
    outcome = h.run_and_inspect(endpoint, fs, name, bucket=BUCKET)
    faults = len(endpoint.injected)
    endpoint.clear_faults()
    restore = "-"
    if outcome.ok and outcome.result.checkpoint is not None:
        for fault in scenario.restore_faults():
            endpoint.add_fault(fault)
        before = len(endpoint.injected)
        try:
            digest = h.restore_hash(outcome.result.checkpoint)
        except Exception as exc:  # noqa: BLE001 - the table reports it
            restore = short(exc, 44)
        else:
            restore = "identical" if digest == outcome.reported[-1]["sha256"] else "DIFFERENT"
        faults += len(endpoint.injected) - before
        endpoint.clear_faults()
    fit, notes = ("success", []) if outcome.ok else worker_errors(outcome.error)
    return Row(scenario.title, which, fit, len(outcome.reported), outcome.n_intact,
               len(outcome.missing), restore, faults, time.perf_counter() - started, notes)


def stored(row: Row) -> str:
    text = f"{row.intact}/{row.reported}"
    if row.missing:
        text += f" ({row.missing} without model.pt)"
    elif row.intact < row.reported:
        text += f" ({row.reported - row.intact} different)"
    return text


def table(rows: list[Row], markdown: bool) -> str:
    head = ["scenario", "filesystem", "fit() reported", "checkpoints reported",
            "stored intact", "restore", "faults hit"]
    cells = [[r.scenario, r.filesystem, r.fit, str(r.reported), stored(r), r.restore,
              str(r.faults)] for r in rows]
    if markdown:
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        lines += ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in cells]
        return "\n".join(lines)
    widths = [max(len(x) for x in col) for col in zip(head, *cells, strict=True)]
    fmt = "  ".join(f"{{:{w}}}" for w in widths)
    return "\n".join([fmt.format(*head)] + [fmt.format(*row) for row in cells])


def main(argv: list[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", action="append", choices=[s.key for s in SCENARIOS],
                        help="run only these scenarios (repeatable)")
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args(argv)
    import ray

    scenarios = [s for s in SCENARIOS if not args.only or s.key in args.only]
    rows: list[Row] = []
    h.ray_init()
    try:
        with S3FaultEndpoint(max_stall=10) as endpoint:
            for n, scenario in enumerate(scenarios):
                for which in ("native", "retryfs"):
                    row = run(endpoint, scenario, which, n)
                    rows.append(row)
                    print(f"[{row.seconds:5.1f}s] {row.scenario} / {row.filesystem}: {row.fit}; "
                          f"{row.intact}/{row.reported} intact; restore {row.restore}",
                          file=sys.stderr, flush=True)
    finally:
        ray.shutdown()
    print(table(rows, args.markdown))
    for row in rows:
        if row.notes:
            print(f"\n{row.scenario} / {row.filesystem}: fit() raised; the workers' errors:")
            for note in row.notes:
                print(f"  {note}")
    return rows


if __name__ == "__main__":
    main()

"""Hunt for hangs in ``copy_files(local -> RetryingFileSystem(S3), use_threads=True)``.

Runs the copy of a 41-file checkpoint (one 14 MiB file) many times on `S3FaultEndpoint`, with
a seeded fault plan per run (5 % of requests answering 503 SlowDown once; optionally resets and
stalls) and optional CPU load (busy threads in this process fighting for the GIL, busy
processes for the cores). A run past ``--bound`` seconds dumps every thread's stack
(``faulthandler``) and counts as a hang.

    PYTHONPATH=$PWD .venv/bin/python benchmarks/hunt_threaded_copy.py --runs 300 --load 2
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import multiprocessing
import random
import sys
import tempfile
import threading
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs

from retryfs import RetryingFileSystem, RetryPolicy
from retryfs.testing.s3 import S3Fault, S3FaultEndpoint

MiB = 1 << 20


def checkpoint(root: Path) -> dict[str, bytes]:
    rng = random.Random(12)
    files = {"model.pt": rng.randbytes(14 * MiB)}
    for i in range(40):
        files[f"part/{i:02d}.bin"] = rng.randbytes(rng.randint(1, 256) * 1024)
    for name, data in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_bytes(data)
    return files


def burn_gil(stop: threading.Event) -> None:
    x = 0
    while not stop.is_set():
        x += 1


def burn_core() -> None:  # pragma: no cover - a load process
    while True:
        pass


def plan(ep: S3FaultEndpoint, bucket: str, seed: int, kinds: list[str]) -> None:
    where = {"path": f"{bucket}/run*"}
    if "slowdown" in kinds:
        ep.add_fault(S3Fault.slow_down(probability=0.05, seed=seed, **where))
    if "reset" in kinds:
        ep.add_fault(S3Fault.reset(probability=0.02, seed=seed + 1, **where))
    if "stall" in kinds:
        ep.add_fault(S3Fault.stall(2.0, probability=0.01, seed=seed + 2, **where))


def copy(local: Path, dest: str, fs: pafs.FileSystem, outcome: list) -> None:
    try:
        pafs.copy_files(str(local), dest, destination_filesystem=fs, use_threads=True)
        outcome.append(None)
    except BaseException as exc:  # noqa: BLE001 - reported by the caller
        outcome.append(exc)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--bound", type=float, default=30.0, help="seconds before a run is a hang")
    parser.add_argument("--gil-load", type=int, default=1, help="busy threads in this process")
    parser.add_argument("--load", type=int, default=0, help="busy processes (nice 19)")
    parser.add_argument("--faults", default="slowdown", help="slowdown,reset,stall")
    parser.add_argument("--timeout", type=float, default=None, help="retryfs per-attempt timeout")
    parser.add_argument("--deadline", type=float, default=None)
    parser.add_argument("--stop-on-hang", action="store_true")
    parser.add_argument("--io-threads", type=int, default=None, help="Arrow's IO pool size")
    args = parser.parse_args()
    kinds = args.faults.split(",")
    logging.getLogger("retryfs").setLevel(logging.ERROR)
    if args.io_threads:
        pa.set_io_thread_count(args.io_threads)
    policy = RetryPolicy(max_attempts=8, initial_delay=0.05, max_delay=0.5,
                         deadline=args.deadline)
    stop = threading.Event()
    burners = [threading.Thread(target=burn_gil, args=(stop,), daemon=True)
               for _ in range(args.gil_load)]
    procs = [multiprocessing.Process(target=burn_core, daemon=True) for _ in range(args.load)]
    for p in procs:
        p.start()
        import os
        os.setpriority(os.PRIO_PROCESS, p.pid, 19)
    for b in burners:
        b.start()
    hangs = failures = 0
    times: list[float] = []
    with tempfile.TemporaryDirectory() as tmp, S3FaultEndpoint(max_stall=10) as ep:
        local = Path(tmp) / "ckpt"
        checkpoint(local)
        ep.create_bucket("hunt")
        for run in range(args.runs):
            ep.reset_record()
            ep.clear_faults()
            plan(ep, "hunt", run, kinds)
            fs = RetryingFileSystem(ep.pyarrow_fs(request_timeout=5, connect_timeout=5),
                                    policy, timeout=args.timeout)
            outcome: list[BaseException | None] = []
            started = time.monotonic()
            worker = threading.Thread(target=copy, args=(local, f"hunt/run{run}", fs, outcome),
                                      daemon=True)
            worker.start()
            worker.join(args.bound)
            elapsed = time.monotonic() - started
            if worker.is_alive():
                hangs += 1
                print(f"run {run}: HANG past {args.bound:g}s; {len(ep.requests())} requests, "
                      f"{len(ep.injected)} faults; stats {fs.stats.snapshot()['retries']} "
                      f"retries; threads:", flush=True)
                faulthandler.dump_traceback(all_threads=True)
                if args.stop_on_hang:
                    break
                worker.join()
                elapsed = time.monotonic() - started
                print(f"run {run}: ended after {elapsed:.1f}s: {outcome}", flush=True)
            elif outcome and outcome[0] is not None:
                failures += 1
                print(f"run {run}: failed in {elapsed:.1f}s: {outcome[0]!r}"[:300], flush=True)
            times.append(elapsed)
            if run % 10 == 0:
                print(f"run {run}: {elapsed:.2f}s, {len(ep.injected)} faults", flush=True)
            for key in ep.keys("hunt", f"run{run}/"):
                ep._backend.delete_object("hunt", key)
    stop.set()
    for p in procs:
        p.terminate()
    times.sort()
    print(f"{len(times)} runs, {hangs} hangs, {failures} failures; median "
          f"{times[len(times) // 2]:.2f}s, max {times[-1]:.2f}s", flush=True)
    return 1 if hangs else 0


if __name__ == "__main__":
    sys.exit(main())

"""A checkpoint upload and download under faults, through every client a user would pick.

On `S3FaultEndpoint` (moto's S3 on loopback), a seeded 1 % and 5 % of all requests fail, half
with a connection reset, half with 503 SlowDown. Each client uploads a checkpoint-shaped tree
and downloads it again; a trial completes when every object is stored and read back
byte-identical. Per client and fault rate: the completion rate over the trials, the bytes the
client sent per byte stored, the bytes the server sent per byte downloaded, and the time
against the same client's fault-free run. Clients, each with its own retries as shipped:

- retryfs over pyarrow's ``S3FileSystem`` as ``from_uri`` builds it (reads and metadata calls
  with the SDK's retries off, one retry layer; its write client keeps 3 SDK attempts per
  part request, so that a failed part is sent again alone, not the file; the files smaller
  than one part sent by obstore, ``one_part_client="auto"``, when it is installed);
- pyarrow's ``S3FileSystem`` alone (AWS standard retry strategy, 3 attempts: its default);
- s3fs (5 attempts of its own loop over botocore's 5: their defaults);
- Ray Data's ``RetryingPyFileSystem`` over pyarrow's ``S3FileSystem`` (3 SDK attempts);
- obstore (Rust ``object_store``; ``RetryConfig`` at its defaults: 10 retries, 100 ms to 15 s).

A second table puts the same clients through a throttle storm: every request answered 503
SlowDown for some seconds from the upload's first object write on, then healthy. It reports the requests each client
sent into the storm per second, the requests it sent per request the fault-free run needed,
and its time; retryfs appears twice, with its rate limiter (``auto``, the default) and without.

A third table takes the fault-free run apart: retryfs (also with ``one_part_client="arrow"``:
every file through pyarrow's client), pyarrow S3 and obstore as they ship and
with the AWS SDK's request checksums off (``AWS_REQUEST_CHECKSUM_CALCULATION=when_required``).
pyarrow's SDK sends every upload ``aws-chunked`` with a CRC64NVME trailer, which moto decodes
and checks in Python; obstore sends a signed payload and no checksum.

A fourth table runs the fault-free tree on SeaweedFS (a Go server) for retryfs, pyarrow S3 and
obstore, upload and download timed apart: a test server whose checksum cost is not Python's.

Peak RSS: each client's fault-free upload and download once more, in an interpreter of its own
(imports done before the measure starts), against the same endpoint served from this process.

Usage: python -m benchmarks.bench_faults [--quick]
"""

from __future__ import annotations

import hashlib
import itertools
import logging
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import pyarrow.fs as pafs

import retryfs
from benchmarks.common import (
    PeakRss,
    Tree,
    ray_wrapper,
    request_checksums_off,
    scratch,
    section_main,
    table,
)
from retryfs.testing.s3 import ACCESS_KEY, SECRET_KEY, S3Fault, S3FaultEndpoint

BUCKET = "bench-faults"
QUICK_TREE = Tree(big_files=1, big_mib=12, small_files=5, small_kib=64)
FULL_TREE = Tree(big_files=1, big_mib=32, small_files=50, small_kib=64)


@dataclass
class Client:
    name: str
    upload: Callable[[str, str], None]  # local directory -> "bucket/prefix"
    download: Callable[[str, str], None]  # "bucket/prefix" -> local directory


def _files(root: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root)
                  for d, _, names in os.walk(root) for f in names)


def _arrow_client(name: str, fs: pafs.FileSystem) -> Client:
    def upload(src: str, dest: str) -> None:
        pafs.copy_files(src, dest, destination_filesystem=fs, use_threads=True)

    def download(src: str, dest: str) -> None:
        pafs.copy_files(src, dest, source_filesystem=fs, use_threads=True)

    return Client(name, upload, download)


def _s3fs_client(endpoint: S3FaultEndpoint) -> Client:
    fs = endpoint.s3fs(max_attempts=5)

    def upload(src: str, dest: str) -> None:
        names = _files(src)
        fs.put([os.path.join(src, n) for n in names], [f"{dest}/{n}" for n in names])

    def download(src: str, dest: str) -> None:
        keys = sorted(fs.find(src))
        locals_ = [os.path.join(dest, os.path.relpath(k, src)) for k in keys]
        for path in locals_:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        fs.get(keys, locals_)

    return Client("s3fs (own retries)", upload, download)


def _obstore_client(endpoint: S3FaultEndpoint) -> Client | None:
    return _obstore_on(endpoint.url, ACCESS_KEY, SECRET_KEY, endpoint.region)


def _obstore_on(url: str, access_key: str, secret_key: str, region: str) -> Client | None:
    """obstore on the S3 endpoint at ``url``, bucket `BUCKET`."""
    try:
        import obstore
        from obstore.store import S3Store
    except ImportError:
        return None
    store = S3Store(
        BUCKET, endpoint=url, access_key_id=access_key, secret_access_key=secret_key,
        region=region, client_options={"allow_http": True},
        retry_config={"max_retries": 10, "backoff": {
            "init_backoff": timedelta(milliseconds=100), "max_backoff": timedelta(seconds=15),
            "base": 2}})

    def key_of(path: str) -> str:
        return path.split("/", 1)[1]  # "bucket/prefix/..." -> "prefix/..."

    def upload(src: str, dest: str) -> None:
        def put(name: str) -> None:
            with open(os.path.join(src, name), "rb") as f:
                obstore.put(store, f"{key_of(dest)}/{name}", f)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(put, _files(src)))

    def download(src: str, dest: str) -> None:
        prefix = key_of(src)
        keys = [meta["path"] for batch in obstore.list(store, prefix=prefix) for meta in batch]

        def get(key: str) -> None:
            path = os.path.join(dest, os.path.relpath(key, prefix))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                for chunk in obstore.get(store, key).stream():
                    f.write(chunk)

        with ThreadPoolExecutor(8) as pool:
            list(pool.map(get, keys))

    return Client("obstore (own RetryConfig)", upload, download)


def _retryfs_over_obstore(endpoint: S3FaultEndpoint) -> Client | None:
    """retryfs (the pyarrow face) over obstore's fsspec adapter, obstore's own retries off
    (one retry layer): what a user who hands retryfs that client gets."""
    try:
        from obstore.fsspec import FsspecStore
    except ImportError:
        return None
    store = FsspecStore(
        "s3", config={"endpoint": endpoint.url, "access_key_id": ACCESS_KEY,
                      "secret_access_key": SECRET_KEY, "region": endpoint.region},
        client_options={"allow_http": True}, retry_config={"max_retries": 0})
    return _arrow_client("retryfs over obstore", retryfs.RetryingFileSystem(store))


def clients(endpoint: S3FaultEndpoint, *, unlimited: bool = False) -> list[Client]:
    found = [_arrow_client("retryfs", retryfs.from_uri(endpoint.uri(BUCKET))[0])]
    if unlimited:
        found.append(_arrow_client("retryfs, rate_limit=off", retryfs.from_uri(
            endpoint.uri(BUCKET, retry_rate_limit="off"))[0]))
    found += [
        _arrow_client("pyarrow S3 (own retries)", endpoint.pyarrow_fs(max_attempts=3)),
        _s3fs_client(endpoint),
    ]
    ray = ray_wrapper(endpoint.pyarrow_fs(max_attempts=3))
    if ray is not None:
        found.append(_arrow_client("Ray Data wrapper", ray))
    for extra in (_obstore_client(endpoint), _retryfs_over_obstore(endpoint)):
        if extra is not None:
            found.append(extra)
    return found


@dataclass
class Trial:
    completed: bool
    sent_per_stored: float  # request body bytes of the upload / bytes of the tree
    served_per_read: float  # response body bytes of the download / bytes of the tree
    seconds: float
    faults: int
    requests: int = 0  # requests the endpoint received, upload and download
    error: str = ""


def _digests(root: str) -> dict[str, str]:
    out = {}
    for name in _files(root):
        with open(os.path.join(root, name), "rb") as f:
            out[name] = hashlib.sha256(f.read()).hexdigest()
    return out


class _Storm:
    """Every request throttled for ``seconds`` from the first object write on (the lanes of
    the upload busy), then none."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.ends: float | None = None

    def __call__(self, request: Any) -> bool:
        if self.ends is None and request.op in ("PutObject", "CreateMultipartUpload"):
            self.ends = time.monotonic() + self.seconds
        return self.ends is not None and time.monotonic() < self.ends


def trial(endpoint: S3FaultEndpoint, client: Client, src: str, want: dict[str, str],
          work: str, rate: float, seed: int, storm: float = 0.0) -> Trial:
    endpoint.reset()
    endpoint.create_bucket(BUCKET)
    if rate:
        endpoint.add_fault(S3Fault.reset(probability=rate / 2, seed=seed))
        endpoint.add_fault(S3Fault.slow_down(probability=rate / 2, seed=seed + 7919))
    if storm:
        endpoint.add_fault(S3Fault.slow_down(when=_Storm(storm)))
    nbytes = sum(os.path.getsize(os.path.join(src, n)) for n in want)
    dest = f"{BUCKET}/ckpt"
    local = os.path.join(work, "down")
    started = time.perf_counter()
    error = ""
    sent = served = 0.0
    requests = 0
    try:
        client.upload(src, dest)
        sent = sum(r.request_bytes for r in endpoint.requests())
        requests = len(endpoint.requests())
        endpoint.reset_record()
        stored = {name: hashlib.sha256(endpoint.get_object(BUCKET, f"ckpt/{name}")).hexdigest()
                  for name in want}
        if stored != want:
            raise AssertionError("stored objects differ from the source")
        client.download(dest, local)
        served = sum(r.response_bytes for r in endpoint.requests(method="GET"))
        requests += len(endpoint.requests())
        if _digests(local) != want:
            raise AssertionError("downloaded files differ from the source")
    except Exception as exc:  # noqa: BLE001 - a failed trial is a result
        error = f"{type(exc).__name__}: {str(exc)[:80]}"
    seconds = time.perf_counter() - started
    faults = sum(endpoint.fired(f) for f in endpoint.faults)
    shutil.rmtree(local, ignore_errors=True)
    return Trial(not error, sent / nbytes, served / nbytes, seconds, faults, requests, error)


def _spread(values: list[float], digits: int = 2) -> str:
    """The median and, over several values, their range."""
    if not values:
        return "-"
    med = statistics.median(values)
    if len(values) == 1:
        return f"{med:.{digits}f}"
    return f"{med:.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


ROOT = Path(__file__).resolve().parent.parent
#: The figure of the performance page (docs/performance.md), drawn by a full run.
FIGURE = ROOT / "docs" / "assets" / "bench-faults.png"


def _figure(series: dict[str, list[tuple[float, float, float]]], path: Path) -> str:
    """Time over fault-free and bytes sent per byte stored against the fault rate, a line per
    client (``series``: client -> [(rate, time ratio, sent/stored)]), written to ``path``."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "(no figure: matplotlib is not installed; pip install '.[bench]')"
    fig, (times, sent) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, points in series.items():
        rates = [100 * rate for rate, _, _ in points]
        times.plot(rates, [ratio for _, ratio, _ in points], marker="o", label=name)
        sent.plot(rates, [bytes_ for _, _, bytes_ in points], marker="o", label=name)
    times.set(xlabel="requests failing (%)", ylabel="time / fault-free time",
              title="time under faults")
    sent.set(xlabel="requests failing (%)", ylabel="bytes sent / byte stored",
             title="bytes sent under faults")
    times.legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return f"figure: {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}"


class _Remote(S3FaultEndpoint):
    """The client side of an endpoint served by another process: its address, no server."""

    def __init__(self, host: str, port: int, region: str) -> None:  # no moto here
        self._address = (host, port)
        self.region = region

    @property
    def port(self) -> int:
        return self._address[1]


def _own_process_peak(endpoint: S3FaultEndpoint, name: str, src: str, want: dict[str, str],
                      work: str) -> str:
    """Client ``name``'s peak RSS over one fault-free upload and download, in a fresh
    interpreter (its imports done before the measure starts), against ``endpoint`` here."""
    endpoint.reset()
    endpoint.create_bucket(BUCKET)
    down = os.path.join(work, "rss-down")
    child = subprocess.run(
        [sys.executable, "-m", "benchmarks.bench_faults", "--rss-child", name, endpoint.host,
         str(endpoint.port), endpoint.region, src, down],
        capture_output=True, text=True, timeout=600, cwd=ROOT)
    intact = child.returncode == 0 and _digests(down) == want
    shutil.rmtree(down, ignore_errors=True)
    if not intact:
        return f"failed: {(child.stderr.strip().splitlines() or ['?'])[-1][:60]}"
    return f"+{float(child.stdout.split()[-1]):.0f} MiB"


def _rss_child(name: str, host: str, port: str, region: str, src: str, down: str) -> None:
    client = next(c for c in clients(_Remote(host, int(port), region)) if c.name == name)
    peak = PeakRss()
    client.upload(src, f"{BUCKET}/ckpt")
    client.download(f"{BUCKET}/ckpt", down)
    print(peak.mib())


def under_faults(tree: Tree, rates: tuple[float, ...], trials: int,
                 figure: Path | None = None) -> list[str]:
    rows = []
    failures = []
    series: dict[str, list[tuple[float, float, float]]] = {}
    logging.getLogger("retryfs").setLevel(logging.ERROR)  # each retry is a warning line
    with scratch("faults") as work, S3FaultEndpoint() as endpoint:
        src = tree.make(os.path.join(work, "ckpt"))
        want = _digests(src)
        for client in clients(endpoint):
            clean = [trial(endpoint, client, src, want, work, 0.0, 0)
                     for _ in range(1 if trials == 1 else 2)]
            base = statistics.median(t.seconds for t in clean)
            needed = statistics.median(t.requests for t in clean)
            points = series.setdefault(client.name, [
                (0.0, 1.0, statistics.median(t.sent_per_stored for t in clean))])
            rows.append([client.name, "0%", f"{sum(t.completed for t in clean)}/{len(clean)}",
                         "0", f"{statistics.median(t.sent_per_stored for t in clean):.2f}",
                         f"{statistics.median(t.served_per_read for t in clean):.2f}",
                         "1.00", f"{base:.2f} s",
                         _own_process_peak(endpoint, client.name, src, want, work)])
            for rate in rates:
                done = [trial(endpoint, client, src, want, work, rate, seed)
                        for seed in range(1, trials + 1)]
                ok = [t for t in done if t.completed]
                failures += [f"{client.name} at {rate:.0%}: {t.error}" for t in done if t.error]
                if ok:
                    points.append((rate, statistics.median(t.seconds / base for t in ok),
                                   statistics.median(t.sent_per_stored for t in ok)))
                rows.append([
                    client.name, f"{rate:.0%}", f"{len(ok)}/{len(done)}",
                    _spread([float(t.faults) for t in done], 0),
                    _spread([t.sent_per_stored for t in ok]),
                    _spread([t.served_per_read for t in ok]),
                    _spread([t.requests / needed for t in ok]),
                    _spread([t.seconds / base for t in ok]) + " x",
                    "",
                ])
    logging.getLogger("retryfs").setLevel(logging.NOTSET)
    title = (f"upload + download of {tree.describe()} on moto S3 with a seeded share of all "
             f"requests failing (half resets, half 503 SlowDown), {trials} trial(s) per rate; "
             "median (range) of the completed trials; peak RSS: one fault-free upload and "
             "download in a process of its own, its peak above its start (the server in this one)")
    lines = [table(title, ["client", "faults", "completed", "faults fired", "sent/stored",
                           "served/read", "requests/needed", "time vs fault-free",
                           "peak RSS"], rows)]
    if failures:
        lines.append("failed trials:\n" + "\n".join(f"  {f}" for f in failures))
    if figure is not None:
        lines.append(_figure(series, figure))
    return ["\n".join(lines)]


def throttle_storm(tree: Tree, storm: float, trials: int) -> list[str]:
    """Every request answered SlowDown for ``storm`` seconds from the upload's start."""
    rows = []
    failures = []
    logging.getLogger("retryfs").setLevel(logging.ERROR)
    with scratch("storm") as work, S3FaultEndpoint() as endpoint:
        src = tree.make(os.path.join(work, "ckpt"))
        want = _digests(src)
        for client in clients(endpoint, unlimited=True):
            clean = trial(endpoint, client, src, want, work, 0.0, 0)
            done = [trial(endpoint, client, src, want, work, 0.0, seed, storm=storm)
                    for seed in range(1, trials + 1)]
            ok = [t for t in done if t.completed]
            failures += [f"{client.name}: {t.error}" for t in done if t.error]
            rows.append([
                client.name, f"{len(ok)}/{len(done)}",
                _spread([t.faults / storm for t in done], 1),
                _spread([t.requests / clean.requests for t in ok]),
                f"{clean.seconds:.2f} s",
                _spread([t.seconds for t in ok]) + " s",
            ])
    logging.getLogger("retryfs").setLevel(logging.NOTSET)
    title = (f"upload + download of {tree.describe()} on moto S3, every request answered 503 "
             f"SlowDown for {storm:g} s from the first object write, {trials} trial(s); "
             "median (range)")
    lines = [table(title, ["client", "completed", "requests/s into the storm",
                           "requests/needed", "fault-free", "time"], rows)]
    if failures:
        lines.append("failed trials:\n" + "\n".join(f"  {f}" for f in failures))
    return ["\n".join(lines)]


def _checksums_off(build: Callable[[], Client | None]) -> Client | None:
    """The client ``build`` makes with the AWS SDK's request checksums off, its transfers run
    so."""
    with request_checksums_off():
        client = build()
    if client is None:
        return None

    def unchecked(work: Callable[[str, str], None]) -> Callable[[str, str], None]:
        def run(src: str, dest: str) -> None:
            with request_checksums_off():
                work(src, dest)
        return run

    return Client(client.name, unchecked(client.upload), unchecked(client.download))


#: retryfs as ``from_uri`` builds it, but its small files sent by pyarrow's client, not obstore's.
ARROW_ONLY = "retryfs, one_part_client=arrow"


def checksum_cost(tree: Tree, rounds: int) -> list[str]:
    """Fault-free, each client as it sends its uploads and with the AWS SDK's request
    checksums off: pyarrow's SDK sends every upload aws-chunked with a CRC64NVME trailer,
    which moto decodes and checks in Python; obstore sends none (nor s3torchconnector)."""
    rows = []
    with scratch("checksums") as work, S3FaultEndpoint() as endpoint:
        src = tree.make(os.path.join(work, "ckpt"))
        want = _digests(src)
        builders: dict[str, Callable[[], Client | None]] = {
            "retryfs": lambda: _arrow_client("retryfs", retryfs.from_uri(
                endpoint.uri(BUCKET))[0]),
            ARROW_ONLY: lambda: _arrow_client(ARROW_ONLY, retryfs.from_uri(
                endpoint.uri(BUCKET, retry_one_part_client="arrow"))[0]),
            "pyarrow S3 (own retries)": lambda: _arrow_client(
                "pyarrow S3 (own retries)", endpoint.pyarrow_fs(max_attempts=3)),
            "obstore (own RetryConfig)": lambda: _obstore_client(endpoint),
        }
        times: dict[tuple[str, bool], list[float]] = {}
        for _ in range(rounds):
            for name, build in builders.items():
                for off in (False, True):
                    client = _checksums_off(build) if off else build()
                    if client is None:
                        continue
                    done = trial(endpoint, client, src, want, work, 0.0, 0)
                    if done.completed:
                        times.setdefault((name, off), []).append(done.seconds)
        obstore = statistics.median(times.get(("obstore (own RetryConfig)", False), [0.0]))
        for name in builders:
            on, off = times.get((name, False), []), times.get((name, True), [])
            if not on:
                continue
            rows.append([name, _spread(on) + " s", _spread(off) + " s",
                         f"{statistics.median(on) / obstore:.2f}" if obstore else "-",
                         f"{statistics.median(off) / obstore:.2f}" if obstore and off else "-"])
    title = (f"fault-free upload + download of {tree.describe()} on moto S3, {rounds} rounds, "
             "with the client's request checksums and with AWS_REQUEST_CHECKSUM_CALCULATION="
             "when_required; median (range), and its ratio to obstore's as it ships")
    return [table(title, ["client", "as shipped", "checksums off", "vs obstore",
                          "off vs obstore"], rows)]


def on_seaweed(tree: Tree, rounds: int) -> list[str]:
    """Fault-free on SeaweedFS (a Go server, which checks a checksum trailer at Go's speed, not
    Python's): retryfs as ``from_uri`` builds it, pyarrow S3 and obstore, as they ship and with
    the AWS SDK's request checksums off; upload and download timed apart. The first round warms
    up and is not counted."""
    from benchmarks.seaweed import ACCESS_KEY as WEED_KEY
    from benchmarks.seaweed import SECRET_KEY as WEED_SECRET
    from benchmarks.seaweed import seaweed_s3

    with scratch("seaweed-tree") as work, seaweed_s3() as server:
        server.pyarrow_fs().create_dir(BUCKET)
        src = tree.make(os.path.join(work, "ckpt"))
        want = _digests(src)
        query = urlencode({"endpoint_override": server.endpoint, "scheme": "http",
                           "region": "us-east-1"})
        builders: dict[str, Callable[[], Client | None]] = {
            "retryfs": lambda: _arrow_client("retryfs", retryfs.from_uri(
                f"s3://{WEED_KEY}:{WEED_SECRET}@{BUCKET}?{query}")[0]),
            ARROW_ONLY: lambda: _arrow_client(ARROW_ONLY, retryfs.from_uri(
                f"s3://{WEED_KEY}:{WEED_SECRET}@{BUCKET}?{query}"
                "&retry_one_part_client=arrow")[0]),
            "pyarrow S3 (own retries)": lambda: _arrow_client(
                "pyarrow S3 (own retries)", server.pyarrow_fs()),
            "obstore (own RetryConfig)": lambda: _obstore_on(
                f"http://{server.endpoint}", WEED_KEY, WEED_SECRET, "us-east-1"),
        }
        times = _timed_apart(builders, src, want, work, rounds)
    return [_apart_table(times, list(builders), f"fault-free upload + download of "
                         f"{tree.describe()} on SeaweedFS, {rounds} rounds after a warm-up")]


def _timed_apart(builders: dict[str, Callable[[], Client | None]], src: str,
                 want: dict[str, str], work: str, rounds: int
                 ) -> dict[tuple[str, bool], list[tuple[float, float]]]:
    """``(upload, download)`` seconds per client and checksums off or not, each round into a
    fresh prefix, every file checked after the download."""
    times: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    prefixes = itertools.count()
    for round_ in range(rounds + 1):
        for name, build in builders.items():
            for off in (False, True):
                client = _checksums_off(build) if off else build()
                if client is None:
                    continue
                dest, local = f"{BUCKET}/tree-{next(prefixes)}", os.path.join(work, "down")
                started = time.perf_counter()
                client.upload(src, dest)
                uploaded = time.perf_counter()
                client.download(dest, local)
                done = time.perf_counter()
                if _digests(local) != want:
                    raise AssertionError(f"{name}: downloaded files differ from the source")
                shutil.rmtree(local)
                if round_:
                    times.setdefault((name, off), []).append((uploaded - started, done - uploaded))
    return times


def _apart_table(times: dict[tuple[str, bool], list[tuple[float, float]]], names: list[str],
                 title: str) -> str:
    def total(name: str, off: bool) -> list[float]:
        return [up + down for up, down in times.get((name, off), [])]

    obstore = statistics.median(total("obstore (own RetryConfig)", False) or [0.0])
    rows = []
    for name in names:
        on, off = total(name, False), total(name, True)
        if not on:
            continue
        ups = [up for up, _ in times[(name, False)]]
        downs = [down for _, down in times[(name, False)]]
        rows.append([name, _spread(on) + " s", f"{statistics.median(ups):.3f} s",
                     f"{statistics.median(downs):.3f} s",
                     f"{statistics.median(on) / obstore:.2f}" if obstore else "-",
                     _spread(off) + " s" if off else "-",
                     f"{statistics.median(off) / obstore:.2f}" if obstore and off else "-"])
    return table(title + "; median (range), the ratio to obstore's time as it ships",
                 ["client", "as shipped", "upload", "download", "vs obstore", "checksums off",
                  "off vs obstore"], rows)


def run(quick: bool) -> list[str]:
    if quick:
        return (under_faults(QUICK_TREE, (0.01, 0.05), 1)
                + throttle_storm(QUICK_TREE, 2.0, 1) + checksum_cost(QUICK_TREE, 1))
    return (under_faults(FULL_TREE, (0.01, 0.05), 3, figure=FIGURE)
            + throttle_storm(FULL_TREE, 5.0, 3) + checksum_cost(FULL_TREE, 5)
            + on_seaweed(FULL_TREE, 7))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--rss-child"]:
        _rss_child(*sys.argv[2:])
    else:
        section_main(run, __doc__)

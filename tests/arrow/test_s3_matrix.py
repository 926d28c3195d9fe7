"""The fault matrix: every fault kind x every operation group x both S3 clients, on a real S3.

Each cell wraps a real client in `RetryingFileSystem` (a tiny, fast policy) and talks to moto's
S3 server through `S3FaultEndpoint`, which injects the fault in the HTTP exchange of the
operation's S3 request (`Group.op`). The clients are pyarrow's native `S3FileSystem` with its
own retries at one attempt, and s3fs (botocore and s3fs retries at one attempt), adapted the
way `RetryingFileSystem` adapts any fsspec filesystem.

- A transient fault: the operation succeeds, the stored (or returned) bytes are identical, the
  wrapper retried exactly once, and the endpoint's record shows the faulted request(s), then
  the good requests of one attempt (none where the retry reconciles an applied change).
- A permanent fault (403 AccessDenied, 404 NoSuchBucket): raised after one request of the
  faulted operation (the record proves it), with the client's own type; a write commits
  nothing, a delete or move leaves its source intact.
- Cells that cannot apply are recorded as such with the reason (n/a).

Every cell records its outcome; at the end of the module the results go to a JSON file
(``tests/.matrix-results.json``, or ``$RETRYFS_FAULT_MATRIX_RESULTS``), which
``python -m tests.render_fault_matrix`` renders into the fault-matrix table of docs/testing.md.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest

from retryfs import RetryingFileSystem, RetryPolicy
from retryfs.testing.s3 import S3Fault, S3FaultEndpoint

MiB = 1 << 20
CHUNK = MiB  # what the caller writes at a time (copy_files writes 1 MiB chunks too)
RESULTS_PATH = Path(os.environ.get("RETRYFS_FAULT_MATRIX_RESULTS")
                    or Path(__file__).resolve().parents[1] / ".matrix-results.json")

#: Tiny and fast: four attempts, a few milliseconds of backoff.
POLICY = RetryPolicy(max_attempts=4, initial_delay=0.001, multiplier=2, max_delay=0.004,
                     jitter=False)
#: The client timeout for stall cells (pyarrow rounds its request_timeout up to whole seconds).
CLIENT_TIMEOUT = 1
STALL = 3.0  # longer than the client timeout; the endpoint then resets the connection

_rng = random.Random(20240603)
SMALL = _rng.randbytes(100 * 1024)
# a multipart upload of two parts: pyarrow's parts are 10 MiB, s3fs's 5 MiB (its block size)
BIG = {"pyarrow": _rng.randbytes(10 * MiB + 64 * 1024), "s3fs": _rng.randbytes(5 * MiB + 64 * 1024)}
S3FS_BLOCK = 5 * MiB


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# -- the columns: fault kinds ------------------------------------------------------------------

@dataclass(frozen=True)
class Kind:
    name: str
    title: str
    make: Callable[..., S3Fault]
    permanent: bool = False


KINDS = [
    Kind("internal_error", "500 InternalError", S3Fault.internal_error),
    Kind("slow_down", "503 SlowDown", S3Fault.slow_down),
    Kind("service_unavailable", "503 ServiceUnavailable", S3Fault.service_unavailable),
    Kind("too_many_requests", "429 TooManyRequests", S3Fault.too_many_requests),
    Kind("reset", "connection reset", S3Fault.reset),
    Kind("truncate", "truncated body", S3Fault.truncate),
    Kind("stall", f"stall > {CLIENT_TIMEOUT} s client timeout",
         lambda **match: S3Fault.stall(STALL, **match)),
    Kind("error_in_200", "200 with `<Error>`", S3Fault.error_in_200),
    Kind("access_denied", "403 AccessDenied", S3Fault.access_denied, permanent=True),
    Kind("no_such_bucket", "404 NoSuchBucket", S3Fault.no_such_bucket, permanent=True),
]
KIND = {kind.name: kind for kind in KINDS}


# -- the rows: operation groups --------------------------------------------------------------

@dataclass
class Ctx:
    """What a cell's action works with."""

    client: str
    fs: RetryingFileSystem
    ep: S3FaultEndpoint
    bucket: str

    def path(self, key: str) -> str:
        return f"{self.bucket}/{key}"

    def stored(self, key: str) -> bytes | None:
        try:
            return self.ep.get_object(self.bucket, key)
        except KeyError:
            return None


def write(fs: pafs.FileSystem, path: str, data: bytes) -> None:
    with fs.open_output_stream(path) as f:
        for start in range(0, len(data), CHUNK):
            f.write(data[start:start + CHUNK])


def ranged_read(fs: pafs.FileSystem, path: str) -> bytes:
    with fs.open_input_file(path) as f:
        f.seek(40_000)
        return f.read(20_000)


def listing(fs: pafs.FileSystem, path: str) -> list[tuple[str, str, int | None]]:
    return sorted((i.path, i.type.name, i.size)
                  for i in fs.get_file_info(pafs.FileSelector(path, recursive=True)))


@dataclass(frozen=True)
class Group:
    name: str
    title: str
    op: str | tuple[str, ...]
    setup: Callable[[Ctx], None]
    action: Callable[[Ctx], Any]
    check: Callable[[Ctx, Any], None]  # after a transient fault: the result, the store
    untouched: Callable[[Ctx], None]  # after a permanent fault: nothing changed
    query: dict[str, Any] | None = None
    pyarrow_options: dict[str, Any] | None = None


def _put(*keys: str, data: bytes = SMALL) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        for key in keys:
            ctx.ep.put_object(ctx.bucket, key, data)
    return setup


def _setup_list(ctx: Ctx) -> None:
    for i, key in enumerate(["ckpt/model.pt", "ckpt/meta.json", "ckpt/shards/0", "ckpt/shards/1"]):
        ctx.ep.put_object(ctx.bucket, key, SMALL[: 1000 * (i + 1)])


def _check_list(ctx: Ctx, result: Any) -> None:
    files = {(p, size) for p, kind, size in result if kind == "File"}
    assert files == {(ctx.path(k), 1000 * (i + 1)) for i, k in enumerate(
        ["ckpt/model.pt", "ckpt/meta.json", "ckpt/shards/0", "ckpt/shards/1"])}


def _stored_is(key: str, data: Callable[[Ctx], bytes]) -> Callable[[Ctx, Any], None]:
    def check(ctx: Ctx, result: Any) -> None:
        stored = ctx.stored(key)
        assert stored is not None, f"{key} was not committed"
        assert sha(stored) == sha(data(ctx))
    return check


def _absent(*keys: str) -> Callable[[Ctx], None]:
    def untouched(ctx: Ctx) -> None:
        for key in keys:
            assert ctx.stored(key) is None, f"{key} exists after a permanent failure"
    return untouched


def _intact(*keys: str) -> Callable[[Ctx], None]:
    def untouched(ctx: Ctx) -> None:
        for key in keys:
            assert ctx.stored(key) == SMALL, f"{key} changed after a permanent failure"
    return untouched


def _nothing(ctx: Ctx) -> None:
    pass


def _check_deleted(ctx: Ctx, result: Any) -> None:
    assert ctx.stored("src") is None
    assert ctx.stored("other") == SMALL


def _check_moved(ctx: Ctx, result: Any) -> None:
    assert ctx.stored("src") is None
    assert ctx.stored("dest") == SMALL


def _check_copied(ctx: Ctx, result: Any) -> None:
    assert ctx.stored("src") == SMALL
    assert ctx.stored("dest") == SMALL


def _commit_data(ctx: Ctx) -> bytes:
    # every pyarrow output stream is a multipart upload; s3fs needs more than a block
    return SMALL if ctx.client == "pyarrow" else BIG["s3fs"]


GROUPS = [
    Group("metadata", "metadata: `get_file_info` (HeadObject)", "HeadObject", _put("obj"),
          lambda ctx: ctx.fs.get_file_info(ctx.path("obj")),
          lambda ctx, info: (info.type == pafs.FileType.File and info.size == len(SMALL))
          or pytest.fail(f"wrong info {info}"), _nothing),
    Group("list", "list: recursive `FileSelector` (ListObjectsV2)", "ListObjectsV2", _setup_list,
          lambda ctx: listing(ctx.fs, ctx.path("ckpt")), _check_list, _nothing),
    Group("small_put", "small put: 100 KiB stream (PutObject)", "PutObject", lambda ctx: None,
          lambda ctx: write(ctx.fs, ctx.path("put"), SMALL),
          _stored_is("put", lambda ctx: SMALL), _absent("put"),
          pyarrow_options={"allow_delayed_open": True}),
    Group("multipart_parts", "multipart put, parts: 2 parts (UploadPart 1)", "UploadPart",
          lambda ctx: None, lambda ctx: write(ctx.fs, ctx.path("mp"), BIG[ctx.client]),
          _stored_is("mp", lambda ctx: BIG[ctx.client]), _absent("mp"),
          query={"partNumber": 1}),
    Group("multipart_commit", "multipart put, commit (CompleteMultipartUpload)",
          "CompleteMultipartUpload", lambda ctx: None,
          lambda ctx: write(ctx.fs, ctx.path("mc"), _commit_data(ctx)),
          _stored_is("mc", _commit_data), _absent("mc")),
    Group("get", "get: `open_input_stream().read()` (GetObject)", "GetObject", _put("obj"),
          lambda ctx: ctx.fs.open_input_stream(ctx.path("obj")).read(),
          lambda ctx, data: sha(data) == sha(SMALL) or pytest.fail("wrong bytes"), _nothing),
    Group("ranged_get", "ranged get: `open_input_file`, seek, read (GetObject Range)",
          "GetObject", _put("obj"), lambda ctx: ranged_read(ctx.fs, ctx.path("obj")),
          lambda ctx, data: data == SMALL[40_000:60_000] or pytest.fail("wrong bytes"),
          _nothing),
    Group("delete", "delete: `delete_file` (DeleteObject; s3fs: DeleteObjects)",
          ("DeleteObject", "DeleteObjects"), _put("src", "other"),
          lambda ctx: ctx.fs.delete_file(ctx.path("src")), _check_deleted, _intact("src")),
    Group("move", "move: `move` (CopyObject, then the source's delete, faulted)",
          ("DeleteObject", "DeleteObjects"), _put("src"),
          lambda ctx: ctx.fs.move(ctx.path("src"), ctx.path("dest")), _check_moved,
          _intact("src")),
    Group("copy", "copy: `copy_file` (CopyObject)", "CopyObject", _put("src"),
          lambda ctx: ctx.fs.copy_file(ctx.path("src"), ctx.path("dest")), _check_copied,
          _absent("dest")),
]
GROUP = {group.name: group for group in GROUPS}
CLIENTS = ["pyarrow", "s3fs"]


# -- what each cell expects --------------------------------------------------------------------

# aiohttp (under s3fs) sends an idempotent request (GET, HEAD, PUT) once more when the
# connection drops before any byte of the answer: inject two so that one reaches the wrapper.
S3FS_REPLAYS = {
    "reset": {"metadata", "list", "small_put", "multipart_parts", "get", "ranged_get", "copy"},
    "truncate": {"metadata", "small_put", "multipart_parts"},  # answers without a body
}
REPLAY_NOTE = ("aiohttp (under s3fs) sends an idempotent request once more when the connection "
               "drops before any byte of the answer: two faults are injected, one reaches the "
               "wrapper")


@dataclass(frozen=True)
class Expect:
    """What one cell expects beyond the defaults."""

    not_applicable: str | None = None  # the reason the cell cannot apply
    times: int = 1  # faults injected (transient)
    resend: int = 1  # good requests of the faulted operation after the fault(s): one attempt
    not_found: bool = False  # permanent: get_file_info answers NotFound instead of raising
    note: str | None = None


def expect(client: str, group: str, kind: str) -> Expect:
    if kind == "error_in_200" and group not in ("multipart_commit", "copy"):
        return Expect(not_applicable=(
            "S3 answers 200 with an `<Error>` body only to CompleteMultipartUpload, CopyObject "
            "and UploadPartCopy"))
    if kind == "stall" and client == "pyarrow" and group in (
            "small_put", "multipart_parts", "multipart_commit"):
        return Expect(not_applicable=(
            "pyarrow's `request_timeout` does not bound a request whose body was sent: the "
            "upload waits out the stall (`test_s3_endpoint.py::"
            "test_pyarrow_stalled_upload_is_not_bounded_by_its_request_timeout`)"))
    if kind == "stall" and client == "s3fs" and group == "small_put":
        return Expect(not_applicable=(
            "s3fs's `read_timeout` does not reliably bound a PutObject (sent with `Expect: "
            "100-continue`): measured, about half of the stalls are waited out to their end, "
            "and aiohttp replays the request unseen after the reset that ends them"))
    times, resend, notes = 1, 1, []
    if client == "s3fs" and group == "list":
        # the adapter lists twice per selector: `info` of the base (a prefix), then `find`
        resend = 2
    if kind == "truncate" and group in ("delete", "move"):
        resend = 0
        notes.append("the delete was applied before its answer was cut: the retry finds the "
                     "object gone and reconciles (no second delete request)")
    if client == "s3fs" and group in S3FS_REPLAYS.get(kind, ()):
        times = 2
        notes.append(REPLAY_NOTE)
    if kind == "no_such_bucket" and group == "metadata":
        return Expect(not_found=True, note=(
            "a HEAD answer has no body to tell NoSuchBucket from a missing key: "
            "`get_file_info` answers `NotFound` after one request, without a retry"))
    return Expect(times=times, resend=resend, note="; ".join(notes) or None)


def permanent_error_ok(client: str, kind: str, error: BaseException) -> bool:
    """The client's own error for a permanent fault, unchanged by the wrapper."""
    if client == "pyarrow":  # pyarrow's S3 errors are plain OSErrors: the text is the signal
        codes = {"access_denied": ("ACCESS_DENIED",),
                 # a GetObject error's text is unreliable (see the README): NoSuchBucket can
                 # come out as RESOURCE_NOT_FOUND
                 "no_such_bucket": ("NO_SUCH_BUCKET", "RESOURCE_NOT_FOUND")}[kind]
        return type(error) is OSError and any(f"AWS Error {c}" in str(error) for c in codes)
    wanted = {"access_denied": PermissionError, "no_such_bucket": FileNotFoundError}[kind]
    return isinstance(error, wanted)


# -- clients and results -----------------------------------------------------------------------

class Clients:
    """One client per kind and options for the whole session: building an s3fs client costs
    more than most cells. Faults and the store are reset per test; clients keep no state
    (s3fs's listings cache is off)."""

    def __init__(self, ep: S3FaultEndpoint) -> None:
        self.ep = ep
        self._built: dict[tuple[Any, ...], Any] = {}

    def get(self, client: str, *, timeout: bool, **options: Any) -> Any:
        key = (client, timeout, tuple(sorted(options.items())))
        if key not in self._built:
            if client == "pyarrow":
                if timeout:
                    options.update(request_timeout=CLIENT_TIMEOUT, connect_timeout=CLIENT_TIMEOUT)
                self._built[key] = self.ep.pyarrow_fs(**options)
            else:
                config = {"read_timeout": CLIENT_TIMEOUT} if timeout else {}
                self._built[key] = self.ep.s3fs(default_block_size=S3FS_BLOCK,
                                                use_listings_cache=False, config_kwargs=config)
        return self._built[key]


@pytest.fixture(scope="session")
def matrix_clients(s3_fault_server: S3FaultEndpoint) -> Clients:
    return Clients(s3_fault_server)


_results: dict[str, dict[str, Any]] = {}


def cell_id(client: str, group: str, kind: str) -> str:
    return f"{client}|{group}|{kind}"


@pytest.fixture(scope="module", autouse=True)
def matrix_results() -> Iterator[dict[str, dict[str, Any]]]:
    """Collects each cell's outcome; writes them (merged over an earlier run's) at the end."""
    yield _results
    if not _results:
        return
    try:
        merged = json.loads(RESULTS_PATH.read_text())
    except (OSError, ValueError):
        merged = {}
    cells = {**merged.get("cells", {}), **_results}
    import aiohttp
    import botocore
    import moto
    import pyarrow
    import s3fs

    RESULTS_PATH.write_text(json.dumps({
        "clients": CLIENTS,
        "kinds": [{"name": k.name, "title": k.title, "permanent": k.permanent} for k in KINDS],
        "groups": [{"name": g.name, "title": g.title} for g in GROUPS],
        "policy": {"max_attempts": POLICY.max_attempts, "max_delay": POLICY.max_delay},
        "versions": {m.__name__: m.__version__ for m in (pyarrow, s3fs, botocore, aiohttp, moto)},
        "cells": dict(sorted(cells.items())),
    }, indent=1) + "\n")


# -- the matrix ------------------------------------------------------------------------------

CELLS = [(client, group.name, kind.name) for kind in KINDS for group in GROUPS
         for client in CLIENTS]


#: A stall cell waits out the client's timeout (1 s: pyarrow's is whole seconds): `slow`, which
#: `make test-fast` leaves out (tests/core/test_timeouts.py and test_write_timeouts.py keep stalls).
PARAMS = [pytest.param(*cell, id="-".join(cell),
                       marks=[pytest.mark.slow] if cell[2] == "stall" else [])
          for cell in CELLS]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("client", "group_name", "kind_name"), PARAMS)
def test_fault_matrix(client: str, group_name: str, kind_name: str,
                      s3_fault_endpoint: S3FaultEndpoint, s3_fault_bucket: str,
                      matrix_clients: Clients) -> None:
    group, kind = GROUP[group_name], KIND[kind_name]
    rule = expect(client, group_name, kind_name)
    key = cell_id(client, group_name, kind_name)
    _results[key] = {"outcome": "failed"}  # until proven otherwise
    if rule.not_applicable:
        _results[key] = {"outcome": "n/a", "note": rule.not_applicable}
        pytest.skip(rule.not_applicable)

    ep = s3_fault_endpoint
    options = (group.pyarrow_options or {}) if client == "pyarrow" else {}
    inner = matrix_clients.get(client, timeout=kind_name == "stall", **options)
    fs = RetryingFileSystem(inner, POLICY, budget=False)
    ctx = Ctx(client, fs, ep, s3_fault_bucket)
    group.setup(ctx)

    match: dict[str, Any] = {"op": group.op, "query": group.query}
    fault = ep.add_fault(kind.make(**match) if kind.permanent
                         else kind.make(times=rule.times, **match))
    started = time.monotonic()
    result: Any = None
    error: BaseException | None = None
    try:
        result = group.action(ctx)
    except Exception as exc:  # noqa: BLE001 - judged below
        error = exc
    elapsed = time.monotonic() - started

    targets = [r for r in ep.requests() if fault.matches(r)]
    faulted = [r for r in targets if r.fault is fault]
    good = [r for r in targets if r.fault is None]
    stats = fs.stats.snapshot()
    record = {"requests": [r.status for r in targets], "faulted": len(faulted),
              "retries": stats["retries"], "seconds": round(elapsed, 3)}

    if kind.permanent:
        if rule.not_found:
            assert error is None, f"expected NotFound, got {error!r}"
            assert result.type == pafs.FileType.NotFound
            outcome = "not_found"
        else:
            assert error is not None, "a permanent fault did not fail the operation"
            assert permanent_error_ok(client, kind_name, error), f"wrong error: {error!r}"
            record["error"] = type(error).__name__
            outcome = "failed_fast"
        assert len(faulted) == len(targets) == 1, record  # one request, no retry
        assert stats["retries"] == 0, stats
        group.untouched(ctx)
    else:
        if error is not None:
            raise error
        group.check(ctx, result)
        assert len(faulted) == ep.fired(fault) == rule.times, record
        assert len(good) == rule.resend, record
        assert all(r.status is not None and r.status < 300 for r in good), record
        assert stats["retries"] == 1 and stats["giveups"] == 0, stats
        outcome = "survived"
    _results[key] = {"outcome": outcome, "note": rule.note, **record}


# -- regressions the matrix found (kept as focused tests) ----------------------------------------

def test_s3fs_broken_upload_is_aborted_never_committed(
        s3_fault_endpoint: S3FaultEndpoint, s3_fault_bucket: str, matrix_clients: Clients,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A broken fsspec upload is discarded (s3fs aborts its multipart upload), not closed: the
    wrapper opens fsspec files itself rather than through pyarrow's FSSpecHandler, whose
    PythonFile has no discard and would commit the partial object when closed (and send the
    failed part again). The discarded file is marked closed, so its __del__ stays quiet."""
    import gc
    import sys

    unraisable: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    fs = RetryingFileSystem(matrix_clients.get("s3fs", timeout=False), POLICY, budget=False)
    data = BIG["s3fs"]

    # part 1 fails as often as the policy tries it, in place: the write fails with its error
    # (one retry layer: max_attempts bounds each request; no replay tries them over again),
    # the upload is aborted and nothing committed
    ep.add_fault(S3Fault.internal_error(op="UploadPart", query={"partNumber": 1},
                                        times=POLICY.max_attempts))
    with pytest.raises(OSError, match="internal error"):
        write(fs, f"{bucket}/broken", data)
    counts = ep.counts()  # part 1's tries, and part 2 unless part 1's end came first
    assert POLICY.max_attempts <= counts["UploadPart"] <= POLICY.max_attempts + 1
    assert (counts["AbortMultipartUpload"], counts["CompleteMultipartUpload"]) == (1, 0)
    assert "broken" not in ep.keys(bucket)
    ep.clear_faults()
    write(fs, f"{bucket}/ok", data)  # the same write with the store healthy
    assert ep.get_object(bucket, "ok") == data

    ep.reset_record()
    ep.add_fault(S3Fault.access_denied(op="UploadPart", query={"partNumber": 1}))
    with pytest.raises(PermissionError):
        write(fs, f"{bucket}/denied", data)
    counts = ep.counts()  # part 2 goes out unless part 1's refusal came back first (parts
    # are sent in the background); the upload is aborted, nothing committed
    assert counts["UploadPart"] in (1, 2) and counts["AbortMultipartUpload"] == 1
    assert counts["CompleteMultipartUpload"] == 0 and "denied" not in ep.keys(bucket)
    gc.collect()
    assert unraisable == []


def test_pyarrow_move_reconciles_a_delete_applied_before_its_answer_was_lost(
        s3_fault_endpoint: S3FaultEndpoint, s3_fault_bucket: str,
        matrix_clients: Clients) -> None:
    """The source's delete happened but its answer was lost; the retried move's CopyObject then
    fails with pyarrow's plain ``OSError`` "AWS Error NO_SUCH_KEY" (not a FileNotFoundError),
    and the wrapper must still see that the move is done."""
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    fs = RetryingFileSystem(matrix_clients.get("pyarrow", timeout=False), POLICY, budget=False)
    ep.put_object(bucket, "src", SMALL)
    ep.add_fault(S3Fault.reset(op="DeleteObject", applied=True))
    fs.move(f"{bucket}/src", f"{bucket}/dest")
    assert ep.keys(bucket) in (["dest"], ["dest", "src/"])  # (pyarrow may leave a dir marker)
    assert ep.get_object(bucket, "dest") == SMALL
    assert [r.status for r in ep.requests(op="CopyObject")] == [200, 404]
    assert fs.stats.snapshot()["retries"] == 1

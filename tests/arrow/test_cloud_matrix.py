"""The GCS and Azure fault matrix: fault kinds x operation groups x the four clients users run.

The clients: pyarrow's `GcsFileSystem` and gcsfs on fake-gcs-server, pyarrow's
`AzureFileSystem` and adlfs on Azurite, each behind an `HttpFaultProxy` that shapes errors the
way the provider does, each wrapped in `RetryingFileSystem` (a tiny policy, ``client_attempts=1``:
retryfs is the only retry layer, except under pyarrow's Azure client, whose C++ SDK retries by
itself and cannot be told otherwise from Python).

- A transient fault: the operation succeeds, the bytes stored or read are identical, every
  planned fault fired, within a time bound written in the cell.
- A permanent fault (403, 404): raised after exactly one request of the faulted operation (the
  proxy's record proves it), with no retry by the wrapper; a write commits nothing.

Each cell records its outcome in ``tests/.cloud-matrix-results.json`` (or
``$RETRYFS_CLOUD_MATRIX_RESULTS``), which ``python -m tests.render_fault_matrix`` renders into
docs/testing.md next to the S3 matrix.
"""

from __future__ import annotations

import itertools
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
from _helpers import sha256

from retryfs import RetryingFileSystem, RetryPolicy
from retryfs.testing.http import HttpFault

MiB = 1 << 20
RESULTS_PATH = Path(os.environ.get("RETRYFS_CLOUD_MATRIX_RESULTS")
                    or Path(__file__).resolve().parents[1] / ".cloud-matrix-results.json")
POLICY = RetryPolicy(max_attempts=4, initial_delay=0.001, multiplier=2, max_delay=0.004,
                     jitter=False)

_rng = random.Random(20261201)
SMALL = _rng.randbytes(100 * 1024)
BIG = _rng.randbytes(6 * MiB)  # resumable (GCS) or block (Azure) upload, several requests


# -- the clients ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Client:
    name: str
    title: str
    store: str  # "gcs" or "azure"
    make: Callable[[Any], Any]  # endpoint -> the inner filesystem
    #: the client's own retries cannot be reduced: it absorbs transient faults by itself
    self_retrying: bool = False


CLIENTS = [
    Client("pyarrow_gcs", "pyarrow GcsFileSystem", "gcs", lambda ep: ep.pyarrow_fs()),
    Client("gcsfs", "gcsfs", "gcs", lambda ep: ep.gcsfs()),
    Client("pyarrow_azure", "pyarrow AzureFileSystem", "azure", lambda ep: ep.pyarrow_fs(),
           self_retrying=True),
    Client("adlfs", "adlfs", "azure", lambda ep: ep.adlfs()),
]
CLIENT = {client.name: client for client in CLIENTS}

#: What one Azure C++ SDK retry costs at most (0.8 s, 1.6 s... with jitter up to 1.3x).
AZURE_SDK_RETRY = 2.2


# -- the columns: fault kinds ------------------------------------------------------------------

@dataclass(frozen=True)
class Kind:
    name: str
    title: str
    make: Callable[..., HttpFault]
    permanent: bool = False


KINDS = [
    Kind("internal_error", "500", HttpFault.internal_error),
    Kind("unavailable", "503 (GCS backendError, Azure ServerBusy)", HttpFault.unavailable),
    Kind("too_many_requests", "429", HttpFault.too_many_requests),
    Kind("forbidden", "403 (Azure AuthorizationPermissionMismatch)", HttpFault.forbidden,
         permanent=True),
    Kind("reset", "reset", HttpFault.reset),
    Kind("truncate", "truncated body", HttpFault.truncate),
    Kind("applied", "applied, then reset", lambda **m: HttpFault.reset(applied=True, **m)),
    Kind("not_found", "404", HttpFault.not_found, permanent=True),
    Kind("conflict", "409", HttpFault.conflict, permanent=True),
]
KIND = {kind.name: kind for kind in KINDS}


# -- the rows: operation groups --------------------------------------------------------------

@dataclass
class Ctx:
    client: Client
    fs: RetryingFileSystem
    ep: Any
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
        for start in range(0, len(data), MiB):
            f.write(data[start:start + MiB])


def ranged_read(fs: pafs.FileSystem, path: str) -> bytes:
    with fs.open_input_file(path) as f:
        f.seek(40_000)
        return f.read(20_000)


def listing(fs: pafs.FileSystem, path: str) -> set[tuple[str, int | None]]:
    return {(i.path, i.size) for i in fs.get_file_info(pafs.FileSelector(path, recursive=True))
            if i.type == pafs.FileType.File}


@dataclass(frozen=True)
class Group:
    name: str
    title: str
    ops: dict[str, tuple[str, ...]]  # store -> the operations a fault targets
    setup: Callable[[Ctx], None]
    action: Callable[[Ctx], Any]
    check: Callable[[Ctx, Any], None]  # after a transient fault
    untouched: Callable[[Ctx], None]  # after a permanent one
    nth: int | None = None  # fault the n-th matching request (e.g. the first block of several)


def _put(*keys: str, data: bytes = SMALL) -> Callable[[Ctx], None]:
    def setup(ctx: Ctx) -> None:
        for key in keys:
            ctx.ep.put_object(ctx.bucket, key, data)
    return setup


TREE = ["ckpt/model.pt", "ckpt/meta.json", "ckpt/shards/0", "ckpt/shards/1"]


def _setup_tree(ctx: Ctx) -> None:
    for i, key in enumerate(TREE):
        ctx.ep.put_object(ctx.bucket, key, SMALL[: 1000 * (i + 1)])


def _check_tree(ctx: Ctx, result: Any) -> None:
    assert result == {(ctx.path(k), 1000 * (i + 1)) for i, k in enumerate(TREE)}, result


def _stored_is(key: str, data: bytes) -> Callable[[Ctx, Any], None]:
    def check(ctx: Ctx, result: Any) -> None:
        stored = ctx.stored(key)
        assert stored is not None, f"{key} was not committed"
        assert sha256(stored) == sha256(data)
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


def _check_info(ctx: Ctx, info: Any) -> None:
    assert info.type == pafs.FileType.File and info.size == len(SMALL), info


def _check_deleted(ctx: Ctx, result: Any) -> None:
    assert ctx.stored("src") is None and ctx.stored("other") == SMALL


def _check_moved(ctx: Ctx, result: Any) -> None:
    assert ctx.stored("src") is None and ctx.stored("dest") == SMALL


GCS_WRITE = ("objects.insert", "uploads.start", "uploads.put")
AZURE_WRITE = ("PutBlob", "PutBlock", "PutBlockList")
GROUPS = [
    Group("metadata", "metadata: `get_file_info`",
          {"gcs": ("objects.get",), "azure": ("GetBlobProperties", "ListBlobs")}, _put("obj"),
          lambda ctx: ctx.fs.get_file_info(ctx.path("obj")), _check_info, _nothing),
    Group("list", "list: recursive `FileSelector`",
          {"gcs": ("objects.list",), "azure": ("ListBlobs",)}, _setup_tree,
          lambda ctx: listing(ctx.fs, ctx.path("ckpt")), _check_tree, _nothing),
    Group("small_write", "write: 100 KiB stream (single-shot)",
          {"gcs": GCS_WRITE, "azure": AZURE_WRITE}, _nothing,
          lambda ctx: write(ctx.fs, ctx.path("put"), SMALL), _stored_is("put", SMALL),
          _absent("put")),
    Group("big_write", "write: 6 MiB stream (resumable / blocks), its 2nd request",
          {"gcs": GCS_WRITE, "azure": AZURE_WRITE}, _nothing,
          lambda ctx: write(ctx.fs, ctx.path("big"), BIG), _stored_is("big", BIG),
          _absent("big"), nth=2),
    Group("read", "read: `open_input_stream().read()`",
          {"gcs": ("objects.download",), "azure": ("GetBlob",)}, _put("obj"),
          lambda ctx: ctx.fs.open_input_stream(ctx.path("obj")).read(),
          lambda ctx, data: sha256(data) == sha256(SMALL) or pytest.fail("wrong bytes"),
          _nothing),
    Group("ranged_read", "ranged read: `open_input_file`, seek, read",
          {"gcs": ("objects.download",), "azure": ("GetBlob",)}, _put("obj"),
          lambda ctx: ranged_read(ctx.fs, ctx.path("obj")),
          lambda ctx, data: data == SMALL[40_000:60_000] or pytest.fail("wrong bytes"),
          _nothing),
    Group("delete", "delete: `delete_file`",
          {"gcs": ("objects.delete",), "azure": ("DeleteBlob",)}, _put("src", "other"),
          lambda ctx: ctx.fs.delete_file(ctx.path("src")), _check_deleted, _intact("src")),
    Group("move", "move: `move` (the copy faulted)",
          {"gcs": ("objects.rewrite", "objects.copy"), "azure": ("CopyBlob",)}, _put("src"),
          lambda ctx: ctx.fs.move(ctx.path("src"), ctx.path("dest")), _check_moved,
          _intact("src")),
]
GROUP = {group.name: group for group in GROUPS}


# -- what each cell expects --------------------------------------------------------------------

@dataclass(frozen=True)
class Expect:
    not_applicable: str | None = None
    times: int = 1
    note: str | None = None
    #: a permanent 404 the client answers as "absent" (NotFound, or a delete that is done), not
    #: an error
    not_found: bool = False
    #: the operations faulted, when not the group's (store -> ops)
    ops: tuple[str, ...] | None = None
    #: permanent: requests of the faulted operation(s), each once (a client's own probes);
    #: by_client: requests of the faulted operation(s) in all, at most
    requests: int = 1
    #: transient: the client recovered by itself (its own resume), so retryfs did not retry
    by_client: bool = False
    #: fault only this key's requests (not a client's parallel probes of others)
    key: str | None = None
    #: the fault proxy runs in a process of its own (the client holds the GIL while it waits)
    proxy_process: bool = False


PYARROW_GCS_INPUT_FILE = (
    "pyarrow 26's GCS input file opens its download lazily inside `NativeFile.closed`, with the "
    "GIL held, which an in-process proxy (Python threads) can never answer: this cell's proxy "
    "runs in a process of its own (`ProcessFaultProxy`). A failed lazy download makes the file "
    "report itself closed (`ValueError: I/O operation on closed file`) instead of the error: "
    "retryfs takes that for a lost stream and reopens at the offset")
PYARROW_GCS_INPUT_FILE_PERMANENT = (
    "the proxy in a process of its own (see the 500 note of this row); the 403/404 answers "
    "the metadata request `open_input_file` makes first (a download alone refused while the "
    "metadata is served would be retried: the file hides why it closed)")
PYARROW_GCS_INPUT_FILE_CUT = (
    "the proxy in a process of its own (see the 500 note of this row); google-cloud-cpp "
    "resumes the lazy download cut short by itself (3 downloads: from 0, resumed, the range)")
BODYLESS = ("a HEAD answer has no body to cut")
REPLAY_NOTE = ("aiohttp (under gcsfs and adlfs) sends an idempotent request once more when the "
               "connection drops before any byte of the answer: two faults are injected")
GCSFS_INFO_PROBES = (
    "gcsfs's `info` asks for the object and, at the same time, lists `obj/` as a directory "
    "probe, which asks for the object again when that listing is empty: the reset of the "
    "first GET is answered by whichever comes first, aiohttp's re-send of it or the probe's "
    "GET (one fault is injected: a second would meet one or the other by timing, and gcsfs "
    "would recover or fail by timing): retryfs has nothing to retry")
CHANGES_ONLY = ("GCS and Azure answer 409 to changes only (a conflicting write or copy, a lease "
                "on the blob)")
GCS_RESUMES = ("google-cloud-cpp resumes a download cut short by itself (one more request, "
               "the object's bytes intact): retryfs has nothing to retry")
AZURE_STORAGE_RESUMES = (
    "azure-storage-blob's downloader re-requests a body cut short by itself (up to 3 times, "
    "1 s apart, fixed in its code: `retry_total` does not reach it): retryfs has nothing to "
    "retry, the read takes 1 s more")
AZURE_EMPTY_BLOB = (
    "pyarrow's AzureFileSystem creates the blob empty when the stream opens (a PutBlob of 0 "
    "bytes, replacing what was there), before any block: retryfs notes that blob's ETag after "
    "each open (one GetBlobProperties per stream, on this client only) and, when the write is "
    "refused, deletes the blob if it is still that empty one: nothing is left as if an empty "
    "file had been written")
AZURE_DELETE_RESENT = (
    "the Azure C++ SDK re-sends the DELETE by itself after the reset and is answered 404 "
    "(BlobNotFound) on retryfs's first attempt: retryfs looked at the blob before the delete "
    "(one ListBlobs per `delete_file`, on this client only) and takes a 404 for a blob it saw, "
    "and that is gone now, for this call's own delete")


def expect(client: Client, group: str, kind: str) -> Expect:
    if client.name == "pyarrow_gcs" and group == "ranged_read" and kind not in ("conflict",
                                                                               "applied"):
        if KIND[kind].permanent:
            return Expect(proxy_process=True, ops=("objects.get", "objects.download"),
                          note=PYARROW_GCS_INPUT_FILE_PERMANENT)
        if kind == "truncate":  # its lazy download from 0 cut, resumed, then the range
            return Expect(proxy_process=True, by_client=True, requests=3,
                          note=PYARROW_GCS_INPUT_FILE_CUT)
        return Expect(proxy_process=True, note=PYARROW_GCS_INPUT_FILE)
    if kind == "truncate" and group not in ("metadata", "list", "read", "ranged_read"):
        return Expect(not_applicable="writes, deletes and copies answer with no body (or one "
                      "too small to matter): see `applied` for an answer lost after the change")
    if kind == "truncate" and group == "metadata" and client.store == "azure":
        return Expect(not_applicable=BODYLESS)
    if kind == "applied" and group not in ("small_write", "delete"):
        return Expect(not_applicable="shown on a single-shot write and a delete")
    if kind == "conflict" and group in ("metadata", "list", "read", "ranged_read"):
        return Expect(not_applicable=CHANGES_ONLY)
    if client.name == "pyarrow_azure" and group == "move":
        return Expect(not_applicable="pyarrow's AzureFileSystem cannot move on a flat-namespace "
                      "account (Azurite has no hierarchical namespace)")
    if client.name == "gcsfs" and group == "metadata" and kind == "forbidden":
        return Expect(not_applicable="gcsfs's `info` answers a 403 on the object by listing its "
                      "parent, which finds it: there is no error to raise (the 403 was sent "
                      "once)")
    if kind == "not_found" and group == "metadata":
        if client.name == "gcsfs":
            return Expect(not_found=True, requests=2, note="`get_file_info` answers NotFound "
                          "(not an error); gcsfs asks for the object and its directory marker "
                          "(`obj/`) at once, each once")
        if client.name == "pyarrow_azure":
            return Expect(note="pyarrow's AzureFileSystem asks a flat-namespace account "
                          "about a path by listing it as a prefix (ListBlobs, one result at "
                          "most): a 404 there (no container) is raised as `OSError` (\"unable "
                          "to determine whether the path exists\") after one request")
        return Expect(not_found=True, ops=("GetBlobProperties",) if client.store == "azure"
                      else None, note="`get_file_info` answers NotFound (not an error) "
                      "after one request")
    if kind == "not_found" and group == "delete" and client.name == "adlfs":
        return Expect(not_found=True, note="adlfs takes a 404 on its DeleteBlob for done (the "
                      "blob is gone; pyarrow's FSSpecHandler saw it exist a moment before): no "
                      "error, after one request")
    if (client.name == "pyarrow_azure" and group == "big_write" and KIND[kind].permanent):
        return Expect(note=AZURE_EMPTY_BLOB)
    if kind == "applied" and group == "delete" and client.name == "pyarrow_azure":
        return Expect(note=AZURE_DELETE_RESENT)
    if kind == "truncate" and group == "read" and client.name == "pyarrow_gcs":
        return Expect(by_client=True, requests=2, note=GCS_RESUMES)
    if kind == "truncate" and group in ("read", "ranged_read") and client.name == "adlfs":
        return Expect(by_client=True, requests=2, note=AZURE_STORAGE_RESUMES)
    if kind == "reset" and client.name == "gcsfs" and group == "metadata":
        # one fault, not REPLAY_NOTE's two: a second would go to whichever of aiohttp's re-send
        # and the probe's GET reaches the server first, and the outcome would be a race
        return Expect(key="obj", by_client=True, requests=3, note=GCSFS_INFO_PROBES)
    times = 1
    notes = []
    key = None
    if kind in ("reset", "applied") and client.name in ("gcsfs", "adlfs"):
        times = 2
        notes.append(REPLAY_NOTE)
    if client.self_retrying and not KIND[kind].permanent:
        notes.append("the Azure C++ SDK retries by itself first (it cannot be told not to); "
                     "retryfs retries what it gives up on")
    return Expect(times=times, key=key, note="; ".join(notes) or None)


def bound(client: Client, kind: Kind, rule: Expect) -> float:
    """Seconds a cell may take: a few of the policy's milliseconds, plus what a self-retrying
    client sleeps per fault by itself."""
    seconds = 5.0
    if client.self_retrying and not kind.permanent:
        seconds += AZURE_SDK_RETRY * rule.times
    return seconds


# -- results -------------------------------------------------------------------------------------

_results: dict[str, dict[str, Any]] = {}


def cell_id(client: str, group: str, kind: str) -> str:
    return f"{client}|{group}|{kind}"


@pytest.fixture(scope="module", autouse=True)
def matrix_results() -> Iterator[dict[str, dict[str, Any]]]:
    yield _results
    if not _results:
        return
    try:
        merged = json.loads(RESULTS_PATH.read_text())
    except (OSError, ValueError):
        merged = {}
    cells = {**merged.get("cells", {}), **_results}
    import adlfs
    import azure.core
    import gcsfs
    import pyarrow

    RESULTS_PATH.write_text(json.dumps({
        "clients": [c.name for c in CLIENTS],
        "client_titles": {c.name: c.title for c in CLIENTS},
        "kinds": [{"name": k.name, "title": k.title, "permanent": k.permanent} for k in KINDS],
        "groups": [{"name": g.name, "title": g.title} for g in GROUPS],
        "policy": {"max_attempts": POLICY.max_attempts, "max_delay": POLICY.max_delay},
        "versions": {"pyarrow": pyarrow.__version__, "gcsfs": gcsfs.__version__,
                     "adlfs": adlfs.__version__, "azure-core": azure.core.__version__},
        "cells": dict(sorted(cells.items())),
    }, indent=1) + "\n")


@pytest.fixture
def endpoint_for(request: pytest.FixtureRequest) -> Callable[..., tuple[Any, str]]:
    def get(client: Client, apart: bool = False) -> tuple[Any, str]:
        if apart:  # the proxy in a process of its own
            ep = request.getfixturevalue("gcs_process_fault_endpoint")
            bucket = f"retryfs-apart-{next(_apart)}"
            ep.create_bucket(bucket)
            return ep, bucket
        if client.store == "gcs":
            return (request.getfixturevalue("gcs_fault_endpoint"),
                    request.getfixturevalue("gcs_fault_bucket"))
        return (request.getfixturevalue("azure_fault_endpoint"),
                request.getfixturevalue("azure_fault_container"))
    return get


_apart = itertools.count(1)


def wrapped(client: Client, ep: Any) -> RetryingFileSystem:
    return RetryingFileSystem(client.make(ep), POLICY, budget=False, client_attempts=1)


# -- the matrix ------------------------------------------------------------------------------

CELLS = [(client.name, group.name, kind.name) for kind in KINDS for group in GROUPS
         for client in CLIENTS]


#: Faults the Azure C++ SDK under pyarrow retries by itself, 0.8 s after the first.
AZURE_SDK_RETRIES = ("internal_error", "unavailable", "reset", "applied")


def slow(client: str, group: str, kind: str) -> bool:
    """A cell that spends about a second in a client's own fixed waits, which cannot be
    shortened from Python: `slow`, which `make test-fast` leaves out (`make test` runs it)."""
    return ((CLIENT[client].self_retrying and kind in AZURE_SDK_RETRIES)
            or expect(CLIENT[client], group, kind).note == AZURE_STORAGE_RESUMES)


PARAMS = [pytest.param(*cell, id="-".join(cell),
                       marks=[pytest.mark.slow] if slow(*cell) else [])
          for cell in CELLS]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("client_name", "group_name", "kind_name"), PARAMS)
def test_cloud_fault_matrix(client_name: str, group_name: str, kind_name: str,
                            endpoint_for: Callable[[Client], tuple[Any, str]]) -> None:
    client, group, kind = CLIENT[client_name], GROUP[group_name], KIND[kind_name]
    rule = expect(client, group_name, kind_name)
    key = cell_id(client_name, group_name, kind_name)
    _results[key] = {"outcome": "failed"}
    if rule.not_applicable:
        _results[key] = {"outcome": "n/a", "note": rule.not_applicable}
        pytest.skip(rule.not_applicable)

    ep, bucket = endpoint_for(client, rule.proxy_process)
    fs = wrapped(client, ep)
    ctx = Ctx(client, fs, ep, bucket)
    group.setup(ctx)
    ops = rule.ops or group.ops[client.store]
    match: dict[str, Any] = {"op": ops, "nth": group.nth}
    if rule.key is not None:
        match["path"] = ctx.path(rule.key)
    fault = ep.add_fault(kind.make(**match) if kind.permanent
                         else kind.make(times=rule.times, **match))
    limit = bound(client, kind, rule)
    started = time.monotonic()
    result: Any = None
    error: BaseException | None = None
    try:
        result = group.action(ctx)
    except Exception as exc:  # noqa: BLE001 - judged below
        error = exc
    elapsed = time.monotonic() - started

    targets = ep.requests(ops)
    faulted = [r for r in targets if r.fault is fault]
    stats = fs.stats.snapshot()
    record = {"requests": [r.status for r in targets], "faulted": len(faulted),
              "retries": stats["retries"], "seconds": round(elapsed, 3)}
    if kind.permanent:
        if rule.not_found:
            assert error is None, f"expected an answer of absence, got {error!r}"
            if group_name == "metadata":
                assert result.type == pafs.FileType.NotFound, result
            outcome = "not_found"
        else:
            assert error is not None, "a permanent fault did not fail the operation"
            record["error"] = type(error).__name__
            outcome = "failed_fast"
        assert len(faulted) == rule.requests, record
        # each request of the faulted operation once from the fault on (a multi-request write
        # had good requests before it)
        after = [r for r in targets if r.seq >= faulted[0].seq]
        assert len(after) == rule.requests, record
        assert stats["retries"] == 0, stats
        group.untouched(ctx)
    else:
        if error is not None:
            raise error
        group.check(ctx, result)
        assert len(faulted) == ep.fired(fault) == rule.times, record
        assert stats["giveups"] == 0, stats
        if rule.by_client:
            assert stats["retries"] == 0, (stats, record)  # the client's own resume
            assert rule.times < len(targets) <= rule.requests, record
        elif not client.self_retrying:
            assert stats["retries"] >= 1, (stats, record)  # retryfs, not the client, recovered
        outcome = "survived"
    assert elapsed < limit, f"{elapsed:.2f}s > {limit}s: {record}"
    _results[key] = {"outcome": outcome, "note": rule.note, **record}


# -- a checkpoint tree through copy_files under a 10 % fault rate --------------------------------

@pytest.mark.timeout(120)
@pytest.mark.parametrize("client_name", ["pyarrow_gcs", "gcsfs", "pyarrow_azure", "adlfs"])
def test_copy_files_of_a_checkpoint_tree_under_a_ten_percent_fault_rate(
        client_name: str, endpoint_for: Callable[[Client], tuple[Any, str]],
        tmp_path: Path) -> None:
    client = CLIENT[client_name]
    # pyarrow GCS's input file opens its download lazily, holding the GIL while it waits (the
    # restore's native download asks each one for its metadata): an in-process proxy could not
    # answer, and the process hung; its proxy runs in a process of its own, as in the matrix
    ep, bucket = endpoint_for(client, apart=client_name == "pyarrow_gcs")
    tree = {f"ckpt/{name}": _rng.randbytes(size) for name, size in [
        ("model.pt", 3 * MiB), ("optimizer.pt", 2 * MiB), ("meta.json", 300),
        *((f"shards/{i}", 100 * 1024 + i) for i in range(7))]}
    local = tmp_path / "local"
    for key, data in tree.items():
        (local / key).parent.mkdir(parents=True, exist_ok=True)
        (local / key).write_bytes(data)
    fs = RetryingFileSystem(client.make(ep), RetryPolicy(max_attempts=8, initial_delay=0.001,
                                                         max_delay=0.004, jitter=False),
                            budget=False, client_attempts=1)
    fault = ep.add_fault(HttpFault.internal_error(probability=0.1, seed=7))
    started = time.monotonic()
    pafs.copy_files(str(local / "ckpt"), f"{bucket}/ckpt", source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=fs)
    for key, data in tree.items():
        assert sha256(ep.get_object(bucket, key)) == sha256(data), key
    back = tmp_path / "back"
    pafs.copy_files(f"{bucket}/ckpt", str(back), source_filesystem=fs,
                    destination_filesystem=pafs.LocalFileSystem())
    for key, data in tree.items():
        assert sha256((back / key.removeprefix("ckpt/")).read_bytes()) == sha256(data), key
    assert ep.fired(fault) >= 1, ep.counts()  # faults fired, and were survived
    assert time.monotonic() - started < 60

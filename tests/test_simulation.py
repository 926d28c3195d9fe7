"""A simulation of the whole wrapper: random operations under random faults, against a model.

Hypothesis drives a `RuleBasedStateMachine`: writes, reads, moves, copies, deletes, create_dir,
listings and ``copy_files`` of trees, through both faces (the pyarrow `RetryingFileSystem` and
the fsspec ``retry`` filesystem), over an in-memory store (pyarrow's ``_MockFileSystem``) behind
a `FaultyFileSystem` that injects seeded faults of every kind: transient errors, throttling,
resets, permanent errors, faults *applied then lost* (the work done, then the error), commits
*acknowledged and lost* (success answered, nothing stored: the older object stays), stalls, and
stalls that end in an error. A fault-free reference store runs the same operation through the
same face's unwrapped equivalent (the mock itself, or fsspec's ``ArrowFSWrapper`` over it).

After every step:

- a call that returned success left the store equal to the reference (and a read returned the
  reference's bytes, a listing the reference's entries);
- a call that raised raised the reference's exception type or the type of a fault injected in
  the step (never a wrapper's), and left every path as it was before or as the reference made
  it (nothing partial); the reference then adopts the store's state;
- the counters are whole: ``attempts == calls + retries`` (totals and per operation), and
  ``giveups <= calls``;
- time is bounded: on a virtual clock (backoff sleeps and stalls advance it; nothing waits),
  a step took at most ``calls * (deadline + longest stall)``, every call at most
  ``deadline + longest stall``.

A failing example is printed with its steps and a ``@reproduce_failure`` blob; replay it with
``pytest tests/test_simulation.py --hypothesis-seed=<seed>`` (or the blob). The run's figures
(examples, operations, faults injected by kind, failures reconciled) are printed at the end and
written to ``$RETRYFS_SIM_REPORT`` if set. ``--hypothesis-profile=long`` runs thousands.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from collections.abc import Callable
from typing import Any

import fsspec
import pyarrow.fs as pafs
import pytest
from fsspec.implementations.arrow import ArrowFSWrapper
from hypothesis import note, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from pyarrow._fs import _MockFileSystem

from retryfs import RetryingFileSystem, RetryPolicy
from retryfs.core.classify import exception_chain
from retryfs.errors import CommitNotVisibleError
from retryfs.testing import FaultyFileSystem, errors

DEADLINE = 3.0  # virtual seconds
POLICY = RetryPolicy(max_attempts=5, initial_delay=0.1, multiplier=2.0, max_delay=0.8,
                     jitter=False, deadline=DEADLINE)

DIRS = ("a", "b", "a/c")
NAMES = ("x", "y", "z.bin")
PATHS = tuple(f"{d}/{n}" for d in DIRS for n in NAMES) + ("top",)
SEED = {"a": "dir", "b": "dir", "a/c": "dir", "a/x": b"checkpoint 1", "a/c/z.bin": b"z" * 100,
        "b/y": b"old", "top": b"top"}
PAYLOADS = st.binary(min_size=0, max_size=64) | st.sampled_from([b"", b"same", b"x" * 3000])

#: Fault kinds: (error factory or None, applied, stall seconds)
KINDS: dict[str, tuple[Callable[[], BaseException] | None, bool, float | None]] = {
    "network": (errors.network(), False, None),
    "throttle": (errors.throttle(), False, None),
    "reset": (errors.reset(), False, None),
    "unavailable": (errors.unavailable(), False, None),
    "denied": (errors.access_denied(), False, None),
    "applied_then_lost": (errors.network(), True, None),
    "stall": (None, False, 0.4),
    "long_stall": (None, False, 2.5),
    "stall_then_reset": (errors.reset(), False, 0.6),
    "lost": (None, False, None),  # a commit acknowledged and never stored (see SILENT)
}
#: Kinds that report success and do nothing: the older object (or nothing) stays.
SILENT = frozenset({"lost"})
#: Where faults go (FaultyFileSystem operation names) and which kinds make sense there.
TARGETS = {
    "get_file_info": ("network", "unavailable", "stall", "long_stall", "stall_then_reset"),
    "get_file_info_selector": ("network", "throttle", "stall", "denied"),
    "create_dir": ("network", "applied_then_lost", "throttle", "denied"),
    "delete_dir": ("network", "applied_then_lost", "reset"),
    "delete_file": ("network", "applied_then_lost", "reset", "denied"),
    "move": ("network", "applied_then_lost", "throttle", "stall_then_reset"),
    "copy_file": ("network", "applied_then_lost", "reset"),
    "open_input_stream": ("network", "reset", "stall", "denied"),
    "open_input_file": ("network", "reset", "stall"),
    "open_output_stream": ("network", "throttle", "long_stall"),
    "read": ("network", "reset", "applied_then_lost", "stall_then_reset"),
    "write": ("network", "throttle", "reset"),
    "close": ("network", "applied_then_lost", "throttle", "stall", "denied", "lost"),
}


def faults(*operations: str) -> st.SearchStrategy[list[tuple[str, str, int, int]]]:
    """Up to 3 faults, each at one of ``operations`` (what the step's calls reach): which
    operation, which kind, how many matching calls pass first (``skip``), how many fail."""
    return st.lists(st.sampled_from(operations).flatmap(lambda op: st.tuples(
        st.just(op), st.sampled_from(TARGETS[op]), st.integers(0, 2), st.integers(1, 3))),
        max_size=3)


WRITES = faults("open_output_stream", "write", "close", "get_file_info")
READS = faults("open_input_stream", "open_input_file", "read", "get_file_info")
COPIES = faults("copy_file", "open_input_stream", "open_output_stream", "write", "close",
                "get_file_info")
TREES = faults("get_file_info_selector", "get_file_info", "create_dir", "open_input_stream",
               "open_output_stream", "read", "close")
MOVES = faults("move", "get_file_info")
FILE_COPIES = faults("copy_file", "get_file_info")
DELETES = faults("delete_file", "get_file_info")
DIR_DELETES = faults("delete_dir", "get_file_info")
MKDIRS = faults("create_dir", "get_file_info")
LISTINGS = faults("get_file_info_selector", "get_file_info")


FIGURES: Counter[str] = Counter()
#: Deletes whose retry, finding nothing, is success by design (README: ambiguous outcomes).
IDEMPOTENT_DELETES = frozenset({"delete_file", "delete_dir", "fsspec rm_file"})


class VirtualClock:
    """Time that passes only when someone sleeps or stalls: the deadline without waiting."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += max(0.0, seconds)


def snapshot(fs: pafs.FileSystem) -> dict[str, Any]:
    """Every path of a store: ``"dir"`` or the file's bytes."""
    state: dict[str, Any] = {}
    for info in fs.get_file_info(pafs.FileSelector("", recursive=True)):
        if info.type == pafs.FileType.Directory:
            state[info.path] = "dir"
        else:
            with fs.open_input_stream(info.path) as f:
                state[info.path] = f.read()
    return state


def restore(fs: pafs.FileSystem, state: dict[str, Any]) -> None:
    fs.delete_dir_contents("", accept_root_dir=True)
    for path, value in sorted(state.items()):
        if value == "dir":
            fs.create_dir(path)
        else:
            with fs.open_output_stream(path) as out:
                out.write(value)


def _writable(fs: pafs.FileSystem, path: str) -> bool:
    """Whether a third party can write ``path``: its directory is there (the mock store has
    real directories) and it is not a directory itself."""
    parent = path.rsplit("/", 1)[0] if "/" in path else ""
    return ((not parent or fs.get_file_info(parent).type == pafs.FileType.Directory)
            and fs.get_file_info(path).type != pafs.FileType.Directory)


def _backend_error_over_a_fault(error: BaseException, fault_types: set[type]) -> bool:
    """Whether ``error`` is not retryfs's own and has an injected fault behind it."""
    return (not type(error).__module__.startswith("retryfs")
            and any(type(cause) in fault_types for cause in exception_chain(error)
                    if cause is not error))


def outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", call()
    except Exception as exc:  # noqa: BLE001 - the outcome is compared, not handled
        return "raised", exc


class Simulation(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = VirtualClock()
        self.store = _MockFileSystem()
        self.reference = _MockFileSystem()
        self.faulty = FaultyFileSystem(self.store, sleep=self.clock.sleep)
        self.arrow = RetryingFileSystem(self.faulty, POLICY, budget=False)
        self.fsspec = fsspec.filesystem("retry", fs=self.faulty, policy=POLICY, budget=False,
                                        skip_instance_cache=True)
        self.durations: list[tuple[str, float]] = []  # (operation, virtual s) of outer calls
        self._depth = 0
        for retrier in (self.arrow.retry_handler.retrier, self.fsspec.retrier):
            retrier.clock = self.clock
            retrier.sleep = self.clock.sleep
            retrier.call = self._timed(retrier.call)
        self.ref_fsspec = ArrowFSWrapper(self.reference)
        for store in (self.store, self.reference):  # a tree to work on from the first step
            restore(store, SEED)
        self.injected: Counter[str] = Counter()
        FIGURES["examples"] += 1

    def _timed(self, call: Callable[..., Any]) -> Callable[..., Any]:
        """``Retrier.call`` that notes how long each outermost call took on the virtual clock."""
        def timed_call(operation: str, *args: Any, **kwargs: Any) -> Any:
            self._depth += 1
            started = self.clock()
            try:
                return call(operation, *args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.durations.append((operation, self.clock() - started))
        return timed_call

    # -- one step: arm faults, run on both, compare ----------------------------------------------
    def step(self, name: str, faults: list[tuple[str, str, int, int]],
             real: Callable[[], Any], ref: Callable[[], Any],
             unprovable: type[BaseException] | None = None) -> None:
        """``unprovable``: an error the wrapper may raise where the reference succeeded, by
        design, when the step's faults leave its outcome beyond proof (see `move`)."""
        before = snapshot(self.store)
        assert before == snapshot(self.reference)
        armed_types = set()
        armed = []
        for op, kind, skip, times in faults:
            error, applied, stall = KINDS[kind]
            armed.append((kind, self.faulty.inject(op, error, skip=skip, times=times,
                                                   applied=applied, stall=stall,
                                                   silent=kind in SILENT)))
            if error is not None:
                armed_types.add(type(error()))
            if kind in SILENT:  # lost on every attempt the deadline allows: not proven
                armed_types.add(CommitNotVisibleError)
        calls_before = self._stats()["calls"]
        self.durations.clear()
        started = self.clock()
        got, value = outcome(real)
        elapsed = self.clock() - started
        fired = dict(self.faulty.injected)
        self.faulty.clear()
        self.injected.update(fired)
        for kind, fault in armed:
            FIGURES[f"faults {kind}"] += fault.fired
        want, expected = outcome(ref)
        after, ref_after = snapshot(self.store), snapshot(self.reference)
        FIGURES["operations"] += 1
        FIGURES[f"op {name}"] += 1
        FIGURES["faults injected"] += sum(fired.values())
        note(f"{name}: {got} {value!r} (reference: {want} {expected!r}); faults {faults}, "
             f"fired {fired}")

        # Virtual time passes only in backoff sleeps and stalls: a call may take its deadline
        # plus the stalls of its last attempt (at most every stall that fired in the step).
        stalled = sum(fault.fired * (fault.stall or 0.0) for _, fault in armed)
        bound = DEADLINE + stalled + 1e-9
        for operation, took in self.durations:
            assert took <= bound, f"{operation} took {took:.2f} virtual s > {bound:.2f}"
        FIGURES["calls timed"] += len(self.durations)
        FIGURES["longest call (virtual ms)"] = max(
            FIGURES["longest call (virtual ms)"],
            *(int(took * 1000) for _, took in self.durations), 0)
        self.durations.clear()
        calls = self._stats()["calls"] - calls_before
        assert elapsed <= max(calls, 1) * bound, f"{name} took {elapsed:.2f} virtual s"

        if got == "ok":
            if want == "raised" and name in IDEMPOTENT_DELETES and fired and isinstance(
                    expected, FileNotFoundError):
                # documented: a retried delete that finds nothing is success (the first
                # attempt may have deleted it); the state is what the reference left
                FIGURES["deletes of an absent path reconciled as success"] += 1
                assert after == ref_after, f"{name} reconciled but the store differs"
                return
            assert want == "ok", f"{name} succeeded where the reference raised {expected!r}"
            assert after == ref_after, f"{name} succeeded but the store differs"
            if isinstance(value, (bytes, list)):
                assert value == expected, f"{name} returned {value!r}, not {expected!r}"
            return
        allowed = armed_types | ({type(expected)} if want == "raised" else set())
        if unprovable is not None and type(value) is unprovable and fired:
            FIGURES[f"{name}: not proven, raised by design"] += 1
            allowed = allowed | {unprovable}
        if (isinstance(value, FileNotFoundError) and ".tmp." in str(value)
                and any(kind in SILENT and fault.fired for kind, fault in armed)):
            # fsspec's ArrowFSWrapper.cp_file writes a temporary file, then moves it into
            # place: the lost commit of that file surfaces as the move's "not found", the
            # backend's own error (the destination is left as it was, checked below)
            FIGURES["lost commits surfaced as the backend's missing temporary file"] += 1
            allowed = allowed | {type(value)}
        if type(value) not in allowed and _backend_error_over_a_fault(value, armed_types):
            # the backend itself answered the fault with an error of its own (fsspec's
            # cp_file closes its broken upload: "upload ... failed earlier", chained to the
            # fault), which retryfs raises as it came
            FIGURES["failures raised as the backend's own error over a fault"] += 1
            allowed = allowed | {type(value)}
        assert type(value) in allowed, (
            f"{name} raised {type(value).__name__} ({value}), not the reference's or a fault's")
        refused = any(kind == "denied" and fault.fired for kind, fault in armed)
        if want == "raised" and not refused:
            assert after == ref_after, f"{name} failed as the reference did, yet changed things"
            return
        # The reference succeeded, or failed at another point than the wrapper, which gave up
        # on a fault (a refusal is final where it comes): no path may be partial.
        assert fired, f"{name} raised {value!r} with no fault fired"
        FIGURES["failures under faults"] += 1
        for path in set(before) | set(after) | set(ref_after):
            assert after.get(path) in (before.get(path), ref_after.get(path)), (
                f"{name} gave up and left {path!r} neither as it was nor as it should be")
        restore(self.reference, after)

    def _stats(self) -> dict[str, int]:
        a, f = self.arrow.stats.snapshot(), self.fsspec.stats.snapshot()
        return {key: a[key] + f[key] for key in ("calls", "attempts", "retries", "giveups")}

    # -- rules: the pyarrow face ---------------------------------------------------------------
    @rule(path=st.sampled_from(PATHS), data=PAYLOADS, faults=WRITES)
    def write(self, path: str, data: bytes, faults: list) -> None:
        def on(fs: pafs.FileSystem) -> Callable[[], None]:
            def run() -> None:
                with fs.open_output_stream(path) as out:
                    out.write(data)
            return run

        self.step("write", faults, on(self.arrow), on(self.reference))

    @rule(path=st.sampled_from(PATHS), seekable=st.booleans(), faults=READS)
    def read(self, path: str, seekable: bool, faults: list) -> None:
        def on(fs: pafs.FileSystem) -> Callable[[], bytes]:
            def run() -> bytes:
                opener = fs.open_input_file if seekable else fs.open_input_stream
                with opener(path) as f:
                    return f.read()
            return run

        self.step("read", faults, on(self.arrow), on(self.reference))

    @rule(src=st.sampled_from(PATHS + DIRS), dst=st.sampled_from(PATHS + DIRS), faults=MOVES)
    def move(self, src: str, dst: str, faults: list) -> None:
        self.step("move", faults, lambda: self.arrow.move(src, dst),
                  lambda: self.reference.move(src, dst), self._unprovable_move(src, dst))

    def _unprovable_move(self, src: str, dst: str) -> type[BaseException] | None:
        """A destination that holds a file of the source's size before a move: the mock's
        modification times never change, so a retry that finds no source (its first attempt
        applied, the answer lost) cannot tell the moved file from the older one, and refuses
        to call it moved (README: a move is reconciled only when the destination changed):
        the retry's FileNotFoundError, by design."""
        source, target = self.store.get_file_info([src, dst])
        same = (src != dst and source.type == target.type == pafs.FileType.File
                and source.size == target.size)
        return FileNotFoundError if same else None

    @rule(src=st.sampled_from(PATHS), dst=st.sampled_from(PATHS), faults=FILE_COPIES)
    def copy_file(self, src: str, dst: str, faults: list) -> None:
        self.step("copy_file", faults, lambda: self.arrow.copy_file(src, dst),
                  lambda: self.reference.copy_file(src, dst))

    @rule(path=st.sampled_from(PATHS), faults=DELETES)
    def delete_file(self, path: str, faults: list) -> None:
        self.step("delete_file", faults, lambda: self.arrow.delete_file(path),
                  lambda: self.reference.delete_file(path))

    @rule(path=st.sampled_from(DIRS), faults=DIR_DELETES)
    def delete_dir(self, path: str, faults: list) -> None:
        self.step("delete_dir", faults, lambda: self.arrow.delete_dir(path),
                  lambda: self.reference.delete_dir(path))

    @rule(path=st.sampled_from(DIRS), recursive=st.booleans(), faults=MKDIRS)
    def create_dir(self, path: str, recursive: bool, faults: list) -> None:
        self.step("create_dir", faults, lambda: self.arrow.create_dir(path, recursive=recursive),
                  lambda: self.reference.create_dir(path, recursive=recursive))

    @rule(path=st.sampled_from(("",) + DIRS), faults=LISTINGS)
    def listing(self, path: str, faults: list) -> None:
        def on(fs: pafs.FileSystem) -> Callable[[], list]:
            def run() -> list:
                infos = fs.get_file_info(pafs.FileSelector(path, recursive=True))
                return sorted((i.path, i.type.name, i.size) for i in infos)
            return run

        self.step("listing", faults, on(self.arrow), on(self.reference))

    @rule(src=st.sampled_from(DIRS), dst=st.sampled_from(("t", "b/t", "a/c")), faults=TREES)
    def copy_tree(self, src: str, dst: str, faults: list) -> None:
        def on(fs: pafs.FileSystem) -> Callable[[], None]:
            return lambda: pafs.copy_files(src, dst, source_filesystem=fs,
                                           destination_filesystem=fs, use_threads=False)

        self.step("copy_files", faults, on(self.arrow), on(self.reference))

    # -- rules: the fsspec face ----------------------------------------------------------------
    @rule(path=st.sampled_from(PATHS), data=PAYLOADS, faults=WRITES)
    def fsspec_write(self, path: str, data: bytes, faults: list) -> None:
        self.step("fsspec pipe_file", faults, lambda: self.fsspec.pipe_file(path, data),
                  lambda: self.ref_fsspec.pipe_file(path, data))

    @rule(path=st.sampled_from(PATHS), faults=READS)
    def fsspec_read(self, path: str, faults: list) -> None:
        self.step("fsspec cat_file", faults, lambda: self.fsspec.cat_file(path),
                  lambda: self.ref_fsspec.cat_file(path))

    @rule(src=st.sampled_from(PATHS), dst=st.sampled_from(PATHS), faults=COPIES)
    def fsspec_copy(self, src: str, dst: str, faults: list) -> None:
        self.step("fsspec cp_file", faults, lambda: self.fsspec.cp_file(src, dst),
                  lambda: self.ref_fsspec.cp_file(src, dst))

    @rule(path=st.sampled_from(PATHS), faults=DELETES)
    def fsspec_rm_file(self, path: str, faults: list) -> None:
        self.step("fsspec rm_file", faults, lambda: self.fsspec.rm_file(path),
                  lambda: self.ref_fsspec.rm_file(path))

    @rule(path=st.sampled_from(DIRS), faults=MKDIRS)
    def fsspec_makedirs(self, path: str, faults: list) -> None:
        self.step("fsspec makedirs", faults, lambda: self.fsspec.makedirs(path, exist_ok=True),
                  lambda: self.ref_fsspec.makedirs(path, exist_ok=True))

    @rule(path=st.sampled_from(DIRS), faults=LISTINGS)
    def fsspec_find(self, path: str, faults: list) -> None:
        self.step("fsspec find", faults,
                  lambda: sorted(self.fsspec.find(path, withdirs=True)),
                  lambda: sorted(self.ref_fsspec.find(path, withdirs=True)))

    # -- rules: a third party acting between a failed attempt and its retry ---------------------
    def beside_a_third_party(self, name: str, operation: str, path: str,
                             action: Callable[[pafs.FileSystem], None],
                             real: Callable[[], Any], ref: Callable[[], Any]) -> None:
        """``real`` whose first ``operation`` attempt on ``path`` fails (a network error); while
        it waits, a third party does ``action`` on the store. The reference sees the same action
        first, when it happened: a success must still mean the store holds what the reference
        makes of it, and an error the reference's."""
        fault = self.faulty.inject(operation, errors.network(), path=path, times=1,
                                   then=lambda: action(self.store))

        def reference() -> Any:
            if fault.fired:
                FIGURES[f"third party: {name}"] += 1
                action(self.reference)
            return ref()

        self.step(name, [], real, reference)

    @rule(src=st.sampled_from(PATHS), dst=st.sampled_from(PATHS), face=st.sampled_from(
        ["pyarrow", "fsspec"]), act=st.sampled_from(["delete the source", "write the dest",
                                                     "delete the source beside an older copy"]),
        data=PAYLOADS)
    def move_beside_a_third_party(self, src: str, dst: str, face: str, act: str,
                                  data: bytes) -> None:
        found = self.store.get_file_info(src)
        if (act.endswith("older copy") and found.type == pafs.FileType.File and src != dst
                and _writable(self.store, dst)):
            # before the call, the destination holds an older object of the source's size
            for fs in (self.store, self.reference):
                with fs.open_output_stream(dst) as out:
                    out.write(b"o" * (found.size or 0))

        def action(fs: pafs.FileSystem) -> None:
            if act.startswith("delete the source"):
                if fs.get_file_info(src).type == pafs.FileType.File:
                    fs.delete_file(src)
            elif _writable(fs, dst):
                with fs.open_output_stream(dst) as out:
                    out.write(data)

        if face == "pyarrow":
            real, ref = (lambda: self.arrow.move(src, dst)), (
                lambda: self.reference.move(src, dst))
        else:
            real, ref = (lambda: self.fsspec.mv(src, dst)), (
                lambda: self.ref_fsspec.mv(src, dst))
        self.beside_a_third_party(f"{face} move, a third party: {act}", "move", src, action,
                                  real, ref)

    @rule(path=st.sampled_from(PATHS), data=PAYLOADS, other=PAYLOADS)
    def write_beside_a_third_party(self, path: str, data: bytes, other: bytes) -> None:
        def action(fs: pafs.FileSystem) -> None:
            if _writable(fs, path):
                with fs.open_output_stream(path) as out:
                    out.write(other)

        def on(fs: pafs.FileSystem) -> Callable[[], None]:
            def run() -> None:
                with fs.open_output_stream(path) as out:
                    out.write(data)
            return run

        self.beside_a_third_party("write, a third party writes the path", "close", path,
                                  action, on(self.arrow), on(self.reference))

    # -- invariants ------------------------------------------------------------------------------
    @invariant()
    def counters_are_whole(self) -> None:
        for fs in (self.arrow, self.fsspec):
            stats = fs.stats.snapshot()
            assert stats["attempts"] == stats["calls"] + stats["retries"], stats
            assert stats["giveups"] <= stats["calls"], stats
            for name, op in stats["by_operation"].items():
                assert op["attempts"] == op["calls"] + op["retries"], (name, op)

    @invariant()
    def store_equals_reference(self) -> None:
        assert snapshot(self.store) == snapshot(self.reference)

    def teardown(self) -> None:
        for name, count in self.injected.items():
            FIGURES[f"faults at {name}"] += count
        stats = self._stats()
        FIGURES["calls"] += stats["calls"]
        FIGURES["retries"] += stats["retries"]
        FIGURES["giveups"] += stats["giveups"]
        _write_report()


def _write_report() -> None:
    """The figures so far to ``$RETRYFS_SIM_REPORT`` (after every example: a long run that is
    stopped still leaves its figures)."""
    target = os.environ.get("RETRYFS_SIM_REPORT")
    if target:
        report = {key: FIGURES[key] for key in sorted(FIGURES)}
        report["profile max_examples"] = settings.default.max_examples
        with open(target, "w") as out:
            json.dump(report, out, indent=1)


# a random fault plan: a fault drawn for an operation the sequence never makes never fires
pytestmark = pytest.mark.unfired_faults_ok
TestSimulation = Simulation.TestCase


@pytest.fixture(scope="module", autouse=True)
def figures() -> Any:
    FIGURES.clear()
    quiet = logging.getLogger("retryfs")
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)  # thousands of retry lines would cost more than the run
    try:
        yield
    finally:
        quiet.setLevel(level)
    report = {key: FIGURES[key] for key in sorted(FIGURES)}
    report["profile max_examples"] = settings.default.max_examples
    print("\nretryfs simulation:", json.dumps(report, indent=1))
    _write_report()

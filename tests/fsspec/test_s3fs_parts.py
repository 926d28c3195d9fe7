"""`retryfs.patches.s3fs_parts.PartsInFlight`: the parts of an s3fs upload go out in the
background, a bounded number at once, each retried in place; a failed one is raised, type kept,
and nothing is completed or aborted while a part is still on its way."""

import os
import threading

import pytest
from fsspec.implementations.memory import MemoryFileSystem
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from retryfs import RetryPolicy
from retryfs.fsspec.filesystem import RetryFileSystem
from retryfs.patches import s3fs_parts
from retryfs.testing.s3 import S3Fault

FAST = RetryPolicy(max_attempts=3, initial_delay=0.0, max_delay=0.0, jitter=False)
WAIT = 10  # seconds: reached only when the behaviour under test is missing


class FakeStore:
    """An s3fs file's ``_call_s3``: parts answer their MD5-shaped ETag, after ``gate`` (if any)
    lets them; every request is logged in the order it ended."""

    def __init__(self, gate=None, fail=None):
        self.gate, self.fail = gate, fail
        self.log, self.lock = [], threading.Lock()
        self.changed = threading.Condition(self.lock)  # notified as parts start and end
        self.in_flight = self.most_bytes = self.most_parts = 0
        self.bytes = 0

    def __call__(self, method, **kwargs):
        if method != "upload_part":
            with self.lock:
                self.log.append((method, kwargs))
            return {}
        size = len(kwargs["Body"])
        with self.lock:
            self.in_flight += 1
            self.bytes += size
            self.most_parts = max(self.most_parts, self.in_flight)
            self.most_bytes = max(self.most_bytes, self.bytes)
            self.changed.notify_all()
        try:
            if self.gate is not None:
                self.gate(kwargs["PartNumber"])
            if self.fail is not None and kwargs["PartNumber"] == self.fail[0]:
                raise self.fail[1]
            return {"ETag": f'"{kwargs["PartNumber"]:032x}"'}
        finally:
            with self.lock:
                self.in_flight -= 1
                self.bytes -= size
                self.log.append(("upload_part", kwargs["PartNumber"]))
                self.changed.notify_all()


class FakeFile:
    """What `retry_parts_in_place` patches: the ``_call_s3`` of an s3fs file (known by its
    ``_upload_chunk``), and its ``_abort_mpu`` (which ``discard`` calls, through the
    filesystem's ``abort_mpu``, not ``_call_s3``)."""

    def __init__(self, store):
        self._call_s3 = self.store = store
        self._upload_chunk = None

    def _abort_mpu(self):
        self.store.log.append(("abort_mpu", None))


def patched(store):
    retrier = RetryFileSystem(fs=MemoryFileSystem(), policy=FAST,
                              skip_instance_cache=True).retrier
    return s3fs_parts.retry_parts_in_place(FakeFile(store), retrier, "b/k")._call_s3


def send(call, number, size=10):
    """What s3fs does with a part: send it, keep ``{"PartNumber", "ETag"}``."""
    answer = call("upload_part", Bucket="b", Key="k", UploadId="u", PartNumber=number,
                  Body=bytes(size))
    return {"PartNumber": number, "ETag": answer["ETag"]}


def complete(call, parts):
    return call("complete_multipart_upload", Bucket="b", Key="k", UploadId="u",
                MultipartUpload={"Parts": parts})


def test_a_part_is_on_its_way_while_the_next_one_is_handed_over():
    second = threading.Event()

    def gate(number):
        if number == 2:
            second.set()
        elif not second.wait(WAIT):
            raise AssertionError("part 2 was not handed over while part 1 was in flight")

    store = FakeStore(gate)
    call = patched(store)
    parts = [send(call, 1), send(call, 2)]
    complete(call, parts)
    assert [entry["ETag"] for entry in parts] == [f'"{n:032x}"' for n in (1, 2)]
    assert [entry for entry, _ in store.log] == ["upload_part", "upload_part",
                                                 "complete_multipart_upload"]
    assert [n for kind, n in store.log[:2]] == [2, 1]  # part 1 ended after part 2 arrived


def test_parts_and_bytes_in_flight_are_bounded(monkeypatch):
    """Parts of 30 bytes under a bound of 100: three in flight, and the fourth handed over only
    when the oldest has ended."""
    monkeypatch.setattr(s3fs_parts, "PART_BYTES_IN_FLIGHT", 100)
    released = {n: threading.Event() for n in range(1, 9)}
    store = FakeStore(lambda number: released[number].wait(WAIT))

    def started():
        return sum(1 for entry, _ in store.log if entry == "upload_part") + store.in_flight

    call = patched(store)
    parts = []
    sender = threading.Thread(target=lambda: parts.extend(send(call, n, 30) for n in range(1, 9)))
    sender.start()
    for oldest in range(1, 7):
        with store.changed:  # the sender fills the window (parts oldest..oldest+2), then waits
            assert store.changed.wait_for(
                lambda n=oldest: started() == n + 2 and store.in_flight == 3, WAIT)
        released[oldest].set()
    for number in (7, 8):
        released[number].set()
    sender.join(WAIT)
    complete(call, parts)
    assert store.most_bytes <= 100 and store.most_parts == 3
    assert all(isinstance(entry["ETag"], str) for entry in parts)


def test_one_part_larger_than_the_bound_still_goes(monkeypatch):
    monkeypatch.setattr(s3fs_parts, "PART_BYTES_IN_FLIGHT", 100)
    store = FakeStore()
    call = patched(store)
    parts = [send(call, 1, size=101), send(call, 2, size=101)]
    complete(call, parts)
    assert store.most_parts == 1  # each alone: the bound is bytes, and one part always goes


def test_a_failed_part_is_raised_with_its_type_and_nothing_is_completed():
    store = FakeStore(fail=(1, PermissionError(13, "Access Denied")))
    call = patched(store)
    parts = [send(call, 1)]
    with pytest.raises(PermissionError, match="Access Denied"):
        parts.append(send(call, 2))
        complete(call, parts)
    assert "complete_multipart_upload" not in [entry for entry, _ in store.log]
    assert [entry for entry, _ in store.log].count("upload_part") in (1, 2)


def test_a_failed_part_is_retried_in_place_in_the_background():
    calls = []

    def flaky(number):
        calls.append(number)
        if number == 1 and calls.count(1) < 3:
            raise ConnectionResetError(104, "Connection reset by peer")

    store = FakeStore(flaky)
    call = patched(store)
    parts = [send(call, 1), send(call, 2)]
    complete(call, parts)
    assert calls.count(1) == 3 and calls.count(2) == 1
    assert parts[0]["ETag"] == f'"{1:032x}"'


@pytest.mark.parametrize("how", ["discard", "request"])
def test_an_abort_waits_for_the_parts_in_flight(how):
    """s3fs's ``discard`` aborts through ``_abort_mpu`` (the filesystem's ``abort_mpu``), and
    an abort may also come as a request: either waits for the part on its way."""
    release = threading.Event()
    store = FakeStore(lambda number: release.wait(WAIT))
    retrier = RetryFileSystem(fs=MemoryFileSystem(), skip_instance_cache=True).retrier
    file = s3fs_parts.retry_parts_in_place(FakeFile(store), retrier, "b/k")
    send(file._call_s3, 1)
    threading.Timer(0.05, release.set).start()
    if how == "discard":
        file._abort_mpu()
    else:
        file._call_s3("abort_multipart_upload", Bucket="b", Key="k", UploadId="u")
    assert [entry for entry, _ in store.log][0] == "upload_part"
    assert len(store.log) == 2 and store.log[1][0] in ("abort_mpu", "abort_multipart_upload")


def test_many_parts_of_a_real_upload_land_in_order_under_faults(s3_fault_endpoint,
                                                                s3_fault_bucket):
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    fs = RetryFileSystem(fs=ep.s3fs(), policy=FAST, skip_instance_cache=True)
    data = os.urandom(23 * 2**20)
    failed = ep.add_fault(S3Fault.internal_error(op="UploadPart", query={"partNumber": 3}, times=1))
    with fs.open(f"{bucket}/many", "wb", block_size=5 * 2**20) as f:
        for start in range(0, len(data), 2**20):
            f.write(data[start:start + 2**20])
    assert ep.get_object(bucket, "many") == data
    assert ep.fired(failed) == 1
    counts = ep.counts()
    assert (counts["UploadPart"], counts["CompleteMultipartUpload"]) == (6, 1)  # 5 parts + 1
    assert fs.stats.snapshot()["by_operation"]["upload_part"]["retries"] == 1


def test_a_write_attempt_is_given_the_time_of_the_parts_before_it():
    """A write may wait for the parts in flight before it: its attempt timeout counts them
    (else a slow network would time the write out and replay a healthy stream)."""
    def base(operation, in_flight):
        return 60 + in_flight / 2**20

    file = FakeFile(FakeStore())
    assert s3fs_parts.with_parts_in_flight(base, file) is base  # not an s3fs file retryfs sent
    patched_file = s3fs_parts.retry_parts_in_place(
        file, RetryFileSystem(fs=MemoryFileSystem(), skip_instance_cache=True).retrier, "b/k")
    timeout = s3fs_parts.with_parts_in_flight(base, patched_file)
    assert timeout("write", 2**20) == 60 + 1 + s3fs_parts.PART_BYTES_IN_FLIGHT / 2**20
    assert timeout("close", 2**20) == 60 + 1  # a close is given its whole size's time already
    assert s3fs_parts.with_parts_in_flight(None, patched_file) is None  # untimed stays so


def test_a_write_larger_than_a_block_goes_as_parts_of_a_block(s3_fault_endpoint,
                                                             s3_fault_bucket):
    """One 12 MiB write with 5 MiB blocks: parts of 5, 5 and 2 MiB (s3fs alone: one part of
    12 MiB), and a failed part sends its 5 MiB again, not the 12."""
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    fs = RetryFileSystem(fs=ep.s3fs(), policy=FAST, skip_instance_cache=True)
    data = os.urandom(12 * 2**20)
    failed = ep.add_fault(S3Fault.internal_error(op="UploadPart", query={"partNumber": 2}, times=1))
    with fs.open(f"{bucket}/one-write", "wb", block_size=5 * 2**20) as f:
        assert f.write(data) == len(data)
    assert ep.get_object(bucket, "one-write") == data
    assert ep.fired(failed) == 1
    parts = ep.requests(op="UploadPart")
    assert sorted(record.request_bytes for record in parts) == sorted(
        [5 * 2**20, 5 * 2**20, 5 * 2**20, 2 * 2**20])  # part 2 twice


class ScriptedStore(FakeStore):
    """Parts fail as scripted: ``script[n] = (resets, denied)``: the first ``resets`` attempts of
    part ``n`` are connection resets (transient), then a refusal if ``denied`` (permanent)."""

    def __init__(self):
        super().__init__(gate=self._scripted)
        self.script, self.tries = {}, {}

    def _scripted(self, number):
        with self.lock:
            self.tries[number] = self.tries.get(number, 0) + 1
            tries = self.tries[number]
        resets, denied = self.script[number]
        if tries <= resets:
            raise ConnectionResetError(104, "Connection reset by peer")
        if denied:
            raise PermissionError(13, "Access Denied")


class PartsMachine(RuleBasedStateMachine):
    """Parts of random sizes and fates, then a commit or an abort: the bounds always hold; the
    commit succeeds iff every part did (their ETags in order in s3fs's list), else it raises a
    failed part's error with its type and nothing is completed; an error raised while parts
    are handed over is a failed part's; no part is in flight after an abort."""

    def __init__(self):
        super().__init__()
        self.store = ScriptedStore()
        retrier = RetryFileSystem(fs=MemoryFileSystem(), policy=FAST,
                                  skip_instance_cache=True).retrier
        self.file = s3fs_parts.retry_parts_in_place(FakeFile(self.store), retrier, "b/k")
        self.parts, self.fates, self.over = [], {}, False
        self.window = s3fs_parts.PART_BYTES_IN_FLIGHT
        s3fs_parts.PART_BYTES_IN_FLIGHT = 100  # parts of at most 60 bytes: 1 to 3 in flight

    def teardown(self):
        s3fs_parts.PART_BYTES_IN_FLIGHT = self.window

    def failures(self):
        return {type(error) for error in self.fates.values() if error is not None}

    @rule(size=st.integers(1, 60),
          resets=st.sampled_from([0] * 12 + [1, 2, FAST.max_attempts]),  # most parts go
          denied=st.integers(0, 29).map(lambda n: n == 0))
    def hand_over_a_part(self, size, resets, denied):
        if self.over:
            return
        number = len(self.parts) + 1
        self.store.script[number] = (resets, denied)
        self.fates[number] = (ConnectionResetError(104, "reset") if resets >= FAST.max_attempts
                              else PermissionError(13, "denied") if denied else None)
        try:
            self.parts.append(send(self.file._call_s3, number, size))
        except OSError as error:
            assert type(error) in self.failures(), error  # an earlier (or this) part's
            event("a failed part raised as the next one was handed over")
            self.file._abort_mpu()  # s3fs's discard
            self.over = True

    @rule()
    def commit(self):
        if self.over or not self.parts:
            return
        self.over = True
        try:
            complete(self.file._call_s3, self.parts)
        except OSError as error:
            assert type(error) in self.failures(), error
            assert "complete_multipart_upload" not in [kind for kind, _ in self.store.log]
            event("the commit raised a failed part's error")
            self.file._abort_mpu()  # what the stream does with a file whose commit failed
            return
        assert not self.failures()
        event(f"committed {len(self.parts)} part(s)")
        assert [part["ETag"] for part in self.parts] == [
            f'"{n:032x}"' for n in range(1, len(self.parts) + 1)]

    @rule()
    def abort(self):
        if self.over or not self.parts:
            return
        self.over = True
        self.file._abort_mpu()

    @invariant()
    def nothing_is_left_on_its_way(self):
        if not self.over:
            return
        assert self.store.in_flight == 0
        ended = [kind for kind, _ in self.store.log]
        assert ended[-1] in ("complete_multipart_upload", "abort_mpu"), ended

    @invariant()
    def bounded(self):
        assert self.store.most_parts <= s3fs_parts.PARTS_IN_FLIGHT
        assert self.store.most_bytes <= 100


TestPartsInFlight = PartsMachine.TestCase
TestPartsInFlight.settings = settings(max_examples=100, stateful_step_count=20, deadline=None)


@pytest.mark.parametrize("seed", [1, 2, 3])  # each fires faults (7 of seeds 1-40 fire none)
def test_s3fs_uploads_under_a_ten_percent_fault_rate_cost_their_faults_and_no_more(
        seed, s3_fault_endpoint, s3_fault_bucket):
    """5 % of every request of the uploads answered 500 and 5 % 503 SlowDown (seeded): every
    file intact, each failed request sent again and nothing else (no stream replayed: every
    request of an s3fs upload is retried in place), the parts stored exactly once."""
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    policy = RetryPolicy(max_attempts=10, initial_delay=0.0, max_delay=0.0, jitter=False)
    fs = RetryFileSystem(fs=ep.s3fs(), policy=policy, skip_instance_cache=True)
    block = 5 * 2**20
    files = {f"f{n}": os.urandom(size) for n, size in
             enumerate([23 * 2**20, 11 * 2**20, 5 * 2**20, 3000, 1])}
    requests = ("CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload", "PutObject")
    ep.add_fault(S3Fault.internal_error(op=requests, probability=0.05, seed=seed))
    ep.add_fault(S3Fault.slow_down(op=requests, probability=0.05, seed=seed + 1000))
    for name, data in files.items():
        with fs.open(f"{bucket}/t/{name}", "wb", block_size=block) as f:
            for start in range(0, len(data), 2**20):
                f.write(data[start:start + 2**20])
    ep.clear_faults()
    assert all(ep.get_object(bucket, f"t/{name}") == data for name, data in files.items())
    parts = [min(block, len(data) - start) for data in files.values() if len(data) >= block
             for start in range(0, len(data), block)]
    stored = [r.request_bytes for r in ep.requests(op="UploadPart") if r.fault is None]
    assert sorted(stored) == sorted(parts)
    faulted = ep.injected
    assert len(faulted) >= 1
    counts = ep.counts()
    clean = {"UploadPart": len(parts), "CreateMultipartUpload": 3,  # 23, 11 and 5 MiB
             "CompleteMultipartUpload": 3, "PutObject": 2}  # 3000 bytes and 1
    for op, needed in clean.items():
        assert counts[op] == needed + sum(1 for r in faulted if r.op == op), (op, counts)
    snapshot = fs.stats.snapshot()
    assert snapshot["bytes_replayed"] == 0 and snapshot["by_operation"]["close"]["retries"] == 0


def test_a_stalled_part_is_abandoned_and_sent_again_in_place(s3_fault_endpoint, s3_fault_bucket):
    """A part whose request stalls is abandoned after its own attempt's time (the write
    timeout plus its bytes at the minimum throughput) and sent again, in place: the stream is
    not replayed, and the write does not wait the stall out."""
    import time

    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    fs = RetryFileSystem(fs=ep.s3fs(), policy=FAST, skip_instance_cache=True,
                         write_timeout=1.0, min_throughput=16 * 2**20)
    data = os.urandom(11 * 2**20)
    stall = ep.add_fault(S3Fault.stall(30.0, op="UploadPart", query={"partNumber": 1}, times=1))
    started = time.monotonic()
    try:
        with fs.open(f"{bucket}/stalled", "wb", block_size=5 * 2**20) as f:
            for start in range(0, len(data), 2**20):
                f.write(data[start:start + 2**20])
    finally:
        ep.release_stalls()
    elapsed = time.monotonic() - started
    assert ep.get_object(bucket, "stalled") == data
    assert ep.fired(stall) == 1
    parts = ep.requests(op="UploadPart")  # 5 + 5 + 1 MiB, and part 1 once more
    assert len(parts) == 4
    assert sum(record.request_bytes for record in parts if record.fault is None) == len(data)
    snapshot = fs.stats.snapshot()
    assert snapshot["by_operation"]["upload_part"]["timeouts"] == 1
    assert snapshot["bytes_replayed"] == 0 and snapshot["by_operation"]["close"]["retries"] == 0
    assert elapsed < 30.0

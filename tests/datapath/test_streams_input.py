"""The input side of `retryfs.datapath.streams`, one promise at a time: the bytes read, the offset a read
resumes at, the reads and reopens it costs, the error it raises, the files it drops.

Each test builds a `ResumableInputFile` over a real file: pyarrow's native files through
`FaultyFileSystem` (faults injected into their reads; its ``calls["read"]`` counts every read
that reached the file, ranged ones included), pyarrow's own local files, Python's and fsspec's
local files, and, for metadata, pyarrow's S3 client on the in-process S3 endpoint. The retry
engine runs with no waits. `SUB_READ` is 1 KiB here: a read of a few KiB is several sub-reads.
"""

from __future__ import annotations

import io
import os
import random
import subprocess
import sys
from collections.abc import Callable
from typing import Any
from unittest import mock

import fsspec
import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from _helpers import FAST
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retryfs.core.classify import ErrorClassifier
from retryfs.core.engine import Retrier
from retryfs.core.stats import RetryEvent, RetryStats
from retryfs.datapath import streams
from retryfs.datapath.streams import ResumableInputFile
from retryfs.errors import InnerFileClosedError
from retryfs.testing import FaultyFileSystem, errors

SUB = 1024  # streams.SUB_READ in these tests
DATA = random.Random(16).randbytes(10 * SUB + 123)  # 11 sub-reads, the last one short
SUB_READS = -(-len(DATA) // SUB)


@pytest.fixture(autouse=True)
def _small_sub_reads(monkeypatch):
    monkeypatch.setattr(streams, "SUB_READ", SUB)


@pytest.fixture
def stored(tmp_path) -> str:
    path = tmp_path / "data.bin"
    path.write_bytes(DATA)
    return str(path)


@pytest.fixture
def faulty() -> FaultyFileSystem:
    return FaultyFileSystem(pafs.LocalFileSystem())


class Engine:
    """The retry engine, no waits, and the retries it made: ``(operation, path)`` each."""

    def __init__(self, attempts: int = 4) -> None:
        policy = FAST.replace(max_attempts=attempts)
        self.stats = RetryStats()
        self.retries: list[RetryEvent] = []
        self.stats.on_retry(self.retries.append)
        self.retrier = Retrier(lambda _op: policy, ErrorClassifier(), self.stats,
                               sleep=lambda _s: None)

    def seen(self) -> list[tuple[str, str]]:
        return [(event.operation, event.path) for event in self.retries]


class Opener:
    """Opens one file, counted; keeps every file it opened (to check that each was closed)."""

    def __init__(self, open_file: Callable[[], Any]) -> None:
        self._open = open_file
        self.opened: list[Any] = []

    def __call__(self) -> Any:
        file = self._open()
        self.opened.append(file)
        return file


def resumable(open_file: Callable[[], Any], path: str, engine: Engine, *,
              seekable: bool) -> tuple[ResumableInputFile, Opener]:
    """A resumable file over ``open_file()``, which its retries call again to reopen."""
    opener = Opener(open_file)
    return ResumableInputFile(path, opener(), opener, engine.retrier, seekable=seekable), opener


def read_in(f: Any, size: int) -> bytes:
    return b"".join(iter(lambda: f.read(size), b""))


class ForwardOnly:
    """The least a file can be: ``read(n)`` (a bytearray, as some readers return) and
    ``close()``; no ``seekable``, ``seek``, ``tell`` or ``size``."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.closed = False

    def read(self, size: int) -> bytearray:
        return bytearray(self._inner.read(size))

    def close(self) -> None:
        self._inner.close()
        self.closed = True


# -- a read that fails resumes at its offset ---------------------------------------------------

def test_a_stream_resumes_at_its_offset_by_reading_a_fresh_one_up_to_it(faulty, stored):
    engine = Engine()
    f, opener = resumable(lambda: faulty.open_input_stream(stored), stored, engine,
                          seekable=False)
    faulty.inject("read", errors.reset(), skip=3, times=1)  # the 4th read: at 3000 bytes
    assert read_in(f, 1000) == DATA
    assert engine.seen() == [("read", stored)]
    assert len(opener.opened) == 2 and opener.opened[0].closed
    # 11 reads with data, the empty one at the end, the failed one and the skip to 3000
    assert faulty.calls["read"] == 11 + 1 + 1 + 1


def test_a_random_access_file_resumes_with_a_seek_not_by_reading_the_prefix(faulty, stored):
    engine = Engine()
    f, opener = resumable(lambda: faulty.open_input_file(stored), stored, engine, seekable=True)
    faulty.inject("read", errors.reset(), skip=3, times=1)
    assert read_in(f, 1000) == DATA
    assert engine.seen() == [("read", stored)]
    assert len(opener.opened) == 2
    assert faulty.calls["read"] == 11 + 1 + 1  # no byte before the offset read again


def test_a_reader_with_only_read_resumes_by_reading_up_to_its_offset(faulty, stored):
    engine = Engine()
    f, opener = resumable(lambda: ForwardOnly(faulty.open_input_stream(stored)), stored,
                          engine, seekable=False)
    faulty.inject("read", errors.reset(), skip=2, times=1)
    first = f.read(1000)
    assert type(first) is bytes  # the reader's bytearray is never handed out
    assert first + read_in(f, 1000) == DATA
    assert engine.seen() == [("read", stored)]
    assert len(opener.opened) == 2 and opener.opened[0].closed


def test_a_forward_seek_on_an_inner_that_cannot_seek_reads_up_to_the_target(faulty, stored):
    """A file opened for random access whose inner file cannot seek (a backend's stream)."""
    engine = Engine()
    f, opener = resumable(lambda: faulty.open_input_stream(stored), stored, engine,
                          seekable=True)
    assert f.read(100) == DATA[:100]
    f.seek(500)
    assert f.read(100) == DATA[500:600]
    assert len(opener.opened) == 1 and engine.seen() == []
    f.seek(10)
    with pytest.raises(OSError) as info:
        f.read(5)
    assert str(info.value) == f"cannot go back to offset 10 in {stored!r}"
    assert opener.opened[0].closed  # dropped: the next read starts on a fresh file
    assert f.read(5) == DATA[10:15] and len(opener.opened) == 2


def test_a_stream_that_shrank_under_a_resume_is_an_error_not_short_data(faulty, stored):
    engine = Engine()
    f, opener = resumable(lambda: faulty.open_input_stream(stored), stored, engine,
                          seekable=False)
    assert f.read(1000) + f.read(1000) == DATA[:2000]
    os.truncate(stored, 1500)  # replaced by a shorter object: the resume cannot reach 2000
    faulty.inject("read", errors.reset(), times=1)
    with pytest.raises(OSError) as info:
        f.read(1000)
    assert str(info.value) == f"{stored!r} ended before offset 2000 on reopen"
    assert f.tell() == 2000 and len(opener.opened) == 2


def test_an_inner_file_that_closed_itself_is_reopened(faulty, stored):
    """pyarrow's GCS file closes itself when its lazily opened download fails."""
    engine = Engine()
    f, opener = resumable(lambda: faulty.open_input_file(stored), stored, engine, seekable=True)
    assert f.read(100) == DATA[:100]
    opener.opened[0].close()
    assert f.read(100) == DATA[100:200]
    assert engine.seen() == [("read", stored)] and len(opener.opened) == 2
    error = engine.retries[0].error
    assert type(error) is InnerFileClosedError
    assert str(error) == (f"{stored!r}: the inner file closed itself (I/O operation on closed "
                          "file): a lazily opened download failed")
    assert error.__context__ is None  # not the permanent ValueError it replaces


@pytest.mark.parametrize(("opener_name", "call", "expected"), [
    ("open_input_stream", "metadata", {}),
    ("open_input_file", "size", len(DATA)),
])
def test_after_a_read_gave_up_the_next_call_reopens_at_the_offset(faulty, stored, opener_name,
                                                                  call, expected):
    engine = Engine()
    f, opener = resumable(lambda: getattr(faulty, opener_name)(stored), stored, engine,
                          seekable=opener_name == "open_input_file")
    assert f.read(100) == DATA[:100]
    faulty.inject("read", errors.reset(), times=4)  # each attempt of the next read
    with pytest.raises(ConnectionResetError):
        f.read(100)
    assert f.tell() == 100 and len(opener.opened) == 4
    faulty.inject(opener_name, errors.reset(), times=1)  # the next call's reopen fails once
    assert getattr(f, call)() == expected
    assert f.read() == DATA[100:]
    assert engine.seen() == [("read", stored)] * 4  # 3 of the read that gave up, 1 reopen
    assert len(opener.opened) == 5 and all(file.closed for file in opener.opened[:4])


# -- large reads: sub-reads ---------------------------------------------------------------------

def test_a_large_read_of_a_random_access_file_is_ranged_sub_reads(faulty, stored):
    engine = Engine()
    f, opener = resumable(lambda: faulty.open_input_file(stored), stored, engine, seekable=True)
    f.seek(100)
    assert f.read(5 * SUB) == DATA[100:100 + 5 * SUB]
    assert faulty.calls["read"] == 5 and f.tell() == 100 + 5 * SUB
    assert f.read() == DATA[100 + 5 * SUB:]
    assert faulty.calls["read"] == 5 + 6  # none past the end
    assert f.tell() == len(DATA) and len(opener.opened) == 1
    f.seek(0)
    data = f.read_buffer()
    assert isinstance(data, pa.Buffer) and data.to_pybytes() == DATA
    assert faulty.calls["read"] == 5 + 6 + SUB_READS


def test_a_fault_in_one_sub_read_costs_that_sub_read_on_a_fresh_file(faulty, stored):
    engine = Engine()
    f, opener = resumable(lambda: faulty.open_input_file(stored), stored, engine, seekable=True)
    faulty.inject("read", errors.reset(), skip=2, times=1)
    assert f.read() == DATA
    assert faulty.calls["read"] == SUB_READS + 1
    assert engine.seen() == [("read", stored)]
    # the other sub-reads kept the shared file; the retry's own file was dropped after it
    assert len(opener.opened) == 2 and opener.opened[1].closed and not opener.opened[0].closed
    f.close()
    assert opener.opened[0].closed


def test_a_sub_read_that_fails_on_the_shared_and_a_fresh_file_drops_each_fresh_one(
        faulty, stored, monkeypatch):
    monkeypatch.setattr(streams, "READ_AHEAD", 1)  # one in flight: the faults' order is fixed
    engine = Engine()
    f, opener = resumable(lambda: faulty.open_input_file(stored), stored, engine, seekable=True)
    faulty.inject("read", errors.reset(), skip=2, times=2)  # the 3rd sub-read, then its retry
    assert f.read() == DATA
    assert engine.seen() == [("read", stored)] * 2
    assert len(opener.opened) == 3 and all(file.closed for file in opener.opened[1:])
    assert faulty.calls["read"] == SUB_READS + 2


def test_a_permanent_error_in_a_large_read_starts_no_further_sub_reads(faulty, stored):
    engine = Engine()
    f, _ = resumable(lambda: faulty.open_input_file(stored), stored, engine, seekable=True)
    faulty.inject("read", errors.access_denied("GetObject"), times=None)
    with pytest.raises(OSError, match="ACCESS_DENIED"):
        f.read()
    assert faulty.calls["read"] == streams.READ_AHEAD  # those in flight; then none
    assert f.tell() == 0 and engine.seen() == []


@pytest.fixture(scope="module")
def stored_once(tmp_path_factory) -> str:
    path = tmp_path_factory.mktemp("once") / "data.bin"
    path.write_bytes(DATA)
    return str(path)


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])  # SUB_READ, constant
@given(start=st.integers(0, len(DATA) - SUB - 1), length=st.integers(SUB + 1, len(DATA) + SUB),
       method=st.sampled_from(["read", "read_buffer", "readinto"]), ahead=st.integers(1, 5),
       data=st.data())
def test_transient_faults_in_any_sub_reads_cost_one_read_each(stored_once, start, length,
                                                              method, ahead, data):
    """Whichever reads of one large read fail once (up to 4, a sub-read's retry included), in
    whatever order the threads ask them, with any number in flight: the bytes are the file's,
    the position moves past them, and each fault costs one read more, retried."""
    wanted = min(length, len(DATA) - start)
    needed = -(-wanted // SUB)
    skips = data.draw(st.sets(st.integers(0, needed - 1), max_size=4), label="failing reads")
    engine, faulty = Engine(attempts=6), FaultyFileSystem(pafs.LocalFileSystem())
    faults = [faulty.inject("read", errors.reset(), skip=skip, times=1) for skip in skips]
    f, _ = resumable(lambda: faulty.open_input_file(stored_once), stored_once, engine,
                     seekable=True)
    f.seek(start)
    with mock.patch.object(streams, "READ_AHEAD", ahead):
        if method == "readinto":
            target = bytearray(length)
            got = bytes(target[:f.readinto(target)])
        else:
            got = bytes(getattr(f, method)(length))
    assert got == DATA[start:start + wanted] and f.tell() == start + wanted
    assert sum(faulty.injected.values()) == len(faults)  # every one fired
    assert faulty.calls["read"] == needed + len(faults)
    assert len(engine.seen()) == len(faults)
    f.close()


def test_a_file_that_shrank_after_its_open_yields_only_the_bytes_there(stored):
    """pyarrow's local file keeps the size it had at open; the last sub-read comes back short."""
    engine = Engine()
    f, _ = resumable(lambda: pafs.LocalFileSystem().open_input_file(stored), stored, engine,
                     seekable=True)
    os.truncate(stored, len(DATA) - 100)
    assert f.read() == DATA[:-100]
    assert f.tell() == len(DATA) - 100


_ONE_COPY = """
import sys, tracemalloc
import pyarrow as pa, pyarrow.fs as pafs
import retryfs
fs = retryfs.RetryingFileSystem(pafs.LocalFileSystem())
before = pa.default_memory_pool().max_memory()
tracemalloc.start()
with fs.open_input_file(sys.argv[1]) as f:
    data = getattr(f, sys.argv[3])()
python_peak = tracemalloc.get_traced_memory()[1]
assert len(data) == int(sys.argv[2]) and type(data) is (bytes if sys.argv[3] == "read" else pa.Buffer)
with open(sys.argv[1], "rb") as original:
    assert data == original.read()
print(pa.default_memory_pool().max_memory() - before, python_peak)
"""


@pytest.mark.parametrize("size", [48 * 2**20, 48 * 2**20 + 12345])
@pytest.mark.parametrize("method", ["read_buffer", "read"])
def test_a_large_read_fills_its_one_buffer_with_no_buffer_per_sub_read(tmp_path, size, method):
    """Each sub-read of a whole-file read goes straight into the result: what a fresh process
    allocates (Arrow's pool and Python's, at their peaks) is the file's size. A Buffer per
    sub-read copied into the result would add `READ_AHEAD` x `SUB_READ` (32 MiB); ``read()``
    into a Buffer then copied into ``bytes``, the whole size again."""
    path = tmp_path / "big.bin"
    path.write_bytes(os.urandom(size))
    done = subprocess.run([sys.executable, "-c", _ONE_COPY, str(path), str(size), method],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    arrow_peak, python_peak = map(int, done.stdout.split()[-2:])
    assert arrow_peak + python_peak < size + 2**20


def test_read_into_bytes_is_cut_to_what_the_file_still_holds(stored):
    """A large ``read()`` straight into ``bytes`` of a file cut short after its open."""
    engine = Engine()
    f, _ = resumable(lambda: pafs.LocalFileSystem().open_input_file(stored), stored, engine,
                     seekable=True)
    f.seek(10)
    os.truncate(stored, len(DATA) - 100)
    data = f.read()
    assert type(data) is bytes and data == DATA[10:-100] and f.tell() == len(DATA) - 100


def test_a_failed_read_into_bytes_leaves_the_position(faulty, stored):
    engine = Engine()
    f, _ = resumable(lambda: faulty.open_input_file(stored), stored, engine, seekable=True)
    f.seek(7)
    faulty.inject("read", errors.access_denied("GetObject"), times=None)
    with pytest.raises(OSError, match="ACCESS_DENIED"):
        f.read()
    assert f.tell() == 7


def test_ranged_buffers_hands_out_each_sub_read_in_order_with_a_window_in_flight(faulty, stored):
    engine = Engine()
    f, opener = resumable(lambda: faulty.open_input_file(stored), stored, engine, seekable=True)
    f.seek(100)
    pieces = list(f.ranged_buffers(3))
    assert all(isinstance(piece, pa.Buffer) and 0 < piece.size <= SUB for piece in pieces)
    assert b"".join(piece.to_pybytes() for piece in pieces) == DATA[100:]
    assert len(pieces) == -(-(len(DATA) - 100) // SUB) == faulty.calls["read"]
    assert f.tell() == len(DATA) and len(opener.opened) == 1 and engine.seen() == []
    assert list(f.ranged_buffers(3)) == []  # at the end: nothing more, no read
    assert faulty.calls["read"] == len(pieces)


def test_ranged_buffers_retries_a_failed_sub_read_alone_on_a_fresh_file(faulty, stored):
    engine = Engine()
    f, opener = resumable(lambda: faulty.open_input_file(stored), stored, engine, seekable=True)
    faulty.inject("read", errors.reset(), skip=4, times=1)
    assert b"".join(piece.to_pybytes() for piece in f.ranged_buffers(4)) == DATA
    assert faulty.calls["read"] == SUB_READS + 1 and engine.seen() == [("read", stored)]
    assert len(opener.opened) == 2 and opener.opened[1].closed and not opener.opened[0].closed


def test_ranged_buffers_stopped_early_leaves_the_position_after_what_it_handed_out(faulty,
                                                                                  stored):
    """A consumer that stops (its destination failed) closes the iterator: the sub-reads in
    flight end first, and the file reads on from the last piece handed out."""
    engine = Engine()
    f, _ = resumable(lambda: faulty.open_input_file(stored), stored, engine, seekable=True)
    pieces = f.ranged_buffers(4)
    first, second = next(pieces), next(pieces)
    pieces.close()
    assert first.to_pybytes() + second.to_pybytes() == DATA[:2 * SUB]
    assert f.tell() == 2 * SUB
    assert faulty.calls["read"] <= 2 + 4  # none started after the close
    assert f.read() == DATA[2 * SUB:]


def test_ranged_buffers_asks_a_window_function_again_at_each_sub_read(faulty, stored):
    """A tree's share of the IO threads (`retryfs.datapath.download.TreeShare`) grows as its
    other files end: one sub-read in flight for the first piece, three once it is 3."""
    engine = Engine()
    f, _ = resumable(lambda: faulty.open_input_file(stored), stored, engine, seekable=True)
    share = [1]
    pieces = f.ranged_buffers(lambda: share[0])
    first = next(pieces)
    assert faulty.calls["read"] == 1
    share[0] = 3
    second = next(pieces)
    pieces.close()  # those in flight end first
    assert faulty.calls["read"] == 1 + 3
    assert first.to_pybytes() + second.to_pybytes() == DATA[:2 * SUB] and f.tell() == 2 * SUB


def test_ranged_buffers_raises_a_permanent_error_and_starts_no_further_sub_reads(faulty,
                                                                                stored):
    engine = Engine()
    f, _ = resumable(lambda: faulty.open_input_file(stored), stored, engine, seekable=True)
    faulty.inject("read", errors.access_denied("GetObject"), times=None)
    with pytest.raises(OSError, match="ACCESS_DENIED"):
        next(f.ranged_buffers(3))
    assert faulty.calls["read"] == 3  # those in flight; then none
    assert f.tell() == 0 and engine.seen() == []


def test_ranged_buffers_of_a_closed_file_raises(faulty, stored):
    engine = Engine()
    f, _ = resumable(lambda: faulty.open_input_file(stored), stored, engine, seekable=True)
    f.close()
    with pytest.raises(ValueError, match="^I/O operation on closed retryfs input file$"):
        next(f.ranged_buffers(2))
    assert faulty.calls["read"] == 0


@pytest.mark.parametrize("kind", ["stream", "python"])
def test_ranged_buffers_of_a_sequential_file_reads_one_sub_read_at_a_time(faulty, stored, kind):
    engine = Engine()
    open_file = ((lambda: faulty.open_input_stream(stored)) if kind == "stream"
                 else (lambda: open(stored, "rb")))  # noqa: SIM115
    f, _ = resumable(open_file, stored, engine, seekable=False)
    pieces = list(f.ranged_buffers(4))
    assert [len(piece) for piece in pieces] == [SUB] * (SUB_READS - 1) + [len(DATA) % SUB]
    assert b"".join(bytes(piece) for piece in pieces) == DATA and f.tell() == len(DATA)


def test_the_rest_of_a_python_file_of_unknown_size_is_read_whole(stored):
    """No size to bound the buffer: it grows until a read finds the end (a Python file is
    read into it through a copy, where a native file reads straight into it)."""
    engine = Engine()
    f, _ = resumable(lambda: open(stored, "rb"), stored, engine, seekable=False)  # noqa: SIM115
    assert f.read(10) == DATA[:10]
    assert f.read() == DATA[10:] and f.tell() == len(DATA)


@pytest.mark.parametrize("start", [0, 100])
def test_a_stream_over_a_random_access_file_reads_ranges_up_to_its_end(faulty, stored, start):
    """``open_input_stream`` (not seekable) whose inner file is random access."""
    engine = Engine()
    f, opener = resumable(lambda: faulty.open_input_file(stored), stored, engine,
                          seekable=False)
    assert f.read(start) == DATA[:start]
    reads = faulty.calls["read"]
    assert f.read(2 * SUB + 1) == DATA[start:start + 2 * SUB + 1]
    assert faulty.calls["read"] == reads + 3
    assert f.read() == DATA[start + 2 * SUB + 1:]
    assert f.read() == b"" and f.read(3 * SUB) == b""
    rest = len(DATA) - (start + 2 * SUB + 1)
    assert faulty.calls["read"] == reads + 3 + -(-rest // SUB)  # none at the end
    assert f.tell() == len(DATA) and len(opener.opened) == 1


def test_a_read_of_one_sub_read_is_one_plain_read(faulty, stored):
    engine = Engine()
    f, _ = resumable(lambda: faulty.open_input_stream(stored), stored, engine, seekable=False)
    assert isinstance(f.read_buffer(SUB), pa.Buffer)
    assert faulty.calls["read"] == 1
    g, _ = resumable(lambda: faulty.open_input_file(stored), stored, engine, seekable=True)
    g.seek(len(DATA) - SUB)
    assert g.read(2 * SUB) == DATA[-SUB:]
    assert faulty.calls["read"] == 2


@pytest.mark.parametrize("seekable", [False, True])
def test_a_large_read_of_a_python_file_fills_one_buffer_in_sub_reads(faulty, stored, seekable):
    """A Python file as pyarrow sees it (``PythonFile``): no ranged reads, reads in order."""
    engine = Engine()
    f, _ = resumable(lambda: faulty.handler.open_input_file(stored), stored, engine,
                     seekable=seekable)
    assert f.read(100) == DATA[:100]
    assert f.read(3 * SUB + 5) == DATA[100:100 + 3 * SUB + 5]
    assert faulty.calls["read"] == 1 + 4
    assert f.read() == DATA[100 + 3 * SUB + 5:]
    rest = len(DATA) - (100 + 3 * SUB + 5)
    # the size unknown, the buffer grows, and a last read finds the end; known, it does not
    assert faulty.calls["read"] == 1 + 4 + -(-rest // SUB) + (0 if seekable else 1)
    assert f.tell() == len(DATA)


def test_a_fault_in_a_large_sequential_read_resumes_that_sub_read(faulty, stored):
    engine = Engine()
    f, opener = resumable(lambda: faulty.handler.open_input_file(stored), stored, engine,
                          seekable=False)
    faulty.inject("read", errors.reset(), skip=5, times=1)
    assert f.read() == DATA
    assert engine.seen() == [("read", stored)] and len(opener.opened) == 2


# -- readinto, read, readall, close ---------------------------------------------------------------

def test_readinto_fills_the_buffer_in_sub_reads(faulty, stored):
    engine = Engine()
    f, _ = resumable(lambda: faulty.open_input_stream(stored), stored, engine, seekable=False)
    buffer = bytearray(3 * SUB)
    assert f.readinto(buffer) == 3 * SUB and bytes(buffer) == DATA[:3 * SUB]
    assert faulty.calls["read"] == 3 and f.tell() == 3 * SUB
    faulty.inject("read", errors.reset(), times=1)
    rest = bytearray(len(DATA))
    assert f.readinto(rest) == len(DATA) - 3 * SUB
    assert bytes(rest[:len(DATA) - 3 * SUB]) == DATA[3 * SUB:]
    assert engine.seen() == [("read", stored)]


@pytest.mark.parametrize("kind", ["python", "fsspec"])
def test_readinto_from_a_python_file(stored, kind):
    engine = Engine()
    open_file = ((lambda: open(stored, "rb")) if kind == "python"  # noqa: SIM115
                 else (lambda: fsspec.filesystem("file").open(stored, "rb")))
    f, opener = resumable(open_file, stored, engine, seekable=True)
    buffer = bytearray(2 * SUB + 7)
    assert f.readinto(memoryview(buffer)) == len(buffer) and bytes(buffer) == DATA[:len(buffer)]
    f.close()
    assert opener.opened[0].closed


def test_read_returns_bytes_and_read_buffer_the_native_buffer(faulty, stored):
    engine = Engine()
    f, _ = resumable(lambda: faulty.open_input_file(stored), stored, engine, seekable=True)
    assert type(f.read(10)) is bytes
    assert isinstance(f.read_buffer(10), pa.Buffer)
    assert f.read(0) == b"" and f.tell() == 20
    assert f.readable() and f.seekable()
    assert f.readall() == DATA[20:]


def test_a_closed_file_refuses_reads_and_has_dropped_its_inner_file(faulty, stored):
    engine = Engine()
    f, opener = resumable(lambda: faulty.open_input_file(stored), stored, engine, seekable=True)
    f.close()
    f.close()
    assert opener.opened[0].closed
    for read in (lambda: f.read(1), lambda: f.read_buffer(1),
                 lambda: f.readinto(bytearray(1))):
        with pytest.raises(ValueError) as info:
            read()
        assert str(info.value) == "I/O operation on closed retryfs input file"
    assert len(opener.opened) == 1


# -- seek, size, metadata -----------------------------------------------------------------------

def test_seek_from_each_origin_and_its_errors(faulty, stored):
    engine = Engine()
    f, _ = resumable(lambda: faulty.open_input_file(stored), stored, engine, seekable=True)
    assert f.seek(0) == 0 and f.seek(300) == 300 and f.tell() == 300
    assert f.seek(-100, io.SEEK_CUR) == 200
    assert f.seek(-10, io.SEEK_END) == len(DATA) - 10
    assert f.read() == DATA[-10:]
    with pytest.raises(ValueError) as info:
        f.seek(0, 3)
    assert str(info.value) == "invalid whence 3"
    with pytest.raises(ValueError) as info:
        f.seek(-1)
    assert str(info.value) == "negative seek position -1"
    assert f.tell() == len(DATA)


def test_a_stream_cannot_seek(faulty, stored):
    f, _ = resumable(lambda: faulty.open_input_stream(stored), stored, Engine(), seekable=False)
    assert not f.seekable()
    with pytest.raises(io.UnsupportedOperation) as info:
        f.seek(0)
    assert str(info.value) == "seek on a retryfs input stream"


@pytest.mark.parametrize("kind", ["native", "fsspec", "python"])
def test_size_of_each_kind_of_file_leaves_its_position(stored, kind):
    """pyarrow's ``size()``, fsspec's ``size`` attribute, or Python's seek to the end."""
    open_file = {
        "native": lambda: pafs.LocalFileSystem().open_input_file(stored),
        "fsspec": lambda: fsspec.filesystem("file").open(stored, "rb"),
        "python": lambda: open(stored, "rb"),  # noqa: SIM115
    }[kind]
    f, _ = resumable(open_file, stored, Engine(), seekable=True)
    assert f.read(100) == DATA[:100]
    assert f.size() == len(DATA)
    assert f.read(100) == DATA[100:200]
    assert f.size() == len(DATA)
    assert f.seek(-5, io.SEEK_END) == len(DATA) - 5


def test_metadata_is_the_inner_stream_s(s3_fault_endpoint, s3_fault_bucket):
    s3 = s3_fault_endpoint.pyarrow_fs()
    path = f"{s3_fault_bucket}/typed.csv"
    with s3.open_output_stream(path, metadata={"Content-Type": "text/csv"}) as out:
        out.write(b"a,b\n")
    f, _ = resumable(lambda: s3.open_input_stream(path), path, Engine(), seekable=False)
    assert f.metadata()["Content-Type"] in (b"text/csv", "text/csv")
    assert f.read() == b"a,b\n"


def test_a_file_without_metadata_has_none(stored):
    f, _ = resumable(lambda: open(stored, "rb"), stored, Engine(), seekable=True)  # noqa: SIM115
    assert f.metadata() == {}


@pytest.mark.skipif(streams._FRESH_BYTES is None, reason="CPython only")
def test_a_slice_of_a_fresh_bytes_view_keeps_the_bytes_alive():
    """A sub-read abandoned by its timeout may still write into its slice after the read
    failed and dropped the ``bytes``: the slice must keep that memory alive."""
    data, view = streams._FRESH_BYTES(64)
    alone = sys.getrefcount(data)
    piece = view[8:16]
    view.release()
    del view
    assert sys.getrefcount(data) == alone  # held through the slice's buffer, not the view
    del piece
    assert sys.getrefcount(data) == alone - 1

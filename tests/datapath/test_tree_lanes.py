"""A threaded tree copy keeps its lanes busy while files sleep out a backoff: a sleeping copy
gives its lane back (`retryfs.datapath.upload.TreeLane`) and takes one again before its next
attempt, so the other files' copies run meanwhile instead of queueing behind the sleeps."""

from __future__ import annotations

import threading
import time

import pyarrow as pa
import pyarrow.fs as pafs
import pytest
from pyarrow._fs import _MockFileSystem

from retryfs import RetryingFileSystem, RetryPolicy
from retryfs.testing import FaultyFileSystem, errors

FAILING = ["a.bin", "b.bin"]
OTHERS = ["c.bin", "d.bin", "e.bin"]


@pytest.fixture
def two_lanes():
    before = pa.io_thread_count()
    pa.set_io_thread_count(2)
    yield
    pa.set_io_thread_count(before)


def test_files_asleep_in_a_backoff_give_their_lanes_to_the_other_files(two_lanes, tmp_path):
    for name in FAILING + OTHERS:
        (tmp_path / name).write_bytes(name.encode() * 1000)
    store = FaultyFileSystem(_MockFileSystem())
    store.create_dir("dst")
    fs = RetryingFileSystem(store, RetryPolicy(max_attempts=3, initial_delay=5, jitter=False),
                            budget=False)
    for name in FAILING:
        store.inject("open_output_stream", errors.network(), path=f"dst/{name}", times=1)
    seen_during_backoff: list[list[str]] = []

    def backoff(seconds: float) -> None:
        # Both lanes' first files fail and sleep here until the three others are copied.
        # Were the sleepers to keep their lanes, no lane would be left for the others: they
        # would queue behind the sleeps, which would end at their deadline empty-handed.
        deadline = time.monotonic() + 5
        done: list[str] = []
        while time.monotonic() < deadline:
            done = [n for n in OTHERS
                    if store.get_file_info(f"dst/{n}").type == pafs.FileType.File]
            if done == OTHERS:
                break
            threading.Event().wait(0.01)
        seen_during_backoff.append(done)

    fs.retry_handler.retrier.sleep = backoff
    pafs.copy_files(str(tmp_path), "dst", source_filesystem=pafs.LocalFileSystem(),
                    destination_filesystem=fs, use_threads=True)
    assert seen_during_backoff == [OTHERS, OTHERS]
    # what the two faults cost: one more open of each failing file, no other file opened again
    assert store.injected["open_output_stream"] == 2
    assert store.calls["open_output_stream"] == len(FAILING + OTHERS) + len(FAILING)
    for name in FAILING + OTHERS:
        with store.open_input_stream(f"dst/{name}") as f:
            assert f.read() == name.encode() * 1000

"""The watchdog of attempts that run on their caller's thread (`retryfs.core.watchdog`): a deadline
that passes hands the operation on exactly once, an attempt that finishes in time keeps it."""

from __future__ import annotations

import os
import threading

from retryfs.core.watchdog import watch


def test_an_attempt_that_outlives_its_deadline_is_expired_once_and_told_so():
    expired = threading.Event()
    calls = []

    def on_expiry() -> None:
        calls.append(1)
        expired.set()

    armed = watch(0.01, on_expiry)
    assert expired.wait(10), "the watchdog never expired the attempt"
    assert armed.finish() is False  # its outcome is to be ignored: the operation went on
    assert armed.finish() is False
    assert calls == [1]


def test_an_attempt_that_finishes_in_time_is_never_expired():
    late = threading.Event()
    fired = []
    kept = watch(0.05, lambda: fired.append("kept"))
    assert kept.finish() is True
    # a later deadline armed after it: once it has fired, the earlier one has been passed by
    watch(0.1, late.set)
    assert late.wait(10)
    assert fired == []
    assert kept.finish() is True


def test_a_sooner_deadline_wakes_the_watchdog():
    # the watchdog sleeps until its earliest deadline: one armed later but due sooner must
    # not wait behind it
    far, near = threading.Event(), threading.Event()
    slow = watch(60.0, far.set)
    watch(0.01, near.set)
    assert near.wait(10), "the sooner deadline waited behind the later one"
    assert not far.is_set()
    assert slow.finish() is True


def test_a_forked_child_expires_its_deadlines():
    """A forked child (a DataLoader worker, multiprocessing's fork) has none of its parent's
    threads: its watchdog must start its own thread, not take the parent's running one for
    alive (then no deadline of the child would ever expire: a stalled write would hang)."""
    armed = watch(60, lambda: None)  # the parent's watchdog thread is running
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child reports whether its deadline expired, and leaves without pytest
        expired = threading.Event()
        watch(0.01, expired.set)
        os.write(write_end, b"expired" if expired.wait(10) else b"never")
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as reader:
        outcome = reader.read().decode()
    os.waitpid(pid, 0)
    assert armed.finish() is True
    assert outcome == "expired"

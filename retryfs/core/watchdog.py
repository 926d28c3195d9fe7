"""Timed attempts that run on the caller's own thread: no thread hop on the happy path.

`retryfs.core.timeouts.run_with_timeout` runs each attempt on a worker and waits for it: two thread
switches per attempt, which on a loaded machine cost more than copying a small file. Where the
rest of an operation can go on on another thread (a file of a threaded ``copy_files``: nobody
waits on the thread that copies it, only on the file's outcome), the attempt instead runs where
it is, watched: `watch` arms a deadline with one shared watchdog thread, and the attempt
`Watch.finish`-es when it returns. If the deadline comes first, the watchdog calls
``on_expiry`` (which carries the operation on elsewhere) and the attempt's thread is left
behind: when it returns, ``finish`` says so and its outcome is ignored, as an abandoned
attempt's is. Arming costs a heap push under a lock; the watchdog sleeps until the earliest
deadline and is woken only when a new one comes sooner.
"""

from __future__ import annotations

import heapq
import itertools
import os
import threading
import time
from collections.abc import Callable

__all__ = ["Watch", "watch"]

_IDLE_SECONDS = 60.0


class Watch:
    """One armed deadline: either the attempt finishes first or the watchdog expires it."""

    __slots__ = ("deadline", "_on_expiry", "_state", "_lock")

    def __init__(self, deadline: float, on_expiry: Callable[[], object]) -> None:
        self.deadline = deadline
        self._on_expiry = on_expiry
        self._state = "running"
        self._lock = threading.Lock()

    def finish(self) -> bool:
        """Called by the attempt when it returns: ``True`` if it was in time (its outcome
        stands), ``False`` if it had expired already (the operation went on elsewhere)."""
        with self._lock:
            if self._state == "expired":
                return False
            self._state = "finished"
            return True

    def _expire(self) -> bool:
        with self._lock:
            if self._state != "running":
                return False
            self._state = "expired"
            return True

    @property
    def pending(self) -> bool:
        return self._state == "running"


class _Watchdog:
    """One daemon thread, started on demand, that expires the armed deadlines in order."""

    def __init__(self) -> None:
        self._cond = threading.Condition()
        self._heap: list[tuple[float, int, Watch]] = []
        self._seq = itertools.count()
        self._running = False

    def arm(self, seconds: float, on_expiry: Callable[[], object]) -> Watch:
        armed = Watch(time.monotonic() + seconds, on_expiry)
        with self._cond:
            heapq.heappush(self._heap, (armed.deadline, next(self._seq), armed))
            if not self._running:
                self._running = True
                threading.Thread(target=self._run, daemon=True, name="retryfs-watchdog").start()
            elif self._heap[0][2] is armed:  # sooner than what the watchdog sleeps for
                self._cond.notify()
        return armed

    def _run(self) -> None:
        while True:
            with self._cond:
                while self._heap and not self._heap[0][2].pending:
                    heapq.heappop(self._heap)  # finished in time: nothing to do
                if not self._heap:
                    self._cond.wait(_IDLE_SECONDS)
                    if not self._heap:
                        self._running = False
                        return
                    continue
                wait = self._heap[0][0] - time.monotonic()
                if wait > 0:
                    self._cond.wait(wait)
                    continue
                _, _, due = heapq.heappop(self._heap)
            if due._expire():
                try:
                    due._on_expiry()
                except Exception:  # noqa: BLE001 - the callback reports its own failures
                    pass


_watchdog = _Watchdog()


def _forget_parent_watchdog() -> None:
    """A forked child gets a watchdog of its own: its parent's thread does not run here, and
    a copy that believed it did would never expire the child's deadlines."""
    global _watchdog
    _watchdog = _Watchdog()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_forget_parent_watchdog)


def watch(seconds: float, on_expiry: Callable[[], object]) -> Watch:
    """Arm a deadline ``seconds`` from now; ``on_expiry()`` runs on the watchdog's thread if
    the attempt has not called `Watch.finish` by then (keep it short: start a thread)."""
    return _watchdog.arm(seconds, on_expiry)

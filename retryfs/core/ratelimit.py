"""Client-side rate limiting under sustained throttling, per endpoint and process.

Modelled on botocore's adaptive retry mode (``botocore.retries.adaptive``): a token bucket
whose fill rate drops to ``beta`` (0.7) times the measured send rate on a throttle and grows
back on success along a CUBIC curve (``scale * (t - K) ** 3 + W_max``, ``t`` the seconds since
the last throttle, ``W_max`` the rate at it), never below ``min_rate``. Unlike botocore, the
rate is not held under twice the measured send rate, and each success adds one request per
second (a slow start): a limiter that fell to ``min_rate`` in a storm, with work waiting, is
back at a hundred requests per second within five seconds of the storm's end, not minutes. A prefix in a SlowDown storm is then asked at the rate it can answer
instead of by every lane at once, each with its own backoff; the requests sent during a storm
stay bounded by the bucket, not by the number of threads.

:class:`RateLimit` is the *configuration* (``mode`` ``"off"``, ``"on"`` or ``"auto"``), compared
and pickled with the wrapper; the live :class:`RateLimiter` is per-process state, shared by
every wrapper of one endpoint (the retry budget's endpoint identity) and never pickled.

``"auto"`` (the default) engages the limiter once ``throttles`` throttling errors arrived within
``window`` seconds and were at least ``share`` of the requests sent in that time (a few
throttles among many successes are not a storm: each is retried on its own), and lets it go
once no throttle came for ``window`` seconds and the curve is back above the rate where
throttling began: an isolated SlowDown costs one slow retry and
nothing more, a storm is paced. ``"on"`` engages it at the first throttle, as botocore does.
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from .budget import PerEndpoint

__all__ = ["RateLimit", "RateLimiter", "limiter_for", "limiters", "normalize_rate_limit",
           "reset_limiters"]

Mode = Literal["off", "on", "auto"]
_SHORTEST_WAIT = 0.001  # a pacing wait shorter than a millisecond is not worth a sleep
MODES: tuple[str, ...] = ("off", "on", "auto")


@dataclass(frozen=True)
class RateLimit:
    """How the per-endpoint client-side rate limiter behaves.

    - ``mode``: ``"auto"`` (engaged after ``throttles`` throttles within ``window`` seconds),
      ``"on"`` (engaged at the first throttle, botocore's adaptive mode) or ``"off"``.
    - ``throttles`` / ``window`` / ``share``: what a storm is, for ``"auto"``: 10 throttles
      within 5 s that are at least a tenth of the requests sent since the first of them.
      ``window`` is also how long a quiet spell must last before an engaged limiter lets go.
    - ``min_rate``: the lowest fill rate, requests per second (botocore: 0.5).
    - ``beta``: the rate is multiplied by this at each throttle (botocore's CUBIC: 0.7).
    - ``scale``: how fast the rate grows back (CUBIC's C; botocore: 0.4).
    """

    mode: Mode = "auto"
    throttles: int = 10
    window: float = 5.0
    min_rate: float = 0.5
    beta: float = 0.7
    scale: float = 0.4
    share: float = 0.1

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"RateLimit.mode must be one of {', '.join(MODES)}, "
                             f"got {self.mode!r}")
        if isinstance(self.throttles, bool) or not isinstance(self.throttles, int) or not (
                1 <= self.throttles <= 1_000_000):
            raise ValueError(f"RateLimit.throttles must be an int in [1, 1000000], "
                             f"got {self.throttles!r}")
        for name, low, high in (("window", 0.0, 3600.0), ("min_rate", 0.0, 1e6),
                                ("beta", 0.0, 1.0), ("scale", 0.0, 1e6),
                                ("share", 0.0, 1.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not (
                    low < value <= high):
                raise ValueError(f"RateLimit.{name} must be a number in ({low:g}, {high:g}], "
                                 f"got {value!r}")

    @property
    def enabled(self) -> bool:
        return self.mode != "off"


def normalize_rate_limit(value: RateLimit | bool | str | None) -> RateLimit:
    """``"auto"``/``"on"``/``"off"``, ``True`` (on), ``False``/``None`` (off) or a RateLimit."""
    if isinstance(value, RateLimit):
        return value
    if value is True:
        return RateLimit(mode="on")
    if value is False or value is None:
        return RateLimit(mode="off")
    if isinstance(value, str):
        text = value.strip().lower()
        aliases = {"true": "on", "1": "on", "yes": "on", "false": "off", "0": "off", "no": "off"}
        text = aliases.get(text, text)
        if text in MODES:
            return RateLimit(mode=text)  # type: ignore[arg-type]
        raise ValueError(f"rate_limit must be one of {', '.join(MODES)} (or true/false), "
                         f"got {value!r}")
    raise TypeError(f"rate_limit must be a RateLimit, 'auto', 'on', 'off' or a bool; got "
                    f"{type(value).__name__} {value!r}")


class _SendRate:
    """The measured send rate (botocore's RateClocker): requests counted in half-second
    buckets, smoothed. Counted without a lock: an estimate, and the happy path's only cost."""

    BUCKET = 0.5
    SMOOTHING = 0.8

    def __init__(self) -> None:
        self.rate = 0.0
        self.count = 0
        self.total = 0  # every request counted, for the share of throttles
        self.bucket_start: float | None = None  # the first send's time (on the caller's clock)

    def sent(self, now: float) -> None:
        self.count += 1
        self.total += 1
        if self.bucket_start is None:
            self.bucket_start = now
        elapsed = now - self.bucket_start
        if elapsed >= self.BUCKET:
            current = self.count / elapsed
            self.rate = current * (1 - self.SMOOTHING) + self.rate * self.SMOOTHING
            self.count = 0
            self.bucket_start = now

    def measured(self, now: float) -> float:
        """The smoothed rate, or the current bucket's if higher (a storm's first half second)."""
        if self.bucket_start is None:
            return self.rate
        elapsed = now - self.bucket_start
        current = self.count / elapsed if elapsed > 0.05 else 0.0
        return max(self.rate, current)


class RateLimiter:
    """The live limiter of one endpoint in this process (thread-safe).

    `before_send` says whether a request may go now (0, its token taken; always while
    disengaged) or how long to wait before asking again; `throttled` and `succeeded` feed it the
    outcome of each attempt. Every method takes the caller's clock reading (``now``).
    """

    def __init__(self, config: RateLimit, endpoint: str,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.config = config
        self.endpoint = endpoint
        self.clock = clock
        self.engaged = False
        self.fill_rate = 0.0
        self.engagements = 0  # how often it engaged (for stats)
        self.paced = 0  # sends it delayed
        self.waited = 0.0  # seconds of delay it imposed
        self._sends = _SendRate()
        self._tokens = 0.0
        self._refilled = 0.0
        self._w_max = 0.0
        self._k = 0.0
        self._last_throttle = -1e18
        # the recent throttles: (when, requests sent by then)
        self._recent: collections.deque[tuple[float, int]] = collections.deque()
        self._lock = threading.Lock()

    # -- the three events --------------------------------------------------------------------
    def before_send(self, now: float | None = None) -> float:
        """0 when the request may go now (its token is taken), else the seconds to wait before
        asking again (nothing taken: waiters ask again, so that a rate that grows back in the
        meantime serves them at once). ``now``: the caller's clock (default: the limiter's)."""
        now = self.clock() if now is None else now
        if self.engaged:
            with self._lock:
                if self.engaged:
                    rate = self.fill_rate
                    self._tokens = min(max(1.0, rate),
                                       self._tokens + (now - self._refilled) * rate)
                    self._refilled = now
                    if self._tokens < 1.0 - 1e-9:  # (not a rounding error's wait)
                        return max(_SHORTEST_WAIT, (1.0 - self._tokens) / rate)
                    self._tokens = max(0.0, self._tokens - 1.0)
        self._sends.sent(now)
        return 0.0

    def note_wait(self, seconds: float) -> None:
        """A caller waited ``seconds`` for a token (for stats)."""
        with self._lock:
            self.paced += 1
            self.waited += seconds

    def throttled(self, now: float | None = None) -> None:
        """A request was answered with a throttling error."""
        if not self.config.enabled:
            return
        now = self.clock() if now is None else now
        with self._lock:
            recent = self._recent
            recent.append((now, self._sends.total))
            while recent and recent[0][0] < now - self.config.window:
                recent.popleft()
            if not self.engaged and self.config.mode != "on" and not self._storm():
                return
            measured = self._sends.measured(now)
            rate = measured if not self.engaged else min(measured, self.fill_rate)
            if not self.engaged:
                self.engaged = True
                self.engagements += 1
                self._tokens = 1.0  # the request after the storm's last throttle goes at once
                self._refilled = now
            self._w_max = rate
            self._k = (rate * (1 - self.config.beta) / self.config.scale) ** (1 / 3)
            self.fill_rate = max(self.config.min_rate, rate * self.config.beta)
            self._last_throttle = now

    def _storm(self) -> bool:
        """For ``"auto"``: enough throttles within the window, and enough of the requests sent
        since the first of them."""
        count = len(self._recent)
        sent = self._sends.total - self._recent[0][1] + 1  # the first throttle's own included
        return count >= self.config.throttles and count >= self.config.share * sent

    def succeeded(self, now: float | None = None) -> None:
        """A request succeeded: the rate grows back along the curve (nothing while disengaged)."""
        if not self.engaged:
            return
        now = self.clock() if now is None else now
        with self._lock:
            if not self.engaged:
                return
            since = now - self._last_throttle
            cubic = self.config.scale * (since - self._k) ** 3 + self._w_max
            # CUBIC in time, and at least one more request per second per success (slow
            # start: the rate doubles about every second while everything succeeds)
            self.fill_rate = max(self.config.min_rate, cubic, self.fill_rate + 1.0)
            if (self.config.mode == "auto" and since >= self.config.window
                    and cubic >= self._w_max):
                self.engaged = False

    def reset(self) -> None:
        """Back to disengaged, no throttle remembered (for test suites)."""
        with self._lock:
            self.engaged = False
            self.fill_rate = 0.0
            self._recent.clear()

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {"endpoint": self.endpoint, "mode": self.config.mode,
                    "engaged": self.engaged, "fill_rate": self.fill_rate if self.engaged
                    else None, "engagements": self.engagements, "paced": self.paced,
                    "waited_seconds": round(self.waited, 6)}

    def __repr__(self) -> str:
        state = f"{self.fill_rate:.2f}/s" if self.engaged else "disengaged"
        return f"RateLimiter({self.endpoint!r}, {self.config.mode}, {state})"


# -- the per-process registry -------------------------------------------------------------------

_limiters: PerEndpoint[RateLimiter] = PerEndpoint(RateLimiter)


def limiter_for(fs: Any, config: RateLimit) -> RateLimiter | None:
    """The limiter of ``fs``'s endpoint under ``config`` (None when ``mode="off"``), shared by
    every wrapper of that endpoint with that configuration in this process."""
    return _limiters.get(fs, config) if config.enabled else None


def limiters() -> list[RateLimiter]:
    """Every live limiter in this process (for exporters and inspection)."""
    return _limiters.values()


def reset_limiters() -> None:
    """Disengage every live limiter and forget its throttles (for test suites that inject
    throttles on purpose: a storm in one test must not make the next one's throttles slow)."""
    for limiter in limiters():
        limiter.reset()

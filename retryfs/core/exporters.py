"""Exporters: retry counters to Prometheus, and to Ray's metrics (the Ray dashboard).

Prometheus (optional extra ``retryfs[prometheus]``)::

    from prometheus_client import CollectorRegistry, generate_latest
    from retryfs.core.exporters import PrometheusCollector

    registry = CollectorRegistry()
    PrometheusCollector(fs, registry=registry)      # or several: {"ckpt": fs1, "data": fs2}
    print(generate_latest(registry).decode())        # retryfs_retries_total{operation=...}

The collector reads ``stats.snapshot()`` at scrape time: nothing is added to the I/O path.
Without sources it exports every ``RetryStats`` alive in the process (summed).

Ray: inside a Ray process (``ray`` imported and initialised) the first ``RetryStats`` created
starts :class:`RayMetricsExporter`, a daemon thread that pushes the counters' increments to
``ray.util.metrics`` every 10 s, so retries show on the Ray dashboard (and in Ray's Prometheus
endpoint as ``ray_retryfs_*``). ``RETRYFS_RAY_METRICS=0`` turns that off.

Metric names (a counter's samples carry the ``_total`` suffix), labels in brackets:
``retryfs_calls``, ``retryfs_attempts``, ``retryfs_recovered``, ``retryfs_sleep_seconds``,
``retryfs_replayed_bytes``, ``retryfs_throttled``, ``retryfs_timeouts``,
``retryfs_budget_exhausted`` [operation]; ``retryfs_retries``, ``retryfs_giveups``
[operation, error]; gauges ``retryfs_budget_available_tokens``,
``retryfs_budget_capacity_tokens`` and counter ``retryfs_budget_denied`` [endpoint]. Labels never
carry paths (unbounded, and possibly secret); error labels are bounded class names such as
``OSError[SLOW_DOWN]``.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
import weakref
from collections.abc import Iterable, Iterator, Mapping
from typing import Any

from . import budget as budget_module
from .stats import RetryStats, all_stats, on_stats_created

__all__ = ["PrometheusCollector", "RayMetricsExporter", "ray_exporter"]

log = logging.getLogger("retryfs")

# (snapshot key, metric suffix, help) of the per-operation counters
_OPERATION_COUNTERS = (
    ("calls", "calls", "Filesystem calls that finished (succeeded or raised)."),
    ("attempts", "attempts", "Attempts made, first attempts included."),
    ("recovered", "recovered", "Calls that succeeded after one or more retries."),
    ("sleep_seconds", "sleep_seconds", "Seconds spent waiting between attempts."),
    ("bytes_replayed", "replayed_bytes", "Bytes written again into a fresh upload after a "
                                         "failure."),
    ("throttled", "throttled", "Retries of throttling errors (SlowDown, 429)."),
    ("timeouts", "timeouts", "Retries after a per-attempt timeout."),
    ("budget_exhausted", "budget_exhausted", "Give-ups because the endpoint's retry budget "
                                             "was empty."),
)
# (by_error key, metric suffix, help) of the per-operation, per-error counters
_ERROR_COUNTERS = (
    ("retries", "retries", "Failed attempts that were retried."),
    ("giveups", "giveups", "Calls that failed for good after retrying (or with no retry left)."),
)


def _stats_of(source: Any) -> RetryStats:
    if isinstance(source, RetryStats):
        return source
    stats = getattr(source, "stats", None)
    if isinstance(stats, RetryStats):
        return stats
    raise TypeError(f"expected a RetryStats or a retryfs filesystem (with .stats), "
                    f"got {type(source).__name__}")


def _resolve_sources(sources: tuple[Any, ...]) -> list[tuple[str | None, RetryStats]] | None:
    """``[(name, stats)]``; ``None`` means every live RetryStats (no name)."""
    if not sources:
        return None
    out: list[tuple[str | None, RetryStats]] = []
    for source in sources:
        if isinstance(source, Mapping):
            out.extend((str(name), _stats_of(value)) for name, value in source.items())
        else:
            out.append((None, _stats_of(source)))
    return out


def _aggregate(pairs: Iterable[tuple[str | None, RetryStats]]
               ) -> dict[str | None, dict[str, dict[str, Any]]]:
    """``{name: {operation: counters}}`` summed over the stats of each name."""
    merged: dict[str | None, dict[str, dict[str, Any]]] = {}
    for name, stats in pairs:
        per_op = merged.setdefault(name, {})
        for operation, counters in stats.snapshot()["by_operation"].items():
            mine = per_op.get(operation)
            if mine is None:
                per_op[operation] = {key: (dict(value) if key == "by_error" else value)
                                     for key, value in counters.items() if key != "errors"}
                per_op[operation]["by_error"] = {
                    cls: dict(counts) for cls, counts in counters["by_error"].items()}
                continue
            for key, _, _ in _OPERATION_COUNTERS:
                mine[key] += counters[key]
            for cls, counts in counters["by_error"].items():
                slot = mine["by_error"].setdefault(cls, {"retries": 0, "giveups": 0})
                slot["retries"] += counts["retries"]
                slot["giveups"] += counts["giveups"]
    return merged


class PrometheusCollector:
    """A ``prometheus_client`` collector of retryfs counters (read at scrape time).

    ``sources``: RetryStats or retryfs filesystems (anything with ``.stats``), or mappings
    ``{name: source}`` whose names become a ``filesystem`` label; none: every RetryStats alive
    in the process. ``registry``: register there at once (``prometheus_client.REGISTRY`` is
    the default registry). ``budgets``: also export the process's retry budgets.
    """

    def __init__(self, *sources: Any, registry: Any = None, namespace: str = "retryfs",
                 budgets: bool = True) -> None:
        try:
            import prometheus_client  # noqa: F401
        except ImportError as exc:  # pragma: no cover - the extra is documented
            raise ImportError("PrometheusCollector needs prometheus-client: "
                              "pip install '.[prometheus]' in the retryfs checkout") from exc
        resolved = _resolve_sources(sources)
        self._sources = resolved
        self._named = resolved is not None and any(n is not None for n, _ in resolved)
        self.namespace = namespace
        self.budgets = budgets
        if registry is not None:
            registry.register(self)

    def _pairs(self) -> list[tuple[str | None, RetryStats]]:
        if self._sources is None:
            return [(None, stats) for stats in all_stats()]
        return self._sources

    def describe(self) -> list[Any]:
        return list(self._families(fill=False))

    def collect(self) -> Iterator[Any]:
        yield from self._families(fill=True)

    def _families(self, *, fill: bool) -> Iterator[Any]:
        from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

        ns = self.namespace
        base = ["filesystem"] if self._named else []
        merged = _aggregate(self._pairs()) if fill else {}
        for key, suffix, doc in _OPERATION_COUNTERS:
            family = CounterMetricFamily(f"{ns}_{suffix}", doc, labels=[*base, "operation"])
            for name, per_op in merged.items():
                prefix = [name or ""] if self._named else []
                for operation, counters in sorted(per_op.items()):
                    family.add_metric([*prefix, operation], counters[key])
            yield family
        for key, suffix, doc in _ERROR_COUNTERS:
            family = CounterMetricFamily(f"{ns}_{suffix}", doc,
                                         labels=[*base, "operation", "error"])
            for name, per_op in merged.items():
                prefix = [name or ""] if self._named else []
                for operation, counters in sorted(per_op.items()):
                    for cls, counts in sorted(counters["by_error"].items()):
                        family.add_metric([*prefix, operation, cls], counts[key])
            yield family
        if not self.budgets:
            return
        live = budget_module.buckets() if fill else []
        available = GaugeMetricFamily(f"{ns}_budget_available_tokens",
                                      "Tokens left in the endpoint's retry budget.",
                                      labels=["endpoint"])
        capacity = GaugeMetricFamily(f"{ns}_budget_capacity_tokens",
                                     "Tokens in a full retry budget.", labels=["endpoint"])
        denied = CounterMetricFamily(f"{ns}_budget_denied",
                                     "Retries refused because the retry budget was empty.",
                                     labels=["endpoint"])
        totals: dict[str, list[int]] = {}
        for bucket in live:
            snap = bucket.snapshot()
            slot = totals.setdefault(snap["endpoint"], [0, 0, 0])
            slot[0] += snap["available"]
            slot[1] += snap["capacity"]
            slot[2] += snap["denied"]
        for endpoint, (left, full, refused) in sorted(totals.items()):
            available.add_metric([endpoint], left)
            capacity.add_metric([endpoint], full)
            denied.add_metric([endpoint], refused)
        yield available
        yield capacity
        yield denied


# -- Ray ----------------------------------------------------------------------------------------

class RayMetricsExporter:
    """Pushes the increments of retryfs counters to ``ray.util.metrics`` periodically.

    Ray's metrics are push-style (``Counter.inc``); retryfs counts in its own ``RetryStats``
    (no per-call cost), and this exporter turns the difference between two snapshots into
    ``inc`` calls every ``interval`` seconds (and at exit). A ``reset()`` of a stats object
    is noticed: its counts start again from zero, nothing is lost or counted twice. ``metrics`` is the module providing ``Counter`` and
    ``Gauge`` (``ray.util.metrics`` by default; tests pass a stand-in).
    """

    def __init__(self, *sources: Any, interval: float = 10.0, namespace: str = "retryfs",
                 metrics: Any = None) -> None:
        if metrics is None:  # ray is optional: imported only for the exporter
            import ray.util.metrics

            metrics = ray.util.metrics
        self._metrics = metrics
        self._sources = _resolve_sources(sources)
        self.interval = interval
        self.namespace = namespace
        self._lock = threading.Lock()
        self._last: weakref.WeakKeyDictionary[
            RetryStats, tuple[int, dict[str, dict[str, Any]]]] = weakref.WeakKeyDictionary()
        self._instruments: dict[str, Any] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _instrument(self, kind: str, suffix: str, doc: str, tags: tuple[str, ...]) -> Any:
        """The Ray metric ``<namespace>_<suffix>`` of ``kind`` (Counter, Gauge), made once."""
        instrument = self._instruments.get(suffix)
        if instrument is None:
            instrument = getattr(self._metrics, kind)(f"{self.namespace}_{suffix}",
                                                      description=doc, tag_keys=tags)
            self._instruments[suffix] = instrument
        return instrument

    def flush(self) -> int:
        """Push what changed since the last flush; returns the number of ``inc`` calls."""
        pairs = ([(None, s) for s in all_stats()] if self._sources is None else self._sources)
        pushed = 0
        with self._lock:
            for _, stats in pairs:
                generation, now = stats._export()
                last_generation, before = self._last.get(stats, (generation, {}))
                if last_generation != generation:  # reset since the last flush: from zero
                    before = {}
                self._last[stats] = (generation, now)
                for operation, counters in now.items():
                    old = before.get(operation, {})
                    tags = {"operation": operation}
                    for key, suffix, doc in _OPERATION_COUNTERS:
                        delta = counters[key] - old.get(key, 0)
                        if delta > 0:
                            counter = self._instrument("Counter", suffix, doc, ("operation",))
                            counter.inc(delta, tags=tags)
                            pushed += 1
                    old_errors = old.get("by_error", {})
                    for cls, counts in counters["by_error"].items():
                        for key, suffix, doc in _ERROR_COUNTERS:
                            delta = counts[key] - old_errors.get(cls, {}).get(key, 0)
                            if delta > 0:
                                counter = self._instrument("Counter", suffix, doc,
                                                           ("operation", "error"))
                                counter.inc(delta, tags={"operation": operation, "error": cls})
                                pushed += 1
            for bucket in budget_module.buckets():
                snap = bucket.snapshot()
                gauge = self._instrument("Gauge", "budget_available_tokens",
                                         "Tokens left in the retry budget.", ("endpoint",))
                gauge.set(snap["available"], tags={"endpoint": snap["endpoint"]})
        return pushed

    def start(self) -> RayMetricsExporter:
        """Flush every ``interval`` seconds on a daemon thread (and once at exit)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="retryfs-ray-metrics",
                                            daemon=True)
            self._thread.start()
            atexit.register(self._final_flush)
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._final_flush()

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self._safe_flush()

    def _final_flush(self) -> None:
        self._safe_flush()

    def _safe_flush(self) -> None:
        try:
            self.flush()
        except Exception:  # noqa: BLE001 - metrics must never break the process
            log.debug("retryfs: pushing metrics to Ray failed", exc_info=True)


_ray_lock = threading.Lock()
_ray_exporter: RayMetricsExporter | None = None


def ray_exporter() -> RayMetricsExporter | None:
    """The process's automatic Ray exporter, if it was started."""
    return _ray_exporter


def _maybe_start_ray_export() -> None:
    """Start the process-wide Ray exporter once, when running inside an initialised Ray."""
    global _ray_exporter
    if _ray_exporter is not None:
        return
    if os.environ.get("RETRYFS_RAY_METRICS", "1").lower() in ("0", "false", "no", "off"):
        return
    ray = sys.modules.get("ray")
    if ray is None:
        return
    try:
        if not ray.is_initialized():
            return
    except Exception:  # noqa: BLE001 - a partial ray import
        return
    with _ray_lock:
        if _ray_exporter is not None:
            return
        try:
            interval = float(os.environ.get("RETRYFS_RAY_METRICS_INTERVAL", "10"))
            _ray_exporter = RayMetricsExporter(interval=interval).start()
        except Exception:  # noqa: BLE001 - no metrics rather than a broken filesystem
            log.debug("retryfs: could not start the Ray metrics exporter", exc_info=True)


def _on_new_stats(_stats: RetryStats) -> None:
    if "ray" in sys.modules:  # inside Ray: retries show on the Ray dashboard
        _maybe_start_ray_export()


on_stats_created(_on_new_stats)

"""Logs, counters, hooks and exporters: every retry can be seen, exactly."""

from __future__ import annotations

import contextlib
import errno
import logging
import threading

import pyarrow.fs as pafs
import pytest
from _helpers import FAST, require

import retryfs
from retryfs import RetryPolicy, RetryStats
from retryfs.core.stats import RetryEvent, basic_redact, error_kind
from retryfs.datapath.streams import GATHERED
from retryfs.testing import FaultyFileSystem, errors

# Delays that show in a log line ("0.01s") and still cost nothing to wait out.
VISIBLE = RetryPolicy(max_attempts=3, initial_delay=0.01, multiplier=2, max_delay=0.04,
                      jitter=False, throttle_delay=0.02, fast_throttle_retries=0)


@pytest.fixture
def store(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "model.pt").write_bytes(b"x" * 1000)
    return FaultyFileSystem(pafs.LocalFileSystem()), str(tmp_path / "ckpt")


def _records(caplog, level):
    return [r for r in caplog.records if r.name == "retryfs" and r.levelno == level]


# -- log lines -------------------------------------------------------------------------------

def test_one_warning_per_retry_and_one_error_on_giveup(store, caplog):
    faulty, base = store
    path = f"{base}/model.pt"
    faulty.inject("get_file_info", errors.throttle("HeadObject"), times=1)
    faulty.inject("get_file_info", errors.network("HeadObject"), times=1)
    fs = retryfs.RetryingFileSystem(faulty, VISIBLE)
    caplog.set_level(logging.WARNING, logger="retryfs")

    assert fs.get_file_info(path).size == 1000
    warnings = [r.getMessage() for r in _records(caplog, logging.WARNING)]
    assert warnings == [
        f"retryfs: get_file_info {path!r} failed (attempt 1 of 3): OSError[SLOW_DOWN]: "
        "AWS Error SLOW_DOWN during HeadObject operation: Please reduce your request rate.; "
        "retrying in 0.02s (throttled)",
        f"retryfs: get_file_info {path!r} failed (attempt 2 of 3): "
        "OSError[NETWORK_CONNECTION]: AWS Error NETWORK_CONNECTION during HeadObject "
        "operation: curlCode: 56, Failure when receiving data from the peer; "
        "retrying in 0.02s",
    ]
    assert not _records(caplog, logging.ERROR)

    caplog.clear()
    faulty.inject("get_file_info", errors.unavailable(), times=None)
    with pytest.raises(OSError, match="HTTP status 503") as raised:
        fs.get_file_info(path)
    assert len(_records(caplog, logging.WARNING)) == 2  # attempts 1 and 2 of 3
    [error] = [r.getMessage() for r in _records(caplog, logging.ERROR)]
    assert error == (
        f"retryfs: get_file_info {path!r} gave up after 3 attempt(s) (no attempts left): "
        "OSError[HTTP 503]: AWS Error UNKNOWN (HTTP status 503) during HeadObject operation: "
        "No response body.")
    assert any("gave up after 3 attempt(s)" in note for note in raised.value.__notes__)


def test_permanent_errors_are_not_logged(store, caplog):
    faulty, base = store
    faulty.inject("get_file_info", errors.access_denied("HeadObject"))
    fs = retryfs.RetryingFileSystem(faulty, VISIBLE)
    caplog.set_level(logging.DEBUG, logger="retryfs")
    with pytest.raises(OSError, match="ACCESS_DENIED"):
        fs.get_file_info(f"{base}/model.pt")
    assert not [r for r in caplog.records if r.name == "retryfs"]
    assert fs.stats.snapshot()["giveups"] == 0  # raised at once: not a give-up


SECRET_TEXT = (
    "AWS Error NETWORK_CONNECTION during GetObject operation: curlCode: 7 connecting to "
    "https://admin:hunter2@minio.internal:9000/b/k?X-Amz-Credential=AKIAIOSFODNN7EXAMPLE"
    "&X-Amz-Signature=0123456789abcdef&X-Amz-Security-Token=FQoGZXIvYXdzEKSESSION "
    "(secret_key=wJalrXUtnFEMI, sig=SASSIGNATURE, Authorization: AWS4-HMAC-SHA256 Credential)")
SECRETS = ("hunter2", "AKIAIOSFODNN7EXAMPLE", "0123456789abcdef", "FQoGZXIvYXdzEKSESSION",
           "wJalrXUtnFEMI", "SASSIGNATURE", "AWS4-HMAC-SHA256")


def test_secrets_never_reach_logs_notes_or_metrics(store, caplog):
    faulty, base = store
    faulty.inject("get_file_info", lambda: OSError(SECRET_TEXT), times=None)
    fs = retryfs.RetryingFileSystem(faulty, VISIBLE)
    caplog.set_level(logging.WARNING, logger="retryfs")
    with pytest.raises(OSError) as raised:
        fs.get_file_info("s3://AKIAIOSFODNN7EXAMPLE:hunter2@bucket/model.pt")
    logged = "\n".join(r.getMessage() for r in caplog.records if r.name == "retryfs")
    assert "minio.internal:9000" in logged and "***" in logged  # redacted, not dropped
    notes = "\n".join(raised.value.__notes__)
    for secret in SECRETS:
        assert secret not in logged
        assert secret not in notes
        assert secret not in repr(fs.stats.snapshot())
    assert str(raised.value) == SECRET_TEXT  # the exception itself is the caller's, unchanged


def test_redaction_of_common_secret_forms():
    for text, secret in [
        ("https://user:pa55@host/x", "pa55"),
        ("?AWSAccessKeyId=AKIAXXXXXXXXXXXXXXXX&Signature=abc%2Fdef", "abc%2Fdef"),
        ("DefaultEndpointsProtocol=https;AccountName=a;AccountKey=bWFueXNlY3JldHM=;", "bWFueXNl"),
        ("token: ya29.a0AfH6SM", "ya29"),
        ("password='s3cr3t'", "s3cr3t"),
        ("{'key': 'AKIAABCDEFGHIJKLMNOP', 'secret': 'zzz'}", "AKIAABCDEFGHIJKLMNOP"),
    ]:
        assert secret not in basic_redact(text), text
    assert basic_redact("bucket/path/to/model.pt") == "bucket/path/to/model.pt"


def test_a_custom_redactor_is_used_for_logs(store, caplog):
    faulty, base = store
    faulty.inject("get_file_info", errors.network(), times=1)
    stats = RetryStats(redact=lambda text: text.replace("ckpt", "[hidden]"))
    fs = retryfs.RetryingFileSystem(faulty, VISIBLE, stats=stats)
    caplog.set_level(logging.WARNING, logger="retryfs")
    fs.get_file_info(f"{base}/model.pt")
    [line] = [r.getMessage() for r in _records(caplog, logging.WARNING)]
    assert "ckpt" not in line and "[hidden]/model.pt" in line


def test_error_classes_are_short_and_bounded():
    class ClientError(Exception):
        def __init__(self, code, status):
            super().__init__(f"An error occurred ({code})")
            self.response = {"Error": {"Code": code},
                             "ResponseMetadata": {"HTTPStatusCode": status}}

    assert error_kind(errors.throttle()()) == "OSError[SLOW_DOWN]"
    assert error_kind(errors.unavailable()()) == "OSError[HTTP 503]"
    assert error_kind(errors.reset()()) == "ConnectionResetError"
    assert error_kind(OSError(errno.ENETUNREACH, "unreachable")) == "OSError[ENETUNREACH]"
    assert error_kind(ClientError("SlowDown", 503)) == "ClientError[SlowDown]"
    assert error_kind(ValueError("x")) == "ValueError"

    class GenericError(Exception):  # obstore's, which quotes the S3 error body in its text
        pass

    assert error_kind(GenericError(
        "Error performing PUT http://h/b/k - Server returned non-2xx status code: 503 Service "
        "Unavailable: <Error><Code>SlowDown</Code><Message>Please reduce</Message></Error>"
    )) == "GenericError[SlowDown]"


# -- counters ------------------------------------------------------------------------------

def test_counters_are_exact_under_concurrency(tmp_path):
    """16 threads, 3200 calls, 300 injected failures: every count adds up exactly."""
    (tmp_path / "f").write_bytes(b"x")
    faulty = FaultyFileSystem(pafs.LocalFileSystem())
    failures = 300
    faulty.inject("get_file_info", errors.network("HeadObject"), times=failures)
    fs = retryfs.RetryingFileSystem(faulty, RetryPolicy(max_attempts=1000, initial_delay=0.001),
                                    budget=False)
    seen = threading.local()
    events: list[RetryEvent] = []
    events_lock = threading.Lock()

    @fs.stats.on_retry
    def count(event: RetryEvent) -> None:
        seen.retries = getattr(seen, "retries", 0) + 1
        with events_lock:
            events.append(event)

    threads, per_thread = 16, 200
    recovered = [0] * threads
    barrier = threading.Barrier(threads)

    def work(index: int) -> None:
        barrier.wait()
        for _ in range(per_thread):
            seen.retries = 0
            assert fs.get_file_info(str(tmp_path / "f")).size == 1
            recovered[index] += seen.retries > 0

    with retryfs.no_sleep():
        workers = [threading.Thread(target=work, args=(i,)) for i in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()

    snap = fs.stats.snapshot()
    calls = threads * per_thread
    assert faulty.injected["get_file_info"] == failures
    assert len(events) == failures
    assert snap["calls"] == calls
    assert snap["retries"] == failures
    assert snap["attempts"] == calls + failures
    assert snap["giveups"] == 0
    assert snap["recovered"] == sum(recovered) > 0
    assert snap["errors"] == {"OSError[NETWORK_CONNECTION]": failures}
    assert snap["by_error"] == {"OSError[NETWORK_CONNECTION]": {"retries": failures,
                                                                "giveups": 0}}
    assert snap["sleep_seconds"] == 0  # test mode: nothing was slept
    assert snap["by_operation"]["get_file_info"]["calls"] == calls


def test_raw_counters_are_exact_under_concurrency():
    stats = RetryStats()
    error = OSError("AWS Error SLOW_DOWN during PutObject operation")
    threads, rounds = 8, 2000

    def work() -> None:
        for _ in range(rounds):
            stats.record_success("write", 1)
            stats.record_retry(RetryEvent("write", "b/k", 1, 3, error, 0.5, throttled=True))
            stats.record_success("write", 2)
            stats.record_replay("write", 10)
            stats.record_first_try("write")  # the happy path's lock-free counter

    logging.getLogger("retryfs").disabled = True
    try:
        workers = [threading.Thread(target=work) for _ in range(threads)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join()
    finally:
        logging.getLogger("retryfs").disabled = False
    snap = stats.snapshot()
    n = threads * rounds
    assert (snap["calls"], snap["attempts"], snap["retries"], snap["recovered"]) == (
        3 * n, 4 * n, n, n)
    assert snap["throttled"] == n and snap["bytes_replayed"] == 10 * n
    assert snap["sleep_seconds"] == pytest.approx(0.5 * n)


def test_sleep_seconds_and_successes_after_retry(store):
    faulty, base = store
    faulty.inject("get_file_info", errors.network(), times=2)
    fs = retryfs.RetryingFileSystem(faulty, VISIBLE)
    fs.get_file_info(f"{base}/model.pt")
    snap = fs.stats.snapshot()
    assert snap["sleep_seconds"] == pytest.approx(0.01 + 0.02)
    assert (snap["calls"], snap["attempts"], snap["retries"], snap["recovered"]) == (1, 3, 2, 1)


def test_bytes_replayed_are_counted(store):
    faulty, base = store
    faulty.inject("write", errors.network("UploadPart"), skip=2, times=1)  # the 3rd write fails
    fs = retryfs.RetryingFileSystem(faulty, FAST)
    with fs.open_output_stream(f"{base}/out.bin") as out:
        for _ in range(3):  # writes as large as GATHERED: each handed over at once
            out.write(b"y" * GATHERED)
    assert faulty.injected["write"] == 1
    snap = fs.stats.snapshot()
    assert snap["bytes_replayed"] == 3 * GATHERED  # the spool, the failed chunk included
    assert snap["by_operation"]["write"]["retries"] == 1
    with open(f"{base}/out.bin", "rb") as f:
        assert f.read() == b"y" * 3 * GATHERED


def test_snapshot_is_a_copy_and_reset_zeroes(store):
    faulty, base = store
    faulty.inject("get_file_info", errors.network(), times=1)
    fs = retryfs.RetryingFileSystem(faulty, FAST)
    fs.get_file_info(f"{base}/model.pt")
    snap = fs.stats.snapshot()
    snap["by_operation"]["get_file_info"]["retries"] = 99
    assert fs.stats.snapshot()["by_operation"]["get_file_info"]["retries"] == 1
    fs.stats.reset()
    empty = fs.stats.snapshot()
    assert empty["calls"] == empty["retries"] == 0 and empty["by_operation"] == {}
    fs.get_file_info(f"{base}/model.pt")
    assert fs.stats.snapshot()["calls"] == 1


# -- hooks ---------------------------------------------------------------------------------

def test_hooks_on_retry_and_giveup(store):
    faulty, base = store
    faulty.inject("get_file_info", errors.throttle(), times=None)
    fs = retryfs.RetryingFileSystem(faulty, VISIBLE)
    retried: list[RetryEvent] = []
    gave_up: list[RetryEvent] = []
    fs.stats.on_retry(retried.append)
    fs.stats.on_giveup(gave_up.append)
    with pytest.raises(OSError):
        fs.get_file_info(f"{base}/model.pt")
    assert [(e.attempt, e.max_attempts, e.throttled, e.gave_up) for e in retried] == [
        (1, 3, True, False), (2, 3, True, False)]
    assert [e.delay for e in retried] == [0.02, 0.04]
    [last] = gave_up
    assert (last.attempt, last.gave_up, last.reason, last.error_class) == (
        3, True, "no attempts left", "OSError[SLOW_DOWN]")
    assert last.path == f"{base}/model.pt" and isinstance(last.error, OSError)


def test_a_failing_hook_never_fails_the_io(store, caplog):
    faulty, base = store
    faulty.inject("get_file_info", errors.network(), times=1)
    fs = retryfs.RetryingFileSystem(faulty, FAST)

    def broken(event: RetryEvent) -> None:
        raise RuntimeError("telemetry is down")

    fs.stats.on_retry(broken)
    caplog.set_level(logging.WARNING, logger="retryfs")
    assert fs.get_file_info(f"{base}/model.pt").size == 1000
    assert any("raised; ignored" in r.getMessage() and r.exc_info for r in caplog.records)
    fs.stats.remove_hook(broken)
    faulty.inject("get_file_info", errors.network(), times=1)
    caplog.clear()
    fs.get_file_info(f"{base}/model.pt")
    assert not any("raised; ignored" in r.getMessage() for r in caplog.records)


# -- test mode -----------------------------------------------------------------------------

SLOW = RetryPolicy(max_attempts=4, initial_delay=60, max_delay=600, jitter=False,
                   throttle_delay=120, fast_throttle_retries=0)


def test_no_sleep_skips_the_backoff_but_counts_everything(store):
    faulty, base = store
    faulty.inject("get_file_info", errors.throttle(), times=3)
    fs = retryfs.RetryingFileSystem(faulty, SLOW)
    delays: list[float] = []
    fs.stats.on_retry(lambda e: delays.append(e.delay))
    with retryfs.no_sleep():
        with retryfs.no_sleep():  # nestable
            pass
        assert fs.get_file_info(f"{base}/model.pt").size == 1000  # 3 x minutes: at once
    snap = fs.stats.snapshot()
    assert snap["retries"] == 3 and snap["recovered"] == 1 and snap["sleep_seconds"] == 0
    assert delays == [120, 240, 480]  # the throttle schedule it would have slept
    from retryfs.core.engine import sleeping_disabled
    assert not sleeping_disabled()


def test_no_sleep_environment_variable(store, monkeypatch):
    faulty, base = store
    faulty.inject("get_file_info", errors.network(), times=2)
    fs = retryfs.RetryingFileSystem(faulty, SLOW)
    monkeypatch.setenv("RETRYFS_NO_SLEEP", "1")
    assert fs.get_file_info(f"{base}/model.pt").size == 1000
    assert fs.stats.snapshot()["retries"] == 2


def test_no_sleep_covers_every_thread(store):
    faulty, base = store
    faulty.inject("get_file_info", errors.network(), times=4)
    fs = retryfs.RetryingFileSystem(faulty, SLOW.replace(max_attempts=5))
    with retryfs.no_sleep():
        workers = [threading.Thread(target=fs.get_file_info, args=(f"{base}/model.pt",))
                   for _ in range(4)]
        for worker in workers:
            worker.start()
        for worker in workers:
            worker.join(timeout=30)
    assert fs.stats.snapshot()["calls"] == 4


# -- Prometheus ------------------------------------------------------------------------------

def _scrape(registry) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    text = generate_latest(registry).decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def test_prometheus_exporter_is_scraped(store):
    from prometheus_client import CollectorRegistry, generate_latest

    from retryfs.core.exporters import PrometheusCollector

    faulty, base = store
    faulty.inject("get_file_info", errors.throttle(), times=2)
    faulty.inject("write", errors.network("UploadPart"), times=1)
    fs = retryfs.RetryingFileSystem(faulty, FAST)
    registry = CollectorRegistry()
    PrometheusCollector(fs, registry=registry)

    fs.get_file_info(f"{base}/model.pt")
    with fs.open_output_stream(f"{base}/out.bin") as out:
        out.write(b"z" * 100)
    faulty.inject("get_file_info", errors.network(), times=None)
    with pytest.raises(OSError):
        fs.get_file_info(f"{base}/model.pt")

    samples = _scrape(registry)
    gfi = (("operation", "get_file_info"),)
    assert samples[("retryfs_calls_total", gfi)] == 2
    assert samples[("retryfs_attempts_total", gfi)] == 3 + 4
    assert samples[("retryfs_recovered_total", gfi)] == 1
    assert samples[("retryfs_throttled_total", gfi)] == 2
    assert samples[("retryfs_retries_total", (("error", "OSError[SLOW_DOWN]"), *gfi))] == 2
    assert samples[("retryfs_retries_total",
                    (("error", "OSError[NETWORK_CONNECTION]"), *gfi))] == 3
    assert samples[("retryfs_giveups_total",
                    (("error", "OSError[NETWORK_CONNECTION]"), *gfi))] == 1
    assert samples[("retryfs_replayed_bytes_total", (("operation", "write"),))] == 100
    assert samples[("retryfs_sleep_seconds_total", gfi)] > 0
    assert any(name == "retryfs_budget_available_tokens" for name, _ in samples)
    text = generate_latest(registry).decode()
    assert "ckpt" not in text and str(base) not in text  # no paths in labels
    assert "# TYPE retryfs_retries_total counter" in text


def test_prometheus_names_several_filesystems_and_defaults_to_all(store):
    from prometheus_client import CollectorRegistry

    from retryfs.core.exporters import PrometheusCollector

    faulty, base = store
    faulty.inject("get_file_info", errors.network(), times=1)
    ckpt = retryfs.RetryingFileSystem(faulty, FAST)
    data = retryfs.RetryingFileSystem(pafs.LocalFileSystem(), FAST)
    ckpt.get_file_info(f"{base}/model.pt")
    data.get_file_info(f"{base}/model.pt")

    named = CollectorRegistry()
    PrometheusCollector({"ckpt": ckpt, "data": data.stats}, registry=named)
    samples = _scrape(named)
    assert samples[("retryfs_retries_total", (("error", "OSError[NETWORK_CONNECTION]"),
                                              ("filesystem", "ckpt"),
                                              ("operation", "get_file_info")))] == 1
    assert samples[("retryfs_calls_total", (("filesystem", "data"),
                                            ("operation", "get_file_info")))] == 1

    everything = CollectorRegistry()
    PrometheusCollector(registry=everything, budgets=False)
    totals = _scrape(everything)
    assert totals[("retryfs_calls_total", (("operation", "get_file_info"),))] >= 2
    assert not any(name.startswith("retryfs_budget_available") for name, _ in totals)


# -- Ray --------------------------------------------------------------------------------------

class _FakeMetric:
    def __init__(self, name, description="", tag_keys=()):
        self.name, self.tag_keys = name, tuple(tag_keys)
        self.values: dict[tuple[tuple[str, str], ...], float] = {}

    def _key(self, tags):
        assert set(tags) == set(self.tag_keys), (tags, self.tag_keys)  # what Ray checks
        return tuple(sorted(tags.items()))

    def inc(self, value=1.0, tags=None):
        assert value > 0  # Ray refuses non-positive increments
        key = self._key(tags)
        self.values[key] = self.values.get(key, 0) + value

    def set(self, value, tags=None):
        self.values[self._key(tags)] = value


class _FakeRayMetrics:
    def __init__(self):
        self.made: dict[str, _FakeMetric] = {}

    def Counter(self, name, description="", tag_keys=()):  # noqa: N802 - Ray's names
        self.made[name] = _FakeMetric(name, description, tag_keys)
        return self.made[name]

    Gauge = Counter


def test_ray_exporter_pushes_exact_increments(store):
    from retryfs.core.exporters import RayMetricsExporter

    faulty, base = store
    fs = retryfs.RetryingFileSystem(faulty, FAST)
    metrics = _FakeRayMetrics()
    exporter = RayMetricsExporter(fs, metrics=metrics)
    faulty.inject("get_file_info", errors.throttle(), times=2)
    fs.get_file_info(f"{base}/model.pt")
    exporter.flush()
    assert exporter.flush() == 0  # nothing new: nothing pushed
    retries = metrics.made["retryfs_retries"].values
    key = (("error", "OSError[SLOW_DOWN]"), ("operation", "get_file_info"))
    assert retries[key] == 2
    assert metrics.made["retryfs_calls"].values[(("operation", "get_file_info"),)] == 1

    fs.get_file_info(f"{base}/model.pt")
    fs.stats.reset()  # a reset between two flushes: counting goes on from zero
    faulty.inject("get_file_info", errors.throttle(), times=1)
    fs.get_file_info(f"{base}/model.pt")
    exporter.flush()
    assert retries[key] == 3
    assert metrics.made["retryfs_calls"].values[(("operation", "get_file_info"),)] == 2


def test_ray_exporter_starts_inside_ray_and_uses_the_real_api(tmp_path):
    """In a Ray task, the first RetryStats starts the exporter, which feeds ray.util.metrics."""
    ray = require("ray")
    import ray_helpers

    with contextlib.ExitStack() as stack:
        if not ray.is_initialized():  # a local Ray of its own, leaving nothing in the temp dir
            stack.enter_context(ray_helpers.ray_session(
                num_cpus=1, runtime_env={"env_vars": {"RETRYFS_RAY_METRICS_INTERVAL": "3600"}}))
        @ray.remote
        def task(path: str) -> tuple[bool, int, int]:
            import pyarrow.fs as pafs

            import retryfs
            from retryfs.core.exporters import ray_exporter
            from retryfs.testing import FaultyFileSystem, errors

            faulty = FaultyFileSystem(pafs.LocalFileSystem())
            faulty.inject("get_file_info", errors.throttle(), times=2)
            fs = retryfs.RetryingFileSystem(faulty, retryfs.RetryPolicy(
                max_attempts=3, initial_delay=0.001, max_delay=0.002))
            fs.get_file_info(path)
            exporter = ray_exporter()
            if exporter is None:
                return False, 0, 0
            return True, exporter.flush(), exporter.flush()

        path = str(tmp_path / "f")
        with open(path, "wb") as f:
            f.write(b"x")
        running, pushed, again = ray.get(task.remote(path), timeout=120)
        # the off switch, in a worker of the same running Ray (where it would start otherwise)
        off = task.options(runtime_env={"env_vars": {"RETRYFS_RAY_METRICS": "0",
                                                     "RETRYFS_RAY_METRICS_INTERVAL": "3600"}})
        switched_off = ray.get(off.remote(path), timeout=120)
    assert running
    assert pushed >= 4  # calls, attempts, recovered, throttled, sleep, retries[error]
    assert again == 0
    assert switched_off == (False, 0, 0)  # RETRYFS_RAY_METRICS=0: no exporter in that worker

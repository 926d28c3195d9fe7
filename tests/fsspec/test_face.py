"""The fsspec face: the ``retry`` protocol, its files, its async side, its conversions.

In-process faults come from `StoreFS`, a tiny object store with real fsspec buffered files
(commit at close, like s3fs); real faults from the S3 fault endpoint under s3fs (moto behind a
WSGI layer that answers 500/503, resets, truncates).
"""

from __future__ import annotations

import asyncio
import io
import os
import pickle
import subprocess
import sys
import textwrap
import threading
from collections import Counter, defaultdict

import fsspec
import pyarrow.fs as pafs
import pytest
from fsspec.asyn import AsyncFileSystem
from fsspec.implementations.memory import MemoryFileSystem
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

import retryfs
from retryfs import RetryingFileSystem, RetryPolicy, RetryStats
from retryfs.core.proof import multipart_etag
from retryfs.fsspec.filesystem import AsyncRetryFileSystem, RetryFileSystem
from retryfs.testing.s3 import ACCESS_KEY, SECRET_KEY, S3Fault

FAST = RetryPolicy(max_attempts=4, initial_delay=0.0, max_delay=0.0, jitter=False)


pytestmark = pytest.mark.usefixtures("clean_retryfs_env")


def reset():
    return ConnectionResetError(104, "Connection reset by peer")


# -- a tiny object store with fsspec buffered files and faults ----------------------------------

class StoreFile(AbstractBufferedFile):
    """Buffered like s3fs: parts go up as the buffer fills, the object appears at close."""

    def _initiate_upload(self):
        self.fs.hit("initiate")
        self.parts = []

    def _upload_chunk(self, final=False):
        self.fs.hit("upload")
        self.parts.append(self.buffer.getvalue())
        if final and self.autocommit:
            self.commit()
        return True

    def commit(self):
        self.fs.hit("commit")
        self.fs.objects[self.path] = b"".join(self.parts)

    def discard(self):
        self.fs.discarded += 1
        self.parts = None

    def _fetch_range(self, start, end):
        self.fs.hit("fetch")
        return self.fs.objects[self.path][start:end]


class StoreFS(AbstractFileSystem):
    """Objects in a dict, directories implied by keys; ``fail(op, *errors)`` queues faults."""

    protocol = "teststore"
    root_marker = ""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self.objects: dict[str, bytes] = {}
        self.faults: dict[str, list[BaseException]] = defaultdict(list)
        self.calls: Counter[str] = Counter()
        self.discarded = 0

    @classmethod
    def _strip_protocol(cls, path):
        path = super()._strip_protocol(path)
        return path.lstrip("/")

    def fail(self, operation, *errors):
        self.faults[operation].extend(errors)

    def hit(self, operation):
        self.calls[operation] += 1
        if self.faults[operation]:
            raise self.faults[operation].pop(0)

    def info(self, path, **kwargs):
        self.hit("info")
        path = self._strip_protocol(path)
        if path in self.objects:
            return {"name": path, "size": len(self.objects[path]), "type": "file"}
        if any(key.startswith(path + "/") for key in self.objects) or path == "":
            return {"name": path, "size": 0, "type": "directory"}
        raise FileNotFoundError(path)

    def ls(self, path, detail=True, **kwargs):
        self.hit("ls")
        path = self._strip_protocol(path)
        prefix = path + "/" if path else ""
        names = sorted({prefix + key[len(prefix):].split("/")[0] for key in self.objects
                        if key.startswith(prefix)})
        if not names:
            if path in self.objects:
                names = [path]
            else:
                raise FileNotFoundError(path)
        infos = [self.info(name) for name in names]
        return infos if detail else [i["name"] for i in infos]

    def cat_file(self, path, start=None, end=None, **kwargs):
        self.hit("cat_file")
        try:
            return self.objects[self._strip_protocol(path)][start:end]
        except KeyError:
            raise FileNotFoundError(path) from None

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        self.hit("pipe_file")
        self.objects[self._strip_protocol(path)] = bytes(value)

    def rm_file(self, path):
        self.hit("rm_file.before")
        try:
            del self.objects[self._strip_protocol(path)]
        except KeyError:
            raise FileNotFoundError(path) from None
        self.hit("rm_file.after")  # the delete happened, then the answer was lost

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None,
              **kwargs):
        self.hit("open")
        return StoreFile(self, self._strip_protocol(path), mode, block_size=block_size or 64,
                         autocommit=autocommit, cache_type="none")

    def tag(self, path, value):
        """A method only this backend has."""
        self.hit("tag")
        return f"{path}:{value}"


def wrap(inner, **options):
    options.setdefault("policy", FAST)
    return fsspec.filesystem("retry", fs=inner, skip_instance_cache=True, **options)


@pytest.fixture
def store():
    return StoreFS(skip_instance_cache=True)


# -- registration and construction --------------------------------------------------------------

def test_protocol_works_in_a_fresh_interpreter_without_importing_retryfs():
    code = textwrap.dedent("""
        import sys, fsspec
        assert "retryfs" not in sys.modules
        fs = fsspec.filesystem("retry", target_protocol="memory", max_attempts=3)
        fs.pipe("/x/y", b"ok")
        print(type(fs).__module__, type(fs).__name__, fs.policy.max_attempts, fs.cat("/x/y"))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True)
    assert out.stdout.split() == ["retryfs.fsspec.filesystem", "RetryFileSystem", "3", "b'ok'"]


def test_options_configure_the_policy_and_strings_parse(store):
    fs = wrap(store, policy=None, max_attempts="7", initial_delay=0.25, jitter="false",
              write_max_attempts=20, delete_deadline="3")
    assert fs.policy == RetryPolicy(max_attempts=7, initial_delay=0.25, jitter=False)
    assert fs._policy_for("pipe_file").max_attempts == 20
    assert fs._policy_for("write").max_attempts == 20  # file I/O is in the write group
    assert fs._policy_for("info").max_attempts == 7
    assert fs._policy_for("rm").deadline == 3.0
    assert fs._policy_for("rm").initial_delay == 0.25  # a group override keeps the base fields


def test_a_policy_per_method_names_the_face_s_methods_and_the_wrapped_filesystem_s(store):
    """``per_operation`` keys are this face's operation names (fsspec's methods) and the
    methods only the wrapped filesystem has, in code and in a ``retry::`` URL's options."""
    fs = wrap(store, max_attempts=3, per_operation={"cat_file": {"max_attempts": 9},
                                                    "pipe_file": RetryPolicy(max_attempts=5)})
    assert fs._policy_for("cat_file").max_attempts == 9
    assert fs._policy_for("pipe_file").max_attempts == 5
    assert fs._policy_for("info").max_attempts == 3
    # the pyarrow face of the same settings: those names apply on this face, not refused there
    assert fs.to_arrow().retry_config.per_operation["cat_file"].max_attempts == 9
    with pytest.raises(ValueError, match="per_operation key 'cat_file'"):
        RetryingFileSystem(pafs.LocalFileSystem(), per_operation={"cat_file": {}})
    url, _ = fsspec.core.url_to_fs("retry::memory://b/x", retry={
        "per_operation": {"cat_file": {"max_attempts": 4}}, "skip_instance_cache": True})
    assert url._policy_for("cat_file").max_attempts == 4
    store.get_tags = lambda path: {}  # a method only this wrapped filesystem has
    assert wrap(store, per_operation={"get_tags": {"max_attempts": 6}})._policy_for(
        "get_tags").max_attempts == 6


def test_an_unknown_option_is_named_with_the_valid_ones(store):
    with pytest.raises(ValueError) as info:
        wrap(store, max_atempts=3)
    message = str(info.value)
    assert "'max_atempts'" in message and "max_attempts" in message
    assert "write_max_attempts" in message and "verify_writes" in message
    with pytest.raises(ValueError, match="max_attempts.*integer >= 1"):
        wrap(store, max_attempts="many")
    with pytest.raises(ValueError, match="per_operation key 'nonsense'"):
        wrap(store, per_operation={"nonsense": {"max_attempts": 2}})


def test_structured_options_from_code(store):
    from retryfs import RetryBudget

    fs = wrap(store, budget=RetryBudget(capacity=50), timeout={"metadata": 2.0},
              retryable_messages=["flaky | backend"], verify_writes=False)
    assert fs.budget == RetryBudget(capacity=50) and fs.retrier.budget is not None
    assert fs._timeouts["info"] == 2.0 and "cat_file" not in fs._timeouts
    assert fs.classifier.retryable_messages == ("flaky | backend",)  # a list is not split
    assert fs.verify_writes is False
    assert wrap(store, budget="false").retrier.budget is None
    store.fail("info", RuntimeError("flaky | backend says no"))
    store.objects["m/f"] = b"1"
    assert fs.info("m/f")["size"] == 1  # the extra text made it transient
    with pytest.raises(ValueError, match="only reads and metadata"):
        wrap(store, timeout={"write": 1})


def test_target_protocol_and_options_like_simplecache():
    fs = fsspec.filesystem("retry", target_protocol="memory",
                           target_options={"global_store": False, "skip_instance_cache": True},
                           policy=FAST,
                           skip_instance_cache=True)
    assert isinstance(fs.fs, MemoryFileSystem) and fs.fs.store == {}
    fs.pipe("/a", b"1")
    assert fs.fs.store["/a"].getvalue() == b"1"
    with pytest.raises(ValueError, match="either fs or target_protocol"):
        fsspec.filesystem("retry", fs=fs.fs, target_protocol="memory")


def test_environment_and_fsspec_config_set_defaults(store, monkeypatch):
    monkeypatch.setenv("RETRYFS_MAX_ATTEMPTS", "6")
    monkeypatch.setenv("RETRYFS_READ_MAX_DELAY", "2.5")
    fs = wrap(store, policy=None)
    assert fs.policy.max_attempts == 6
    assert fs._policy_for("cat_file").max_delay == 2.5
    assert wrap(store, policy=None, max_attempts=2).policy.max_attempts == 2  # option beats env
    monkeypatch.setitem(fsspec.config.conf, "retry", {"max_attempts": "9"})  # FSSPEC_RETRY_*
    assert wrap(store, policy=None).policy.max_attempts == 9
    monkeypatch.setenv("RETRYFS_MAX_DELAY", "soon")
    with pytest.raises(ValueError, match="RETRYFS_MAX_DELAY"):
        wrap(store, policy=None)


def test_chained_url_with_per_protocol_options():
    MemoryFileSystem.store.pop("/chained/file", None)
    with fsspec.open("retry::memory://chained/file", "wb", retry={"max_attempts": 5}) as f:
        f.write(b"through the chain")
    fs, path = fsspec.core.url_to_fs("retry::memory://chained/file", retry={"max_attempts": 5})
    assert isinstance(fs, RetryFileSystem) and fs.policy.max_attempts == 5
    assert isinstance(fs.fs, MemoryFileSystem)
    assert path == "/chained/file"
    assert fs.cat(path) == b"through the chain"
    with fsspec.open("retry::memory://chained/file", "rb") as f:
        assert f.read() == b"through the chain"
    with pytest.raises(ValueError, match="unknown retry option 'max_atempts'"):
        fsspec.open("retry::memory://chained/file", retry={"max_atempts": 5}).open()


# -- retrying calls -------------------------------------------------------------------------------

def test_transient_errors_are_retried_and_counted(store):
    store.objects["d/f"] = b"payload"
    store.fail("cat_file", reset(), TimeoutError("timed out"))
    fs = wrap(store)
    assert fs.cat_file("d/f") == b"payload"
    assert store.calls["cat_file"] == 3
    snap = fs.stats.snapshot()["by_operation"]["cat_file"]
    assert (snap["calls"], snap["attempts"], snap["retries"], snap["recovered"]) == (1, 3, 2, 1)


def test_permanent_errors_are_raised_at_once_unchanged(store):
    error = PermissionError(13, "Access Denied")
    store.fail("info", error)
    fs = wrap(store)
    with pytest.raises(PermissionError) as info:
        fs.info("d/f")
    assert info.value is error and store.calls["info"] == 1
    with pytest.raises(FileNotFoundError):
        fs.cat_file("missing")
    assert store.calls["cat_file"] == 1


def test_giving_up_raises_the_last_error_with_a_note(store):
    store.fail("info", *[reset() for _ in range(4)])
    fs = wrap(store)
    with pytest.raises(ConnectionResetError) as info:
        fs.info("d/f")
    assert store.calls["info"] == 4
    assert any("gave up after 4 attempt(s)" in note for note in info.value.__notes__)
    assert fs.stats.snapshot()["giveups"] == 1


def test_keyword_paths_do_not_collide_with_the_engine(store):
    store.fail("pipe_file", reset())
    fs = wrap(store)
    fs.pipe_file(path="k/w", value=b"v")  # path= and value= as keywords
    assert store.objects["k/w"] == b"v"


def test_backend_specific_methods_are_forwarded_and_retried(store):
    store.fail("tag", reset())
    fs = wrap(store)
    assert fs.tag("a/b", value=3) == "a/b:3"
    assert store.calls["tag"] == 2
    assert fs.objects is store.objects  # plain attributes are forwarded as they are
    with pytest.raises(AttributeError):
        fs.no_such_method()


def test_bulk_operations_retry_each_item_not_the_whole(store, tmp_path):
    # StoreFS inherits fsspec's generic put/get/cat: they run on the wrapper, per file
    for i in range(5):
        (tmp_path / f"f{i}").write_bytes(b"x" * (i + 1))
    store.fail("upload", reset())  # the first file's upload fails once
    fs = wrap(store)
    fs.put(str(tmp_path), "up", recursive=True)
    assert sorted(store.objects) == [f"up/f{i}" for i in range(5)]
    assert store.calls["upload"] == 6  # five uploads and one retry, not ten
    # each upload proven by reading it back (the store shows no ETag, no MD5: retryfs.core.proof)
    assert store.calls["cat_file"] == 5
    store.fail("cat_file", reset())
    assert fs.cat([f"up/f{i}" for i in range(5)]) == {
        f"up/f{i}": b"x" * (i + 1) for i in range(5)}
    assert store.calls["cat_file"] == 5 + 6  # five reads and one retry


def test_a_delete_whose_answer_was_lost_is_reconciled(store):
    store.objects["gone/f"] = b"x"
    store.fail("rm_file.after", reset())  # deleted, but the caller sees a reset
    fs = wrap(store)
    fs.rm_file("gone/f")  # the retry finds nothing: the first attempt did it
    assert "gone/f" not in store.objects
    assert fs.stats.snapshot()["by_operation"]["rm_file"]["recovered"] == 1


def test_generators_are_retried_until_their_first_item():
    class WalkFS(MemoryFileSystem):
        failures = 2

        def walk(self, path, *args, **kwargs):
            if WalkFS.failures:
                WalkFS.failures -= 1
                raise reset()
            yield from super().walk(path, *args, **kwargs)

    inner = WalkFS(global_store=False, skip_instance_cache=True)
    inner.pipe("/w/a/b", b"1")
    fs = wrap(inner)
    assert [root for root, _, _ in fs.walk("/w")] == ["/w", "/w/a"]
    assert fs.stats.snapshot()["by_operation"]["walk"]["retries"] == 2


def test_per_attempt_timeouts_on_metadata_calls(store):
    slow = {"left": 1}
    hung, released = threading.Event(), threading.Event()
    original = store.info

    def sometimes_slow(path, **kwargs):
        if slow["left"]:
            slow["left"] -= 1
            hung.set()
            released.wait(30)  # hangs until the test lets it go
        return original(path, **kwargs)

    store.info = sometimes_slow
    store.objects["t/f"] = b"1"
    fs = wrap(store, timeout=0.1)
    try:
        assert fs.info("t/f")["size"] == 1
        # the answer came while the first attempt still hung: it was abandoned, not awaited
        assert hung.is_set() and not released.is_set()
    finally:
        released.set()
    assert fs.stats.snapshot()["timeouts"] == 1


# -- files ----------------------------------------------------------------------------------------

def test_a_buffered_upload_that_fails_at_close_is_replayed_into_a_fresh_file(store):
    data = bytes(range(256)) * 3  # several 64-byte parts
    # Without the wrapper: the failed close cannot be redone, nothing lands.
    store.fail("commit", reset())
    raw = store.open("raw/obj", "wb")
    raw.write(data)
    with pytest.raises(ConnectionResetError):
        raw.close()
    raw.close()  # fsspec: a second close does nothing, the object is lost
    assert "raw/obj" not in store.objects
    # With it: a fresh upload gets every byte.
    store.fail("commit", reset())
    fs = wrap(store)
    with fs.open("wrapped/obj", "wb") as f:
        for start in range(0, len(data), 100):
            f.write(data[start:start + 100])
    assert store.objects["wrapped/obj"] == data
    assert store.discarded == 1  # the broken upload was discarded, never committed
    snap = fs.stats.snapshot()
    assert snap["by_operation"]["close"]["recovered"] == 1
    assert snap["bytes_replayed"] == len(data)


def test_a_failed_part_upload_mid_stream_is_replayed(store):
    data = os.urandom(1000)
    fs = wrap(store)
    f = fs.open("mid/obj", "wb")
    f.write(data[:300])  # parts 1-4 go up
    store.fail("upload", reset())
    f.write(data[300:])  # the next part fails: fresh upload, replay, go on
    f.close()
    assert store.objects["mid/obj"] == data
    assert store.faults["upload"] == []  # the reset was raised
    assert fs.stats.snapshot()["by_operation"]["write"]["recovered"] == 1


def test_reads_resume_at_the_same_offset(store):
    data = os.urandom(500)
    store.objects["r/obj"] = data
    fs = wrap(store)
    with fs.open("r/obj", "rb", block_size=64) as f:
        assert f.size == 500 and f.readable() and f.seekable()
        first = f.read(100)
        store.fail("fetch", reset(), reset())
        rest = f.read()
        f.seek(-10, io.SEEK_END)
        tail = f.read()
    assert first + rest == data and tail == data[-10:]
    assert fs.stats.snapshot()["by_operation"]["read"]["retries"] == 2


def test_text_mode_lines_and_iteration(store):
    fs = wrap(store)
    with fs.open("t/lines.txt", "w") as f:
        f.write("one\ntwo\nthree\n")
    assert store.objects["t/lines.txt"] == b"one\ntwo\nthree\n"
    with fs.open("t/lines.txt", "rb") as f:
        assert f.readline() == b"one\n"
        assert list(f) == [b"two\n", b"three\n"]
    with fs.open("t/lines.txt", "r") as f:
        assert f.readlines() == ["one\n", "two\n", "three\n"]


def test_written_objects_are_verified(store):
    class LosingStoreFS(StoreFS):
        lose = 1

        def info(self, path, **kwargs):
            if LosingStoreFS.lose and path == "v/obj":  # the commit answered OK, nothing landed
                LosingStoreFS.lose -= 1
                self.objects.pop("v/obj", None)
            return super().info(path, **kwargs)

    inner = LosingStoreFS(skip_instance_cache=True)
    fs = wrap(inner)
    with fs.open("v/obj", "wb") as f:
        f.write(b"must land")
    assert inner.objects["v/obj"] == b"must land"
    assert inner.calls["commit"] == 2
    unverified = wrap(StoreFS(skip_instance_cache=True), verify_writes="false")
    with unverified.open("v/obj", "wb") as f:
        f.write(b"x")
    assert unverified.fs.calls["info"] == 0


def test_transactions_commit_at_the_end(tmp_path):
    fs = wrap(fsspec.filesystem("file"))
    target = str(tmp_path / "in-transaction")
    with fs.transaction:
        with fs.open(target, "wb") as f:
            f.write(b"later")
        assert not os.path.exists(target)
    assert open(target, "rb").read() == b"later"


def test_local_files_through_the_wrapper(tmp_path):
    fs = wrap(fsspec.filesystem("file"))
    path = str(tmp_path / "sub" / "file.bin")
    fs.makedirs(str(tmp_path / "sub"), exist_ok=True)
    with fs.open(path, "wb") as f:
        f.write(b"abc")
    with fs.open(path, "ab") as f:  # appends: only the open is retried
        f.write(b"def")
    assert fs.cat_file(path) == b"abcdef"
    with fs.open(path, "rb") as f:
        f.seek(2)
        assert f.read(2) == b"cd" and f.tell() == 4
        assert f.info()["size"] == 6


# -- identity, pickling, pyarrow ------------------------------------------------------------------

def test_pickling_keeps_type_and_configuration():
    stats = RetryStats()
    fs = fsspec.filesystem("retry", target_protocol="memory", policy=FAST, stats=stats,
                           write_max_attempts=9, skip_instance_cache=True)
    clone = pickle.loads(pickle.dumps(fs))
    assert type(clone) is RetryFileSystem
    assert clone.policy == FAST and clone._policy_for("pipe_file").max_attempts == 9
    assert isinstance(clone.fs, MemoryFileSystem)


def test_to_arrow_and_back_keep_the_configuration(tmp_path):
    fs = wrap(fsspec.filesystem("file"), read_max_attempts=7)
    arrow = fs.to_arrow()
    assert isinstance(arrow, RetryingFileSystem) and isinstance(arrow, pafs.FileSystem)
    assert arrow.policy == fs.policy and arrow.stats is fs.stats
    assert arrow.retry_handler.policy_for("open_input_file").max_attempts == 7
    path = str(tmp_path / "via-arrow")
    with arrow.open_output_stream(path) as out:
        out.write(b"arrow")
    assert fs.cat_file(path) == b"arrow"
    back = RetryFileSystem.from_arrow(arrow)
    assert back.policy == fs.policy and back.stats is fs.stats
    assert back._policy_for("cat_file").max_attempts == 7
    assert back.cat_file(path) == b"arrow"
    # a plain pyarrow filesystem is adapted
    plain = fsspec.filesystem("retry", fs=pafs.LocalFileSystem(), policy=FAST,
                              skip_instance_cache=True)
    assert plain.cat_file(path) == b"arrow"


def test_a_wrapper_of_an_object_is_never_a_cached_one_that_prints_alike():
    # fsspec's instance cache keys arguments by their str: two retryfs wrappers of the same
    # (cached) fsspec filesystem print alike, so from_arrow handed back the first one's face,
    # around the first wrapper and counting into its stats
    inner = fsspec.filesystem("file")
    first, second = (RetryingFileSystem(inner, policy=FAST) for _ in range(2))
    assert repr(first) == repr(second)
    faces = [RetryFileSystem.from_arrow(w) for w in (first, second)]
    assert faces[0] is not faces[1]
    assert faces[0].stats is first.stats and faces[1].stats is second.stats
    # a wrapper built from a protocol and its options is still fsspec's cached instance
    by_name = [fsspec.filesystem("retry", target_protocol="memory", policy=FAST)
               for _ in range(2)]
    assert by_name[0] is by_name[1]


def test_every_path_of_a_chained_url_shares_one_wrapper_and_one_client(s3_fault_endpoint,
                                                                          s3_fault_bucket):
    """``url_to_fs`` passes a chained filesystem the URL it was opened with (``fo``); keyed by
    it, each checkpoint directory built a wrapper and an s3fs client of its own: a botocore
    session and its service model read again for every DCP save, connections opened again."""
    ep = s3_fault_endpoint
    s3 = {"key": "testing", "secret": "testing", "endpoint_url": ep.url,
          "client_kwargs": {"region_name": ep.region}}
    retry = {"max_attempts": 3, "initial_delay": 0.001}
    first, _ = fsspec.core.url_to_fs(f"retry::s3://{s3_fault_bucket}/ckpt/step-100",
                                     s3=s3, retry=retry)
    second, path = fsspec.core.url_to_fs(f"retry::s3://{s3_fault_bucket}/ckpt/step-200",
                                         s3=s3, retry=retry)
    assert second is first and second.fs is first.fs
    assert path == f"{s3_fault_bucket}/ckpt/step-200"
    second.pipe_file(path + "/x", b"1")
    assert first.cat_file(f"retry::s3://{s3_fault_bucket}/ckpt/step-200/x") == b"1"
    other, _ = fsspec.core.url_to_fs(f"retry::s3://{s3_fault_bucket}/ckpt/step-300",
                                     s3=s3, retry={**retry, "max_attempts": 4})
    assert other is not first  # other settings: another wrapper


def test_repr_names_the_backend_and_policy(store):
    text = repr(wrap(store))
    assert "StoreFS" in text and "max_attempts=4" in text


# -- s3fs on the S3 fault endpoint: real faults, sync and async ----------------------------------

@pytest.fixture
def s3(s3_fault_endpoint, s3_fault_bucket):
    return s3_fault_endpoint, s3_fault_bucket


def test_s3fs_wrapper_is_async_and_retries_real_faults(s3):
    ep, bucket = s3
    inner = ep.s3fs()
    fs = wrap(inner)
    assert isinstance(fs, AsyncRetryFileSystem) and isinstance(fs, AsyncFileSystem)
    assert fs.async_impl and not fs.asynchronous and fs.loop is inner.loop
    ep.add_fault(S3Fault.internal_error(op="PutObject", times=2))
    fs.pipe_file(f"{bucket}/a", b"data")
    ep.add_fault(S3Fault.service_unavailable(op="HeadObject", times=1))
    assert fs.info(f"{bucket}/a")["size"] == 4
    ep.add_fault(S3Fault.internal_error(op="GetObject", times=1))
    assert fs.cat_file(f"{bucket}/a") == b"data"
    assert ep.counts()["PutObject"] == 3 and ep.counts()["GetObject"] == 2
    by_op = fs.stats.snapshot()["by_operation"]
    assert by_op["pipe_file"]["retries"] == 2 and by_op["cat_file"]["retries"] == 1
    ep.add_fault(S3Fault.access_denied(op="GetObject"))
    with pytest.raises(PermissionError):
        fs.cat_file(f"{bucket}/a")
    assert ep.counts()["GetObject"] == 3  # permanent: one attempt


def test_s3fs_commit_failing_at_close_is_retried_in_place(s3):
    ep, bucket = s3
    inner = ep.s3fs()
    data = os.urandom(3000)
    alone = ep.add_fault(S3Fault.internal_error(op="PutObject", times=1))
    with pytest.raises(OSError):  # s3fs alone: the object is lost
        with inner.open(f"{bucket}/raw", "wb") as f:
            f.write(data)
    assert not ep.keys(bucket)
    assert ep.fired(alone) == 1
    fs = wrap(inner)
    wrapped = ep.add_fault(S3Fault.internal_error(op="PutObject", times=1))
    ep.reset_record()
    with fs.open(f"{bucket}/obj", "wb") as f:
        f.write(data)
    assert ep.get_object(bucket, "obj") == data
    assert ep.fired(wrapped) == 1
    assert ep.counts()["PutObject"] == 2  # the failed PUT, sent again: nothing else
    by_op = fs.stats.snapshot()["by_operation"]
    assert (by_op["commit"]["retries"], by_op["close"]["retries"]) == (1, 0)  # no replay


def test_s3fs_multipart_upload_failing_mid_stream_and_at_commit(s3):
    ep, bucket = s3
    fs = wrap(ep.s3fs())
    data = os.urandom(11 * 1024 * 1024)  # two 5 MiB parts and a remainder
    part = ep.add_fault(S3Fault.internal_error(op="UploadPart", query={"partNumber": 2}, times=1))
    commit = ep.add_fault(S3Fault.error_in_200(times=1))  # CompleteMultipartUpload: 200 <Error>
    with fs.open(f"{bucket}/big", "wb", block_size=5 * 1024 * 1024) as f:
        for start in range(0, len(data), 1024 * 1024):
            f.write(data[start:start + 1024 * 1024])
    assert ep.get_object(bucket, "big") == data
    assert (ep.fired(part), ep.fired(commit)) == (1, 1)
    counts = ep.counts()  # each failed request sent again, and nothing else
    assert (counts["UploadPart"], counts["CompleteMultipartUpload"]) == (4, 2)
    assert (counts["CreateMultipartUpload"], counts["AbortMultipartUpload"]) == (1, 0)


@pytest.mark.parametrize("retry_answer", ["the commit again", "NoSuchUpload"])
def test_s3fs_complete_applied_then_lost(s3, retry_answer):
    """The first CompleteMultipartUpload is applied but answered 500. Its retry is answered as
    S3 does: the commit again while the object is the upload's (moto: "idempotent"), or 404
    NoSuchUpload once S3 no longer knows the upload; then the object's ETag is the one the
    parts make (one HEAD), and the commit is done. Either way: no replay."""
    ep, bucket = s3
    fs = wrap(ep.s3fs())
    data = os.urandom(11 * 1024 * 1024)
    ep.reset_record()
    lost = ep.add_fault(S3Fault.internal_error(op="CompleteMultipartUpload", times=1,
                                               applied=True))
    if retry_answer == "NoSuchUpload":
        gone = ep.add_fault(S3Fault.error(404, "NoSuchUpload", "The specified upload does not "
                                          "exist.", op="CompleteMultipartUpload", times=1))
    with fs.open(f"{bucket}/big", "wb", block_size=5 * 1024 * 1024) as f:
        f.write(data)
    assert ep.get_object(bucket, "big") == data
    assert ep.fired(lost) == 1
    counts = ep.counts()
    assert (counts["CompleteMultipartUpload"], counts["UploadPart"]) == (2, 3)  # 5 + 5 + 1 MiB
    assert (counts["CreateMultipartUpload"], counts["AbortMultipartUpload"]) == (1, 0)
    by_op = fs.stats.snapshot()["by_operation"]
    assert by_op["close"]["retries"] == 0 and by_op["commit"]["retries"] == 1  # no replay
    if retry_answer == "NoSuchUpload":
        assert ep.fired(gone) == 1
        assert by_op["verify"]["calls"] >= 1  # the HEAD that settled it


def test_s3fs_complete_whose_upload_vanished_under_another_object_is_replayed(s3):
    """The retried CompleteMultipartUpload finds the upload gone and another object at the key
    (a third party wrote after the lost commit): not proven, so the stream is replayed and
    this write's bytes committed again."""
    ep, bucket = s3
    fs = wrap(ep.s3fs())
    data = os.urandom(11 * 1024 * 1024)
    lost = ep.add_fault(S3Fault.internal_error(op="CompleteMultipartUpload", times=1,
                                               applied=True))
    other = os.urandom(len(data))  # the same size: the size alone would not tell

    def third_party_writes_while_the_commit_waits(seconds):
        if ep.fired(lost) and ep.get_object(bucket, "big") != other:
            ep.put_object(bucket, "big", other)

    fs.retrier.sleep = third_party_writes_while_the_commit_waits
    with fs.open(f"{bucket}/big", "wb", block_size=5 * 1024 * 1024) as f:
        f.write(data)
    assert ep.get_object(bucket, "big") == data
    assert ep.fired(lost) == 1
    counts = ep.counts()
    assert counts["CompleteMultipartUpload"] == 3  # lost, NoSuchUpload, the replay's
    assert counts["CreateMultipartUpload"] == 2  # the replay's upload
    assert fs.stats.snapshot()["by_operation"]["close"]["retries"] == 1


def test_multipart_etag_is_the_etag_s3_gives_the_parts(s3):
    ep, bucket = s3
    fs = wrap(ep.s3fs())
    with fs.open(f"{bucket}/big", "wb", block_size=5 * 1024 * 1024) as f:
        for _ in range(11):
            f.write(os.urandom(1024 * 1024))
        inner = f._last_inner.file
    parts = [part["ETag"] for part in inner.parts]
    assert len(parts) == 3
    assert multipart_etag(parts) == fs.info(f"{bucket}/big")["ETag"].strip('"')
    assert multipart_etag(parts[:2]) != multipart_etag(parts)
    assert multipart_etag(['"not-an-md5"']) is None and multipart_etag([]) is None


def test_s3fs_exclusive_create_keeps_its_own_commit(s3):
    """``xb`` commits with If-None-Match: not retried in place (a retry after an applied commit
    would meet its own object); a failed commit replays the stream, and the object is written."""
    ep, bucket = s3
    fs = wrap(ep.s3fs())
    failed = ep.add_fault(S3Fault.internal_error(op="PutObject", times=1))
    ep.reset_record()
    with fs.open(f"{bucket}/x", "xb") as f:
        f.write(b"once")
    assert ep.get_object(bucket, "x") == b"once"
    assert ep.fired(failed) == 1
    puts = ep.requests(op="PutObject")  # the failed PUT and the replay's: 4 bytes each
    assert [record.request_bytes for record in puts] == [4, 4]
    by_op = fs.stats.snapshot()["by_operation"]
    assert by_op["close"]["retries"] == 1 and "commit" not in by_op


def test_s3fs_reads_resume_after_real_faults(s3):
    ep, bucket = s3
    data = os.urandom(300_000)
    ep.put_object(bucket, "r", data)
    fs = wrap(ep.s3fs())
    with fs.open(f"{bucket}/r", "rb", block_size=100_000, cache_type="none") as f:
        head = f.read(150_000)
        ep.add_fault(S3Fault.internal_error(op="GetObject", times=1))
        rest = f.read()
    assert head + rest == data
    assert fs.stats.snapshot()["by_operation"]["read"]["retries"] == 1


def test_a_failed_s3fs_read_keeps_the_blocks_the_file_holds(s3):
    """A read that failed is retried on the same fsspec file (each of its reads is a ranged GET
    of its own): the blocks it had fetched are not fetched again, and no reopen asks for the
    object's size again. DCP's loads read tensors out of order through such blocks."""
    ep, bucket = s3
    block = 2**20
    data = os.urandom(4 * block)
    ep.put_object(bucket, "r", data)
    fs = wrap(ep.s3fs())
    with fs.open(f"{bucket}/r", "rb", block_size=block, cache_type="blockcache") as f:
        ep.reset_record()
        first = f.read(block)  # block 0
        f.seek(2 * block)
        slowed = ep.add_fault(S3Fault.slow_down(op="GetObject", times=1))
        third = f.read(block)  # block 2: one failed GET, then its retry
        f.seek(0)
        again = f.read(block)  # block 0 again: from the file's blocks
    assert (first, third, again) == (data[:block], data[2 * block:3 * block], data[:block])
    assert ep.fired(slowed) == 1
    counts = ep.counts()
    assert counts["GetObject"] == 3 and counts.get("HeadObject", 0) == 0, counts
    served = [record.response_bytes for record in ep.requests(op="GetObject")
              if record.fault is None]
    assert served == [block, block]  # blocks 0 and 2, each once; the SlowDown only its error
    assert fs.stats.snapshot()["by_operation"]["read"]["retries"] == 1


def test_s3fs_bulk_put_retries_only_the_failed_file(s3, tmp_path):
    ep, bucket = s3
    for i in range(6):
        (tmp_path / f"f{i}").write_bytes(b"%d" % i)
    fs = wrap(ep.s3fs())
    ep.add_fault(S3Fault.internal_error(op="PutObject", path=f"{bucket}/up/f3", times=1))
    fs.put(str(tmp_path), f"{bucket}/up", recursive=True)
    assert sorted(ep.keys(bucket)) == [f"up/f{i}" for i in range(6)]
    assert ep.counts()["PutObject"] == 7  # six files, one retried


def test_s3fs_backend_methods_are_retried(s3):
    ep, bucket = s3
    ep.put_object(bucket, "m", b"1")
    fs = wrap(ep.s3fs())
    ep.add_fault(S3Fault.internal_error(op="HeadObject", times=1))
    head = fs.call_s3("head_object", Bucket=bucket, Key="m")  # s3fs's own method
    assert head["ContentLength"] == 1
    assert ep.counts()["HeadObject"] == 2


def test_chained_s3_url_with_options_per_protocol(s3):
    ep, bucket = s3
    s3_options = {"key": ACCESS_KEY, "secret": SECRET_KEY, "endpoint_url": ep.url,
                  "client_kwargs": {"region_name": ep.region},
                  "config_kwargs": {"retries": {"total_max_attempts": 1, "mode": "standard"}},
                  "skip_instance_cache": True}
    ep.add_fault(S3Fault.internal_error(op="PutObject", times=2))
    with fsspec.open(f"retry::s3://{bucket}/chained", "wb",
                     retry={"max_attempts": 5, "initial_delay": 0, "max_delay": 0},
                     s3=s3_options) as f:
        f.write(b"chained")
    assert ep.get_object(bucket, "chained") == b"chained"
    assert ep.counts()["PutObject"] == 3


def test_async_retries_never_block_the_event_loop(s3, monkeypatch):
    ep, bucket = s3
    policy = RetryPolicy(max_attempts=4, initial_delay=0.1, max_delay=0.1, jitter=False)

    async def main():
        inner = ep.s3fs(asynchronous=True)
        await inner.set_session()
        fs = RetryFileSystem(fs=inner, policy=policy, skip_instance_cache=True)
        assert isinstance(fs, AsyncRetryFileSystem) and fs.asynchronous
        ticks = 0
        done = asyncio.Event()

        async def ticker():
            nonlocal ticks
            while not done.is_set():
                await asyncio.sleep(0.005)
                ticks += 1

        task = asyncio.create_task(ticker())
        ep.add_fault(S3Fault.internal_error(op="PutObject", times=2))
        await fs._pipe_file(f"{bucket}/async", b"async data")
        during = ticks
        done.set()
        await task
        payload = os.urandom(200_000)
        await fs._pipe_file(f"{bucket}/stream", payload)
        ep.add_fault(S3Fault.internal_error(op="GetObject", times=1))  # the first GET: 500
        ep.add_fault(S3Fault.truncate(op="GetObject", keep_bytes=50_000, times=1))  # then cut
        async with await fs.open_async(f"{bucket}/stream") as reader:
            first = await reader.read(10)
            rest = await reader.read()  # dies at 50 000 bytes: goes on with ranged reads
        assert first + rest == payload
        listing = await fs._ls(bucket, detail=False)
        await inner._s3.close()
        return during, listing, fs.stats.snapshot()

    during, listing, snap = asyncio.run(main())
    assert listing == [f"{bucket}/async", f"{bucket}/stream"]
    assert snap["by_operation"]["pipe_file"]["sleep_seconds"] == pytest.approx(0.2)  # 2 waits
    assert during >= 2  # ...while the loop went on running other tasks (a blocking sleep: 0)
    assert snap["by_operation"]["pipe_file"]["retries"] == 2
    assert snap["by_operation"]["read"]["retries"] == 2


def test_public_names():
    assert retryfs.RetryFileSystem is RetryFileSystem
    assert callable(retryfs.from_uri) and callable(retryfs.redact)

"""A success means the destination holds the bytes this call wrote: the cases where it did not.

Each test reproduces, on real servers (moto's S3 through `S3FaultEndpoint`, a local disk), a
call that reported success over the wrong bytes, left something behind, or failed where
unwrapped pyarrow succeeds; each failed before its fix.
"""

import os
import re
import subprocess
import sys

import pyarrow.fs as pafs
import pytest
from _helpers import FAST

import retryfs
from retryfs.core.locations import NAME_MAX, temporary_beside
from retryfs.testing import S3Fault


def _tree(root, names, size):
    os.makedirs(root, exist_ok=True)
    data = {}
    for index, name in enumerate(names):
        data[name] = bytes([index % 251]) * size
        with open(os.path.join(root, name), "wb") as f:
            f.write(data[name])
    return data


# -- a file that grew or shrank since the listing ------------------------------------------------

class _ChangesAfterListing(pafs.FileSystemHandler):
    """A local source whose listing is taken, then ``grow.bin`` grows or shrinks by ``delta``."""

    def __init__(self, delta):
        self.fs = pafs.LocalFileSystem()
        self.delta = delta

    def __eq__(self, other):
        return self is other

    def __ne__(self, other):
        return self is not other

    def get_type_name(self):
        return "changes-after-listing"

    def normalize_path(self, path):
        return path

    def get_file_info(self, paths):
        return self.fs.get_file_info(paths)

    def get_file_info_selector(self, selector):
        infos = self.fs.get_file_info(selector)
        for info in infos:
            if info.path.endswith("grow.bin"):
                with open(info.path, "r+b") as f:
                    if self.delta > 0:
                        f.seek(0, 2)
                        f.write(b"+" * self.delta)
                    else:
                        f.truncate(info.size + self.delta)
        return infos

    def open_input_stream(self, path):
        return self.fs.open_input_stream(path)

    def open_input_file(self, path):
        return self.fs.open_input_file(path)

    def create_dir(self, path, recursive):
        raise NotImplementedError

    def delete_dir(self, path):
        raise NotImplementedError

    def delete_dir_contents(self, path, missing_dir_ok=False):
        raise NotImplementedError

    def delete_root_dir_contents(self):
        raise NotImplementedError

    def delete_file(self, path):
        raise NotImplementedError

    def move(self, src, dest):
        raise NotImplementedError

    def copy_file(self, src, dest):
        raise NotImplementedError

    def open_output_stream(self, path, metadata):
        raise NotImplementedError

    def open_append_stream(self, path, metadata):
        raise NotImplementedError


@pytest.mark.parametrize("size", [1000, 3 << 20], ids=["small", "several_chunks"])
@pytest.mark.parametrize("delta", [700, -700], ids=["grew", "shrank"])
@pytest.mark.parametrize("threads", [False, True], ids=["serial", "threaded"])
def test_a_local_copy_of_a_file_changed_since_its_listing_is_copied_to_its_end(
        tmp_path, size, delta, threads):
    src, dst = tmp_path / "src", tmp_path / "dst"
    _tree(src, ["a.bin", "grow.bin", "z.bin"], size)
    dst.mkdir()
    fs = retryfs.RetryingFileSystem(pafs.LocalFileSystem(), FAST)
    pafs.copy_files(str(src), str(dst), source_filesystem=pafs.PyFileSystem(
        _ChangesAfterListing(delta)), destination_filesystem=fs, use_threads=threads,
        chunk_size=1 << 20)
    for name in ("a.bin", "grow.bin", "z.bin"):  # as unwrapped pyarrow: the file as it is now
        assert (dst / name).read_bytes() == (src / name).read_bytes()
    assert (dst / "grow.bin").stat().st_size == size + delta
    assert fs.stats.snapshot()["retries"] == 0
    assert sorted(os.listdir(dst)) == ["a.bin", "grow.bin", "z.bin"]


# -- the root of a SubTreeFileSystem ---------------------------------------------------------------

def _subtree(kind, tmp_path, endpoint, bucket):
    if kind == "local":
        root = tmp_path / "subtree"
        root.mkdir()
        return pafs.SubTreeFileSystem(str(root), pafs.LocalFileSystem()), None
    if kind == "pyarrow_s3":
        return pafs.SubTreeFileSystem(f"{bucket}/prefix", endpoint.pyarrow_fs()), "prefix/"
    from pyarrow.fs import FSSpecHandler

    handler = FSSpecHandler(endpoint.s3fs())
    return pafs.SubTreeFileSystem(f"{bucket}/prefix", pafs.PyFileSystem(handler)), "prefix/"


@pytest.mark.parametrize("kind", ["local", "pyarrow_s3", "s3fs"])
@pytest.mark.parametrize("destination", ["", "/", "nested/dir"],
                         ids=["empty", "root", "nested"])
def test_a_tree_copy_into_a_subtree_uploads_each_file_once(kind, destination, tmp_path,
                                                           s3_fault_endpoint, s3_fault_bucket):
    data = _tree(tmp_path / "src", ["a.bin", "b.bin"], 4096)
    base, prefix = _subtree(kind, tmp_path, s3_fault_endpoint, s3_fault_bucket)
    fs = retryfs.RetryingFileSystem(base, FAST)
    if destination == "nested/dir":
        fs.create_dir(destination)
    s3_fault_endpoint.reset_record()
    pafs.copy_files(str(tmp_path / "src"), destination, destination_filesystem=fs,
                    use_threads=True)
    assert fs.stats.snapshot()["retries"] == 0
    where = destination.strip("/")
    for name, content in data.items():
        path = f"{where}/{name}" if where else name
        with base.open_input_stream(path) as f:
            assert f.read() == content
    if prefix is not None:  # each file sent once
        puts = s3_fault_endpoint.requests(op=("PutObject", "CreateMultipartUpload"))
        assert sorted(r.key for r in puts if r.key.endswith(".bin")) == sorted(
            f"{prefix}{where + '/' if where else ''}{name}" for name in data)
    # and back: a download into the root of a local subtree
    back = tmp_path / "back"
    back.mkdir()
    local = pafs.SubTreeFileSystem(str(back), pafs.LocalFileSystem())
    pafs.copy_files(where, "", source_filesystem=fs, destination_filesystem=local)
    assert sorted(os.listdir(back)) == sorted(data)


# -- names of 255 bytes ----------------------------------------------------------------------------

LONG_NAMES = ["a" * 255, "字" * 85, "é" * 127]  # 255, 255, 254 bytes


def test_a_temporary_name_stays_within_name_max():
    for name in LONG_NAMES + ["short.bin", "x" * 233, "x" * 234]:
        temporary = temporary_beside(f"/d/{name}", "0123abcd")
        tail = temporary.rsplit("/", 1)[1]
        assert len(tail.encode()) <= NAME_MAX
        assert tail.startswith(".") and tail.endswith(".retryfs-0123abcd.tmp")
        tail.encode().decode()  # whole characters
    assert temporary_beside("/d/short.bin", "t") == "/d/.short.bin.retryfs-t.tmp"
    # two long names that share their first 240 bytes get different temporary names
    assert temporary_beside("/d/" + "a" * 254 + "1", "t") != \
        temporary_beside("/d/" + "a" * 254 + "2", "t")
    # without a tag, a random one of 8 hex digits: two writers of one name get two names
    first, second = temporary_beside("/d/" + "a" * 255), temporary_beside("/d/" + "a" * 255)
    assert first != second and re.fullmatch(r"/d/\..*\.retryfs-[0-9a-f]{8}\.tmp", first)
    assert len(first.rsplit("/", 1)[1].encode()) <= NAME_MAX


@pytest.mark.parametrize("size", [1000, 3 << 20], ids=["small", "several_chunks"])
@pytest.mark.parametrize("threads", [False, True], ids=["serial", "threaded"])
def test_names_of_255_bytes_copy_and_download(tmp_path, size, threads, s3_fault_endpoint,
                                              s3_fault_bucket):
    names = LONG_NAMES + ["z.bin"]
    data = _tree(tmp_path / "src", names, size)
    local = retryfs.RetryingFileSystem(pafs.LocalFileSystem(), FAST)
    (tmp_path / "dst").mkdir()
    pafs.copy_files(str(tmp_path / "src"), str(tmp_path / "dst"), destination_filesystem=local,
                    use_threads=threads, chunk_size=1 << 20)
    assert sorted(os.listdir(tmp_path / "dst")) == sorted(names)
    s3 = retryfs.RetryingFileSystem(s3_fault_endpoint.pyarrow_fs(), FAST)
    pafs.copy_files(str(tmp_path / "src"), f"{s3_fault_bucket}/long",
                    destination_filesystem=s3, use_threads=threads)
    (tmp_path / "down").mkdir()
    pafs.copy_files(f"{s3_fault_bucket}/long", str(tmp_path / "down"), source_filesystem=s3,
                    use_threads=threads, chunk_size=1 << 20)
    for name, content in data.items():
        assert (tmp_path / "dst" / name).read_bytes() == content
        assert (tmp_path / "down" / name).read_bytes() == content
    assert sorted(os.listdir(tmp_path / "down")) == sorted(names)


def test_the_command_copies_names_of_255_bytes(tmp_path):
    names = LONG_NAMES + ["z.bin"]
    data = _tree(tmp_path / "src", names, 2000)
    result = subprocess.run([sys.executable, "-m", "retryfs", "cp", "-r", str(tmp_path / "src"),
                             str(tmp_path / "dst")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert sorted(os.listdir(tmp_path / "dst")) == sorted(names)
    for name, content in data.items():
        assert (tmp_path / "dst" / name).read_bytes() == content


# -- a move that moved nothing -------------------------------------------------------------------

def _third_party_deletes_source(endpoint, bucket, key):
    def delete(request):  # the copy fails before acting; meanwhile the source is deleted
        endpoint._backend.delete_object(bucket, key)
        return True
    return delete


@pytest.mark.parametrize("face", ["pyarrow", "fsspec"])
def test_a_move_whose_source_a_third_party_deleted_is_not_reported_as_done(
        face, s3_fault_endpoint, s3_fault_bucket):
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    ep.put_object(bucket, "src.bin", b"N" * 100)   # the new checkpoint
    ep.put_object(bucket, "dst.bin", b"O" * 100)   # an older one, same size, written after
    ep.add_fault(S3Fault.slow_down(op="CopyObject", times=1,
                                   when=_third_party_deletes_source(ep, bucket, "src.bin")))
    if face == "pyarrow":
        fs = retryfs.RetryingFileSystem(ep.pyarrow_fs(), FAST, budget=False)
        with pytest.raises(OSError, match="NO_SUCH_KEY"):  # the retry's own error, unchanged
            fs.move(f"{bucket}/src.bin", f"{bucket}/dst.bin")
    else:
        from retryfs.fsspec.filesystem import RetryFileSystem

        # pyarrow's S3 through fsspec's ArrowFSWrapper: its mv is one move, reconciled
        fs = RetryFileSystem(fs=ep.pyarrow_fs(), policy=FAST, budget=False)
        with pytest.raises(OSError, match="NO_SUCH_KEY"):
            fs.mv(f"{bucket}/src.bin", f"{bucket}/dst.bin")
    assert len(ep.injected) == 1
    assert ep.get_object(bucket, "dst.bin") == b"O" * 100  # nothing moved, and it says so


@pytest.mark.parametrize("face", ["pyarrow", "fsspec"])
def test_a_move_applied_then_lost_over_an_older_object_is_still_done(
        face, s3_fault_endpoint, s3_fault_bucket):
    # the twin: the move did land (its answer was lost); the destination changed: success
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    ep.put_object(bucket, "dst.bin", b"O" * 100)
    ep.put_object(bucket, "src.bin", b"N" * 101)
    op = "DeleteObject" if face == "pyarrow" else ("DeleteObject", "DeleteObjects")
    ep.add_fault(S3Fault.internal_error(op=op, times=1, applied=True))
    if face == "pyarrow":
        fs = retryfs.RetryingFileSystem(ep.pyarrow_fs(), FAST, budget=False)
        fs.move(f"{bucket}/src.bin", f"{bucket}/dst.bin")
    else:
        from retryfs.fsspec.filesystem import RetryFileSystem

        fs = RetryFileSystem(fs=ep.s3fs(), policy=FAST, budget=False)
        fs.mv(f"{bucket}/src.bin", f"{bucket}/dst.bin")
    assert len(ep.injected) == 1
    assert ep.get_object(bucket, "dst.bin") == b"N" * 101
    assert "src.bin" not in ep.keys(bucket)


# -- a copy of a wrapper is the same filesystem -----------------------------------------------------

def _copies():
    import copy
    import pickle

    import cloudpickle

    return {"pickle": lambda o: pickle.loads(pickle.dumps(o)), "deepcopy": copy.deepcopy,
            "cloudpickle": lambda o: cloudpickle.loads(cloudpickle.dumps(o))}


@pytest.mark.parametrize("how", ["pickle", "deepcopy", "cloudpickle"])
@pytest.mark.parametrize("made", ["target_protocol", "instance", "url", "s3fs_url"])
def test_a_copied_fsspec_wrapper_equals_the_original_and_adds_no_twin_to_the_cache(
        how, made, s3_fault_endpoint):
    import fsspec

    from retryfs.fsspec.filesystem import RetryFileSystem

    if made == "target_protocol":
        fs = fsspec.filesystem("retry", target_protocol="memory", max_attempts=3)
    elif made == "instance":
        fs = fsspec.filesystem("retry", fs=fsspec.filesystem("memory"), max_attempts=3)
    elif made == "url":
        fs = fsspec.core.url_to_fs("retry::memory://x", retry={"max_attempts": 3})[0]
    else:
        options = {"key": "testing", "secret": "testing", "endpoint_url": s3_fault_endpoint.url}
        fs = fsspec.core.url_to_fs("retry::s3://b/k", s3=options, retry={"max_attempts": 3})[0]
    cached = {cls: len(cls._cache) for cls in (type(fs), RetryFileSystem)}
    copied = _copies()[how](fs)
    assert copied == fs and hash(copied) == hash(fs)
    assert copied.retry_config == fs.retry_config and type(copied) is type(fs)
    assert {cls: len(cls._cache) for cls in cached} == cached
    other = fsspec.filesystem("retry", target_protocol="memory", max_attempts=4)
    assert other != fs  # other settings: another filesystem


@pytest.mark.parametrize("how", ["pickle", "deepcopy", "cloudpickle"])
def test_a_copied_pyarrow_wrapper_equals_the_original(how, s3_fault_endpoint):
    fs = retryfs.RetryingFileSystem(s3_fault_endpoint.pyarrow_fs(),
                                    retryfs.RetryPolicy(max_attempts=3), client_attempts=1)
    copied = _copies()[how](fs)
    assert copied == fs and type(copied) is type(fs)
    assert copied.retry_handler.retry_config == fs.retry_handler.retry_config


# -- a transfer whose source fails for good -------------------------------------------------------

def test_cp_never_commits_a_prefix_when_its_source_fails_for_good(s3_fault_endpoint,
                                                                  s3_fault_bucket, monkeypatch):
    import io

    from retryfs.cli import main

    monkeypatch.setenv("RETRYFS_NO_SLEEP", "1")
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    good_old = b"G" * 1000
    ep.put_object(bucket, "dst/big.bin", good_old)  # the previous, good object
    ep.put_object(bucket, "src/big.bin", bytes(range(256)) * (24 * 4096))  # 24 MiB
    # the first GET sends 10 MiB and the connection ends; every later one (the resumed,
    # ranged reads) fails: the source fails for good mid-file; and a clean-up DELETE, if any,
    # meets a transient 503
    ep.add_fault(S3Fault.truncate(keep_bytes=10 << 20, op="GetObject",
                                  path=f"{bucket}/src/big.bin", times=1))
    ep.add_fault(S3Fault.internal_error(op="GetObject", path=f"{bucket}/src/big.bin",
                                        times=None))
    ep.add_fault(S3Fault.slow_down(op=("DeleteObject", "DeleteObjects"), times=1))

    def url(key):
        return ep.uri(f"{bucket}/{key}", retry_max_attempts=3, retry_initial_delay=0,
                      retry_max_delay=0)

    out, err = io.StringIO(), io.StringIO()
    code = main(["cp", "-r", url("src"), url("dst")], stdout=out, stderr=err)
    assert code != 0
    assert "big.bin" in out.getvalue() + err.getvalue()
    assert ep.get_object(bucket, "dst/big.bin") == good_old  # never replaced by a prefix
    assert [r for r in ep.requests(op=("CompleteMultipartUpload", "PutObject"))
            if r.key == "dst/big.bin"] == []


# -- a commit abandoned by its timeout that lands later ----------------------------------------------

def _commits_of(ep, key):
    return [r for r in ep.requests(op=("PutObject", "CompleteMultipartUpload")) if r.key == key]


def _write_through(how, fs, tmp_path, bucket):
    if how == "stream":
        with fs.open_output_stream(f"{bucket}/k") as f:
            f.write(b"v1" * 100)
        return
    if how == "write_with":
        fs.write_with(f"{bucket}/k", lambda f: f.write(b"v1" * 100))
        return
    src = tmp_path / "src"
    src.mkdir()
    (src / "k").write_bytes(b"v1" * 100)
    if how == "copy_files_threaded":
        (src / "other").write_bytes(b"o")
    pafs.copy_files(str(src), bucket, destination_filesystem=fs,
                    use_threads=how == "copy_files_threaded")


@pytest.mark.parametrize("how", ["stream", "write_with", "copy_files", "copy_files_threaded"])
def test_a_call_returns_only_once_its_abandoned_commit_has_landed(how, tmp_path,
                                                                  s3_fault_endpoint,
                                                                  s3_fault_bucket):
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    fs = retryfs.RetryingFileSystem(ep.pyarrow_fs(), FAST, write_timeout=1.0, budget=False)
    # the first commit of k is served 1.6 s late: its attempt is abandoned at 1 s and the
    # retry commits; the late one still lands (its body is with the server), within one more
    # attempt timeout: the call waits for it, then reports success
    ep.add_fault(S3Fault.delay(1.6, op=("PutObject", "CompleteMultipartUpload"),
                               path=f"{bucket}/k", times=1))
    _write_through(how, fs, tmp_path, bucket)
    assert len(ep.injected) == 1 and fs.stats.snapshot()["retries"] >= 1
    # when the call returns, every commit request it sent has been answered
    commits = _commits_of(ep, "k")
    assert len(commits) == 2 and all(r.status == 200 for r in commits)
    ep.put_object(bucket, "k", b"v2" * 100)  # the application writes the next version
    assert ep.get_object(bucket, "k") == b"v2" * 100


@pytest.mark.parametrize("how", ["stream", "write_with", "copy_files", "copy_files_threaded"])
@pytest.mark.parametrize("deadline", [None, 1.0], ids=["no_deadline", "deadline"])
def test_a_commit_still_under_way_later_is_an_error_not_a_success(
        how, deadline, tmp_path, s3_fault_endpoint, s3_fault_bucket):
    from retryfs.errors import CommitInFlightError

    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    policy = retryfs.RetryPolicy(max_attempts=4, initial_delay=0.001, jitter=False,
                                 deadline=deadline)
    fs = retryfs.RetryingFileSystem(ep.pyarrow_fs(), policy, write_timeout=0.3, budget=False)
    # served 4 s late: past the deadline, and past one more attempt timeout (0.3 s)
    ep.add_fault(S3Fault.delay(4.0, op=("PutObject", "CompleteMultipartUpload"),
                               path=f"{bucket}/k", times=1))
    try:
        with pytest.raises(CommitInFlightError, match="still under way"):
            _write_through(how, fs, tmp_path, bucket)
    finally:
        ep.release_stalls()
    assert f"{bucket}/k" in fs.failed_commits()


# -- a commit acknowledged and never stored, over an older object of the same size ---------------

def _lost_once(ep, bucket, key):
    return ep.add_fault(S3Fault.lost(op=("PutObject", "CompleteMultipartUpload"),
                                     path=f"{bucket}/{key}", times=1))


def _write_new(how, ep, bucket, tmp_path, new):
    """Write ``new`` at ``ckpt/k`` (and ``ckpt/x`` beside it for the trees) by ``how``."""
    fs = retryfs.RetryingFileSystem(ep.pyarrow_fs(), FAST, budget=False)
    src = tmp_path / "src"
    src.mkdir()
    (src / "k").write_bytes(new)
    (src / "x").write_bytes(new)
    if how == "stream":
        with fs.open_output_stream(f"{bucket}/ckpt/k") as f:
            f.write(new)
    elif how == "write_with":
        fs.write_with(f"{bucket}/ckpt/k", lambda f: f.write(new))
    elif how == "copy_files_one":
        pafs.copy_files(str(src / "k"), f"{bucket}/ckpt/k", destination_filesystem=fs)
    elif how in ("copy_files_tree", "copy_files_tree_threaded"):
        pafs.copy_files(str(src), f"{bucket}/ckpt", destination_filesystem=fs,
                        use_threads=how.endswith("threaded"))
    elif how == "fsspec":
        from retryfs.fsspec.filesystem import RetryFileSystem

        fs = RetryFileSystem(fs=ep.s3fs(), policy=FAST, budget=False)
        with fs.open(f"{bucket}/ckpt/k", "wb") as f:
            f.write(new)
    elif how == "retryfs_copy":
        fs = retryfs.RetryingFileSystem(ep.pyarrow_fs(), FAST, budget=False)
        retryfs.copy(str(src), (fs, f"{bucket}/ckpt"), recursive=True, resume=False,
                     policy=FAST)
        return
    return fs


HOWS = ["stream", "write_with", "copy_files_one", "copy_files_tree", "copy_files_tree_threaded", "fsspec",
        "retryfs_copy"]


@pytest.mark.parametrize("size", [300, 12 << 20], ids=["small", "large"])
@pytest.mark.parametrize("how", HOWS)
def test_an_acknowledged_commit_that_stored_nothing_is_not_a_success(
        how, size, tmp_path, s3_fault_endpoint, s3_fault_bucket):
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    old, new = b"o" * size, b"n" * size  # the previous checkpoint: same name, same size
    for key in ("ckpt/k", "ckpt/x"):
        ep.put_object(bucket, key, old)
    lost = _lost_once(ep, bucket, "ckpt/k")
    _write_new(how, ep, bucket, tmp_path, new)
    assert ep.fired(lost) == 1
    assert ep.get_object(bucket, "ckpt/k") == new  # committed again, and proven
    # what the loss cost: one more commit of that object, its bytes once more, nothing else
    commits = ep.requests(op=("PutObject", "CompleteMultipartUpload"))
    assert [r.key for r in commits].count("ckpt/k") == 2
    sent = sum(r.request_bytes for r in ep.requests(op=("PutObject", "UploadPart"))
               if r.key == "ckpt/k")
    assert 2 * size <= sent <= 2 * size * 1.01 + 4096
    if how.startswith("copy_files_tree") or how == "retryfs_copy":
        assert ep.get_object(bucket, "ckpt/x") == new
        assert [r.key for r in commits].count("ckpt/x") == 1


def test_a_lost_copy_whose_source_this_tree_copy_replaced_is_an_error_not_a_wrong_copy(
        s3_fault_endpoint, s3_fault_bucket):
    # A tree copied into its own subdirectory: t/a/b.bin is copied to t/a/a/b.bin (lost), then
    # replaced by the copy of t/b.bin. The lost copy cannot be made again from t/a/b.bin (it
    # would commit t/b.bin's bytes): the copy fails, naming it, and never reports success.
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    ep.put_object(bucket, "t/a/b.bin", b"z" * 100)
    ep.put_object(bucket, "t/b.bin", b"new")
    lost = ep.add_fault(S3Fault.lost(op="PutObject", path=f"{bucket}/t/a/a/b.bin", times=1))
    fs, _ = retryfs.from_uri(ep.uri(bucket, retry_budget="false"))
    with pytest.raises(OSError, match="t/a/a/b.bin") as info:
        pafs.copy_files(f"{bucket}/t", f"{bucket}/t/a", source_filesystem=fs,
                        destination_filesystem=fs, use_threads=False)
    assert ep.fired(lost) == 1
    assert "t/a/a/b.bin" not in ep.keys(bucket)  # never committed from the replaced source
    # its one PutObject (the lost one) and no other: nothing re-sent from the replaced source
    assert [r.key for r in ep.requests("PutObject")].count("t/a/a/b.bin") == 1
    assert ep.get_object(bucket, "t/a/b.bin") == b"new"  # the copy of t/b.bin stands
    assert any("also a destination of this copy" in note
               for error in (info.value, info.value.__cause__) if error is not None
               for note in getattr(error, "__notes__", []))


def test_the_lost_fault_keeps_the_older_object_as_it_was(s3_fault_endpoint, s3_fault_bucket):
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    fs = ep.pyarrow_fs()
    ep.put_object(bucket, "k", b"old")
    before = fs.get_file_info(f"{bucket}/k")
    ep.add_fault(S3Fault.lost(op=("PutObject", "CompleteMultipartUpload"), times=1))
    with fs.open_output_stream(f"{bucket}/k") as f:  # unwrapped: the loss goes unseen
        f.write(b"new")
    after = fs.get_file_info(f"{bucket}/k")
    assert ep.get_object(bucket, "k") == b"old"
    assert (after.size, after.mtime) == (before.size, before.mtime)


@pytest.mark.parametrize("size", [300, 12 << 20], ids=["small", "large"])
@pytest.mark.parametrize("client", ["s3fs", "pyarrow"])
def test_a_lost_pipe_file_on_the_fsspec_face_is_committed_again(client, size, s3_fault_endpoint,
                                                                s3_fault_bucket):
    # pipe_file sends its bytes in one call (Lightning's _atomic_save on object storage): the
    # check after it compares the store's ETag with their MD5, or reads the object back
    from retryfs.fsspec.filesystem import RetryFileSystem

    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    ep.put_object(bucket, "ckpt/k", b"o" * size)
    lost = _lost_once(ep, bucket, "ckpt/k")
    inner = ep.s3fs() if client == "s3fs" else ep.pyarrow_fs()
    fs = RetryFileSystem(fs=inner, policy=FAST, budget=False)
    fs.pipe_file(f"retry::s3://{bucket}/ckpt/k", b"n" * size)
    assert ep.fired(lost) == 1
    assert ep.get_object(bucket, "ckpt/k") == b"n" * size
    commits = ep.requests(op=("PutObject", "CompleteMultipartUpload"))
    assert [r.key for r in commits].count("ckpt/k") == 2  # the lost one, then one more
    # s3fs has its own pipe_file (one PutObject), retried; ArrowFSWrapper has none: fsspec's
    # generic one writes a file, whose close is retried
    operation = "pipe_file" if client == "s3fs" else "close"
    assert fs.stats.snapshot()["by_operation"][operation]["retries"] == 1

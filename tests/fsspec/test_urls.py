"""Every method of the fsspec face takes the chained URL (``retry::s3://b/k``), the inner URL
(``s3://b/k``) and the bare path (``b/k``), as fsspec's chained filesystems do.

torch DCP's ``FsspecWriter`` and Lightning's ``get_filesystem`` open the filesystem with
``url_to_fs(url)`` and then pass the *original* URL to its methods. Before the face stripped
the prefix, the bucket became ``"retry::s3:"``, ``makedirs`` on a local disk created
``./retry::file:/...`` in the working directory and ``exists`` said False for an object that
exists. A URL of a protocol the wrapped filesystem does not serve is a ``ValueError``.
"""

import asyncio
import os

import fsspec
import pytest
from _helpers import FAST
from fsspec.implementations.memory import MemoryFileSystem
from fsspec.spec import AbstractFileSystem

from retryfs.fsspec.filesystem import ASYNC_METHODS, SYNC_METHODS, RetryFileSystem
from retryfs.fsspec.inner import inner_path
from retryfs.testing import S3Fault


def _forms(protocol, root):
    """The three spellings of a path under ``root`` (``bucket`` or ``/abs/dir``)."""
    bare_root = root if protocol != "memory" else root
    return {
        "chained": lambda name: f"retry::{protocol}://{root.lstrip('/') if protocol != 'file' else root}/{name}",
        "inner_url": lambda name: f"{protocol}://{root.lstrip('/') if protocol != 'file' else root}/{name}",
        "bare": lambda name: f"{bare_root}/{name}",
    }


def _exercise(fs, url, local_dir, *, directories=True):
    """The face's public methods, each given paths spelled by ``url``."""
    src = os.path.join(local_dir, "src.bin")
    with open(src, "wb") as f:
        f.write(b"local")
    if directories:
        fs.makedirs(url("d/sub"), exist_ok=True)
        fs.mkdir(url("d/sub2"))
    fs.pipe_file(url("d/a.bin"), b"aaa")
    fs.pipe({url("d/b.bin"): b"bb"})
    fs.write_bytes(url("d/c.bin"), b"c")
    fs.write_text(url("d/t.txt"), "text")
    with fs.open(url("d/o.bin"), "wb") as f:
        f.write(b"open")
    assert fs.exists(url("d/a.bin")) and fs.lexists(url("d/a.bin"))
    assert fs.isfile(url("d/a.bin")) and not fs.isdir(url("d/a.bin"))
    assert fs.isdir(url("d")) and not fs.isfile(url("d"))
    assert not fs.exists(url("d/missing"))
    assert fs.info(url("d/a.bin"))["size"] == 3
    assert fs.stat(url("d/a.bin"))["size"] == 3
    assert fs.size(url("d/a.bin")) == 3
    assert fs.sizes([url("d/a.bin"), url("d/b.bin")]) == [3, 2]
    assert fs.cat_file(url("d/a.bin")) == b"aaa"
    assert fs.cat(url("d/b.bin")) == b"bb"
    assert fs.cat_ranges([url("d/a.bin")], [0], [2]) == [b"aa"]
    assert fs.head(url("d/a.bin"), 1) == b"a" and fs.tail(url("d/a.bin"), 1) == b"a"
    assert fs.read_bytes(url("d/c.bin")) == b"c"
    assert fs.read_text(url("d/t.txt")) == "text"
    assert fs.read_block(url("d/a.bin"), 0, 2) == b"aa"
    with fs.open(url("d/o.bin"), "rb") as f:
        assert f.read() == b"open"
    expected = {"a.bin", "b.bin", "c.bin", "t.txt", "o.bin"}
    assert expected <= {p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(url("d"), detail=False)}
    assert expected <= {e["name"].rstrip("/").rsplit("/", 1)[-1] for e in fs.listdir(url("d"))}
    assert expected <= {p.rsplit("/", 1)[-1] for p in fs.find(url("d"))}
    assert {"a.bin", "b.bin", "c.bin", "o.bin"} == {p.rsplit("/", 1)[-1]
                                                   for p in fs.glob(url("d/*.bin"))}
    assert fs.du(url("d")) >= 3 + 2 + 1 + 4 + 4
    assert expected <= {name for _, _, files in fs.walk(url("d")) for name in files}
    assert expected <= {p.rsplit("/", 1)[-1] for p in fs.expand_path(url("d"), recursive=True)}
    fs.cp_file(url("d/a.bin"), url("d/a2.bin"))
    fs.copy(url("d/a.bin"), url("d/a3.bin"))
    fs.mv(url("d/a3.bin"), url("d/a4.bin"))
    fs.rename(url("d/a4.bin"), url("d/a5.bin"))
    assert fs.cat_file(url("d/a2.bin")) == b"aaa" and fs.cat_file(url("d/a5.bin")) == b"aaa"
    assert not fs.exists(url("d/a3.bin")) and not fs.exists(url("d/a4.bin"))
    fs.put_file(src, url("d/p.bin"))
    fs.put(src, url("d/p2.bin"))
    fs.upload(src, url("d/p3.bin"))
    for name in ("p.bin", "p2.bin", "p3.bin"):
        target = os.path.join(local_dir, f"got-{name}")
        fs.get_file(url(f"d/{name}"), target)
        with open(target, "rb") as f:
            assert f.read() == b"local"
    fs.get(url("d/p.bin"), os.path.join(local_dir, "got-get"))
    fs.download(url("d/p.bin"), os.path.join(local_dir, "got-download"))
    fs.touch(url("d/touched"))
    assert fs.exists(url("d/touched"))
    fs.rm_file(url("d/touched"))
    fs.rm(url("d/a5.bin"))
    fs.delete(url("d/a2.bin"))
    assert not fs.exists(url("d/touched")) and not fs.exists(url("d/a5.bin"))
    fs.rm(url("d"), recursive=True)
    assert not fs.exists(url("d/a.bin"))


@pytest.mark.parametrize("form", ["chained", "inner_url", "bare"])
def test_memory_takes_every_spelling(form, tmp_path):
    fs = RetryFileSystem(fs=MemoryFileSystem(skip_instance_cache=True), policy=FAST)
    fs.fs.store.clear()
    fs.fs.pseudo_dirs[:] = [""]
    _exercise(fs, _forms("memory", "bkt")[form], str(tmp_path))


@pytest.mark.parametrize("form", ["chained", "inner_url", "bare"])
def test_a_local_disk_takes_every_spelling_and_creates_nothing_under_a_url(
        form, tmp_path, monkeypatch):
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    root = tmp_path / "root"
    root.mkdir()
    local = tmp_path / "local"
    local.mkdir()
    fs, _ = fsspec.core.url_to_fs(f"retry::file://{root}", retry={"max_attempts": 2})
    _exercise(fs, _forms("file", str(root))[form], str(local))
    assert os.listdir(cwd) == []  # nothing named retry::file:/... here


@pytest.mark.parametrize("form", ["chained", "inner_url", "bare"])
def test_s3fs_takes_every_spelling(form, s3_fault_endpoint, s3_fault_bucket, tmp_path):
    fs = RetryFileSystem(fs=s3_fault_endpoint.s3fs(), policy=FAST)
    _exercise(fs, _forms("s3", s3_fault_bucket)[form], str(tmp_path), directories=False)


@pytest.mark.parametrize("form", ["chained", "inner_url", "bare"])
def test_gcsfs_takes_every_spelling(form, gcs_fault_endpoint, gcs_fault_bucket, tmp_path):
    fs = RetryFileSystem(fs=gcs_fault_endpoint.gcsfs(), policy=FAST)
    _exercise(fs, _forms("gs", gcs_fault_bucket)[form], str(tmp_path), directories=False)


@pytest.mark.parametrize("form", ["chained", "inner_url", "bare"])
def test_adlfs_takes_every_spelling(form, azure_fault_endpoint, azure_fault_container, tmp_path):
    fs = RetryFileSystem(fs=azure_fault_endpoint.adlfs(), policy=FAST)
    _exercise(fs, _forms("abfs", azure_fault_container)[form], str(tmp_path),
              directories=False)


def test_the_url_form_is_retried_like_any_other(s3_fault_endpoint, s3_fault_bucket):
    s3_fault_endpoint.put_object(s3_fault_bucket, "k", b"v")
    s3_fault_endpoint.add_fault(S3Fault.slow_down(op="HeadObject", times=2))
    fs = RetryFileSystem(fs=s3_fault_endpoint.s3fs(), policy=FAST, budget=False)
    assert fs.isfile(f"retry::s3://{s3_fault_bucket}/k")
    assert fs.stats.snapshot()["retries"] == 2


def test_the_async_coroutines_take_the_chained_url(s3_fault_endpoint, s3_fault_bucket):
    s3_fault_endpoint.put_object(s3_fault_bucket, "k", b"value")
    fs = RetryFileSystem(fs=s3_fault_endpoint.s3fs(), policy=FAST)
    url = f"retry::s3://{s3_fault_bucket}/k"

    async def run():
        assert (await fs._info(url))["size"] == 5
        assert await fs._cat_file(url) == b"value"
        assert await fs._exists(url)
        await fs._pipe_file(f"retry::s3://{s3_fault_bucket}/k2", b"two")
        await fs._cp_file(url, f"s3://{s3_fault_bucket}/k3")
        return await fs._cat_file(f"{s3_fault_bucket}/k3")

    assert fsspec.asyn.sync(fs.loop, run) == b"value"
    assert s3_fault_endpoint.get_object(s3_fault_bucket, "k2") == b"two"


def test_a_url_built_wrapper_on_s3_takes_its_own_url(s3_fault_endpoint, s3_fault_bucket):
    options = {"key": "testing", "secret": "testing", "endpoint_url": s3_fault_endpoint.url,
               "client_kwargs": {"region_name": s3_fault_endpoint.region}}
    url = f"retry::s3://{s3_fault_bucket}/exp/model.pt"
    fs, path = fsspec.core.url_to_fs(url, s3=options, retry={"max_attempts": 2})
    assert path == f"{s3_fault_bucket}/exp/model.pt"
    fs.makedirs(f"retry::s3://{s3_fault_bucket}/exp", exist_ok=True)
    with fs.open(url, "wb") as f:
        f.write(b"weights")
    assert fs.isfile(url) and fs.exists(url) and fs.cat(url) == b"weights"
    assert s3_fault_endpoint.get_object(s3_fault_bucket, "exp/model.pt") == b"weights"


@pytest.mark.parametrize("path", ["gs://b/k", "retry::gs://b/k", "retry::https://h/k"])
def test_a_protocol_the_inner_does_not_serve_is_a_clear_error(path, tmp_path):
    fs = RetryFileSystem(fs=fsspec.filesystem("file"), policy=FAST)
    with pytest.raises(ValueError, match="is not served by the wrapped LocalFileSystem"):
        fs.info(path)
    with pytest.raises(ValueError, match="is not served"):
        fs.open(path, "wb")
    with pytest.raises(ValueError, match="is not served"):
        fs.makedirs(path)


def test_a_bare_local_name_with_colons_is_a_name():
    fs = MemoryFileSystem(skip_instance_cache=True)
    assert inner_path(fs, "dir/a::b") == "dir/a::b"
    assert inner_path(fs, "retry::memory://dir/a::b") == "dir/a::b"  # memory keeps it as is


# -- every method, by the table: a recording filesystem that implements each one ----------------

class _Recording(AbstractFileSystem):
    """Implements every public method of the face by recording the paths it was given."""

    protocol = ("rec",)
    seen: list

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = []


def _recorder(name):
    def method(self, *args, **kwargs):
        self.seen.append((name, args, kwargs))
        return {"name": "b/k", "size": 1, "type": "file"} if name == "info" else None
    return method


def _arecorder(name):
    async def method(self, *args, **kwargs):
        self.seen.append((name, args, kwargs))
        return {"name": "b/k", "size": 1, "type": "file"} if name == "_info" else None
    return method


for _name in SYNC_METHODS:
    setattr(_Recording, _name, _recorder(_name))
_Recording.walk = lambda self, *args, **kwargs: iter(self.seen.append(("walk", args, kwargs))
                                                     or [("b", [], [])])
_Recording._rm = _recorder("_rm")

_TWO_REMOTE = {"cp_file", "copy", "cp", "mv", "move", "rename"}
_UPLOADS = {"put_file", "put", "upload"}


@pytest.mark.parametrize("name", SYNC_METHODS)
def test_every_blocking_method_hands_the_inner_its_own_path(name):
    inner = _Recording(skip_instance_cache=True)
    fs = RetryFileSystem(fs=inner, policy=FAST)
    args = ("retry::rec://b/k", "retry::rec://b/k2")
    if name in _UPLOADS:
        args = ("retry::rec://local", "retry::rec://b/k")
    result = getattr(fs, name)(*args)
    if name == "walk":
        list(result)
    called, given, _ = inner.seen[-1]
    assert called == name
    if name in _UPLOADS:
        assert given == ("retry::rec://local", "b/k")  # the local side is left as given
    elif name in _TWO_REMOTE:
        assert given == ("b/k", "b/k2")
    else:
        assert given[0] == "b/k" and given[1:] == args[1:]


def test_every_keyword_path_is_the_inner_s_own():
    inner = _Recording(skip_instance_cache=True)
    fs = RetryFileSystem(fs=inner, policy=FAST)
    fs.cp_file(path1="retry::rec://b/1", path2="rec://b/2")
    fs.put_file(lpath="retry::rec://local", rpath="retry::rec://b/3")
    fs.pipe({"retry::rec://b/4": b"x"})
    assert inner.seen[0] == ("cp_file", (), {"path1": "b/1", "path2": "b/2"})
    assert inner.seen[1] == ("put_file", (), {"lpath": "retry::rec://local", "rpath": "b/3"})
    assert inner.seen[2] == ("pipe", ({"b/4": b"x"},), {})


def test_every_coroutine_hands_the_inner_its_own_path():
    from fsspec.asyn import AsyncFileSystem

    class _AsyncRecording(AsyncFileSystem):
        protocol = ("rec",)

    for name in ASYNC_METHODS:
        if name != "_walk":
            setattr(_AsyncRecording, name, _arecorder(name))

    inner = _AsyncRecording(skip_instance_cache=True, asynchronous=True)
    inner.seen = []
    fs = RetryFileSystem(fs=inner, policy=FAST)

    async def run():
        for name in ASYNC_METHODS:
            if name == "_walk":
                continue
            args = ("retry::rec://b/k", "retry::rec://b/k2")
            if name in ("_put", "_put_file"):
                args = ("local", "retry::rec://b/k")
            await getattr(fs, name)(*args)
            called, given, _ = inner.seen[-1]
            assert called == name
            expected_first = "local" if name in ("_put", "_put_file") else "b/k"
            assert given[0] == expected_first, name
            if name in ("_put", "_put_file", "_copy", "_cp_file", "_mv_file"):
                assert given[1] in ("b/k", "b/k2"), name

    asyncio.run(run())

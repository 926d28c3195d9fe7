"""What the cloud clients' own habits leave for retryfs to set right, on the emulators.

- A client that re-sends a request by itself (the Azure C++ SDK under pyarrow, aiohttp under
  gcsfs) turns a DELETE that was applied and whose answer was lost into a 404 on retryfs's first
  attempt: retryfs must tell that from a file that never existed, and only pays for it on the
  clients that re-send.
- pyarrow's Azure client creates the blob empty when an output stream opens: a write refused
  later must not leave it behind as if an empty file had been written, nor delete a blob that
  somebody wrote since.

Every test counts the requests on the fault proxy.
"""

from __future__ import annotations

import time

import pyarrow.fs as pafs
import pytest
from _helpers import FAST

from retryfs import RetryingFileSystem
from retryfs.core.proof import UNKNOWN, WriteDigest
from retryfs.testing.http import HttpFault


def wrapped(inner):
    return RetryingFileSystem(inner, FAST, budget=False, client_attempts=1)


def ops(ep, *names):
    return [(r.op, r.status) for r in ep.requests(names)]


# -- delete_file: the client's own re-send of an applied DELETE ----------------------------------

@pytest.mark.slow  # the Azure C++ SDK waits 0.8 s before its own re-send
@pytest.mark.timeout(60)
def test_pyarrow_azure_delete_applied_then_lost_is_success(azure_fault_endpoint,
                                                           azure_fault_container):
    ep, container = azure_fault_endpoint, azure_fault_container
    fs = wrapped(ep.pyarrow_fs())
    ep.put_object(container, "ckpt", b"x" * 1000)
    ep.put_object(container, "other", b"y")
    fault = ep.add_fault(HttpFault.reset(applied=True, op="DeleteBlob", times=1))
    fs.delete_file(f"{container}/ckpt")
    assert ep.fired(fault) == 1
    # the SDK's own re-send found nothing: this call's delete, not an error
    assert ops(ep, "DeleteBlob") == [("DeleteBlob", None), ("DeleteBlob", 404)]
    assert ep.keys(container) == ["other"]
    stats = fs.stats.snapshot()
    assert stats["retries"] == 0 and stats["giveups"] == 0, stats


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_pyarrow_azure_delete_of_a_blob_that_never_existed_still_raises(
        azure_fault_endpoint, azure_fault_container):
    ep, container = azure_fault_endpoint, azure_fault_container
    fs = wrapped(ep.pyarrow_fs())
    # the same sequence on the wire as the applied one above: a reset, the SDK's re-send, 404
    fault = ep.add_fault(HttpFault.reset(op="DeleteBlob", times=1))
    with pytest.raises(FileNotFoundError, match="never"):
        fs.delete_file(f"{container}/never")
    assert ep.fired(fault) == 1
    assert ops(ep, "DeleteBlob") == [("DeleteBlob", None), ("DeleteBlob", 404)]
    assert fs.stats.snapshot()["retries"] == 0


@pytest.mark.timeout(60)
def test_pyarrow_azure_delete_refused_404_while_the_blob_is_there_raises(
        azure_fault_endpoint, azure_fault_container):
    ep, container = azure_fault_endpoint, azure_fault_container
    fs = wrapped(ep.pyarrow_fs())
    ep.put_object(container, "ckpt", b"x")
    fault = ep.add_fault(HttpFault.not_found(op="DeleteBlob"))
    with pytest.raises(OSError, match="Not a regular file"):  # pyarrow's, from its own look
        fs.delete_file(f"{container}/ckpt")
    assert ep.fired(fault) == 1 and len(ep.requests("DeleteBlob")) == 1
    assert ep.get_object(container, "ckpt") == b"x"  # seen before, seen after: not deleted


@pytest.mark.slow  # google-cloud-cpp waits about a second before its own re-send
@pytest.mark.timeout(60)
def test_pyarrow_gcs_with_its_own_retries_delete_applied_then_lost_is_success(
        gcs_fault_endpoint, gcs_fault_bucket):
    ep, bucket = gcs_fault_endpoint, gcs_fault_bucket
    fs = RetryingFileSystem(ep.pyarrow_fs(retry_time_limit=60.0), FAST, budget=False)
    ep.put_object(bucket, "ckpt", b"x")
    fault = ep.add_fault(HttpFault.reset(applied=True, op="objects.delete", times=1))
    fs.delete_file(f"{bucket}/ckpt")
    assert ep.fired(fault) == 1
    assert ops(ep, "objects.delete") == [("objects.delete", None), ("objects.delete", 404)]
    assert ep.keys(bucket) == []


@pytest.mark.timeout(60)
def test_pyarrow_gcs_delete_refused_404_while_the_object_is_there_raises(gcs_fault_endpoint,
                                                                         gcs_fault_bucket):
    ep, bucket = gcs_fault_endpoint, gcs_fault_bucket
    fs = RetryingFileSystem(ep.pyarrow_fs(retry_time_limit=60.0), FAST, budget=False)
    ep.put_object(bucket, "ckpt", b"x")
    fault = ep.add_fault(HttpFault.not_found(op="objects.delete"))
    with pytest.raises(FileNotFoundError):  # seen before, there after: it was not deleted
        fs.delete_file(f"{bucket}/ckpt")
    assert ep.fired(fault) == 1 and len(ep.requests("objects.delete")) == 1
    assert ep.get_object(bucket, "ckpt") == b"x"


@pytest.mark.timeout(60)
def test_gcsfs_delete_applied_then_lost_once_is_success(gcs_fault_endpoint, gcs_fault_bucket):
    ep, bucket = gcs_fault_endpoint, gcs_fault_bucket
    fs = wrapped(ep.gcsfs())
    ep.put_object(bucket, "ckpt", b"x" * 1000)
    # one reset: aiohttp re-sends the DELETE by itself and is answered 404
    fault = ep.add_fault(HttpFault.reset(applied=True, op="objects.delete", times=1))
    fs.delete_file(f"{bucket}/ckpt")
    assert ep.fired(fault) == 1
    assert ops(ep, "objects.delete") == [("objects.delete", None), ("objects.delete", 404)]
    assert ep.keys(bucket) == []
    assert fs.stats.snapshot()["retries"] == 0


@pytest.mark.timeout(60)
def test_gcsfs_delete_of_an_object_that_never_existed_still_raises(gcs_fault_endpoint,
                                                                   gcs_fault_bucket):
    ep, bucket = gcs_fault_endpoint, gcs_fault_bucket
    fs = wrapped(ep.gcsfs())
    with pytest.raises(FileNotFoundError):
        fs.delete_file(f"{bucket}/never")
    assert ep.requests("objects.delete") == []  # the look before found nothing: no DELETE


# -- delete_dir, delete_dir_contents, move: the same re-send, inside a composite operation ------

TREE = ("d/a", "d/b", "d/sub/c", "other")


def _put_tree(ep, bucket):
    for key in TREE:
        ep.put_object(bucket, key, b"x" * 100)


#: What each directory delete leaves: pyarrow's Azure delete_dir_contents keeps (writes) the
#: directory's marker blob ``d/``, as it does unfaulted.
AZURE_LEFT = {"delete_dir": ["other"], "delete_dir_contents": ["d/", "other"]}


@pytest.mark.slow  # the Azure C++ SDK waits 0.8 s before its own re-send
@pytest.mark.timeout(60)
@pytest.mark.parametrize("operation", ["delete_dir", "delete_dir_contents"])
@pytest.mark.parametrize("blobs", [TREE, ("d/a", "other")], ids=["three-blobs", "one-blob"])
def test_pyarrow_azure_directory_delete_whose_batch_was_applied_then_lost_is_success(
        operation, blobs, azure_fault_endpoint, azure_fault_container):
    """pyarrow deletes a directory's blobs in one batch request; the SDK re-sends it by itself
    when its answer is lost, and every DeleteBlob of the re-send is a 404, which pyarrow
    raised as ``OSError: Failed to delete blobs`` (``a blob``, for one) for a delete that was
    done."""
    ep, container = azure_fault_endpoint, azure_fault_container
    for key in blobs:
        ep.put_object(container, key, b"x" * 100)
    fs = wrapped(ep.pyarrow_fs())
    fault = ep.add_fault(HttpFault.reset(applied=True, op="SubmitBatch", times=1))
    getattr(fs, operation)(f"{container}/d")
    assert ep.fired(fault) == 1
    assert ops(ep, "SubmitBatch") == [("SubmitBatch", None), ("SubmitBatch", 202)]
    assert ep.keys(container) == AZURE_LEFT[operation]
    stats = fs.stats.snapshot()
    assert stats["retries"] == 0 and stats["giveups"] == 0, stats


@pytest.mark.timeout(60)
@pytest.mark.parametrize("operation", ["delete_dir", "delete_dir_contents"])
@pytest.mark.parametrize(("leased", "text"), [(("d/b",), "Failed to delete a blob: d/b"),
                                              (("d/a", "d/b"), "Failed to delete blobs: ")],
                         ids=["one-refused", "two-refused"])
def test_pyarrow_azure_directory_delete_whose_batch_left_blobs_still_raises(
        operation, leased, text, azure_fault_endpoint, azure_fault_container):
    """The same error texts from a batch that did not delete everything (a lease refuses a
    blob's DeleteBlob): the blob is still listed, so it is an error, as pyarrow said."""
    ep, container = azure_fault_endpoint, azure_fault_container
    _put_tree(ep, container)
    leases = [ep._service().get_blob_client(container, key).acquire_lease() for key in leased]
    fs = wrapped(ep.pyarrow_fs())
    try:
        with pytest.raises(OSError, match=text):
            getattr(fs, operation)(f"{container}/d")
    finally:
        for lease in leases:
            lease.release()
    assert ops(ep, "SubmitBatch") == [("SubmitBatch", 202)]  # once: not retried
    assert set(leased) <= set(ep.keys(container)) and "d/sub/c" not in ep.keys(container)
    assert fs.stats.snapshot()["retries"] == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("operation", ["delete_dir", "delete_dir_contents"])
def test_pyarrow_azure_directory_delete_of_a_directory_that_never_existed_still_raises(
        operation, azure_fault_endpoint, azure_fault_container):
    ep, container = azure_fault_endpoint, azure_fault_container
    fs = wrapped(ep.pyarrow_fs())
    with pytest.raises(FileNotFoundError):
        getattr(fs, operation)(f"{container}/never")
    assert ep.requests("SubmitBatch") == []
    assert fs.stats.snapshot()["retries"] == 0


@pytest.mark.timeout(60)
def test_pyarrow_azure_move_on_a_flat_namespace_is_a_clear_error_that_changes_nothing(
        azure_fault_endpoint, azure_fault_container):
    """pyarrow cannot move on an account without a hierarchical namespace (Azurite has none):
    the error is pyarrow's own, raised once, and neither path is touched."""
    ep, container = azure_fault_endpoint, azure_fault_container
    ep.put_object(container, "src", b"s" * 100)
    fs = wrapped(ep.pyarrow_fs())
    with pytest.raises(NotImplementedError, match="Hierarchical Namespace"):
        fs.move(f"{container}/src", f"{container}/dest")
    assert ep.get_object(container, "src") == b"s" * 100
    assert ep.keys(container) == ["src"]
    assert ep.requests(("CopyBlob", "PutBlob", "DeleteBlob", "SubmitBatch")) == []
    assert fs.stats.snapshot()["retries"] == 0


def _gcs_with_its_own_retries(ep):
    return RetryingFileSystem(ep.pyarrow_fs(retry_time_limit=60.0), FAST, budget=False)


@pytest.mark.slow  # google-cloud-cpp waits about a second before its own re-send
@pytest.mark.timeout(60)
@pytest.mark.parametrize("operation", ["delete_dir", "delete_dir_contents"])
def test_pyarrow_gcs_with_its_own_retries_directory_delete_applied_then_lost_is_success(
        operation, gcs_fault_endpoint, gcs_fault_bucket):
    """pyarrow deletes a directory object by object; google-cloud-cpp re-sends the DELETE of
    one whose answer was lost and raised its 404 (FileNotFoundError) for the whole call.
    ``delete_dir`` stops there, before the directory's marker (which pyarrow's create_dir
    writes and deletes last): retryfs retries, and the retry deletes the marker."""
    ep, bucket = gcs_fault_endpoint, gcs_fault_bucket
    _put_tree(ep, bucket)
    ep.put_object(bucket, "d/", b"")
    fs = _gcs_with_its_own_retries(ep)
    fault = ep.add_fault(HttpFault.reset(applied=True, op="objects.delete",
                                         path=f"{bucket}/d/a", times=1))
    getattr(fs, operation)(f"{bucket}/d")
    assert ep.fired(fault) == 1
    assert [r.status for r in ep.requests("objects.delete", path=f"{bucket}/d/a")] == [
        None, 404]  # the client's own re-send
    # delete_dir_contents keeps the directory (its marker), as it does unfaulted
    assert ep.keys(bucket) == (["other"] if operation == "delete_dir" else ["d/", "other"])
    stats = fs.stats.snapshot()
    assert stats["giveups"] == 0, stats
    assert stats["retries"] == (1 if operation == "delete_dir" else 0), stats


@pytest.mark.slow
@pytest.mark.timeout(60)
def test_pyarrow_gcs_with_its_own_retries_move_whose_source_delete_was_lost_is_success(
        gcs_fault_endpoint, gcs_fault_bucket):
    """pyarrow moves by a copy and a delete of the source; google-cloud-cpp re-sends the
    source's DELETE whose answer was lost, and its 404 failed a move that was done."""
    ep, bucket = gcs_fault_endpoint, gcs_fault_bucket
    ep.put_object(bucket, "src", b"s" * 100)
    fs = _gcs_with_its_own_retries(ep)
    fault = ep.add_fault(HttpFault.reset(applied=True, op="objects.delete", times=1))
    fs.move(f"{bucket}/src", f"{bucket}/dest")
    assert ep.fired(fault) == 1
    assert ops(ep, "objects.rewrite", "objects.delete") == [
        ("objects.rewrite", 200), ("objects.delete", None), ("objects.delete", 404)]
    assert ep.keys(bucket) == ["dest"] and ep.get_object(bucket, "dest") == b"s" * 100
    stats = fs.stats.snapshot()
    assert stats["retries"] == 0 and stats["giveups"] == 0, stats


@pytest.mark.timeout(60)
def test_pyarrow_gcs_with_its_own_retries_move_of_a_source_that_never_existed_still_raises(
        gcs_fault_endpoint, gcs_fault_bucket):
    ep, bucket = gcs_fault_endpoint, gcs_fault_bucket
    ep.put_object(bucket, "dest", b"old")
    fs = _gcs_with_its_own_retries(ep)
    with pytest.raises(OSError, match="does not exist"):  # pyarrow's own words
        fs.move(f"{bucket}/never", f"{bucket}/dest")
    assert ep.get_object(bucket, "dest") == b"old"
    assert ep.requests(("objects.rewrite", "objects.copy", "objects.delete")) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("name", "extra"), [
    ("pyarrow_azure", ["ListBlobs"]),
    ("pyarrow_gcs", []),  # client_attempts=1: it does not re-send
    ("pyarrow_gcs_own_retries", ["objects.get", "objects.list"]),
])
@pytest.mark.parametrize("operation", ["delete_dir", "delete_dir_contents"])
def test_what_a_directory_delete_costs_on_the_happy_path(
        name, extra, operation, gcs_fault_endpoint, gcs_fault_bucket, azure_fault_endpoint,
        azure_fault_container):
    """The requests of one directory delete, wrapped and not: the same, plus one look at the
    directory before it (pyarrow's `get_file_info`) on a client that re-sends by itself."""
    ep, bucket = ((gcs_fault_endpoint, gcs_fault_bucket) if "gcs" in name
                  else (azure_fault_endpoint, azure_fault_container))
    own = {"retry_time_limit": 60.0} if name.endswith("own_retries") else {}

    def requests(fs):
        _put_tree(ep, bucket)
        ep.put_object(bucket, "d/", b"")  # a marker: pyarrow GCS's delete_dir raises without
        ep.reset_record()
        getattr(fs, operation)(f"{bucket}/d")
        assert "d/a" not in ep.keys(bucket)
        return sorted(r.op for r in ep.requests())

    inner = ep.pyarrow_fs(**own)
    requests(inner)  # a first one: the client's one-time probes
    bare = requests(inner)
    fs = RetryingFileSystem(ep.pyarrow_fs(**own), FAST, budget=False,
                            client_attempts=None if own else 1)
    requests(fs)
    assert requests(fs) == sorted(bare + extra), bare
    assert fs.stats.snapshot()["retries"] == 0


def _delete_requests(ep, bucket, fs, *, racy_info=False):
    """The requests of one delete_file. ``racy_info``: gcsfs's ``info`` races the object's GET
    against a directory probe (a listing, which when empty GETs the object again) and cancels
    the loser, so how many of its GETs and listings reach the server varies run to run, wrapped
    or not (25 runs each: three different sets on both sides). Then the DELETEs are compared,
    and the GETs of the object are bounded by what one ``info`` can send (2)."""
    ep.put_object(bucket, "obj", b"x")
    ep.reset_record()
    fs.delete_file(f"{bucket}/obj")
    assert ep.keys(bucket) == []
    ops = [r.op for r in ep.requests()]
    if not racy_info:
        return ops
    assert 1 <= ops.count("objects.get") <= 2, ops  # one info, never a second one
    return [op for op in ops if op not in ("objects.get", "objects.list")]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["pyarrow_gcs", "gcsfs", "pyarrow_azure", "adlfs"])
def test_what_a_delete_costs_on_the_happy_path(name, gcs_fault_endpoint, gcs_fault_bucket,
                                               azure_fault_endpoint, azure_fault_container):
    """The requests of one delete_file, wrapped and not: the same, except on pyarrow's Azure
    client (whose SDK re-sends by itself), which pays one metadata request (a ListBlobs)."""
    ep, bucket = ((gcs_fault_endpoint, gcs_fault_bucket) if "gcs" in name
                  else (azure_fault_endpoint, azure_fault_container))
    make = ep.pyarrow_fs if name.startswith("pyarrow") else getattr(ep, name)
    inner = make()
    if not isinstance(inner, pafs.FileSystem):  # an fsspec client as pyarrow users have it
        inner = pafs.PyFileSystem(pafs.FSSpecHandler(inner))
    racy = name == "gcsfs"
    _delete_requests(ep, bucket, inner)  # a first delete: the client's one-time probes
    bare = _delete_requests(ep, bucket, inner, racy_info=racy)
    fs = wrapped(make())
    _delete_requests(ep, bucket, fs)
    started = time.monotonic()
    through = _delete_requests(ep, bucket, fs, racy_info=racy)
    assert time.monotonic() - started < 5
    extra = ["ListBlobs"] if name == "pyarrow_azure" else []
    assert sorted(through) == sorted(bare + extra), (bare, through)
    assert fs.stats.snapshot()["retries"] == 0


# -- open_output_stream: the empty blob pyarrow's Azure client creates at open -------------------

MiB = 1 << 20
BLOCK_WRITE = ("PutBlob", "PutBlock", "PutBlockList")


def write(fs, path, data):
    with fs.open_output_stream(path) as out:
        for start in range(0, len(data), MiB):
            out.write(data[start:start + MiB])


def test_pyarrow_azure_replaces_a_blob_with_an_empty_one_when_a_stream_opens(
        azure_fault_endpoint, azure_fault_container):
    """Why removing the empty blob is right: the old content is gone the moment pyarrow
    opens the stream, before a byte is written."""
    ep, container = azure_fault_endpoint, azure_fault_container
    ep.put_object(container, "ckpt", b"old checkpoint")
    out = ep.pyarrow_fs().open_output_stream(f"{container}/ckpt")
    assert ep.get_object(container, "ckpt") == b""
    out.close()
    assert [op for op, _ in ops(ep, *BLOCK_WRITE)] == ["PutBlob", "PutBlockList"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("fault", "refused"), [(HttpFault.forbidden, 403),
                                               (HttpFault.not_found, 404),
                                               (HttpFault.conflict, 409)], ids=["403", "404", "409"])
@pytest.mark.parametrize("existing", [False, True], ids=["new", "over-an-old-blob"])
def test_pyarrow_azure_write_refused_later_leaves_no_empty_blob(
        fault, refused, existing, azure_fault_endpoint, azure_fault_container):
    ep, container = azure_fault_endpoint, azure_fault_container
    if existing:
        ep.put_object(container, "big", b"old")
    fs = wrapped(ep.pyarrow_fs())
    planted = ep.add_fault(fault(op=BLOCK_WRITE, nth=2))  # the first block, after the open
    with pytest.raises(OSError):
        write(fs, f"{container}/big", b"x" * 6 * MiB)
    assert ep.fired(planted) == 1
    assert "big" not in ep.keys(container)
    assert ops(ep, *BLOCK_WRITE, "GetBlobProperties", "DeleteBlob") == [
        ("PutBlob", 201), ("GetBlobProperties", 200),  # the open, and its empty blob noted
        ("PutBlock", refused),  # sent once
        ("GetBlobProperties", 200), ("DeleteBlob", 202)]  # still that blob: removed
    assert fs.stats.snapshot()["retries"] == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("theirs", [b"their checkpoint", b""], ids=["bytes", "empty"])
def test_pyarrow_azure_write_refused_later_keeps_a_blob_written_since(
        theirs, azure_fault_endpoint, azure_fault_container):
    ep, container = azure_fault_endpoint, azure_fault_container
    fs = wrapped(ep.pyarrow_fs())
    planted = ep.add_fault(HttpFault.forbidden(op="PutBlock"))
    out = fs.open_output_stream(f"{container}/big")
    ep.put_object(container, "big", theirs)  # another writer, after this stream opened
    with pytest.raises(OSError):
        with out:
            out.write(b"x" * 6 * MiB)
    assert ep.fired(planted) == 1
    assert ep.get_object(container, "big") == theirs  # another ETag: not this stream's blob
    assert ep.requests("DeleteBlob") == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["pyarrow_gcs", "gcsfs", "pyarrow_azure", "adlfs"])
def test_what_a_write_costs_on_the_happy_path(name, gcs_fault_endpoint, gcs_fault_bucket,
                                              azure_fault_endpoint, azure_fault_container):
    """The requests of one 6 MiB stream write, wrapped (without its read-after-write check)
    and not: the same, except on pyarrow's Azure client, which pays one GetBlobProperties
    after the open (the ETag of the empty blob it created)."""
    ep, bucket = ((gcs_fault_endpoint, gcs_fault_bucket) if "gcs" in name
                  else (azure_fault_endpoint, azure_fault_container))
    make = ep.pyarrow_fs if name.startswith("pyarrow") else getattr(ep, name)
    inner = make()
    if not isinstance(inner, pafs.FileSystem):
        inner = pafs.PyFileSystem(pafs.FSSpecHandler(inner))
    data = b"x" * 6 * MiB

    def requests(fs):
        ep.reset_record()
        write(fs, f"{bucket}/big", data)
        assert len(ep.get_object(bucket, "big")) == len(data)
        return [r.op for r in ep.requests()]

    requests(inner)  # a first write: the client's one-time probes
    bare = requests(inner)
    fs = RetryingFileSystem(make(), FAST, budget=False, client_attempts=1, verify_writes=False)
    requests(fs)
    through = requests(fs)
    extra = ["GetBlobProperties"] if name == "pyarrow_azure" else []
    assert sorted(through) == sorted(bare + extra), (bare, through)
    assert fs.stats.snapshot()["retries"] == 0


def _local_checkpoint(tmp_path, files):
    local = tmp_path / "ckpt"
    local.mkdir()
    for name, data in files.items():
        (local / name).write_bytes(data)
    return local


@pytest.mark.timeout(60)
def test_pyarrow_azure_copy_files_refused_later_leaves_no_empty_blob(
        azure_fault_endpoint, azure_fault_container, tmp_path):
    ep, container = azure_fault_endpoint, azure_fault_container
    local = _local_checkpoint(tmp_path, {"model.pt": b"m" * 2 * MiB, "meta.json": b"{}"})
    fs = wrapped(ep.pyarrow_fs())
    planted = ep.add_fault(HttpFault.forbidden(op="PutBlock", path=f"{container}/ckpt/model.pt"))
    with pytest.raises(OSError):
        pafs.copy_files(str(local), f"{container}/ckpt", source_filesystem=pafs.LocalFileSystem(),
                        destination_filesystem=fs, use_threads=False)
    assert ep.fired(planted) == 1 and len(ep.requests("PutBlock", path=planted.path)) == 1
    assert "ckpt/model.pt" not in ep.keys(container)  # its empty blob removed
    assert ops(ep, "DeleteBlob") == [("DeleteBlob", 202)]


# -- an open that fails after its PutBlob was applied ---------------------------------------------

def _applied_then_refused(ep, path):
    """What the client sees when the SDK's own re-send of an applied PutBlob is refused: the
    PutBlob applied, and answered 403. (The real sequence, a 500 or a reset after the PutBlob
    was applied and then a 403 on the re-send, made the Azure C++ SDK abort this process now
    and then, ``Failed to parse xml`` while it read the second error: it cannot run here.)"""
    return ep.add_fault(HttpFault.forbidden(applied=True, op="PutBlob", path=path, times=1))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("existing", [False, True], ids=["new", "over-an-old-blob"])
def test_pyarrow_azure_open_that_fails_after_its_put_blob_was_applied_leaves_no_empty_blob(
        existing, azure_fault_endpoint, azure_fault_container):
    ep, container = azure_fault_endpoint, azure_fault_container
    if existing:
        ep.put_object(container, "ckpt", b"old")
    fs = wrapped(ep.pyarrow_fs())
    fault = _applied_then_refused(ep, f"{container}/ckpt")
    with pytest.raises(OSError, match="403"):
        fs.open_output_stream(f"{container}/ckpt")
    assert ep.fired(fault) == 1
    assert ops(ep, *BLOCK_WRITE, "GetBlobProperties", "DeleteBlob") == [
        ("PutBlob", 403),  # applied, then refused
        ("GetBlobProperties", 200), ("DeleteBlob", 202)]  # an empty blob: removed
    assert ep.keys(container) == []
    assert fs.stats.snapshot()["retries"] == 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("op", "old", "looked"), [
    ("PutBlob", b"old", True),  # its PutBlob refused: looked at, not empty, kept
    ("ListBlobs", b"", False),  # refused before its PutBlob: not even looked at
], ids=["put-blob-refused", "listing-refused"])
def test_pyarrow_azure_open_refused_keeps_the_blob_that_was_there(
        op, old, looked, azure_fault_endpoint, azure_fault_container):
    ep, container = azure_fault_endpoint, azure_fault_container
    ep.put_object(container, "ckpt", old)
    fs = wrapped(ep.pyarrow_fs())
    where = {"query": {"prefix": "ckpt"}} if op == "ListBlobs" else {"path": f"{container}/ckpt"}
    fault = ep.add_fault(HttpFault.forbidden(op=op, **where))
    with pytest.raises(OSError, match="403"):
        fs.open_output_stream(f"{container}/ckpt")
    assert ep.fired(fault) == 1
    assert ep.get_object(container, "ckpt") == old
    assert len(ep.requests("GetBlobProperties")) == (1 if looked else 0)
    assert ep.requests("DeleteBlob") == []


@pytest.mark.timeout(60)
def test_pyarrow_azure_copy_files_whose_open_fails_after_its_put_blob_leaves_no_empty_blob(
        azure_fault_endpoint, azure_fault_container, tmp_path):
    ep, container = azure_fault_endpoint, azure_fault_container
    local = _local_checkpoint(tmp_path, {"model.pt": b"m" * 1000})
    fs = wrapped(ep.pyarrow_fs())
    fault = _applied_then_refused(ep, f"{container}/ckpt/model.pt")
    with pytest.raises(OSError, match="403"):
        pafs.copy_files(str(local), f"{container}/ckpt", source_filesystem=pafs.LocalFileSystem(),
                        destination_filesystem=fs, use_threads=False)
    assert ep.fired(fault) == 1
    assert [(r.op, r.status) for r in ep.requests(
        ("PutBlob", "GetBlobProperties", "DeleteBlob"), path=fault.path)] == [
        ("PutBlob", 403), ("GetBlobProperties", 200), ("DeleteBlob", 202)]
    assert "ckpt/model.pt" not in ep.keys(container)  # (pyarrow's delete keeps ckpt/)


# -- a large-chunk download from pyarrow Azure: ranged sub-reads in flight -----------------------

@pytest.mark.timeout(120)
def test_pyarrow_azure_large_chunk_download_resends_only_what_a_cut_lost(
        azure_fault_endpoint, azure_fault_container, tmp_path):
    """Ray Train restores with 64 MiB chunks: retryfs reads an Azure blob's chunk as ranged
    sub-reads of 8 MiB in flight together (the native download: the first, answered 2 s
    late, is the last answered). A sub-read cut half-way is resumed by the Azure C++ client
    itself, from the byte it stopped at: the server sends the blob's bytes once, and retryfs
    has nothing to retry."""
    import hashlib
    import random

    ep, container = azure_fault_endpoint, azure_fault_container
    sub = 8 << 20
    data = random.Random(31).randbytes(3 * sub - 999)
    ep.put_object(container, "ckpt/model.pt", data)
    ranges = [f"bytes={start}-{min(start + sub, len(data)) - 1}"
              for start in range(0, len(data), sub)]
    cut = ep.add_fault(HttpFault.truncate(
        keep_bytes=sub // 2, op="GetBlob", times=1,
        when=lambda request: request.headers.get("x-ms-range") == ranges[1]))
    late = ep.add_fault(HttpFault.delay(
        2.0, op="GetBlob", times=1,
        when=lambda request: request.headers.get("x-ms-range") == ranges[0]))
    fs = wrapped(ep.pyarrow_fs())
    (tmp_path / "down").mkdir()
    pafs.copy_files(f"{container}/ckpt", str(tmp_path / "down"), source_filesystem=fs,
                    chunk_size=64 << 20)
    assert ep.fired(cut) == 1 and ep.fired(late) == 1
    got = (tmp_path / "down" / "model.pt").read_bytes()
    assert hashlib.sha256(got).digest() == hashlib.sha256(data).digest()
    gets = ep.requests("GetBlob")
    asked = [r.headers.get("x-ms-range") for r in gets]
    resumed = f"bytes={sub + sub // 2}-{2 * sub - 1}"
    assert sorted(asked) == sorted([*ranges, resumed]), asked
    assert asked[-1] == ranges[0], asked  # one at a time, it would have been the first
    assert sum(r.response_bytes for r in gets) == len(data)
    assert fs.stats.snapshot()["by_operation"]["read"]["retries"] == 0


# -- the read-after-write check on gcsfs: the MD5 GCS keeps, not the content read back ------------

@pytest.mark.timeout(60)
def test_a_verified_gcsfs_write_reads_its_md5_not_its_content(gcs_fault_endpoint,
                                                              gcs_fault_bucket):
    """gcsfs's ``info()`` carries the object's MD5: the check after a write compares it with the
    bytes' own, in one metadata request (it read the object back, 12 requests for 2 MiB, each one
    a chance for a fault to fail the whole check)."""
    ep, bucket = gcs_fault_endpoint, gcs_fault_bucket
    fs = wrapped(ep.gcsfs())
    data = b"n" * 2 * MiB
    ep.reset_record()
    with fs.open_output_stream(f"{bucket}/ckpt") as stream:
        stream.write(data)
    assert ep.get_object(bucket, "ckpt") == data
    assert ep.requests(["objects.download"]) == []


@pytest.mark.timeout(60)
@pytest.mark.parametrize("theirs", [b"o" * 2 * MiB, None], ids=["older-same-size", "absent"])
def test_the_gcsfs_md5_tells_the_new_object_from_an_older_one(theirs, gcs_fault_endpoint,
                                                               gcs_fault_bucket):
    """The verdict of the check on what a lost upload leaves: an older object of the same size is
    not the new one, nothing there is no object; the object written is."""
    ep, bucket = gcs_fault_endpoint, gcs_fault_bucket
    fs = wrapped(ep.gcsfs())
    ours = b"n" * 2 * MiB
    digest = WriteDigest()
    digest.update(ours)
    if theirs is not None:
        ep.put_object(bucket, "ckpt", theirs)
    ep.reset_record()
    assert fs._retry_handler._landed(f"{bucket}/ckpt", len(ours), digest, UNKNOWN) is False
    ep.put_object(bucket, "ckpt", ours)
    assert fs._retry_handler._landed(f"{bucket}/ckpt", len(ours), digest, UNKNOWN) is True
    assert ep.requests(["objects.download"]) == []


@pytest.mark.timeout(60)
def test_the_adlfs_content_md5_proves_a_small_write_in_one_request(azure_fault_endpoint,
                                                                   azure_fault_container):
    """A blob put whole carries its Content-MD5: adlfs's ``info()`` hands it over, and the check
    is one GetBlobProperties (it read the blob back); an older blob of the same size is still
    told apart."""
    ep, container = azure_fault_endpoint, azure_fault_container
    fs = wrapped(ep.adlfs())
    ours = b"n" * 100 * 1024
    digest = WriteDigest()
    digest.update(ours)
    ep.put_object(container, "meta", b"o" * len(ours))
    ep.reset_record()
    assert fs._retry_handler._landed(f"{container}/meta", len(ours), digest, UNKNOWN) is False
    ep.put_object(container, "meta", ours)
    assert fs._retry_handler._landed(f"{container}/meta", len(ours), digest, UNKNOWN) is True
    assert [r.op for r in ep.requests()] == ["GetBlobProperties", "GetBlobProperties"]


# -- pyarrow's GCS client: a failed listing answered as "not found" -----------------------------

@pytest.mark.timeout(60)
def test_pyarrow_gcs_directory_whose_listing_failed_is_not_reported_absent(
        gcs_process_fault_endpoint):
    """pyarrow's GCS ``get_file_info`` of a directory looks for an object, then lists the
    prefix; a listing that fails ends as NotFound, not as its error. The wrapper confirms a
    "not found" by a listing that raises, retried: the directory is found."""
    ep = gcs_process_fault_endpoint
    bucket = "retryfs-unlisted"
    ep.create_bucket(bucket)
    ep.put_object(bucket, "ckpt/model.pt", b"m")
    failed_list = ep.add_fault(HttpFault.internal_error(op="objects.list", times=1))
    assert ep.pyarrow_fs().get_file_info(f"{bucket}/ckpt").type == pafs.FileType.NotFound
    assert ep.fired(failed_list) == 1  # the NotFound was the failed listing's
    ep.reset()
    planted = ep.add_fault(HttpFault.internal_error(op="objects.list", times=1))
    fs = wrapped(ep.pyarrow_fs())
    assert fs.get_file_info(f"{bucket}/ckpt").type == pafs.FileType.Directory
    assert ep.fired(planted) == 1
    assert ops(ep, "objects.get", "objects.list") == [
        ("objects.get", 404), ("objects.list", 500), ("objects.list", 200)]
    ep.reset()
    assert fs.get_file_info([f"{bucket}/none", f"{bucket}/ckpt/model.pt"])[0].type == \
        pafs.FileType.NotFound  # absent: one listing more, which finds nothing
    assert ops(ep, "objects.get", "objects.list") == [
        ("objects.get", 404), ("objects.list", 200), ("objects.get", 200), ("objects.list", 200)]

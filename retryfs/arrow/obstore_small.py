"""The small files of a ``copy_files`` to and from S3, through obstore (``one_part_client``).

A file of a tree copy smaller than one part is one PutObject. Through pyarrow's S3 client that
request costs 1.5 ms of client CPU for 64 KiB (measured on SeaweedFS, 8 lanes), a quarter of
it zeroing the 5 MiB part buffer that Arrow's output stream pads at its close; obstore (Rust's
``object_store``) sends the same PutObject for 0.25 ms. A small file downloaded through pyarrow
costs a HeadObject (its open) and a GetObject; through obstore, one GetObject. On a checkpoint
of many small files the client's CPU, not the network, sets the pace of the copy.

With ``one_part_client="obstore"`` (``"auto"``, what `retryfs.from_uri` chooses, when obstore
is installed and the client's settings carry over), obstore's own retries off:

- **uploads**: each file smaller than one part (`ONE_PART`) is held in memory as it is read and
  sent at its close as one PutObject. retryfs retries it as it retries the pyarrow one (its
  schedules, rate limiter, budget, per-attempt timeout) and checks it the same way after the
  commit; an attempt dropped unclosed sends nothing.
- **downloads** onto a local disk: each file of at most 1 MiB (the whole-file copies of
  `retryfs.datapath.download`) is one GetObject of the whole object, streamed into the file
  beside its destination (in chunks: a file that grew since its listing is not held whole),
  each attempt retried as the operation ``read``.

What does not fit keeps pyarrow's client:

- a file that grew past one part since its listing goes on as a pyarrow S3 stream (the bytes
  held so far written into it first), a multipart upload as before;
- a file with metadata to set (an S3 source's ``Content-Type``...) is a pyarrow stream;
- in a process forked from one that had used obstore (a ``fork`` DataLoader worker,
  ``multiprocessing`` with fork), pyarrow's client is used: obstore's runtime threads are not in
  the child, and a request there would never return;
- settings that obstore cannot be given the same way (no explicit keys and not anonymous: the
  AWS SDK's credential chain, with its profiles and roles, is not obstore's; ``role_arn``, a
  proxy, a CA file, default metadata, an unknown region) leave every file to pyarrow
  (``"auto"``) or are a ``ValueError`` naming what does not carry over (``"obstore"``).

obstore's errors reach the caller as obstore raises them (``obstore.exceptions``: a 403 is a
``PermissionDeniedError``, a missing object or bucket a ``NotFoundError``, which is a
``FileNotFoundError``); `retryfs.core.classify` reads their status and text.
"""

from __future__ import annotations

import os
import threading
from datetime import timedelta
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from retryfs.datapath.iopool import ONE_PART

__all__ = ["ObstoreSmallFiles", "obstore_options", "obstore_small_client"]

#: About the most bytes of a download `ObstoreSmallFiles.fetch` holds before it writes them.
FETCH_CHUNK = 1 << 20

#: obstore's whole-request timeout (its own default is 30 s, too short for 5 MiB on a slow
#: link): retryfs's ``write_timeout`` bounds an attempt.
_NO_TIMEOUT = timedelta(hours=1)


def _missing(options: dict[str, Any]) -> str | None:
    """What in pyarrow S3 ``options`` obstore cannot be given the same way, or None."""
    if options.get("role_arn"):
        return "role_arn (an assumed role)"
    if (options.get("proxy_options") or {}).get("host"):
        return "proxy_options"
    if options.get("tls_ca_file_path"):
        return "tls_ca_file_path"
    if options.get("default_metadata"):
        return "default_metadata"
    if not options.get("region"):
        return "region (none resolved)"
    if not options.get("anonymous") and not (options.get("access_key")
                                             and options.get("secret_key")):
        return "credentials (no access_key/secret_key given: the AWS SDK's own chain)"
    return None


def obstore_options(s3: pafs.S3FileSystem) -> dict[str, Any] | str:
    """``obstore.store.S3Store`` keywords (but the bucket) for the client ``s3`` describes, its
    retries off; or what does not carry over, as text."""
    _, (options,) = s3.__reduce__()
    missing = _missing(options)
    if missing is not None:
        return missing
    config: dict[str, Any] = {"region": options["region"]}
    if options.get("anonymous"):
        config["skip_signature"] = True
    else:
        config["access_key_id"] = options["access_key"]
        config["secret_access_key"] = options["secret_key"]
        if options.get("session_token"):
            config["session_token"] = options["session_token"]
    client: dict[str, Any] = {}
    endpoint = options.get("endpoint_override")
    scheme = options.get("scheme") or "https"
    if endpoint:
        config["endpoint"] = endpoint if "://" in endpoint else f"{scheme}://{endpoint}"
        config["virtual_hosted_style_request"] = bool(options.get("force_virtual_addressing"))
        client["allow_http"] = config["endpoint"].startswith("http://")
    else:
        config["virtual_hosted_style_request"] = True  # as the AWS SDK addresses AWS
    # pyarrow's request timeout bounds each wait for the socket, not the whole request:
    # obstore's read timeout, which resets after each read (its whole-request timeout is off:
    # retryfs's write_timeout bounds an upload attempt)
    client["timeout"] = _NO_TIMEOUT
    request, connect = options.get("request_timeout"), options.get("connect_timeout")
    if request and request > 0:  # (pyarrow's -1: not set)
        client["read_timeout"] = timedelta(seconds=request)
    if connect and connect > 0:
        client["connect_timeout"] = timedelta(seconds=connect)
    return {"config": config, "client_options": client,
            "retry_config": {"max_retries": 0, "retry_timeout": timedelta(seconds=1)}}


def obstore_small_client(s3: pafs.S3FileSystem, arrow: pafs.FileSystem
                         ) -> pafs.FileSystem | str:
    """A filesystem (`ObstoreSmallFiles`) whose output streams send through obstore what fits
    one part, the rest through ``arrow``; or why it cannot be built (obstore missing, or what
    of ``s3`` does not carry over), as text."""
    try:
        import obstore.store  # noqa: F401 - an optional dependency
    except ImportError:
        return "obstore is not installed (pip install 'retryfs[obstore]')"
    options = obstore_options(s3)
    if isinstance(options, str):
        return options
    return pafs.PyFileSystem(ObstoreSmallFiles(options, arrow))


#: The process in which retryfs first used obstore (and so started its runtime), if any.
_RUNTIME_PID: int | None = None


def _runtime_here() -> bool:
    """Whether obstore can be used from this process: not a fork of one whose obstore runtime
    had started (its threads are not in the child, and a request there never returns). The
    first use marks the process."""
    global _RUNTIME_PID
    if _RUNTIME_PID is None:
        _RUNTIME_PID = os.getpid()
    return _RUNTIME_PID == os.getpid()


class ObstoreSmallFiles(pafs.FileSystemHandler):  # type: ignore[misc]
    """A write-only filesystem (``bucket/key`` paths): output streams that hold what is written,
    one part at most, and send it as one obstore PutObject at their close; past one part, with
    metadata, or in a forked child of a process that used obstore, an ``arrow`` stream. And
    `fetch`, a whole object into a local file. One store per bucket and process."""

    def __init__(self, options: dict[str, Any], arrow: pafs.FileSystem) -> None:
        self._options = options
        self.arrow = arrow
        self._stores: dict[tuple[int, str], Any] = {}
        self._lock = threading.Lock()

    def store(self, bucket: str) -> Any:
        """The obstore ``S3Store`` of ``bucket`` in this process (a store does not cross a
        fork). A bucket with a dot in its name is addressed by path, as the AWS SDK does: a
        virtual host of it would not match the TLS certificate of ``*.s3.amazonaws.com``."""
        key = (os.getpid(), bucket)
        with self._lock:
            found = self._stores.get(key)
            if found is None:
                from obstore.store import S3Store

                options = self._options
                if "." in bucket:
                    options = dict(options, config={**options["config"],
                                                    "virtual_hosted_style_request": False})
                found = self._stores[key] = S3Store(bucket, **options)
            return found

    def open_output_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        if metadata or not _runtime_here():
            return self.arrow.open_output_stream(path, compression=None, metadata=metadata)
        bucket, key = _bucket_and_key(path)
        return pa.PythonFile(_PutOnClose(self, path, bucket, key), mode="w")

    def usable(self) -> bool:
        """Whether obstore can be used from this process (not a fork of one that used it)."""
        return _runtime_here()

    def fetch(self, path: str, destination_fs: pafs.FileSystem, target: str) -> int:
        """The object at ``path`` (one GetObject of it whole) written into a new file
        ``target`` of ``destination_fs``, in chunks of about `FETCH_CHUNK` bytes as they
        arrive; the bytes written. A failure leaves ``target`` partly written: the caller writes
        it beside its destination and removes it."""
        import obstore

        bucket, key = _bucket_and_key(path)
        result = obstore.get(self.store(bucket), key)
        written = 0
        with destination_fs.open_output_stream(target, compression=None) as out:
            for chunk in result.stream(min_chunk_size=FETCH_CHUNK):
                out.write(chunk)
                written += len(chunk)
        return written

    # -- what a FileSystemHandler must have; only output streams are asked of this one -----
    def get_type_name(self) -> str:
        return "retryfs-obstore-small-files"

    def __eq__(self, other: object) -> bool:
        return self is other

    def __ne__(self, other: object) -> bool:
        return self is not other

    def normalize_path(self, path: str) -> str:
        return path

    def _write_only(self, *args: Any) -> Any:
        raise NotImplementedError(
            "retryfs's obstore client of small files only opens output streams")

    get_file_info = get_file_info_selector = create_dir = delete_dir = _write_only
    delete_dir_contents = delete_root_dir_contents = delete_file = move = _write_only
    copy_file = open_input_stream = open_input_file = open_append_stream = _write_only


def _bucket_and_key(path: str) -> tuple[str, str]:
    bucket, _, key = path.partition("/")
    if not bucket or not key:
        raise ValueError(f"path: expected 'bucket/key', got {path!r}")
    return bucket, key


class _PutOnClose:
    """The Python side of one output stream of `ObstoreSmallFiles`."""

    def __init__(self, owner: ObstoreSmallFiles, path: str, bucket: str, key: str) -> None:
        self._owner, self._path, self._bucket, self._key = owner, path, bucket, key
        self._held: list[Any] = []  # the Buffers written (never reused by their writer)
        self._size = 0
        self._stream: pa.NativeFile | None = None  # past one part: pyarrow's
        self.closed = False

    def writable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._size

    def write(self, data: Any) -> int:
        if self.closed:
            raise ValueError("write to a closed stream")
        size = memoryview(data).nbytes
        if self._stream is None and self._size + size > ONE_PART:
            self._stream = self._owner.arrow.open_output_stream(self._path, compression=None)
            for held in self._held:
                self._stream.write(held)
            self._held = []
        if self._stream is not None:
            self._stream.write(data)
        else:
            self._held.append(data)
        self._size += size
        return size

    def flush(self) -> None:
        if self._stream is not None:
            self._stream.flush()

    def close(self) -> None:
        """The commit: the PutObject (or pyarrow's close). Once: a failed commit is not sent
        again by closing again (a retry opens a new stream)."""
        if self.closed:
            return
        self.closed = True
        if self._stream is not None:
            self._stream.close()
            return
        import obstore

        held, self._held = self._held, []
        # one buffer as it is (a byte view: obstore takes unsigned bytes, an Arrow Buffer's
        # format is signed), several joined
        body = memoryview(held[0]).cast("B") if len(held) == 1 else b"".join(held)
        obstore.put(self._owner.store(self._bucket), self._key, body, use_multipart=False)

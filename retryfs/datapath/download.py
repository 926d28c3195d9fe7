"""``pyarrow.fs.copy_files`` from a `RetryingFileSystem`: the inner filesystem's native streams.

Arrow's own copy reads a retryfs source through ``PythonFile``: every chunk crosses into
Python, through the retried read, and is copied into Arrow's buffer before it is written
(1.6-1.8x the client CPU of unwrapped pyarrow on a checkpoint download from S3). When the
source of ``copy_files`` is a `RetryingFileSystem` and the destination is not one (a
download, Ray Train's restore), retryfs's guard copies each file itself: the source's
resumable reader (`RetryingHandler.resumable_input`) over the inner filesystem's native stream,
each pyarrow Buffer it reads written as it is into the destination's native output stream.

Each read is retried as the operation ``read`` (its policy, attempts and deadline, as any read
of a retryfs stream); after a fault the inner file is reopened with ``open_input_file`` and
positioned at the offset (S3: a GET of ``Range: bytes=<offset>-``), so a fault costs at most
the chunk that was being read, never the prefix. The destination's own calls are not retried
(it is not retryfs): their errors fail the file, as in Arrow's copy.

A small file (at most `WHOLE_FILE`, 1 MiB) from S3, Azure or a local disk onto a local disk is
copied whole by Arrow's own one-file copy instead, with the GIL released, written beside its
destination and renamed into place; each attempt is that whole copy (open and reads together),
retried as the operation ``read``. A fault costs what it costs the resumable reader: the one
GET of a small file holds all of it, so that reader's resume is a HEAD and a GET from byte 0
too. The per-file Python work of a resumable reader is what made a checkpoint's hundreds of
small files slower than unwrapped pyarrow's. Not under a per-attempt timeout of the open or
the reads, which only a resumable reader can apply.

Only a whole copy is committed: when the source finally fails, the destination stream is
dropped unclosed (an object store shows nothing; Arrow's own copy closes it, committing the
prefix as the file) and a local destination, written in place as it goes, is written beside
and renamed (`retryfs.datapath.upload.written_whole`). Per file as Arrow: a serial copy stops at
the first file that fails and raises its error; a threaded one (``pyarrow.io_thread_count()``
files at a time) copies every file and raises the first failure of the listing, with a note
naming every file that was not copied.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import wait as futures_wait
from typing import Any, Protocol

import pyarrow as pa
import pyarrow.fs as pafs
from pyarrow._fs import _copy_files as _arrow_copy_file  # the unguarded one, one file

from retryfs.core.engine import Retrier
from retryfs.core.locations import subtree_base
from retryfs.core.redact import redact
from retryfs.core.timeouts import AttemptSignal, in_background

from .streams import SUB_READ, ResumableInputFile
from .upload import (
    PlannedFile,
    prepare_tree,
    pump_into,
    writes_through,
    written_whole,
)

__all__ = ["WHOLE_FILE", "DownloadSource", "TreeShare", "download_file_tree",
           "download_single_file", "reads_ranges_concurrently", "unlisted_parents"]

#: A download has no attempt of its own to abandon: each read is retried where it failed.
_NEVER = AttemptSignal()  # a download attempt is never abandoned
#: The most sub-reads of one file in flight: ``window`` x `SUB_READ` is at most one 64 MiB
#: chunk of ``copy_files`` (Ray Train's), the memory unwrapped pyarrow holds per file.
MAX_WINDOW = 8
_EMPTY = pa.py_buffer(b"")
#: Filesystems whose random-access files read ranges concurrently. Not pyarrow's GCS: its
#: input file opens its download lazily, holding the GIL (an in-process server never answers).
_RANGED = tuple(cls for cls in (pafs.S3FileSystem, getattr(pafs, "AzureFileSystem", None))
                if cls is not None)
#: The largest file a download onto a local disk copies whole with Arrow's one-file copy, each
#: attempt the whole file (`_copied_whole`).
WHOLE_FILE = 1 << 20
#: The sources whose files Arrow's one-file copy reads without holding the GIL. Not pyarrow's
#: GCS (its lazy open, above) nor a ``PyFileSystem`` (each of its reads is Python again).
_WHOLE_FILE_SOURCES = (*_RANGED, pafs.LocalFileSystem)
#: The operations of a resumable download whose per-attempt timeouts keep it resumable.
_TIMED = frozenset({"open_input_stream", "open_input_file", "read"})


def reads_ranges_concurrently(fs: pafs.FileSystem) -> bool:
    """Whether ``fs`` (or the base of a ``SubTreeFileSystem`` of it) is one whose
    random-access files read ranges concurrently (pyarrow S3 and Azure: each read is its own
    ranged GET; opening one costs what opening a stream does, one HEAD)."""
    return isinstance(subtree_base(fs), _RANGED)


class DownloadSource(Protocol):
    """What a download needs of the source's handler (`retryfs.arrow.filesystem.RetryingHandler`)."""

    inner: pafs.FileSystem
    retrier: Retrier
    timeouts: dict[str, float]

    def resumable_input(self, operation: str, path: str, *,
                        seekable: bool) -> ResumableInputFile: ...
    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]: ...
    def small_files_reader(self) -> Callable[[str, pafs.FileSystem, str], int] | None: ...


def download_single_file(handler: DownloadSource, source: str, destination_fs: pafs.FileSystem,
                         destination: str, chunk_size: int, use_threads: bool) -> None:
    """What ``pyarrow.fs._copy_files`` does, reading through ``handler``'s retries."""
    _download(handler, source, destination_fs, destination, max(1, chunk_size), None)


def download_file_tree(handler: DownloadSource, selector: pafs.FileSelector,
                       destination_fs: pafs.FileSystem, destination_base: str, chunk_size: int,
                       use_threads: bool) -> None:
    """A tree downloaded as `retryfs.datapath.upload.copy_file_tree` copies one (Arrow's order:
    directories, then files, serial or ``pyarrow.io_thread_count()`` at a time)."""
    create_dir = functools.partial(destination_fs.create_dir, recursive=True)
    files = prepare_tree(handler.get_file_info_selector(selector), selector.base_dir,
                         destination_base, chunk_size, create_dir)
    if writes_through(destination_fs):
        for directory in unlisted_parents(files, destination_base):
            create_dir(directory)
    if not use_threads or len(files) < 2:
        for source, destination, buffer_size, size in files:
            _download(handler, source, destination_fs, destination, buffer_size, size)  # raises
        return
    lanes = max(1, pa.io_thread_count())
    _raise_first(_download_in_lanes(handler, destination_fs, files, lanes,
                                    TreeShare(lanes, len(files))))


def unlisted_parents(files: list[PlannedFile], destination_base: str) -> list[str]:
    """The directories a local disk needs for ``files`` that the listing may not have named: an
    object store lists a directory only where an object marks it (a GCS bucket written by
    another tool has no markers; a marker whose creation failed, which pyarrow's GCS client
    does not report, is missing), and Arrow's copy then fails to open the local file. The
    deepest of each branch: each is created with its parents."""
    if not files:
        return []
    parents = {destination.rpartition("/")[0] for _, destination, _, _ in files}
    parents.add(destination_base.rstrip("/"))
    parents.discard("")
    ancestors = {ancestor for parent in parents for ancestor in _ancestors(parent)}
    return sorted(parents - ancestors)


def _ancestors(path: str) -> Iterator[str]:
    while "/" in path.strip("/"):
        path = path.rpartition("/")[0]
        yield path


class TreeShare:
    """The most sub-reads of one file in flight in a threaded tree: the IO threads divided
    among the tree's files not yet done, at least 1, at most `MAX_WINDOW`, asked again at each
    sub-read. While files wait for a lane every lane keeps one request in flight, as many as
    unwrapped pyarrow's copy (one per IO thread); once the last files are in their lanes, the
    lanes left idle go to them (a 64 MiB file alone at the end: 8). A 64 MiB file's 8
    sub-reads beside 100 small files' requests made the tree slower (moto, 2026-12-03: 0.92-0.95
    of unwrapped); after the small files were copied whole, 2 in flight for the whole tree went
    at 0.96-0.99 and 1 at 0.98-1.01 (five A/B runs of 15 to 31 rounds)."""

    def __init__(self, io_threads: int, files: int) -> None:
        self._io_threads = max(1, io_threads)
        self._left = max(1, files)
        self._lock = threading.Lock()

    def __call__(self) -> int:
        return max(1, min(MAX_WINDOW, self._io_threads // max(1, self._left)))

    def file_done(self) -> None:
        with self._lock:
            self._left -= 1


def _whole_window() -> int:
    """A file copied alone: its whole window in flight."""
    return MAX_WINDOW


def _download_in_lanes(handler: DownloadSource, destination_fs: pafs.FileSystem,
                       files: list[PlannedFile], lanes: int, share: TreeShare
                       ) -> list[tuple[str, Exception]]:
    """Every file downloaded, ``lanes`` at a time as Arrow's IO threads: each lane, a worker
    of its own, takes the next file of the listing when it is done with the last, with at
    most ``share()`` sub-reads in flight. One task per lane, not one per file: with a task, a
    future and a semaphore per file, 100 files of 64 KiB from SeaweedFS took 1.40x the
    client CPU of unwrapped pyarrow, in lanes 1.26x (2026-12-03). The failed files,
    ``(destination, error)`` in the listing's order."""
    failed: list[tuple[int, str, Exception]] = []
    taken = itertools.count()  # its next() is atomic: each index goes to one lane

    def lane() -> None:
        for index in taken:
            if index >= len(files):
                return
            source, destination, buffer_size, size = files[index]
            try:
                _download(handler, source, destination_fs, destination, buffer_size, size,
                          share)
            except Exception as exc:  # noqa: BLE001 - every file runs; the caller raises
                failed.append((index, destination, exc))
            finally:
                share.file_done()

    running = [in_background(lane) for _ in range(min(lanes, len(files)))]
    futures_wait(running)  # every lane ends before any outcome is raised
    for outcome in running:
        outcome.result()
    return [(destination, error) for _, destination, error in sorted(failed,
                                                                     key=lambda f: f[0])]


def _download(handler: DownloadSource, source: str, destination_fs: pafs.FileSystem,
              destination: str, buffer_size: int, size: int | None,
              share: Callable[[], int] = _whole_window) -> None:
    if _copied_whole(handler, destination_fs, size):
        fetch = handler.small_files_reader()  # obstore's GetObject (one_part_client)
        attempt = (functools.partial(_fetched, fetch, source, destination_fs) if fetch
                   else functools.partial(_arrow_copy, handler.inner, source, destination_fs))
        handler.retrier.call("read", source, written_whole, destination_fs, destination,
                             attempt, _NEVER)
        return
    window = _window(handler.inner, buffer_size, size)

    def write(target: str, beside: bool) -> int:
        if not window:  # one read per chunk, each split into sub-reads one after the other
            with handler.resumable_input("open_input_stream", source, seekable=False) as reader:
                return pump_into(destination_fs, target, reader, buffer_size, _NEVER, beside,
                                 listed=size)
        with handler.resumable_input("open_input_file", source, seekable=True) as reader, \
                contextlib.closing(_Pieces(reader, lambda: min(window, share()))) as pieces:
            return pump_into(destination_fs, target, pieces, buffer_size, _NEVER, beside,
                             listed=size)

    written_whole(destination_fs, destination, write, _NEVER)


def _copied_whole(handler: DownloadSource, destination_fs: pafs.FileSystem,
                  size: int | None) -> bool:
    """Whether a file of ``size`` is downloaded by whole-file attempts of Arrow's one-file copy:
    a small one (`WHOLE_FILE`), from a source Arrow reads natively, onto a local disk (written
    beside and renamed: a failed copy leaves nothing), with no per-attempt timeout on its open
    or reads (`_TIMED`: only the resumable reader applies them)."""
    if size is None or not 0 <= size <= WHOLE_FILE or not _TIMED.isdisjoint(handler.timeouts):
        return False
    return (isinstance(subtree_base(handler.inner), _WHOLE_FILE_SOURCES)
            and writes_through(destination_fs))


def _arrow_copy(source_fs: pafs.FileSystem, source: str, destination_fs: pafs.FileSystem,
                target: str, beside: bool) -> int:
    """One attempt of `_copied_whole`: Arrow's copy of ``source`` into ``target`` (beside), in
    reads of `WHOLE_FILE`, not of the listed size: a file listed empty that has grown since
    would be read a byte at a time (on S3 a GET each; S3's reads end at the size its open
    found). Arrow reads into one buffer again and again; 0: the bytes are not counted."""
    _arrow_copy_file(source_fs, source, destination_fs, target, WHOLE_FILE, False)
    return 0


def _fetched(fetch: Callable[[str, pafs.FileSystem, str], int], source: str,
             destination_fs: pafs.FileSystem, target: str, beside: bool) -> int:
    """One attempt of `_copied_whole` through obstore (`retryfs.arrow.obstore_small`): one
    GetObject of the whole object, no HeadObject, into ``target`` (beside)."""
    return fetch(source, destination_fs, target)


def _window(fs: pafs.FileSystem, buffer_size: int, size: int | None) -> int:
    """How many sub-reads of a file to keep in flight at most (in a tree, fewer while its
    other files are copied: `TreeShare`); 0: read it as a stream. Only for a file of several
    sub-reads, on a filesystem whose files read ranges concurrently (the open costs a HEAD on
    S3). In a tree (sizes listed), a chunk smaller than a sub-read still reads by sub-reads,
    one in flight: on S3 each read of a stream is one GET, and ``copy_files``'s default 1 MiB
    chunk made a 32 MiB file 32 GETs one after the other, where 8 MiB sub-reads make 4."""
    if not reads_ranges_concurrently(fs) or (size is not None and size <= SUB_READ):
        return 0
    if size is None and buffer_size <= SUB_READ:  # one file, its size unknown: as a stream
        return 0
    return min(MAX_WINDOW, -(-buffer_size // SUB_READ))  # the sub-reads of one chunk, or one


class _Pieces:
    """The reader as `retryfs.datapath.upload.pump_into` reads it: each ``read_buffer`` the next
    piece of `ResumableInputFile.ranged_buffers` (empty at the end), whatever size it asks."""

    def __init__(self, reader: ResumableInputFile, window: Callable[[], int]) -> None:
        self._reader = reader
        self._pieces: Iterator[Any] = reader.ranged_buffers(window)

    def metadata(self) -> dict[str, bytes]:
        return self._reader.metadata()

    def read_buffer(self, size: int) -> pa.Buffer:
        piece = next(self._pieces, _EMPTY)
        return piece if isinstance(piece, pa.Buffer) else pa.py_buffer(piece)

    def close(self) -> None:
        """Ends the reads in flight, before the file is closed."""
        close = getattr(self._pieces, "close", None)
        if close is not None:
            close()


def _raise_first(failed: list[tuple[str, Exception]]) -> None:
    """The first failed file's error (its own type), noting every file not copied."""
    if not failed:
        return
    error = failed[0][1]
    if len(failed) > 1 and hasattr(error, "add_note"):
        shown = ", ".join(repr(redact(path)) for path, _ in failed[:10])
        more = f" and {len(failed) - 10} more" if len(failed) > 10 else ""
        error.add_note(f"retryfs: pyarrow.fs.copy_files did not copy {len(failed)} files: "
                       f"{shown}{more}")
    raise error

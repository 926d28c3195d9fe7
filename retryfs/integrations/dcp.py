"""torch.distributed.checkpoint through retryfs: `RetryingStorageWriter`, `RetryingStorageReader`.

::

    import torch.distributed.checkpoint as dcp
    from retryfs.integrations.dcp import RetryingStorageReader, RetryingStorageWriter

    dcp.save(state, storage_writer=RetryingStorageWriter("s3://bucket/ckpt/step-100"))
    dcp.load(state, storage_reader=RetryingStorageReader("s3://bucket/ckpt/step-100"))

DCP's own ``FileSystemWriter`` and ``FileSystemReader`` with their filesystem replaced by
retryfs's pyarrow face, as AWS's s3torchconnector ships ``S3StorageWriter`` and
``S3StorageReader``. DCP's ``FsspecWriter`` on a ``retry::`` URL works too (docs/pytorch.md);
these go through the native S3, GCS and Azure clients instead of s3fs:

- each rank's file is written through `RetryingFileSystem.open_output_stream`: parts uploaded
  in parallel while DCP serialises, a failed part re-sent by the client, an upload that fails
  replayed from retryfs's spool, the commit retried and proven new (as for any stream);
- ``.metadata`` is written beside as ``.metadata.tmp`` and renamed (DCP's protocol; on an
  object store the rename is a copy and a delete, each retried);
- a load reads each stored item with one ranged, resumable read of exactly its bytes (DCP's
  own reader reads each item's zip headers with a request each), and ``.metadata`` whole;
- on an object store DCP's ``mkdir`` makes no directory marker (pyarrow's client leaves an
  empty ``ckpt/`` when it deletes ``.metadata.tmp``).

Locations are written as users write them: ``s3://bucket/ckpt``, ``retry::s3://bucket/ckpt``,
``gs://...``, ``abfs://...``, with ``retry_*`` query parameters, or a local path. Given
``filesystem=``, the location is a path on it. ``fsync`` is not offered: an object store has
none, and on a local disk DCP's fallback (``os.sync()``) would flush the whole machine.
"""

from __future__ import annotations

import io
import os
from collections.abc import Generator
from contextlib import contextmanager
from typing import IO, Any, cast

import pyarrow as pa
import pyarrow.fs as pafs
from torch.distributed.checkpoint.filesystem import (
    FileSystemBase,
    FileSystemReader,
    FileSystemWriter,
)

from retryfs.arrow.filesystem import RetryingFileSystem
from retryfs.integrations.locations import Locations, on_local_disk, split_location

__all__ = ["RetryingDCPFileSystem", "RetryingStorageReader", "RetryingStorageWriter"]

#: A file read whole when opened for reading at most this long (``.metadata``): one GET instead
#: of one per ``pickle`` read.
WHOLE_READ = 8 * 2**20


class RetryingDCPFileSystem(FileSystemBase):  # type: ignore[misc]  # untyped library
    """DCP's filesystem interface on a `RetryingFileSystem`, one checkpoint location at a time.

    ``init_path`` takes a location (``s3://bucket/ckpt``, a local path...) and makes the paths
    that follow paths on that location's filesystem.
    """

    def __init__(self, locations: Locations) -> None:
        self.locations = locations
        self.filesystem: RetryingFileSystem | None = None
        self.local = False

    @property
    def fs(self) -> RetryingFileSystem:
        if self.filesystem is None:
            raise RuntimeError("no checkpoint location yet: init_path() comes first")
        return self.filesystem

    def init_path(self, path: str | os.PathLike[str]) -> str:
        fs, inner = self.locations.resolve(os.fspath(path))
        self.filesystem = fs
        self.local = on_local_disk(fs)
        return inner.rstrip("/") if inner.strip("/") else inner

    def concat_path(self, path: str | os.PathLike[str], suffix: str) -> str:
        return f"{os.fspath(path).rstrip('/')}/{suffix}"

    @contextmanager
    def create_stream(self, path: str | os.PathLike[str], mode: str
                      ) -> Generator[io.IOBase, None, None]:
        path = os.fspath(path)
        if mode == "wb":
            with self.fs.open_output_stream(path, compression=None) as stream:
                yield stream
        elif mode == "rb":
            with self.fs.open_input_file(path) as stream:
                if stream.size() <= WHOLE_READ:
                    yield pa.BufferReader(stream.read())
                else:
                    yield stream
        else:
            raise ValueError(f"mode: 'rb' or 'wb', got {mode!r}")

    def rename(self, path: str | os.PathLike[str], new_path: str | os.PathLike[str]) -> None:
        if self.local:
            self.fs.move(os.fspath(path), os.fspath(new_path))
            return
        # on an object store a copy, then a delete, each its own retried operation: a failed
        # delete does not copy again
        self.fs.copy_file(os.fspath(path), os.fspath(new_path))
        self.fs.delete_file(os.fspath(path))

    def mkdir(self, path: str | os.PathLike[str]) -> None:
        if self.local:  # an object store has no directories to make (nor markers to leave)
            self.fs.create_dir(os.fspath(path), recursive=True)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        try:
            split_location(os.fspath(checkpoint_id))
        except (TypeError, ValueError):
            return False
        return True

    def exists(self, path: str | os.PathLike[str]) -> bool:
        return bool(self.fs.get_file_info(os.fspath(path)).type != pafs.FileType.NotFound)

    def rm_file(self, path: str | os.PathLike[str]) -> None:
        self.fs.delete_file(os.fspath(path))

    def ls(self, path: str | os.PathLike[str]) -> list[str]:
        selector = pafs.FileSelector(os.fspath(path), allow_not_found=True)
        return [info.path for info in self.fs.get_file_info(selector)]


class RetryingStorageWriter(FileSystemWriter):  # type: ignore[misc]  # untyped library
    """DCP's ``FileSystemWriter`` writing through retryfs.

    Args:
        path: the checkpoint's location (``s3://bucket/ckpt``, ``retry::gs://b/c``, a local
            directory...), or a path on ``filesystem``.
        filesystem: the filesystem to write to: a `RetryingFileSystem` (for example from
            `retryfs.from_uri`), or any pyarrow or fsspec filesystem, which is wrapped.
            ``None``: one per store, made by `retryfs.from_uri` from the location.
        single_file_per_rank / thread_count / per_thread_copy_ahead / overwrite: DCP's
            ``FileSystemWriter`` options, unchanged.
        **options: options of `RetryingFileSystem` (``policy=``, ``deadline``...) for the
            filesystem made or wrapped.
    """

    def __init__(self, path: str | os.PathLike[str], filesystem: Any = None, *,
                 single_file_per_rank: bool = True, thread_count: int = 1,
                 per_thread_copy_ahead: int = 10_000_000, overwrite: bool = True,
                 **options: Any) -> None:
        super().__init__(path=os.fspath(path), single_file_per_rank=single_file_per_rank,
                         sync_files=False, thread_count=thread_count,
                         per_thread_copy_ahead=per_thread_copy_ahead, overwrite=overwrite)
        self.fs = RetryingDCPFileSystem(Locations(filesystem, options))
        self.path = self.fs.init_path(path)

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return RetryingDCPFileSystem.validate_checkpoint_id(checkpoint_id)


class RetryingStorageReader(FileSystemReader):  # type: ignore[misc]  # untyped library
    """DCP's ``FileSystemReader`` reading through retryfs: one ranged, resumable read per
    stored item.

    Args:
        path, filesystem, **options: as for `RetryingStorageWriter`.
    """

    def __init__(self, path: str | os.PathLike[str], filesystem: Any = None,
                 **options: Any) -> None:
        super().__init__(path=os.fspath(path))
        self.fs = RetryingDCPFileSystem(Locations(filesystem, options))
        self.path = self.fs.init_path(path)

    def _slice_file(self, file: Any, sinfo: Any) -> IO[bytes]:
        """The stored item's bytes, read at once (DCP's own slice reads its zip headers
        piecemeal: one request each on an object store)."""
        if sinfo.offset + sinfo.length > file.size():  # cut short since it was saved
            raise OSError(f"{sinfo.relative_path}: {file.size()} bytes, but {sinfo.length} "
                          f"were stored at offset {sinfo.offset}")
        if isinstance(file, pa.BufferReader):  # read whole already
            return super()._slice_file(file, sinfo)  # type: ignore[no-any-return]
        # the item into one Buffer through the resumable reader of the handler's InputFile
        # (its read_at would make bytes of that Buffer); bytes from a non-native inner file
        file.source.seek(sinfo.offset)
        data = file.source.read_buffer(sinfo.length)
        if len(data) != sinfo.length:  # cut short while it was read
            raise OSError(f"{sinfo.relative_path}: {len(data)} bytes at offset "
                          f"{sinfo.offset}, {sinfo.length} stored")
        return cast("IO[bytes]", pa.BufferReader(data))

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:
        return RetryingDCPFileSystem.validate_checkpoint_id(checkpoint_id)

"""Lightning checkpoints through retryfs: `RetryingCheckpointIO`, a ``CheckpointIO`` plugin.

::

    from lightning.pytorch import Trainer
    from retryfs.integrations.lightning import RetryingCheckpointIO

    trainer = Trainer(default_root_dir="retry::s3://bucket/exp",
                      plugins=[RetryingCheckpointIO()])

A ``CheckpointIO`` plugin is Lightning's supported way to own checkpoint I/O (AWS's
s3torchconnector ships ``S3LightningCheckpoint`` the same way). Without one, Lightning saves
through fsspec's ``fs.open("wb")`` inside ``fs.transaction`` unless it recognises the
filesystem as s3fs, gcsfs or adlfs: on a ``retry::`` URL a checkpoint is then one part of its
whole size, and the check after the commit is off inside the transaction. The plugin saves
through retryfs's pyarrow face instead. ``torch.save`` streams into the upload
(`RetryingFileSystem.write_with`): parts go out in parallel while it serialises, a failed part
is re-sent alone by the client, an upload that fails anyway is made again by calling
``torch.save`` again into a fresh one (no replay spool: nothing in a temporary file, nothing
held beyond the parts in flight), the commit is proven new, and an error in ``torch.save``
commits nothing. On a local disk the checkpoint is written beside its name and renamed. A load
reads the object with ranged, resumable reads. Paths may be ``retry::s3://b/k``, ``s3://b/k`` or local.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import pyarrow.fs as pafs

from retryfs.arrow.filesystem import RetryingFileSystem
from retryfs.integrations.locations import Locations, on_local_disk, split_location

try:  # Lightning 2.x ships as ``lightning`` and as ``pytorch_lightning``
    from lightning.fabric.plugins.io.checkpoint_io import CheckpointIO
except ImportError:  # pragma: no cover - only without the ``lightning`` package
    from lightning_fabric.plugins.io.checkpoint_io import CheckpointIO

__all__ = ["RetryingCheckpointIO", "split_location"]


class RetryingCheckpointIO(CheckpointIO):  # type: ignore[misc]  # untyped library
    """Save, load and remove Lightning checkpoints through a `retryfs.RetryingFileSystem`.

    Args:
        filesystem: the filesystem every checkpoint goes to: a `RetryingFileSystem` (for
            example from `retryfs.from_uri`), or any pyarrow or fsspec filesystem, which is
            wrapped. Paths are given to it without their ``retry::`` and scheme
            (``s3://bucket/k`` -> ``bucket/k``). ``None``: each location's filesystem is made
            by `retryfs.from_uri` from its scheme, bucket and ``retry_*`` query (credentials,
            region and the ``RETRYFS_*`` policy from the environment), once per store and
            process.
        **options: options of `RetryingFileSystem` (``policy=``, ``deadline``...) for the
            filesystems this plugin wraps or makes.
    """

    def __init__(self, filesystem: Any = None, **options: Any) -> None:
        self._locations = Locations(filesystem, options)

    def resolve(self, path: Any) -> tuple[RetryingFileSystem, str]:
        """The filesystem a checkpoint location goes to, and the path on it."""
        return self._locations.resolve(path)

    # -- CheckpointIO ---------------------------------------------------------------------------
    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any,
                        storage_options: Any | None = None) -> None:
        """``torch.save`` ``checkpoint`` into an upload to ``path`` (see the module)."""
        if storage_options is not None:
            raise TypeError("RetryingCheckpointIO.save_checkpoint takes no storage_options "
                            f"(got {storage_options!r}): configure the filesystem instead")
        import torch

        fs, target = self.resolve(path)
        parent = target.rsplit("/", 1)[0] if "/" in target.strip("/") else ""
        if parent and on_local_disk(fs):
            fs.create_dir(parent, recursive=True)
        # torch.save streams into the upload (parts sent while it serialises), and runs again
        # into a fresh one if that fails; an error in torch.save commits nothing; on a local
        # disk the file is written beside its name and renamed
        fs.write_with(target, lambda stream: torch.save(checkpoint, stream))

    def load_checkpoint(self, path: Any, map_location: Callable[..., Any] | Any = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        """Read ``path`` whole (ranged, resumable reads), then ``torch.load`` it."""
        import torch

        fs, target = self.resolve(path)
        if fs.get_file_info(target).type != pafs.FileType.File:
            raise FileNotFoundError(f"checkpoint not found: {path}")
        with fs.open_input_file(target) as stream:
            data = stream.read()
        loaded: dict[str, Any] = torch.load(io.BytesIO(data), map_location=map_location,
                                            weights_only=weights_only)
        return loaded

    def remove_checkpoint(self, path: Any) -> None:
        """Delete the checkpoint at ``path`` (a file, or a directory of one); absent is done."""
        fs, target = self.resolve(path)
        kind = fs.get_file_info(target).type
        if kind == pafs.FileType.File:
            fs.delete_file(target)
        elif kind == pafs.FileType.Directory:
            fs.delete_dir(target)

"""The pyarrow face: `RetryingFileSystem`, a ``pyarrow.fs.FileSystem`` that retries every call
of another, and the adapter that lets it wrap an fsspec filesystem.
"""

from .filesystem import RetryingFileSystem, RetryingHandler, as_arrow_filesystem
from .filesystem import _rebuild_filesystem as _rebuild_filesystem  # pickles of 0.1.0 name it

__all__ = ["RetryingFileSystem", "RetryingHandler", "as_arrow_filesystem"]

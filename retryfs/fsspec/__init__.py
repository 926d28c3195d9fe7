"""The fsspec face: `RetryFileSystem` (the ``retry::`` protocol) and its async twin, with the
files it opens and how a retry tells its own earlier work from someone else's.
"""

from .filesystem import AsyncRetryFileSystem, RetryFileSystem
from .filesystem import _restore as _restore  # pickles of 0.1.0 name it

__all__ = ["AsyncRetryFileSystem", "RetryFileSystem"]

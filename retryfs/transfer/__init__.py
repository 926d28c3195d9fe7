"""`retryfs.copy` and ``retryfs cp``: a file or a tree between two locations, skipping what
the destination already holds and checking what it wrote.
"""

from .copier import copy
from .results import CopyResult

__all__ = ["CopyResult", "copy"]

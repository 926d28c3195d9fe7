"""retryfs: storage I/O that survives transient failures.

``RetryingFileSystem`` wraps any pyarrow or fsspec filesystem and retries every operation, and
every read, write and close of the files it opens, under a ``RetryPolicy``.
"""

from . import _moved
from .arrow import RetryingFileSystem
from .config import WrapperConfig
from .core import exporters as _exporters  # noqa: F401 - starts Ray metrics inside Ray
from .core.budget import RetryBudget
from .core.classify import Decision, ErrorClassifier
from .core.engine import no_sleep
from .core.policy import RetryPolicy
from .core.ratelimit import RateLimit
from .core.redact import redact
from .core.stats import RetryEvent, RetryStats
from .errors import (
    AttemptAbandoned,
    AttemptTimeoutError,
    CommitInFlightError,
    CommitNotVisibleError,
    CopyError,
    CopyFilesGuardError,
    InnerFileClosedError,
    RetryfsError,
    UnfinishedDeleteError,
    UsageError,
    VerificationError,
)
from .fsspec import RetryFileSystem
from .transfer import CopyResult, copy
from .uri import from_uri

_moved.install()  # the module names of 0.1.0 (its pickles name them)

__version__ = "0.1.0"

__all__ = [
    "AttemptAbandoned",
    "AttemptTimeoutError",
    "CommitInFlightError",
    "CommitNotVisibleError",
    "CopyError",
    "CopyFilesGuardError",
    "CopyResult",
    "Decision",
    "ErrorClassifier",
    "InnerFileClosedError",
    "RateLimit",
    "RetryBudget",
    "RetryEvent",
    "RetryFileSystem",
    "RetryPolicy",
    "RetryStats",
    "RetryfsError",
    "RetryingFileSystem",
    "UnfinishedDeleteError",
    "UsageError",
    "VerificationError",
    "WrapperConfig",
    "copy",
    "from_uri",
    "no_sleep",
    "redact",
]

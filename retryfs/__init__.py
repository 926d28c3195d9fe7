"""retryfs: storage I/O that survives transient failures.

``RetryingFileSystem`` wraps any pyarrow or fsspec filesystem and retries every operation, and
every read, write and close of the files it opens, under a ``RetryPolicy``.
"""

from . import exporters as _exporters  # noqa: F401 - starts Ray metrics inside Ray
from .arrow import RetryingFileSystem
from .budget import RetryBudget
from .classify import Decision, ErrorClassifier
from .config import WrapperConfig
from .engine import no_sleep
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
from .policy import RetryPolicy
from .ratelimit import RateLimit
from .redact import redact
from .stats import RetryEvent, RetryStats
from .transfer import CopyResult, copy
from .uri import from_uri

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

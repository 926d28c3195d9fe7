"""Shared test helpers (not fixtures): tiny policies, hashing."""

import hashlib

from retryfs import RetryPolicy

FAST = RetryPolicy(max_attempts=4, initial_delay=0.001, multiplier=2, max_delay=0.004,
                   jitter=False)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()

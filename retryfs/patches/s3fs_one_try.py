"""s3fs under one try: a failed request raised at once, a bucket probe that fails not read as
"no bucket".

s3fs sends each request through its own retry loop (``s3fs.core._error_wrapper``), which sleeps
after *every* failed try, the last one included: with ``retries = 1`` (what retryfs sets, so
that retryfs's own policy is the one retry layer) a SlowDown or a reset answered in 5 ms
reaches retryfs 100 ms later, and retryfs's backoff comes on top.

retryfs gives the s3fs clients it configures for one attempt a ``retries`` of
`retryfs.clients.OneTry` (an ``int`` equal to 1). The wrapped ``_error_wrapper`` sends a request whose ``retries`` is a
`OneTry` once and raises its error translated as s3fs translates it
(``s3fs.errors.translate_boto_error``), without the sleep; any other call (an s3fs client
retryfs did not configure, or one allowed more than one attempt) goes to s3fs's own loop
unchanged.

s3fs decides that a bucket exists by two probes (``head_bucket``, then
``get_bucket_location``) and reads *any* error of both as "no bucket": ``makedirs`` of a path
in an existing bucket then tries to create the bucket, which fails with an error that is not
retried (``InvalidLocationConstraint``, ``BucketAlreadyOwnedByYou``). With s3fs's five tries a
probe rarely fails; with one, a SlowDown on each is enough (a torch DCP save makes that call
every time). For a `OneTry` client, a bucket that s3fs found absent is asked once more with a
``head_bucket`` whose errors count: not found or denied, it is absent, as s3fs says; there, it
exists; any other error (a throttle, a reset) is raised, and retryfs retries the operation.
"""

from __future__ import annotations

import threading
from collections.abc import Awaitable, Callable
from typing import Any

from retryfs.clients import OneTry

from . import registry

__all__ = ["OneTry", "install", "spare"]


_lock = threading.Lock()
_installed = False


def install() -> bool:
    """Wrap ``s3fs.core._error_wrapper`` and ``S3FileSystem._exists`` once per process if the
    patch applies; whether it is installed."""
    global _installed
    with _lock:
        if _installed:
            return True
        if not registry.applies("s3fs_one_try"):
            return False
        import s3fs.core

        original = s3fs.core._error_wrapper
        s3fs.core._error_wrapper = _without_the_last_sleep(original)
        exists = s3fs.core.S3FileSystem._exists
        s3fs.core.S3FileSystem._exists = _bucket_confirmed(exists)
        _installed = True
    registry.note_applied("s3fs_one_try", "s3fs.core._error_wrapper sends a one-try request "
                                          "once, without its sleep after the failure; "
                                          "S3FileSystem._exists confirms an absent bucket")
    return True


def spare(fs: Any) -> None:
    """Install the patch if ``fs`` is an s3fs client retryfs configured for one attempt (its
    ``retries`` a `OneTry`): called by both faces on the client they wrap."""
    if isinstance(getattr(fs, "retries", None), OneTry):
        install()


def _without_the_last_sleep(original: Callable[..., Awaitable[Any]]
                            ) -> Callable[..., Awaitable[Any]]:
    from s3fs.errors import translate_boto_error

    async def _error_wrapper(func: Callable[..., Awaitable[Any]], *, args: Any = (),
                             kwargs: Any = None, retries: int) -> Any:
        if not isinstance(retries, OneTry):
            return await original(func, args=args, kwargs=kwargs, retries=retries)
        try:
            return await func(*args, **(kwargs or {}))
        except Exception as error:  # noqa: BLE001 - translated as s3fs does, and raised
            failed = error
        # raised outside the except block, as s3fs raises it: the translation's __cause__ is
        # the client's error, and no __context__ is added
        raise translate_boto_error(failed)

    _error_wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    return _error_wrapper


def _bucket_confirmed(original: Callable[..., Awaitable[bool]]) -> Callable[..., Awaitable[bool]]:
    async def _exists(self: Any, path: str) -> bool:
        found = await original(self, path)
        if found or not isinstance(getattr(self, "retries", None), OneTry):
            return found
        bucket, key, _ = self.split_path(self._strip_protocol(path)) if path else ("", "", None)
        if key or not bucket:
            return found
        try:  # raises what s3fs's own probes swallowed (translated: EBUSY, EIO, timeouts...)
            await self._call_s3("head_bucket", Bucket=bucket)
        except (FileNotFoundError, PermissionError):
            return False
        return True

    _exists.__wrapped__ = original  # type: ignore[attr-defined]
    return _exists

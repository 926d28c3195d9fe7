"""One try of an s3fs request without s3fs's sleep after it.

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
    """Wrap ``s3fs.core._error_wrapper`` once per process if the patch applies; whether it is
    installed."""
    global _installed
    with _lock:
        if _installed:
            return True
        if not registry.applies("s3fs_one_try"):
            return False
        import s3fs.core

        original = s3fs.core._error_wrapper
        s3fs.core._error_wrapper = _without_the_last_sleep(original)
        _installed = True
    registry.note_applied("s3fs_one_try", "s3fs.core._error_wrapper sends a one-try request "
                                          "once, without its sleep after the failure")
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

"""The registry of every change retryfs makes to another library: versions, opt-out, logging.

| patch | what it changes | scope, and why | written against |
| --- | --- | --- | --- |
| ``copy_files`` | wraps ``pyarrow.fs._copy_files`` and ``_copy_files_selector`` (what ``pyarrow.fs.copy_files`` delegates to): a copy onto or from a retryfs wrapper goes through retryfs's data path, and a commit that finally failed is raised instead of ignored (`retryfs.patches.copy_files`, reading the record of `retryfs.datapath.commits`) | process-wide, because ``copy_files`` is a module function that callers (Ray Train) hold; installed when the first retryfs wrapper (either face) is made in the process, never by ``import retryfs`` | pyarrow 14 to 26 |
| ``s3fs_one_try`` | wraps ``s3fs.core._error_wrapper`` (s3fs's retry loop, which sleeps after every failed try, the last included): a request of an s3fs client that retryfs configured for one attempt (its ``retries`` a `retryfs.clients.OneTry`) is sent once and its error raised at once, translated as s3fs translates it; and wraps ``S3FileSystem._exists``: for such a client, a bucket that s3fs's probes found absent is asked once more with a ``head_bucket`` whose errors count (a throttle is raised, not read as "no bucket", so ``makedirs`` never tries to create a bucket that is there) (`retryfs.patches.s3fs_one_try`) | process-wide, because s3fs calls the module function and the class's method; every other call goes to s3fs's own loop unchanged; installed when retryfs first configures an s3fs client for one attempt | s3fs 2023.6 to 2026.9 |
| ``s3fs_parts`` | the ``_call_s3`` and ``_abort_mpu`` of each s3fs file that retryfs itself opens for writing: its ``upload_part`` requests sent in the background and, with ``create_multipart_upload``, ``put_object`` and ``complete_multipart_upload``, retried in place; its abort waits for the parts in flight (`retryfs.patches.s3fs_parts`) | that file only | s3fs 2023.6 to 2026.9 |

Each patch checks the installed version before it applies: outside the versions it was written
against it is skipped with a WARNING naming the patch, the version and what is lost (a patch
that does not fit a changed library must not apply half). Each logs at DEBUG, once per
process, what it changed. Each can be turned off: ``RETRYFS_DISABLE_PATCHES=copy_files,s3fs_parts,s3fs_one_try``
in the environment (``all`` for every one), or `disable` before the first wrapper is made.
Turned off, ``copy_files`` is plain pyarrow's again (its silently ignored commit failures
included), s3fs files are replayed from the spool when a part or the commit fails, and a failed
s3fs request waits out s3fs's 100 ms sleep before retryfs sees it.

(Ray metrics are not a patch: a retryfs ``RetryStats`` inside a Ray worker exports its own
counters through ``ray.util.metrics``; ``RETRYFS_RAY_METRICS=0`` turns that off.)
"""

from __future__ import annotations

import functools
import logging
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["PATCHES", "Patch", "applies", "disable", "enable", "enabled",
           "install_copy_files_guard", "note_applied", "status", "version_fits"]

log = logging.getLogger("retryfs")

#: The environment variable that turns patches off (comma-separated names, or ``all``).
ENV = "RETRYFS_DISABLE_PATCHES"


@dataclass(frozen=True)
class Patch:
    """One change to another library: its package, the versions it was written against
    (``(major, minor)`` bounds, inclusive) and what is lost without it."""

    name: str
    package: str
    lowest: tuple[int, int]
    highest: tuple[int, int]
    without: str


PATCHES: dict[str, Patch] = {
    "copy_files": Patch("copy_files", "pyarrow", (14, 0), (26, 99),
                        "copy_files onto retryfs uses pyarrow's own copy, and a commit that "
                        "finally failed is ignored by copy_files (a checkpoint can be reported "
                        "saved while it is not)"),
    "s3fs_parts": Patch("s3fs_parts", "s3fs", (2023, 6), (2026, 99),
                        "a failed part or commit of an s3fs upload replays the whole stream, and "
                        "its parts go one at a time"),
    "s3fs_one_try": Patch("s3fs_one_try", "s3fs", (2023, 6), (2026, 99),
                          "every failed request of an s3fs client retryfs configured for one "
                          "attempt reaches retryfs 100 ms late (s3fs sleeps after its last try), "
                          "and a throttled bucket probe reads as no bucket (makedirs then "
                          "fails creating a bucket that is there)"),
}

_lock = threading.Lock()
_disabled: set[str] = set()
_logged: set[str] = set()
_installed: set[str] = set()


def disable(*names: str) -> None:
    """Turn patches off for this process (before the first wrapper is made: an installed
    ``copy_files`` guard stays installed)."""
    with _lock:
        _disabled.update(_known(names))


def enable(*names: str) -> None:
    """Undo `disable` (the environment variable still applies)."""
    with _lock:
        _disabled.difference_update(_known(names))


def _known(names: tuple[str, ...]) -> tuple[str, ...]:
    for name in names:
        if name not in PATCHES:
            raise ValueError(f"unknown patch {name!r}; known: {', '.join(PATCHES)}")
    return names


def enabled(name: str) -> bool:
    """Whether patch ``name`` is allowed (not turned off by `disable` or the environment)."""
    wanted = {part.strip() for part in os.environ.get(ENV, "").split(",") if part.strip()}
    return name not in _disabled and name not in wanted and "all" not in wanted


@functools.cache
def _version_of(package: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def version_fits(patch: Patch, version: str | None) -> bool:
    """Whether ``version`` (``"26.0.1"``) is within the versions ``patch`` was written for."""
    if version is None:
        return False
    numbers = re.findall(r"\d+", version)
    if len(numbers) < 2:
        return False
    found = (int(numbers[0]), int(numbers[1]))
    return patch.lowest <= found <= patch.highest


def _once(key: str, level: int, message: str, *args: Any) -> None:
    with _lock:
        if key in _logged:
            return
        _logged.add(key)
    log.log(level, message, *args)


def applies(name: str) -> bool:
    """Whether patch ``name`` may apply now: turned on, and the installed version is one it
    was written against (else one WARNING per process says what is lost)."""
    patch = PATCHES[name]
    if not enabled(name):
        _once(f"{name}:off", logging.DEBUG, "retryfs: patch %s turned off (%s): %s", name,
              ENV, patch.without)
        return False
    version = _version_of(patch.package)
    if not version_fits(patch, version):
        _once(f"{name}:version", logging.WARNING,
              "retryfs: patch %s skipped: %s %s is not a version it was written against "
              "(%d.%d to %d.%d); without it, %s", name, patch.package, version, *patch.lowest,
              *patch.highest, patch.without)
        return False
    return True


def note_applied(name: str, what: str) -> None:
    """The DEBUG line, once per process, of a per-object patch applied for the first time."""
    patch = PATCHES[name]
    with _lock:
        _installed.add(name)
    _once(f"{name}:on", logging.DEBUG, "retryfs: patch %s: %s (%s %s)", name, what,
          patch.package, _version_of(patch.package))


def install_copy_files_guard(direct: dict[str, Callable[..., Any]]) -> bool:
    """The ``copy_files`` patch (`retryfs.patches.copy_files`), once per
    process, if it applies; whether it is installed."""
    with _lock:
        if "copy_files" in _installed:
            return True
    if not applies("copy_files"):
        return False
    from .copy_files import install_copy_files_guard as install

    install(direct)
    with _lock:
        _installed.add("copy_files")
    _once("copy_files:on", logging.DEBUG, "retryfs: patch copy_files: pyarrow.fs._copy_files "
          "and _copy_files_selector wrapped (pyarrow %s)", _version_of("pyarrow"))
    return True


def status() -> dict[str, str]:
    """Each patch: ``installed``, ``available``, ``off`` or ``skipped (version)``."""
    out = {}
    for name, patch in PATCHES.items():
        if name in _installed:
            out[name] = "installed"
        elif not enabled(name):
            out[name] = "off"
        elif not version_fits(patch, _version_of(patch.package)):
            out[name] = f"skipped ({patch.package} {_version_of(patch.package)})"
        else:
            out[name] = "available"
    return out

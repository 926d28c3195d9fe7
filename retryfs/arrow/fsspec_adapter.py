"""pyarrow's face for fsspec filesystems: `FsspecHandler`, the adapter `RetryingFileSystem` uses.

pyarrow's own ``FSSpecHandler`` opens a file only after ``isfile`` and lists a directory only
after ``isdir`` and ``exists``; fsspec's generic versions of those answer False on *any* error,
so a transient failure became a FileNotFoundError, or an empty listing, that no retry could see.
"""

from __future__ import annotations

from typing import Any, cast

import pyarrow as pa
import pyarrow.fs as pafs

from retryfs.core.classify import http_status_of

__all__ = ["FsspecHandler"]


def _server_error_behind(exc: BaseException) -> bool:
    """A FileNotFoundError raised from a 5xx or 429 (fsspec's HTTP ``info`` does that)."""
    cause = exc.__cause__
    status = http_status_of(cause) if cause is not None else None
    return status is not None and (status >= 500 or status == 429)


_MTIME_KEYS = ("LastModified", "last_modified", "updated", "created")


class FsspecHandler(pafs.FSSpecHandler):  # type: ignore[misc]  # untyped library
    """pyarrow's ``FSSpecHandler`` minus the checks that hide errors (used by `RetryingFileSystem`
    for fsspec filesystems).

    pyarrow's opens a file only after ``isfile`` and lists a directory only after ``isdir`` and
    ``exists``; fsspec's generic versions of those answer False on *any* error, so a transient
    failure became a FileNotFoundError, or an empty listing, that no retry could see. Here the
    checks are ``info`` calls whose errors go up, and a "not found" raised from a server error
    (fsspec's HTTP filesystem) is raised, not reported as NotFound.
    """

    @staticmethod
    def _create_file_info(path: str, info: dict[str, Any]) -> pafs.FileInfo:
        """pyarrow's, with the modification time under the other names fsspec backends use
        (s3fs ``LastModified``, gcsfs ``updated``; the memory filesystem, whose files are
        written once, only has ``created``)."""
        found = pafs.FSSpecHandler._create_file_info(path, info)
        if found.mtime is not None or found.type == pafs.FileType.NotFound:
            return found
        mtime = next((info[key] for key in _MTIME_KEYS if info.get(key) is not None), None)
        if mtime is None:
            return found
        return pafs.FileInfo(path, found.type, size=found.size, mtime=mtime)

    def _info_or_none(self, path: str) -> dict[str, Any] | None:
        try:
            return cast("dict[str, Any] | None", self.fs.info(path))
        except FileNotFoundError as exc:
            if _server_error_behind(exc):
                raise
            return None

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        infos = []
        for path in paths:
            info = self._info_or_none(path)
            infos.append(pafs.FileInfo(path, pafs.FileType.NotFound) if info is None
                         else self._create_file_info(path, info))
        return infos

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        info = self._info_or_none(selector.base_dir)
        if info is None:
            if selector.allow_not_found:
                return []
            raise FileNotFoundError(selector.base_dir)
        if info.get("type") != "directory":
            raise NotADirectoryError(selector.base_dir)
        found = self.fs.find(selector.base_dir, maxdepth=None if selector.recursive else 1,
                             withdirs=True, detail=True)
        base_dir = selector.base_dir.strip("/")
        return [self._create_file_info(path, entry) for path, entry in found.items()
                if path.strip("/") != base_dir]

    def _check_file(self, path: str) -> None:
        info = self._info_or_none(path)
        if info is None or info.get("type") != "file":
            raise FileNotFoundError(path)

    def delete_file(self, path: str) -> None:
        """pyarrow's, with the check an ``info`` call: ``exists`` answers False on any error.
        A file seen a moment ago that ``rm`` reports missing and that is gone now was deleted:
        aiohttp (gcsfs) re-sends a DELETE whose answer was lost by itself, and is answered 404."""
        if self._info_or_none(path) is None:
            raise FileNotFoundError(path)
        try:
            self.fs.rm(path)
        except FileNotFoundError:
            if self._info_or_none(path) is not None:
                raise

    def open_input_stream(self, path: str) -> Any:
        self._check_file(path)
        return pa.PythonFile(self.fs.open(path, mode="rb"), mode="r")

    def open_input_file(self, path: str) -> Any:
        self._check_file(path)
        return pa.PythonFile(self.fs.open(path, mode="rb"), mode="r")

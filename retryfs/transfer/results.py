"""What `retryfs.copy` reports: per-file outcomes, totals, progress snapshots, its errors."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from retryfs.errors import CopyError, VerificationError

__all__ = ["CHUNK", "Checked", "CopyError", "CopyProgress", "CopyResult", "FileCopy", "MiB",
           "PART_SIZES", "Status", "VerificationError", "Verify", "human_bytes"]

MiB = 1024 * 1024
#: Bytes read from the source and written to the destination at a time. 10 MiB is pyarrow's S3
#: part size: each write of this size goes out as one UploadPart, so the parts of what `copy`
#: uploads are always 10 MiB (the last one smaller), whatever the file.
CHUNK = 10 * MiB
#: Multipart part sizes tried when a multipart ETag is compared with a local file: the common
#: uploaders (5 MiB minimum and s3fs small writes, 8 MiB AWS CLI/boto3, 10 MiB pyarrow and
#: `copy`, 16 MiB, 50 MiB s3fs's default block, 64 MiB Ray Train's `copy_files` chunk, 100 MiB).
PART_SIZES = tuple(n * MiB for n in (5, 8, 10, 16, 50, 64, 100))

Verify = Literal["size", "hash"]
Status = Literal["copied", "skipped", "failed", "planned"]
Checked = Literal["sha256", "etag", "size", ""]
_CHECK_NAMES = {"sha256": "SHA-256", "etag": "ETag", "size": "size"}


@dataclass
class FileCopy:
    """What happened to one file."""

    path: str  # relative to the source directory (the file name for a single file)
    source: str
    destination: str
    size: int
    status: Status = "planned"  # "planned": a dry run would copy it
    reason: str = ""  # why skipped / why failed
    attempts: int = 0  # upload attempts made (0: nothing uploaded)
    error: BaseException | None = field(default=None, repr=False, compare=False)
    #: How the destination's content was checked: "sha256" (read back and hashed), "etag"
    #: (the store's checksum matched the source's), "size" (the size only), "" (not checked).
    checked: Checked = ""

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "source": self.source, "destination": self.destination,
                "size": self.size, "status": self.status, "reason": self.reason,
                "attempts": self.attempts, "checked": self.checked}


@dataclass
class CopyResult:
    """The outcome of `copy`: every file with its status, and the totals."""

    source: str
    destination: str
    files: list[FileCopy]
    retries: int = 0  # retries of any operation during the copy (uploads, reads, listings)
    elapsed: float = 0.0
    verify: str = "size"
    dry_run: bool = False

    def _with(self, status: str) -> list[FileCopy]:
        return [f for f in self.files if f.status == status]

    @property
    def copied(self) -> list[FileCopy]:
        return self._with("copied")

    @property
    def skipped(self) -> list[FileCopy]:
        return self._with("skipped")

    @property
    def failed(self) -> list[FileCopy]:
        return self._with("failed")

    @property
    def planned(self) -> list[FileCopy]:
        """Files a dry run would copy."""
        return self._with("planned")

    @property
    def verified(self) -> list[FileCopy]:
        """Copied or skipped files whose content was checked (by SHA-256, ETag or, for a file
        copied with ``verify="size"``, the committed size)."""
        return [f for f in self.files if f.status in ("copied", "skipped") and f.checked
                and not (f.status == "skipped" and f.checked == "size")]

    @property
    def skipped_unverified(self) -> list[FileCopy]:
        """Files skipped because the destination had the same size, their bytes never compared
        (no checksum to compare, and no ``verify="hash"``)."""
        return [f for f in self.skipped if f.checked == "size"]

    @property
    def ok(self) -> bool:
        return not self.failed

    @property
    def bytes_copied(self) -> int:
        return sum(f.size for f in self.copied)

    @property
    def bytes_skipped(self) -> int:
        return sum(f.size for f in self.skipped)

    @property
    def bytes_total(self) -> int:
        return sum(f.size for f in self.files)

    def summary(self) -> str:
        """One line: what was copied, skipped, failed, and how long it took."""
        if self.dry_run:
            head = (f"dry run: would copy {len(self.planned)} file(s) "
                    f"({human_bytes(sum(f.size for f in self.planned))})")
        else:
            rate = self.bytes_copied / self.elapsed if self.elapsed > 0 else 0.0
            head = (f"copied {len(self.copied)} file(s) ({human_bytes(self.bytes_copied)}) "
                    f"in {self.elapsed:.1f}s ({human_bytes(rate)}/s)")
        parts = [head, f"skipped {len(self.skipped)} already there",
                 f"failed {len(self.failed)}", f"retries {self.retries}"]
        if not self.dry_run:
            parts.append(self._verified_summary())
            if self.skipped_unverified:
                parts.append(f"{len(self.skipped_unverified)} skipped by size, not verified")
        return ", ".join(parts)

    def _verified_summary(self) -> str:
        """``verified 4 by SHA-256`` or ``verified 7 (4 by SHA-256, 3 by ETag)``: only what
        was checked, file by file."""
        counts: dict[str, int] = {}
        for f in self.verified:
            counts[f.checked] = counts.get(f.checked, 0) + 1
        total = sum(counts.values())
        if len(counts) <= 1:
            how = _CHECK_NAMES[next(iter(counts))] if counts else (
                "SHA-256" if self.verify == "hash" else "size")
            return f"verified {total} by {how}"
        shown = ", ".join(f"{n} by {_CHECK_NAMES[k]}" for k, n in sorted(
            counts.items(), key=lambda kv: list(_CHECK_NAMES).index(kv[0])))
        return f"verified {total} ({shown})"

    def to_dict(self) -> dict[str, Any]:
        """Plain data for ``--json``."""
        return {
            "ok": self.ok,
            "source": self.source,
            "destination": self.destination,
            "dry_run": self.dry_run,
            "verify": self.verify,
            "files": {"total": len(self.files), "copied": len(self.copied),
                      "skipped": len(self.skipped), "failed": len(self.failed),
                      "planned": len(self.planned)},
            "bytes": {"total": self.bytes_total, "copied": self.bytes_copied,
                      "skipped": self.bytes_skipped},
            "verified": {kind: sum(1 for f in self.verified if f.checked == kind)
                         for kind in _CHECK_NAMES},
            "skipped_unverified": len(self.skipped_unverified),
            "retries": self.retries,
            "elapsed_seconds": round(self.elapsed, 3),
            "failures": [{"path": f.path, "error": f.reason} for f in self.failed],
            "items": [f.to_dict() for f in self.files],
        }


@dataclass(frozen=True)
class CopyProgress:
    """A snapshot handed to the ``progress`` callback of `copy`.

    Called after every chunk written, every retry (``file`` None) and every file finished
    (``file`` set), from the copying threads, one call at a time. ``bytes_done`` counts bytes
    handed to the destination's client (which may still be sending them: pyarrow uploads parts
    in the background), counts skipped files as done, and goes back when an upload restarts;
    a file is done once it is committed and checked.
    """

    files_total: int
    files_done: int
    bytes_total: int
    bytes_done: int
    copied: int
    skipped: int
    failed: int
    retries: int
    file: FileCopy | None = None


def human_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"  # pragma: no cover

"""One retry layer: each client's own retry loop reduced to ``attempts`` under retryfs.

Every storage client retries by itself, and under retryfs those loops multiply: three attempts
of the AWS SDK times eight of retryfs is 24 requests per failing call, and azure-core's
exponential policy turns a few 503s into a minute. `with_client_attempts` returns the
filesystem with its client's loop set to ``attempts`` (``client_attempts=1``: retryfs's policy
is the only schedule). It never changes the object it is given (a cached fsspec instance is
shared): it builds a fresh one. Since pickling loses what is set here (pyarrow forgets
``retry_strategy``; fsspec rebuilds from constructor arguments), `RetryingFileSystem` keeps
``client_attempts`` as configuration and applies it again after unpickling.

| client | its loop | what ``attempts`` sets |
| --- | --- | --- |
| pyarrow ``S3FileSystem`` | AWS SDK, 3 attempts (more from ``from_uri``) | one attempt: ``AwsStandardS3RetryStrategy(max_attempts=1)``; more: ``AwsDefaultS3RetryStrategy(max_attempts=attempts - 1)`` (it counts retries), whose retries wait 0, 50, 100 ms... |
| pyarrow ``GcsFileSystem`` | google-cloud-cpp, 15 min of retries | ``retry_time_limit`` 1 ms (one attempt) when ``attempts`` is 1; left as is otherwise |
| s3fs ``S3FileSystem`` | its own loop (``retries``, 5 tries, a sleep after each failed one) around botocore's (3 attempts, legacy mode) | ``retries = attempts`` and botocore's ``total_max_attempts = attempts`` (standard mode); one attempt goes without s3fs's sleep after it (the ``s3fs_one_try`` patch). Bodies over plain HTTP go unsigned with their CRC32 (`_unsigned_payload`) |
| gcsfs ``GCSFileSystem`` | ``retry_request``, 6 attempts | the same decorator with ``retries=attempts`` |
| adlfs ``AzureBlobFileSystem`` | azure-core/storage ``RetryPolicy``, 3 retries | ``retry_total = attempts - 1`` |
| pyarrow ``AzureFileSystem`` | Azure C++ SDK, 3 retries | cannot be told from Python: its exhausted errors are classified |

A client whose loop is left running (`resends_by_itself`) re-sends a request whose answer was
lost: an applied DELETE comes back 404, and retryfs's first attempt sees a FileNotFoundError for
a delete that succeeded (`RetryingHandler.delete_file` then looks before it deletes).
"""

from __future__ import annotations

import os
import types
from datetime import timedelta
from typing import Any

import pyarrow.fs as pafs

from retryfs.core.locations import subtree_base

__all__ = ["confirm_not_found", "hides_list_errors", "resends_by_itself", "with_client_attempts"]

#: google-cloud-cpp's retry limit that leaves exactly one attempt: 0 s is spent before the first
#: ("Retry policy exhausted before first request attempt"); 1 ms outlives only the first, whose
#: failure then ends the loop with "Retry policy exhausted, with a last message of ...".
GCS_ONE_ATTEMPT = timedelta(milliseconds=1)

#: gcsfs methods decorated with its ``retry_request`` (6 attempts fixed at class creation).
_GCSFS_RETRIED = ("_request", "_get_file_request", "_get_file_concurrent")


class OneTry(int):
    """s3fs's ``retries`` for a client retryfs configured for one attempt: 1, marked for the
    ``s3fs_one_try`` patch (`retryfs.patches.s3fs_one_try`); s3fs alone reads it as 1."""

    def __new__(cls) -> OneTry:
        return super().__new__(cls, 1)

    def __reduce__(self) -> tuple[Any, ...]:
        return (OneTry, ())


def with_client_attempts(fs: Any, attempts: int) -> Any:
    """``fs`` with its client's own retries set to ``attempts`` where retryfs can set them;
    other filesystems are returned as they are."""
    if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
        raise ValueError(f"client_attempts must be an int >= 1, got {attempts!r}")
    if isinstance(fs, pafs.S3FileSystem):
        return _s3(fs, attempts)
    if isinstance(fs, pafs.GcsFileSystem):
        return _gcs(fs, attempts)
    module = type(fs).__module__
    if module.startswith("s3fs"):
        return _s3fs(fs, attempts)
    if module.startswith("gcsfs"):
        return _gcsfs(fs, attempts)
    if module.startswith("adlfs"):
        return _adlfs(fs, attempts)
    return fs


def resends_by_itself(fs: Any) -> bool:
    """Whether ``fs`` (as retryfs calls it, `with_client_attempts` applied) re-sends a failed
    request on its own, unseen by retryfs, with a "not found" as a possible answer: pyarrow's
    Azure client always, pyarrow's GCS client unless its retries were cut to one attempt.
    (S3 answers a repeated DELETE with success; gcsfs's and adlfs's re-sends are seen by
    retryfs's fsspec adapter, which checks that the file exists before it deletes.)"""
    if isinstance(fs, pafs.AzureFileSystem):
        return True
    if isinstance(fs, pafs.GcsFileSystem):
        limit = fs.__reduce__()[1][0].get("retry_time_limit")
        return limit is None or limit > GCS_ONE_ATTEMPT
    return False


def hides_list_errors(fs: pafs.FileSystem) -> bool:
    """Whether ``fs`` (or the base of its ``SubTreeFileSystem``) can answer "not found" for a
    directory whose listing failed: pyarrow's GCS client. Its ``get_file_info`` of a path with
    no object there lists the prefix, and a listing that failed (a 500) ends as
    ``FileType.NotFound``, not as the error: under retryfs, its own retries cut to one
    attempt, a transient fault made an existing checkpoint directory look absent, and
    ``copy_files`` of it a single-file copy of nothing. See `confirm_not_found`."""
    return isinstance(subtree_base(fs), pafs.GcsFileSystem)


def confirm_not_found(fs: pafs.FileSystem, info: pafs.FileInfo) -> pafs.FileInfo:
    """``info`` (a "not found" of a client that `hides_list_errors`) confirmed by a listing
    that raises its errors: a directory if anything is under the path (one more request for
    each path not found)."""
    under = fs.get_file_info(pafs.FileSelector(info.path, allow_not_found=True))
    return pafs.FileInfo(info.path, pafs.FileType.Directory) if under else info


def _s3(fs: pafs.S3FileSystem, attempts: int) -> pafs.S3FileSystem:
    _, (options,) = fs.__reduce__()
    options = dict(options)
    options["retry_strategy"] = _sdk_strategy(attempts)
    return pafs.S3FileSystem(**options)


def _sdk_strategy(attempts: int) -> pafs.S3RetryStrategy:
    """The AWS SDK's retry strategy for ``attempts`` attempts per request.

    More than one (the write client's, so that a failed UploadPart is re-sent alone): the SDK's
    default strategy, whose retries wait 0, 50, 100, 200 ms... (a 25 ms scale, as the CRT's),
    not its standard one, whose retries wait a uniform draw under 1 s, then 2 s...:
    measured on moto, a part reset twice held its upload for up to 3 s. pyarrow's
    ``AwsDefaultS3RetryStrategy`` counts retries (``max_attempts=2`` is 3 requests), its
    ``AwsStandardS3RetryStrategy`` attempts. Throttling that persists reaches retryfs's own
    schedules and rate limiter once the SDK's few quick attempts are spent."""
    if attempts == 1:
        return pafs.AwsStandardS3RetryStrategy(max_attempts=1)
    return pafs.AwsDefaultS3RetryStrategy(max_attempts=attempts - 1)


def _gcs(fs: pafs.GcsFileSystem, attempts: int) -> pafs.GcsFileSystem:
    # google-cloud-cpp retries for a time, not a count: only one attempt fits in 1 ms.
    if attempts != 1:
        return fs
    rebuild, (options,) = fs.__reduce__()
    options = dict(options)
    options["retry_time_limit"] = GCS_ONE_ATTEMPT
    return rebuild(options)


def _fresh_fsspec(fs: Any) -> Any:
    options = dict(fs.storage_options)
    options["skip_instance_cache"] = True
    return type(fs)(*fs.storage_args, **options)


def _s3fs(fs: Any, attempts: int) -> Any:
    options = dict(fs.storage_options)
    config = dict(options.get("config_kwargs") or {})
    config["retries"] = {**dict(config.get("retries") or {}), "total_max_attempts": attempts,
                         "mode": "standard"}
    config["retries"].pop("max_attempts", None)  # botocore refuses both spellings at once
    _unsigned_payload(config)
    options["config_kwargs"] = config
    options["skip_instance_cache"] = True
    fresh = type(fs)(*fs.storage_args, **options)
    # s3fs's own loop: a class attribute, not an argument; one try marked, so that the
    # s3fs_one_try patch (retryfs.patches) spares it s3fs's sleep after the failure
    fresh.retries = OneTry() if attempts == 1 else attempts
    fresh._retryfs_client_attempts = attempts
    return fresh


def _unsigned_payload(config: dict[str, Any]) -> None:
    """botocore's ``config_kwargs`` set not to hash each body for its signature over plain
    HTTP, as pyarrow's AWS SDK does not (it sends ``STREAMING-UNSIGNED-PAYLOAD-TRAILER``): the
    body keeps its CRC32 checksum header, which S3 checks. Over HTTPS botocore already signs
    no body that carries a checksum. Left as it is when the options say how to sign, or when
    request checksums are only sent where required (``request_checksum_calculation``, or
    ``AWS_REQUEST_CHECKSUM_CALCULATION``, ``when_required``): a body would then go over HTTP
    with neither. The SHA-256 of every body was 9 % of a torch DCP save of 200 MiB."""
    s3 = dict(config.get("s3") or {})
    if "payload_signing_enabled" in s3:
        return
    calculation = config.get("request_checksum_calculation") or os.environ.get(
        "AWS_REQUEST_CHECKSUM_CALCULATION", "")
    if str(calculation).strip().lower() == "when_required":
        return
    s3["payload_signing_enabled"] = False
    config["s3"] = s3


def _gcsfs(fs: Any, attempts: int) -> Any:
    from gcsfs.retry import retry_request

    fresh = _fresh_fsspec(fs)
    for name in _GCSFS_RETRIED:
        method = getattr(type(fresh), name, None)
        plain = getattr(method, "__wrapped__", None)
        if plain is not None:
            setattr(fresh, name, types.MethodType(retry_request(retries=attempts)(plain), fresh))
    fresh._retryfs_client_attempts = attempts
    return fresh


def _adlfs(fs: Any, attempts: int) -> Any:
    fresh = _fresh_fsspec(fs)
    client = getattr(fresh, "service_client", None)
    pipeline = getattr(client, "_pipeline", None)
    # the container clients adlfs takes from it (files included) share these policy objects
    for policy in getattr(pipeline, "_impl_policies", ()):
        if hasattr(policy, "total_retries"):
            policy.total_retries = attempts - 1
    fresh._retryfs_client_attempts = attempts
    return fresh

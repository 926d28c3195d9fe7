"""Secrets are redacted before text is cut: a secret at a truncation boundary never shows, even
in part, in a log line, an exception note, a copy failure's reason or the CLI's error line.

A secret is placed at every offset around each limit (200 characters of error text in a log
line, 300 in a copy failure's reason), in each form retryfs knows: URL userinfo, query
parameters (``sig``, ``token``, SAS, ``X-Amz-*``), option dictionaries, connection strings and
values registered as secrets. The secret's alphabet occurs nowhere else in the text, so any
5 consecutive characters of it in the output are a leak.
"""

from __future__ import annotations

import io
import logging

import pyarrow.fs as pafs
import pytest
from fsspec.implementations.memory import MemoryFileSystem
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from retryfs import RetryingFileSystem, RetryPolicy
from retryfs.cli import _one_line, main
from retryfs.core.redact import register_secret
from retryfs.testing import FaultyFileSystem
from retryfs.transfer.copier import CopyError, copy

ONCE = RetryPolicy(max_attempts=2, initial_delay=0, max_delay=0, jitter=False)
LOG_LIMIT, REASON_LIMIT = 200, 300  # stats._short and transfer._short
ALPHABET = "qzjxQZJX0189/+"  # none of it in a run of 5 anywhere else in the texts below
SHAPES = [
    "s3://AKIAIOSFODNN7EXAMPLE:{s}@bucket/key",
    "https://acct.blob.core.windows.net/c/b?sv=2021-08-06&se=2030&sp=r&sig={s}&x=1",
    "https://b.s3.amazonaws.com/k?X-Amz-Credential=AKIAX&X-Amz-Signature={s}&y=2",
    "https://b.s3.amazonaws.com/k?X-Amz-Security-Token={s}",
    "GET https://host/p?token={s}&x=1 failed",
    "{{'key': 'id', 'secret': '{s}', 'region': 'r'}}",
    "DefaultEndpointsProtocol=https;AccountName=a;AccountKey={s};EndpointSuffix=x",
    "the server said: {s} is not a valid credential",  # registered: no name gives it away
]
secrets_ = st.text(ALPHABET, min_size=8, max_size=48).filter(
    lambda s: s[0] not in "/+" and s[-1] not in "/+")


def _leaks(secret: str, text: str, window: int = 5) -> list[str]:
    return [secret[i:i + window] for i in range(len(secret) - window + 1)
            if secret[i:i + window] in text]


TRANSIENT = "AWS Error NETWORK_CONNECTION during HeadObject operation: "  # so it is retried


def _message(shape: str, secret: str, offset: int) -> str:
    """An error text whose secret starts ``offset`` characters in (the rest is padding)."""
    head, tail = shape.split("{s}")
    head = TRANSIENT + head.replace("{{", "{").replace("}}", "}")
    tail = tail.replace("{{", "{").replace("}}", "}")
    pad = max(offset - len(head), 0)
    return head[:len(TRANSIENT)] + "p" * pad + head[len(TRANSIENT):] + secret + tail + " words"


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _log_and_note_text(tmp_path, message: str) -> str:
    """Everything retryfs wrote about a failing call: the retry WARNING, the give-up ERROR and
    the note on the raised exception (whose own message is the backend's, left unchanged)."""
    faulty = FaultyFileSystem(pafs.LocalFileSystem())
    faulty.inject("get_file_info", lambda: OSError(message), times=None)
    fs = RetryingFileSystem(faulty, ONCE)
    lines = _Lines()
    logger = logging.getLogger("retryfs")
    logger.addHandler(lines)
    try:
        with pytest.raises(OSError) as raised:
            fs.get_file_info(str(tmp_path / "x"))
    finally:
        logger.removeHandler(lines)
    assert faulty.injected["get_file_info"] == 2  # it retried, then gave up
    assert len(lines.lines) == 2
    return "\n".join(lines.lines + raised.value.__notes__)


@pytest.mark.parametrize("shape", SHAPES)
def test_log_lines_and_notes_never_show_part_of_a_secret_at_the_cut(tmp_path, shape):
    secret = "qZ9x/J+8zQxj0Q1zXj9Z"
    register_secret(secret)  # the last shape has no name that marks it as a secret
    for offset in range(LOG_LIMIT - len(secret) - 4, LOG_LIMIT + 4):
        text = _log_and_note_text(tmp_path, _message(shape, secret, offset))
        assert _leaks(secret, text) == [], (offset, text)


@settings(max_examples=50, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(shape=st.sampled_from(SHAPES), secret=secrets_, data=st.data())
def test_copy_failure_reasons_never_show_part_of_a_secret(tmp_path, shape, secret, data):
    register_secret(secret)
    offset = data.draw(st.integers(REASON_LIMIT - len(secret) - 20, REASON_LIMIT + 2))
    message = _message(shape, secret, offset)
    source = tmp_path / "src.bin"
    source.write_bytes(b"x")
    faulty = FaultyFileSystem(pafs.LocalFileSystem())
    faulty.inject("open_input_stream", lambda: PermissionError(message), times=None)
    with pytest.raises(CopyError) as raised:
        copy((faulty, str(source)), str(tmp_path / "dst.bin"), policy=ONCE)
    assert faulty.injected["open_input_stream"] >= 1
    shown = "\n".join([str(raised.value), *(f.reason for f in raised.value.result.failed)])
    assert _leaks(secret, shown) == [], shown


@given(shape=st.sampled_from(SHAPES), secret=secrets_, offset=st.integers(0, 260),
       lines=st.integers(0, 2))
def test_the_cli_error_line_never_shows_part_of_a_secret(shape, secret, offset, lines):
    register_secret(secret)
    message = "\n" * lines + _message(shape, secret, offset) + "\nsecond line " + secret
    for error in (OSError(message), ValueError(message)):
        shown = _one_line(error)
        assert _leaks(secret, shown) == [], shown


def test_the_cli_prints_a_redacted_error_line(tmp_path):
    """End to end: `retryfs ls` of a URL whose token the backend quotes back."""
    secret = "qZ9x/J+8zQxj0Q1zXj9Z"
    err = io.StringIO()
    code = main(["ls", f"memory://bucket/{'p' * 190}/missing?token={secret}"],
                stdout=io.StringIO(), stderr=err)
    assert code != 0
    assert _leaks(secret, err.getvalue()) == [], err.getvalue()


def test_the_wrappers_repr_hides_what_the_backends_repr_shows():
    """The inner filesystem's repr is the backend's own, and some show their options."""
    class Chatty(MemoryFileSystem):
        def __repr__(self) -> str:
            return f"Chatty(token={self.storage_options['token']}, region=r)"

    secret = "qZ9x/J+8zQxj0Q1zXj9Z"
    inner = Chatty(token=secret, skip_instance_cache=True)
    shown = repr(RetryingFileSystem(inner, ONCE))
    assert _leaks(secret, shown) == [] and "region=r" in shown, shown

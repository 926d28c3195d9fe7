"""The `retryfs` command: ``cp``, ``ls``, ``rm``, ``cat`` and ``demo``.

Locations are URIs or local paths; ``retry_*`` query parameters configure the retries
(``s3://bucket/ckpt?retry_max_attempts=8``, see `retryfs.from_uri`). Exit codes: 0 success,
1 a failure after retries (or a permanent storage error), 2 a usage error (bad arguments, a bad
URL, an unknown ``retry_*`` parameter, a source that does not exist), 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Any, TextIO

import pyarrow.fs as pafs

from retryfs.core.locations import dangerous_target
from retryfs.core.redact import redact
from retryfs.transfer.copier import CopyError, copy
from retryfs.transfer.results import human_bytes

from .config import WrapperConfig
from .errors import UsageError
from .uri import from_uri

EXIT_OK, EXIT_FAILED, EXIT_USAGE, EXIT_INTERRUPTED = 0, 1, 2, 130

_URL_HELP = ("a URI (s3://bucket/key, gs://..., file:///..., memory://..., any fsspec "
             "protocol) or a local path; retry_* query parameters set the retry policy, e.g. "
             "?retry_max_attempts=8&retry_max_delay=30")

_EPILOG = """\
exit codes: 0 success, 1 failure after retries, 2 usage error (bad arguments, bad URL,
unknown retry_* parameter, missing source), 130 interrupted.
Retry settings: retry_* URL parameters, or RETRYFS_* environment variables
(RETRYFS_MAX_ATTEMPTS=8) for defaults."""


# -- parser --------------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="retryfs", description="Storage I/O that survives transient failures: copy, list, "
        "remove and read files on any pyarrow or fsspec storage, every operation retried.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"retryfs {_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    cp = commands.add_parser(
        "cp", help="copy files (upload, download, remote to remote): parallel, retried per "
        "file, verified, resumable",
        description="Copy SRC to DST. Each file is retried as a whole (re-read from the "
        "source) until it lands; every committed object is checked (size, and with --verify "
        "its SHA-256); files DST already holds (same size, and same checksum where the storage "
        "gives one) are skipped, so running the same command again resumes. With -r the "
        "contents of SRC land under DST (DST/<relative path>). A single file lands at DST, or "
        "inside it when DST ends with '/' or is a directory.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    cp.add_argument("src", metavar="SRC", help=_URL_HELP)
    cp.add_argument("dst", metavar="DST", help="where to copy to (same forms as SRC)")
    cp.add_argument("-r", "--recursive", action="store_true", help="copy a directory tree")
    cp.add_argument("-w", "--workers", type=_positive_int, default=8,
                    help="files copied at once (default: 8)")
    cp.add_argument("--verify", action="store_const", const="hash", default="size",
                    help="re-read every copied object and compare its SHA-256 with the source; "
                    "skip a file already there only when its SHA-256 (or the store's ETag) "
                    "matches the source's (default: check sizes, and ETags where the store "
                    "gives them)")
    cp.add_argument("--no-resume", dest="resume", action="store_false",
                    help="copy every file, even those the destination already holds")
    cp.add_argument("-n", "--dry-run", action="store_true",
                    help="list what would be copied and skipped; write nothing")
    cp.add_argument("--json", action="store_true",
                    help="print the result as JSON on stdout (progress stays on stderr)")
    cp.add_argument("-q", "--quiet", action="store_true",
                    help="no progress and no per-file lines; the summary only")
    cp.set_defaults(run=_cmd_cp)

    ls = commands.add_parser("ls", help="list a directory (or show a file)",
                             description="List the entries of URL (its name if it is a file).",
                             epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    ls.add_argument("url", metavar="URL", help=_URL_HELP)
    ls.add_argument("-r", "--recursive", action="store_true", help="list the whole tree")
    ls.add_argument("-l", "--long", action="store_true",
                    help="show size in bytes and modification time")
    ls.set_defaults(run=_cmd_ls)

    rm = commands.add_parser("rm", help="remove a file (or with -r a directory tree)",
                             description="Remove URL. A directory (prefix) needs -r.",
                             epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    rm.add_argument("url", metavar="URL", help=_URL_HELP)
    rm.add_argument("-r", "--recursive", action="store_true",
                    help="remove a directory and everything under it")
    rm.add_argument("--preserve-root", action=argparse.BooleanOptionalAction, default=True,
                    help="refuse to remove a filesystem root, a bucket root, the working "
                    "directory or a directory above it (default); --no-preserve-root allows it")
    rm.set_defaults(run=_cmd_rm)

    cat = commands.add_parser("cat", help="write a file's bytes to stdout",
                              description="Write the bytes of URL to stdout (reads resume "
                              "where they failed).", epilog=_EPILOG,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    cat.add_argument("url", metavar="URL", help=_URL_HELP)
    cat.set_defaults(run=_cmd_cat)

    demo = commands.add_parser(
        "demo", help="upload a checkpoint through injected S3 faults, with and without retryfs",
        description="Start a local S3 server (moto) that fails like S3 does, upload a "
        "synthetic checkpoint with plain pyarrow and through retryfs under the same faults, "
        "and show what each reported and what storage holds. No cloud account needed "
        "(needs the demo extra; in the retryfs checkout: pip install '.[demo]').")
    demo.add_argument("--size-mb", type=_positive_float, default=200.0,
                      help="checkpoint size in MiB (default: 200)")
    demo.add_argument("--ray", action="store_true",
                      help="also run a short Ray Train job the same way (needs ray[train] and "
                      "torch)")
    demo.set_defaults(run=_cmd_demo)
    return parser


def _version() -> str:
    try:
        return metadata.version("retryfs")
    except metadata.PackageNotFoundError:  # run from a source tree that was not installed
        return "unknown"


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number > 0, got {text!r}")
    return value


# -- output helpers --------------------------------------------------------------------------------

def _one_line(error: BaseException) -> str:
    text = redact(str(error)).strip()  # redacted whole before any of it is cut away
    first = text.splitlines()[0] if text else type(error).__name__
    head, valid, names = first.partition("; valid: ")
    if valid and names.count(",") > 8:  # from_uri lists every parameter: keep it one short line
        shown = ", ".join(names.split(", ")[:7])
        first = f"{head}; valid: {shown}, ... (all in docs/configuration.md)"
    if isinstance(error, (FileNotFoundError, IsADirectoryError, NotADirectoryError,
                          UsageError, ValueError)):
        return redact(first)
    return redact(f"{type(error).__name__}: {first}")


def _open(url: str, config: WrapperConfig | None = None) -> tuple[Any, str]:
    return from_uri(url, config=config)


def _open_existing(url: str, config: WrapperConfig | None = None
                   ) -> tuple[Any, str, pafs.FileInfo]:
    """``(filesystem, path, info)`` of what ``url`` names; FileNotFoundError if nothing."""
    fs, path = _open(url, config)
    info = fs.get_file_info(path)
    if info.type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"not found: {_shown(url)}")
    return fs, path, info


def _is_tty(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


@contextlib.contextmanager
def _retry_log(stream: TextIO, bar: Any = None) -> Iterator[None]:
    """Retry WARNING/ERROR lines of retryfs on ``stream`` (through tqdm when a bar is shown)."""
    logger = logging.getLogger("retryfs")
    if bar is not None:
        from tqdm.contrib.logging import logging_redirect_tqdm

        with logging_redirect_tqdm(loggers=[logger]):
            yield
        return
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logging.Formatter("%(levelname)s %(message)s"))
    handler.setLevel(logging.WARNING)
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)


class _Progress:
    """The ``progress`` callback of `retryfs.copy`: a bar on a terminal, plain lines otherwise."""

    def __init__(self, stream: TextIO, *, bar: bool, quiet: bool, dry_run: bool) -> None:
        self.stream, self.quiet, self.dry_run = stream, quiet, dry_run
        self.human = human_bytes
        self.bar: Any = None
        if bar and not quiet:
            try:
                from tqdm import tqdm
            except ImportError:  # the cli extra is not installed: plain lines
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(total=0, unit="B", unit_scale=True, unit_divisor=1024,
                                file=stream, dynamic_ncols=True, desc="copying",
                                leave=True, mininterval=0.2)

    def __call__(self, p: Any) -> None:
        if self.bar is not None:
            if self.bar.total != p.bytes_total:
                self.bar.total = p.bytes_total
            self.bar.set_postfix_str(f"files {p.files_done}/{p.files_total}, "
                                     f"retries {p.retries}", refresh=False)
            self.bar.update(p.bytes_done - self.bar.n)
            if p.file is not None and p.file.status == "failed":
                self.bar.write(f"FAILED  {p.file.path}: {p.file.reason}", file=self.stream)
            return
        if self.quiet or p.file is None:
            return
        f = p.file
        words = {"copied": "copied ", "skipped": "skipped", "failed": "FAILED ",
                 "planned": "would copy" if self.dry_run else "planned"}
        line = f"{words[f.status]} {f.path} ({self.human(f.size)})"
        if f.status == "copied" and f.attempts > 1:
            line += f" after {f.attempts} attempts"
        if f.reason:
            line += f": {f.reason}"
        line += f"  [{p.files_done}/{p.files_total}, retries {p.retries}]"
        print(line, file=self.stream, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


# -- commands --------------------------------------------------------------------------------------

def _cmd_cp(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    progress = _Progress(err, bar=_is_tty(err), quiet=args.quiet, dry_run=args.dry_run)
    try:
        with _retry_log(err, progress.bar):
            try:
                result = copy(args.src, args.dst, recursive=args.recursive, workers=args.workers,
                              verify=args.verify, resume=args.resume, dry_run=args.dry_run,
                              progress=progress, config=args.config)
            except CopyError as exc:
                result = exc.result
    finally:
        progress.close()
    if args.json:
        print(json.dumps(result.to_dict(), indent=2), file=out)
    else:
        for f in result.failed:
            print(f"FAILED {f.path}: {f.reason}", file=out)
        print(result.summary(), file=out)
    if result.failed:
        print(f"retryfs: error: {len(result.failed)} file(s) did not land after retries; run "
              "the same command again to copy what is missing", file=err)
        return EXIT_FAILED
    return EXIT_OK


def _cmd_ls(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    fs, path, info = _open_existing(args.url, args.config)
    if info.type == pafs.FileType.File:
        entries, base = [info], path.rsplit("/", 1)[0] if "/" in path else ""
    else:
        base = path.rstrip("/")
        entries = sorted(fs.get_file_info(pafs.FileSelector(base, recursive=args.recursive)),
                         key=lambda e: e.path)
    for entry in entries:
        name = entry.path[len(base):].lstrip("/") if base and entry.path.startswith(base) \
            else entry.path
        if entry.type == pafs.FileType.Directory:
            name += "/"
        if args.long:
            size = "DIR" if entry.type == pafs.FileType.Directory else str(entry.size or 0)
            mtime = entry.mtime.strftime("%Y-%m-%d %H:%M:%S") if entry.mtime else "-"
            print(f"{size:>14}  {mtime:<19}  {name}", file=out)
        else:
            print(name, file=out)
    return EXIT_OK


def _cmd_rm(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    fs, path, info = _open_existing(args.url, args.config)
    if info.type == pafs.FileType.Directory:
        if not args.recursive:
            raise UsageError(f"{_shown(args.url)} is a directory: remove it with -r")
        why = dangerous_target(fs.unwrap(), path) if args.preserve_root else None
        if why:
            raise UsageError(f"refusing to remove {_shown(args.url)}: {why} "
                             "(pass --no-preserve-root to remove it anyway)")
        files = [e for e in fs.get_file_info(pafs.FileSelector(path.rstrip("/"), recursive=True))
                 if e.type == pafs.FileType.File]
        fs.delete_dir(path.rstrip("/"))
        print(f"removed {len(files)} file(s) ({human_bytes(sum(e.size or 0 for e in files))}) "
              f"under {_shown(args.url)}", file=out)
    else:
        fs.delete_file(path)
        print(f"removed {_shown(args.url)} ({human_bytes(info.size or 0)})", file=out)
    return EXIT_OK


def _cmd_cat(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    fs, path, info = _open_existing(args.url, args.config)
    if info.type == pafs.FileType.Directory:
        raise UsageError(f"{_shown(args.url)} is a directory")
    sink = getattr(out, "buffer", out)
    with fs.open_input_stream(path, compression=None) as stream:
        while True:
            data = stream.read(1024 * 1024)
            if not data:
                break
            sink.write(data)
    sink.flush()
    return EXIT_OK


def _cmd_demo(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from retryfs.demo.run import run as run_demo  # moto and tqdm: only for this command

    return run_demo(out=out, size_mb=args.size_mb, ray=args.ray)


def _shown(url: str) -> str:
    return redact(url)


# -- entry point -----------------------------------------------------------------------------------

def main(argv: list[str] | None = None, *, stdout: TextIO | None = None,
         stderr: TextIO | None = None, config: WrapperConfig | None = None) -> int:
    """Run the command; returns the exit code (never raises for a usage error).

    ``config``: the settings of every wrapper the command opens (`retryfs.WrapperConfig`;
    the URLs' ``retry_*`` parameters still apply over it). Default: environment and URL.
    """
    out = stdout if stdout is not None else sys.stdout
    err = stderr if stderr is not None else sys.stderr
    parser = build_parser()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
            args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version (0) and argparse's usage errors (2)
        return exc.code if isinstance(exc.code, int) else EXIT_USAGE
    args.config = config
    run: Callable[[argparse.Namespace, TextIO, TextIO], int] = args.run
    try:
        return run(args, out, err)
    except KeyboardInterrupt:
        print("retryfs: interrupted (run the same command again to resume)", file=err)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # `retryfs cat ... | head`: stop quietly
        with contextlib.suppress(Exception):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return EXIT_OK
    except (UsageError, ValueError, FileNotFoundError, IsADirectoryError, NotADirectoryError,
            ImportError) as exc:
        print(f"retryfs: error: {_one_line(exc)}", file=err)
        return EXIT_USAGE
    except OSError as exc:
        if exc.errno == errno.ENAMETOOLONG:  # the OS's message repeats the whole name
            print("retryfs: error: a name in the location is too long for the filesystem "
                  f"(errno {exc.errno}, {os.strerror(exc.errno)})", file=err)
            return EXIT_USAGE
        print(f"retryfs: error: {_one_line(exc)}", file=err)
        return EXIT_FAILED
    except Exception as exc:  # noqa: BLE001 - a storage failure: one line, no traceback
        print(f"retryfs: error: {_one_line(exc)}", file=err)
        return EXIT_FAILED


def run() -> None:
    """The ``retryfs`` command: `main`, then exit with its code. An interrupted command exits at
    once (``os._exit``, after flushing its output): a request still in flight in a worker thread
    (a stalled read, a per-attempt timeout's thread) would otherwise hold the interpreter's
    shutdown, which joins those threads, and Ctrl-C would not end the command."""
    code = main()
    if code == EXIT_INTERRUPTED:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    run()

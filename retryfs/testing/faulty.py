"""A pyarrow filesystem that fails on purpose: in-process fault injection for tests.

``FaultyFileSystem(inner)`` behaves like ``inner`` until told otherwise::

    faulty = FaultyFileSystem(pyarrow.fs.LocalFileSystem())
    faulty.inject("open_output_stream", errors.network(), times=2)    # first 2 opens fail
    faulty.inject("write", errors.throttle(), skip=2, times=1)         # the 3rd write fails
    faulty.inject("close", errors.commit_failed(), path="ckpt/*.pt")    # every commit fails
    faulty.inject("read", stall=30)                                     # the 1st read hangs 30 s

A ``stall`` holds the call for that many seconds (a black-holed connection), then goes on
normally, or raises ``error`` if one is given; ``faulty.release()`` ends every stall at once.
``applied=True`` does the work first and then raises ``error``: the server applied the request
and the answer was lost, the ambiguous outcome a retry has to reconcile::

    faulty.inject("move", errors.network(), applied=True)    # moved, then "connection reset"

Operations are the 15 ``FileSystemHandler`` method names plus the stream operations ``read``,
``write``, ``flush`` and ``close``. Output streams behave like an object store: nothing is
visible until a successful close, and a failed close leaves nothing behind, which is what makes
a silently ignored commit failure observable. Append streams write through (what was appended
before a fault stays), and their ``write``, ``flush`` and ``close`` can fail too. ``calls`` and ``injected`` count per operation.
"""

from __future__ import annotations

import fnmatch
import io
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import pyarrow as pa
import pyarrow.fs as pafs

__all__ = ["Fault", "FaultyFileSystem", "errors", "STREAM_OPERATIONS", "HANDLER_OPERATIONS"]

HANDLER_OPERATIONS = (
    "get_file_info", "get_file_info_selector", "create_dir", "delete_dir",
    "delete_dir_contents", "delete_root_dir_contents", "delete_file", "move", "copy_file",
    "open_input_stream", "open_input_file", "open_output_stream", "open_append_stream",
    "normalize_path", "get_type_name",
)
STREAM_OPERATIONS = ("read", "write", "flush", "close")

ErrorFactory = Callable[[], BaseException]


class errors:  # noqa: N801 - a namespace of factories, read as errors.network()
    """Factories of the errors real clients raise (texts as pyarrow's S3 client words them)."""

    @staticmethod
    def network(op: str = "PutObject") -> ErrorFactory:
        return lambda: OSError(
            f"AWS Error NETWORK_CONNECTION during {op} operation: curlCode: 56, "
            "Failure when receiving data from the peer")

    @staticmethod
    def throttle(op: str = "PutObject") -> ErrorFactory:
        return lambda: OSError(
            f"AWS Error SLOW_DOWN during {op} operation: Please reduce your request rate.")

    @staticmethod
    def unavailable(op: str = "HeadObject") -> ErrorFactory:
        return lambda: OSError(
            f"AWS Error UNKNOWN (HTTP status 503) during {op} operation: No response body.")

    @staticmethod
    def commit_failed() -> ErrorFactory:
        return lambda: OSError(
            "AWS Error INTERNAL_FAILURE during CompleteMultipartUpload operation: "
            "We encountered an internal error. Please try again.")

    @staticmethod
    def reset() -> ErrorFactory:
        return lambda: ConnectionResetError(104, "Connection reset by peer")

    @staticmethod
    def access_denied(op: str = "PutObject") -> ErrorFactory:
        return lambda: OSError(f"AWS Error ACCESS_DENIED during {op} operation: Access Denied")

    @staticmethod
    def not_found(path: str = "") -> ErrorFactory:
        return lambda: FileNotFoundError(2, "No such file or directory", path)


@dataclass
class Fault:
    """Fail ``operation`` on paths matching ``path`` (a glob): let ``skip`` matches pass, then
    fail ``times`` of them (``None``: every one). ``error`` makes a fresh exception each time.
    ``silent`` (for ``close`` only): report success but drop the object, like a commit that
    an object store acknowledged and lost. ``stall``: hold the call that many seconds first
    (then raise ``error``, or, without one, go on normally). ``applied``: do the work, then
    raise ``error`` (applied, then the answer lost). ``then``: called each time the fault
    fires, after its work (if applied) and before its error: a third party acting between
    the failed attempt and its retry (deleting the source of a move, writing the path)."""

    operation: str
    error: ErrorFactory | None
    path: str = "*"
    skip: int = 0
    times: int | None = 1
    silent: bool = False
    stall: float | None = None
    applied: bool = False
    then: Callable[[], Any] | None = None
    seen: int = 0
    fired: int = 0

    def matches(self, operation: str, path: str) -> bool:
        return operation == self.operation and fnmatch.fnmatchcase(path, self.path)

    def take(self) -> bool:
        """Count a match; True when this one must fail."""
        self.seen += 1
        if self.seen <= self.skip:
            return False
        if self.times is not None and self.fired >= self.times:
            return False
        self.fired += 1
        return True


class _Plan:
    """The faults of one filesystem and what they did; thread-safe."""

    def __init__(self, sleep: Callable[[float], Any] | None = None) -> None:
        self.lock = threading.Lock()
        self.faults: list[Fault] = []
        self.calls: Counter[str] = Counter()
        self.injected: Counter[str] = Counter()
        self.unstall = threading.Event()
        self.sleep = sleep

    def hold(self, fault: Fault) -> None:
        """Wait out ``fault``'s stall (ended early by ``release``; or the plan's own sleep),
        then let its third party act (``then``)."""
        self._hold(fault)
        if fault.then is not None:
            fault.then()

    def _hold(self, fault: Fault) -> None:
        if fault.stall:
            if self.sleep is not None:
                self.sleep(fault.stall)
            else:
                self.unstall.wait(fault.stall)

    def release(self) -> None:
        with self.lock:
            event, self.unstall = self.unstall, threading.Event()
        event.set()

    def check(self, operation: str, path: str) -> Fault | None:
        with self.lock:
            self.calls[operation] += 1
            for fault in self.faults:
                if fault.matches(operation, path) and fault.take():
                    self.injected[operation] += 1
                    return fault
        return None

    def maybe_fail(self, operation: str, path: str) -> None:
        fault = self.check(operation, path)
        if fault is None:
            return
        self.hold(fault)
        if fault.error is not None and not fault.silent:
            raise fault.error()

    def run(self, operation: str, path: str, work: Callable[[], Any]) -> Any:
        """``work()`` under the faults of ``operation``: before it, or after it if applied."""
        fault = self.check(operation, path)
        if fault is None:
            return work()
        if not fault.applied:
            self.hold(fault)
            if fault.error is not None and not fault.silent:
                raise fault.error()
            return work()
        work()
        self.hold(fault)
        assert fault.error is not None  # inject() refuses applied without an error
        raise fault.error()


class _FaultyOutput(io.RawIOBase):
    """Buffers like an object store upload: the object appears only on a successful close."""

    def __init__(self, plan: _Plan, inner_fs: pafs.FileSystem, path: str, metadata: Any) -> None:
        super().__init__()
        self._plan, self._fs, self._path, self._metadata = plan, inner_fs, path, metadata
        self._buffer = io.BytesIO()
        self._broken: BaseException | None = None

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        written = self._fail_if("write", lambda: self._buffer.write(memoryview(data).cast("B")))
        return int(written)

    def flush(self) -> None:
        if not self.closed:
            self._fail_if("flush", lambda: None)

    def _fail_if(self, operation: str, work: Callable[[], Any]) -> Any:
        try:
            return self._plan.run(operation, self._path, work)
        except BaseException as exc:
            self._broken = exc  # like an S3 upload whose part failed: it will not complete
            raise

    def close(self) -> None:
        if self.closed:
            return
        try:
            if self._broken is not None:
                raise OSError(f"upload of {self._path!r} failed earlier: {self._broken}")
            fault = self._plan.check("close", self._path)
            if fault is not None and not fault.applied:
                self._plan.hold(fault)
                if fault.silent:
                    return
                if fault.error is not None:
                    raise fault.error()
            with self._fs.open_output_stream(self._path, compression=None,
                                             metadata=self._metadata) as out:
                out.write(self._buffer.getvalue())
            if fault is not None and fault.applied:  # committed, then the answer was lost
                self._plan.hold(fault)
                assert fault.error is not None
                raise fault.error()
        finally:
            super().close()

    def discard(self) -> None:
        """Abandon the upload: nothing is committed."""
        super().close()


class _FaultyAppend(io.RawIOBase):
    """An append stream: writes go straight through to the inner stream (what was written
    before a fault stays written), and ``write``, ``flush`` and ``close`` can fail."""

    def __init__(self, plan: _Plan, inner: pa.NativeFile, path: str) -> None:
        super().__init__()
        self._plan, self._inner, self._path = plan, inner, path
        self._closing = False

    def writable(self) -> bool:
        return True

    def write(self, data: Any) -> int:
        self._plan.maybe_fail("write", self._path)
        view = memoryview(data).cast("B")
        self._inner.write(view)
        return len(view)

    def flush(self) -> None:
        if not self.closed and not self._closing:
            self._plan.maybe_fail("flush", self._path)
            self._inner.flush()

    def close(self) -> None:
        if self.closed:
            return
        try:
            self._plan.maybe_fail("close", self._path)
        finally:
            self._closing = True  # RawIOBase.close flushes: not a flush of the caller's
            super().close()
            self._inner.close()


class _FaultyInput(io.RawIOBase):
    def __init__(self, plan: _Plan, inner: pa.NativeFile, path: str) -> None:
        super().__init__()
        self._plan, self._inner, self._path = plan, inner, path

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return bool(self._inner.seekable())

    def read(self, size: int | None = -1) -> bytes:
        data = self._plan.run("read", self._path, lambda: self._inner.read()
                              if size is None or size < 0 else self._inner.read(size))
        return cast(bytes, data)

    def seek(self, offset: int, whence: int = 0) -> int:
        return int(self._inner.seek(offset, whence))

    def tell(self) -> int:
        return int(self._inner.tell())

    def size(self) -> int:
        return int(self._inner.size())

    def close(self) -> None:
        if not self.closed:
            self._inner.close()
            super().close()


class _FaultyHandler(pafs.FileSystemHandler):  # type: ignore[misc]  # untyped library
    def __init__(self, inner: pafs.FileSystem, plan: _Plan) -> None:
        self.inner, self.plan = inner, plan

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _FaultyHandler) and other.plan is self.plan

    def __ne__(self, other: object) -> bool:
        return not self == other

    def __hash__(self) -> int:
        return id(self.plan)

    def get_type_name(self) -> str:
        return f"faulty+{self.inner.type_name}"

    def normalize_path(self, path: str) -> str:
        normalized = self.plan.run("normalize_path", path, lambda: self.inner.normalize_path(path))
        return cast(str, normalized)

    def get_file_info(self, paths: list[str]) -> list[pafs.FileInfo]:
        for path in paths:  # a read: applied or not, the answer is lost the same way
            self.plan.maybe_fail("get_file_info", path)
        return cast("list[pafs.FileInfo]", self.inner.get_file_info(paths))

    def get_file_info_selector(self, selector: pafs.FileSelector) -> list[pafs.FileInfo]:
        infos = self.plan.run("get_file_info_selector", selector.base_dir,
                              lambda: self.inner.get_file_info(selector))
        return cast("list[pafs.FileInfo]", infos)

    def create_dir(self, path: str, recursive: bool) -> None:
        self.plan.run("create_dir", path, lambda: self.inner.create_dir(path, recursive=recursive))

    def delete_dir(self, path: str) -> None:
        self.plan.run("delete_dir", path, lambda: self.inner.delete_dir(path))

    def delete_dir_contents(self, path: str, missing_dir_ok: bool = False) -> None:
        self.plan.run("delete_dir_contents", path, lambda: self.inner.delete_dir_contents(
            path, missing_dir_ok=missing_dir_ok))

    def delete_root_dir_contents(self) -> None:
        self.plan.run("delete_root_dir_contents", "/", lambda: self.inner.delete_dir_contents(
            "/", accept_root_dir=True))

    def delete_file(self, path: str) -> None:
        self.plan.run("delete_file", path, lambda: self.inner.delete_file(path))

    def move(self, src: str, dest: str) -> None:
        self.plan.run("move", src, lambda: self.inner.move(src, dest))

    def copy_file(self, src: str, dest: str) -> None:
        self.plan.run("copy_file", src, lambda: self.inner.copy_file(src, dest))

    def open_input_stream(self, path: str) -> pa.NativeFile:
        inner = self.plan.run("open_input_stream", path,
                              lambda: self.inner.open_input_stream(path, compression=None))
        return pa.PythonFile(_FaultyInput(self.plan, inner, path), mode="r")

    def open_input_file(self, path: str) -> pa.NativeFile:
        inner = self.plan.run("open_input_file", path, lambda: self.inner.open_input_file(path))
        return pa.PythonFile(_FaultyInput(self.plan, inner, path), mode="r")

    def open_output_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        self.plan.maybe_fail("open_output_stream", path)
        return pa.PythonFile(_FaultyOutput(self.plan, self.inner, path, metadata), mode="w")

    def open_append_stream(self, path: str, metadata: Any) -> pa.NativeFile:
        inner = self.plan.run("open_append_stream", path,
                              lambda: self.inner.open_append_stream(path, compression=None,
                                                                    metadata=metadata))
        return pa.PythonFile(_FaultyAppend(self.plan, inner, path), mode="w")


class FaultyFileSystem(pafs.PyFileSystem):  # type: ignore[misc]  # untyped library
    """``inner`` with faults injected where you say (see the module docstring)."""

    def __init__(self, inner: pafs.FileSystem | None = None, *,
                 sleep: Callable[[float], Any] | None = None) -> None:
        """``sleep(seconds)``, if given, is how a stall waits: a test on a virtual clock passes
        the clock's own, so that stalls cost virtual time and the test never waits."""
        plan = _Plan(sleep)
        super().__init__(_FaultyHandler(inner if inner is not None else pafs.LocalFileSystem(),
                                        plan))
        self.__dict__["_plan"] = plan

    @property
    def plan(self) -> _Plan:
        return cast("_Plan", self.__dict__["_plan"])

    def inject(self, operation: str, error: ErrorFactory | BaseException | None = None, *,
               path: str = "*", skip: int = 0, times: int | None = 1, silent: bool = False,
               stall: float | None = None, applied: bool = False,
               then: Callable[[], Any] | None = None) -> Fault:
        """Add a fault; ``error`` is an exception factory (or an exception, copied each time).

        ``stall`` (seconds) holds the call first; a stall without an error is a slow call
        that then succeeds. ``then`` runs each time it fires, before its error is raised (a
        third party acting between attempts).
        """
        if error is None and not silent and not stall:
            raise ValueError("a fault needs an error, a stall (seconds) or silent=True")
        if stall is not None and (isinstance(stall, bool) or not isinstance(stall, (int, float))
                                  or stall <= 0):
            raise ValueError(f"stall must be a number of seconds > 0, got {stall!r}")
        if operation not in HANDLER_OPERATIONS + STREAM_OPERATIONS:
            raise ValueError(f"unknown operation {operation!r}; valid: "
                             f"{', '.join(HANDLER_OPERATIONS + STREAM_OPERATIONS)}")
        if silent and operation != "close":
            raise ValueError("silent=True is only meaningful for 'close'")
        if applied and (error is None or silent):
            raise ValueError("applied=True needs an error (the answer that replaces success)")
        if isinstance(error, BaseException):
            template = error
            error = lambda: type(template)(*template.args)  # noqa: E731
        fault = Fault(operation, error, path=path, skip=skip, times=times, silent=silent,
                      stall=stall, applied=applied, then=then)
        with self.plan.lock:
            self.plan.faults.append(fault)
        return fault

    def clear(self) -> None:
        """Remove every fault, end every stall and zero the counters."""
        with self.plan.lock:
            self.plan.faults.clear()
            self.plan.calls.clear()
            self.plan.injected.clear()
        self.plan.release()

    def release(self) -> None:
        """End every stall in progress now (the stalled calls go on as their fault says)."""
        self.plan.release()

    @property
    def calls(self) -> Counter[str]:
        return self.plan.calls

    @property
    def injected(self) -> Counter[str]:
        return self.plan.injected

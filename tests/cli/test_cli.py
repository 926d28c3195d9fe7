"""The `retryfs` command against the S3 fault endpoint: real transfers, exit codes, progress.

Locations are URLs, as a user types them (``s3://KEY:SECRET@bucket/key?endpoint_override=...``
with ``retry_*`` parameters), so they go through ``retryfs.from_uri``. A pyarrow S3 filesystem
made from a URL keeps the AWS SDK's own retries (pyarrow offers no URL option for them), so
faults that the SDK retries itself are absorbed before retryfs sees them; the faults that reach
retryfs here are the ones the SDK cannot see: a commit that answered OK but did not land, an
object corrupted behind the tool's back.
"""

import hashlib
import http.server
import io
import json
import os
import select
import signal
import subprocess
import sys
import threading
import time

import pytest

from retryfs.cli import main
from retryfs.testing.s3 import SECRET_KEY, S3Fault

MiB = 1024 * 1024
UPLOADS = ("PutObject", "CreateMultipartUpload", "UploadPart", "CompleteMultipartUpload")
FILES = {"model.pt": 2 * MiB + 3, "optimizer.pt": MiB, "shards/a.bin": 5000, "meta.json": 40}


@pytest.fixture(autouse=True)
def _no_sleep(monkeypatch):
    monkeypatch.setenv("RETRYFS_NO_SLEEP", "1")


@pytest.fixture
def ckpt(tmp_path):
    root = tmp_path / "ckpt"
    digests = {}
    for rel, size in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        data = os.urandom(size)
        (root / rel).write_bytes(data)
        digests[rel] = hashlib.sha256(data).hexdigest()
    return root, digests


@pytest.fixture
def url(s3_fault_endpoint, s3_fault_bucket):
    ep = s3_fault_endpoint

    def make(key, **retry):
        params = {"retry_max_attempts": 4, "retry_initial_delay": 0, "retry_max_delay": 0}
        params.update({f"retry_{k}": v for k, v in retry.items()})
        return ep.uri(f"{s3_fault_bucket}/{key}", **params)

    return make


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = main([str(a) for a in argv], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def stored(ep, bucket, prefix, digests):
    return {rel: hashlib.sha256(ep.get_object(bucket, f"{prefix}/{rel}")).hexdigest()
            for rel in digests} == digests


def test_cp_uploads_through_faults(ckpt, url, s3_fault_endpoint, s3_fault_bucket):
    src, digests = ckpt
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    part = ep.add_fault(S3Fault.internal_error(op="UploadPart", path=f"{bucket}/up/model.pt",
                                               times=1))
    create = ep.add_fault(S3Fault.reset(op="CreateMultipartUpload",
                                        path=f"{bucket}/up/meta.json", times=1))
    code, out, err = run("cp", "-r", "-w", 2, src, url("up"))
    assert code == 0, err
    assert "copied 4 file(s)" in out and "failed 0" in out
    assert (ep.fired(part), ep.fired(create)) == (1, 1)
    # from_uri sets the SDK's own attempts to 1 (client_attempts=1): retryfs retried both
    assert "retries 2" in out, out
    assert stored(ep, bucket, "up", digests)
    # not a terminal: one plain line per file on stderr, no progress bar
    assert "copied  model.pt (2.0 MiB)" in err and "copying:" not in err
    assert SECRET_KEY not in out + err


def test_a_second_run_transfers_nothing(ckpt, url, s3_fault_endpoint, s3_fault_bucket):
    src, digests = ckpt
    ep = s3_fault_endpoint
    assert run("cp", "-r", src, url("up"))[0] == 0
    ep.reset_record()
    code, out, err = run("cp", "-r", src, url("up"))
    assert code == 0
    assert "copied 0 file(s)" in out and "skipped 4 already there" in out
    assert "skipped model.pt (2.0 MiB): same size and ETag" in err
    assert [r for r in ep.requests() if r.op in UPLOADS] == []  # no PutObject, no UploadPart
    assert ep.counts()["HeadObject"] >= len(FILES)  # an ETag per file, compared with MD5s


def test_a_commit_that_did_not_land_is_redone(ckpt, url, s3_fault_endpoint, s3_fault_bucket):
    src, digests = ckpt
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    lost = []

    def lose_it(request):  # the commit answered OK; then the object is not what was sent
        if not lost:
            lost.append(request.path)
            ep.put_object(bucket, "up/model.pt", b"")
        return False  # a hook: the rule never fires

    ep.add_fault(S3Fault.internal_error(op="HeadObject", path=f"{bucket}/up/model.pt",
                                        when=lose_it))
    code, out, err = run("cp", "-r", src, url("up"))
    assert code == 0, err
    assert "retries 1" in out
    assert "copied  model.pt (2.0 MiB) after 2 attempts" in err
    assert "VerificationError" in err  # the retry's WARNING line says why
    assert stored(ep, bucket, "up", digests)


def test_verify_catches_a_corrupted_object(ckpt, url, s3_fault_endpoint, s3_fault_bucket):
    src, digests = ckpt
    ep, bucket = s3_fault_endpoint, s3_fault_bucket

    def corrupt(request):  # whenever the object is read back, its bytes have changed
        ep.put_object(bucket, "up/optimizer.pt", b"\xff" * FILES["optimizer.pt"])
        return False

    ep.add_fault(S3Fault.internal_error(op="GetObject", path=f"{bucket}/up/optimizer.pt",
                                        when=corrupt))
    code, out, err = run("cp", "-r", "--verify", src, url("up", max_attempts=3))
    assert code == 1
    assert "FAILED optimizer.pt: VerificationError:" in out and "SHA-256" in out
    assert "copied 3 file(s)" in out and "failed 1" in out
    assert "1 file(s) did not land after retries" in err
    assert "Traceback" not in err
    # without --verify the size check cannot see a same-size corruption: the next run can,
    # because the stored object's ETag no longer matches the local file's MD5
    ep.clear_faults()
    code, out, err = run("cp", "-r", src, url("up"))
    assert code == 0
    assert "copied 1 file(s)" in out and "skipped 3" in out
    assert stored(ep, bucket, "up", digests)


def test_exit_1_when_storage_refuses(ckpt, url, s3_fault_endpoint, s3_fault_bucket):
    src, _ = ckpt
    s3_fault_endpoint.add_fault(S3Fault.access_denied(op="CreateMultipartUpload",
                                                      path=f"{s3_fault_bucket}/up/shards/*"))
    code, out, err = run("cp", "-r", "--json", src, url("up"))
    assert code == 1
    data = json.loads(out)
    assert data["ok"] is False and data["files"]["failed"] == 1
    assert data["failures"][0]["path"] == "shards/a.bin"
    assert "ACCESS_DENIED" in data["failures"][0]["error"]
    assert "retryfs: error: 1 file(s) did not land" in err


@pytest.mark.parametrize("argv, message", [
    (["cp", "-r", "{src}", "nosuch://bucket/x"], "Protocol not known: nosuch"),
    (["cp", "-r", "{src}?retry_max_atempts=3", "{tmp}/out"], "unknown URL parameter "
                                                              "'retry_max_atempts'"),
    (["cp", "-r", "{tmp}/missing", "{tmp}/out"], "source not found"),
    (["cp", "{src}", "{tmp}/out"], "is a directory"),
    (["cp", "-r", "{src}", "{tmp}/out?retry_max_attempts=zero"], "retry_max_attempts"),
    (["ls", "{tmp}/missing"], "not found"),
    (["rm", "{src}"], "remove it with -r"),
    (["cat", "{src}"], "is a directory"),
    (["cp", "-w", "0", "{src}", "{tmp}/out"], "expected a whole number"),
    (["cp", "{src}"], "required: DST"),
    (["mv", "a", "b"], "invalid choice"),
])
def test_usage_errors_exit_2_with_one_line(ckpt, tmp_path, argv, message):
    src, _ = ckpt
    argv = [a.format(src=src.as_uri() if "?" in a else src, tmp=tmp_path) for a in argv]
    code, out, err = run(*argv)
    assert code == 2
    assert message in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if "error" in line]) == 1
    if argv[0] != "mv" and "-w" not in argv and len(argv) > 2:
        assert err.startswith("retryfs: error: ") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_dry_run_and_json(ckpt, url, s3_fault_endpoint, s3_fault_bucket):
    src, _ = ckpt
    ep = s3_fault_endpoint
    code, out, err = run("cp", "-r", "-n", src, url("up"))
    assert code == 0 and "dry run: would copy 4 file(s)" in out
    assert "would copy model.pt" in err
    assert ep.keys(s3_fault_bucket) == [] and not [r for r in ep.requests() if r.op in UPLOADS]
    code, out, _ = run("cp", "-r", "--json", "-q", src, url("up"))
    data = json.loads(out)
    assert code == 0 and data["ok"] and data["files"]["copied"] == 4
    assert data["bytes"]["copied"] == sum(FILES.values())
    assert SECRET_KEY not in data["destination"]


def test_ls_cat_rm(ckpt, url, s3_fault_endpoint, s3_fault_bucket):
    src, _ = ckpt
    assert run("cp", "-r", src, url("up"))[0] == 0
    code, out, _ = run("ls", url("up"))
    assert code == 0 and out.split() == ["meta.json", "model.pt", "optimizer.pt", "shards/"]
    code, out, _ = run("ls", "-r", "-l", url("up"))
    assert code == 0 and "shards/a.bin" in out and "5000" in out
    reset = s3_fault_endpoint.add_fault(S3Fault.reset(op="GetObject", times=1))
    buffer = io.BytesIO()
    wrapper = io.TextIOWrapper(buffer)
    code = main(["cat", url("up/meta.json")], stdout=wrapper, stderr=io.StringIO())
    wrapper.flush()
    assert code == 0 and buffer.getvalue() == (src / "meta.json").read_bytes()
    assert s3_fault_endpoint.fired(reset) == 1
    code, out, _ = run("rm", "-r", url("up/shards"))
    assert code == 0 and "removed 1 file(s)" in out
    code, out, _ = run("rm", url("up/meta.json"))
    assert code == 0 and "removed" in out
    left = [k for k in s3_fault_endpoint.keys(s3_fault_bucket) if not k.endswith("/")]
    assert left == ["up/model.pt", "up/optimizer.pt"]  # (pyarrow leaves an "up/" marker)


@pytest.mark.parametrize("command", ["cp", "ls", "rm", "cat", "demo"])
def test_every_command_has_help(command):
    code, out, _ = run(command, "--help")
    assert code == 0 and f"usage: retryfs {command}" in out


def _run_on_a_terminal(argv, cwd, timeout=60):
    """Run ``python -m retryfs argv`` with stderr on a pseudo terminal; (code, stdout, tty)."""
    import fcntl
    import struct
    import termios

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 40, 160, 0, 0))
    env = {**os.environ, "RETRYFS_NO_SLEEP": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "retryfs", *argv], cwd=cwd, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=slave)
    os.close(slave)
    seen = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.1)
            if ready:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # the child closed its end
                    break
                if not chunk:
                    break
                seen += chunk
            elif proc.poll() is not None:
                break
        out = proc.stdout.read().decode()
        code = proc.wait(timeout=timeout)
    finally:
        os.close(master)
        if proc.poll() is None:
            proc.kill()
    return code, out, seen.decode(errors="replace")


def test_progress_bar_on_a_terminal(ckpt, tmp_path):
    src, digests = ckpt
    code, out, tty = _run_on_a_terminal(["cp", "-r", "--verify", str(src), str(tmp_path / "out")],
                                        cwd=tmp_path)
    assert code == 0, tty
    assert "copying:" in tty and "100%" in tty  # the bar
    assert "files 4/4" in tty and "retries 0" in tty and "B/s" in tty
    assert "\r" in tty  # redrawn in place
    assert "copied  model.pt" not in tty  # no plain per-file lines on a terminal
    assert "copied 4 file(s)" in out and "verified 4 by SHA-256" in out
    assert hashlib.sha256((tmp_path / "out/model.pt").read_bytes()).hexdigest() == digests[
        "model.pt"]


class _StallingHandler(http.server.BaseHTTPRequestHandler):
    """Holds every request until the test releases it (a black-holed download)."""

    def log_message(self, *args):  # quiet
        pass

    def do_GET(self):  # noqa: N802
        self.server.arrived.set()
        self.server.release.wait(30)

    do_HEAD = do_GET


def test_an_interrupted_command_exits_130(tmp_path):
    """Ctrl-C (SIGINT) during a stalled download: exit code 130, one line, no traceback."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _StallingHandler)
    server.daemon_threads = True
    server.arrived, server.release = threading.Event(), threading.Event()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/blob.bin"
    # Ctrl-C as a terminal delivers it: a test run launched as a background job (`make test &`,
    # nohup) has SIGINT ignored, the child would inherit that and never see the signal
    proc = subprocess.Popen([sys.executable, "-m", "retryfs", "cat", url], cwd=tmp_path,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert server.arrived.wait(60), "the download never reached the server"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=60)
    finally:
        server.release.set()
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        server.shutdown()
        server.server_close()
    assert proc.returncode == 130, err
    assert "interrupted" in err.decode() and "Traceback" not in err.decode()


def test_an_interrupted_command_exits_even_with_a_request_still_in_flight(tmp_path):
    """The command's own entry (`retryfs.cli.run`) ends an interrupted command at once, while a
    worker thread is still blocked in a request (here: a non-daemon thread waiting forever, as a
    stalled read in a per-attempt timeout's thread does): the interpreter's shutdown would join
    that thread and Ctrl-C would never end the command. Its output is flushed first."""
    script = ("import threading, retryfs.cli as cli\n"
              "threading.Thread(target=threading.Event().wait).start()\n"
              "def interrupted(*args, **kwargs):\n"
              "    print('partial output', end='')\n"
              "    return cli.EXIT_INTERRUPTED\n"
              "cli.main = interrupted\n"
              "cli.run()\n")
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=tmp_path,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    try:
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, err
    assert out == b"partial output"


def test_version_names_the_installed_distribution():
    import io

    import retryfs

    out = io.StringIO()
    assert main(["--version"], stdout=out, stderr=io.StringIO()) == 0
    assert out.getvalue().strip() == f"retryfs {retryfs.__version__}"

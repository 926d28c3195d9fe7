"""``retryfs cp -r --verify`` never claims what it did not check.

A file already at the destination with the source's size but other bytes: with ``--verify``
it is compared by SHA-256 (or the store's ETag) before it counts as done, and copied again when
it differs; without, it is skipped and the summary says "skipped by size, not verified".
"""

import hashlib
import io
import json
import os

import pytest

from retryfs.cli import main

FILES = {"model.pt": 300_001, "optimizer.pt": 70_000, "shards/a.bin": 5000, "meta.json": 40}


@pytest.fixture(autouse=True)
def _no_sleep(monkeypatch):
    monkeypatch.setenv("RETRYFS_NO_SLEEP", "1")


@pytest.fixture
def ckpt(tmp_path):
    root = tmp_path / "ckpt"
    for rel, size in FILES.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(os.urandom(size))
    return root


def run(*argv):
    out, err = io.StringIO(), io.StringIO()
    code = main([str(a) for a in argv], stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def digests(root):
    return {rel: hashlib.sha256((root / rel).read_bytes()).hexdigest() for rel in FILES}


def tamper(path):
    """Other bytes of the same size, as a crashed or concurrent writer leaves them."""
    size = path.stat().st_size
    path.write_bytes(bytes(b ^ 0xFF for b in path.read_bytes()[:size]))


def test_verify_rehashes_a_same_size_file_before_skipping_it(ckpt, tmp_path):
    dst = tmp_path / "dst"
    assert run("cp", "-r", ckpt, dst)[0] == 0
    tamper(dst / "optimizer.pt")
    code, out, err = run("cp", "-r", "--verify", ckpt, dst)
    assert code == 0, err
    assert digests(dst) == digests(ckpt)  # the differing file was copied again
    assert "copied 1 file(s)" in out and "skipped 3 already there" in out
    assert "verified 4 by SHA-256" in out and "not verified" not in out
    assert "skipped meta.json (40 B): same size and SHA-256" in err
    assert "copied  optimizer.pt" in err and "content differs (SHA-256)" in err


def test_without_verify_a_size_skip_is_reported_as_unverified(ckpt, tmp_path):
    dst = tmp_path / "dst"
    assert run("cp", "-r", ckpt, dst)[0] == 0
    tamper(dst / "optimizer.pt")
    code, out, err = run("cp", "-r", ckpt, dst)
    assert code == 0, err
    assert "skipped 4 already there" in out
    assert "verified 0 by size, 4 skipped by size, not verified" in out
    assert "SHA-256" not in out
    code, out, _ = run("cp", "-r", "--json", "-q", ckpt, dst)
    data = json.loads(out)
    assert data["skipped_unverified"] == 4
    assert data["verified"] == {"sha256": 0, "etag": 0, "size": 0}
    assert {item["checked"] for item in data["items"]} == {"size"}


def test_first_copy_counts_what_it_checked(ckpt, tmp_path):
    code, out, _ = run("cp", "-r", "--verify", "--json", "-q", ckpt, tmp_path / "dst")
    data = json.loads(out)
    assert code == 0 and data["verified"] == {"sha256": 4, "etag": 0, "size": 0}
    assert data["skipped_unverified"] == 0
    code, out, _ = run("cp", "-r", ckpt, tmp_path / "dst2")
    assert code == 0 and "verified 4 by size" in out and "not verified" not in out


def test_verify_against_s3_counts_etag_matches_and_recopies_a_tampered_object(
        ckpt, s3_fault_endpoint, s3_fault_bucket):
    ep, bucket = s3_fault_endpoint, s3_fault_bucket
    url = ep.uri(f"{bucket}/up", retry_max_attempts=3, retry_initial_delay=0)
    assert run("cp", "-r", ckpt, url)[0] == 0
    ep.put_object(bucket, "up/meta.json", b"\x00" * FILES["meta.json"])  # same size, other bytes
    ep.reset_record()
    code, out, err = run("cp", "-r", "--verify", ckpt, url)
    assert code == 0, err
    assert "copied 1 file(s)" in out and "skipped 3 already there" in out
    assert "verified 4 (1 by SHA-256, 3 by ETag)" in out and "not verified" not in out
    assert ep.get_object(bucket, "up/meta.json") == (ckpt / "meta.json").read_bytes()
    # the ETags decided: the skipped objects were not downloaded
    assert [r.path for r in ep.requests("GetObject")] == [f"{bucket}/up/meta.json"]

"""A ranged GetObject through `S3FaultEndpoint` reads its range, not the whole object.

moto 5's GetObject reads and copies the whole object (``FakeKey.value``) and slices the range
out of it; with ``read_ranges_only`` (the default) the endpoint reads only the range. Asserted
here: every answer (status, body, the headers but the date and request id) is the one moto gives
with it off, for ranges moto serves, refuses (416) and treats as the whole object; 8 ranged GETs
of 8 MiB of a 64 MiB object read 64 MiB from the store, not 512; faults on ranged GETs answer
as before; concurrent ranged GETs of an object being replaced each see one object.
"""

from __future__ import annotations

import copy
import hashlib
import http.client
import os
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import botocore.exceptions
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from moto.s3.models import FakeKey

import retryfs.testing.s3 as s3_module
from retryfs.testing.s3 import S3Fault, S3FaultEndpoint

BUCKET = "retryfs-test"
MIB = 1 << 20

#: moto checks that a request is signed, not its signature (its auth is off by default).
AUTH = ("AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range, Signature=0")

#: What differs between two answers to the same request.
UNSTABLE_HEADERS = {"date", "x-amzn-requestid", "x-amz-request-id"}


def payload(size: int, seed: int = 0) -> bytes:
    return hashlib.shake_256(f"{seed}:{size}".encode()).digest(size) if size else b""


@pytest.fixture
def ep(s3_fault_endpoint: S3FaultEndpoint, s3_fault_bucket: str) -> Iterator[S3FaultEndpoint]:
    assert s3_fault_endpoint.read_ranges_only  # the default
    yield s3_fault_endpoint
    s3_fault_endpoint.read_ranges_only = True


class WholeReads:
    """Counts moto's own `FakeKey.value` reads (each one the whole object)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        moto_value = s3_module._moto_value

        def counting(key: FakeKey) -> bytes:
            self.count += 1
            return moto_value(key)

        monkeypatch.setattr(s3_module, "_moto_value", counting)


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> WholeReads:
    return WholeReads(monkeypatch)


def get(ep: S3FaultEndpoint, key: str, range_header: str | None,
        query: str = "") -> tuple[int, list[tuple[str, str]], bytes]:
    """A raw GET: status, headers (lowercase names, unstable ones dropped), body (request ids
    and host ids in an error body blanked)."""
    headers = {"Authorization": AUTH}
    if range_header is not None:
        headers["Range"] = range_header
    conn = http.client.HTTPConnection(ep.host, ep.port, timeout=60)
    try:
        conn.request("GET", f"/{BUCKET}/{key}{query}", headers=headers)
        response = conn.getresponse()
        body = response.read()
        kept = [(k.lower(), v) for k, v in response.getheaders()
                if k.lower() not in UNSTABLE_HEADERS]
    finally:
        conn.close()
    if response.status >= 300:
        body = re.sub(rb"<(RequestId|HostId)>[^<]*</\1>", rb"<\1/>", body)
    return response.status, kept, body


def both_ways(ep: S3FaultEndpoint, reads: WholeReads, key: str, range_header: str | None,
              query: str = "") -> tuple[Any, Any, int]:
    """The answer with only ranges read, moto's own, and the whole-object reads of the first."""
    before = reads.count
    ep.read_ranges_only = True
    ours = get(ep, key, range_header, query)
    ours_whole = reads.count - before
    ep.read_ranges_only = False
    stock = get(ep, key, range_header, query)
    ep.read_ranges_only = True
    return ours, stock, ours_whole


def put_multipart(ep: S3FaultEndpoint, key: str, parts: list[bytes]) -> bytes:
    client = ep.boto3_client()
    upload = client.create_multipart_upload(Bucket=BUCKET, Key=key)["UploadId"]
    etags = [client.upload_part(Bucket=BUCKET, Key=key, UploadId=upload, PartNumber=n,
                                Body=part)["ETag"] for n, part in enumerate(parts, 1)]
    client.complete_multipart_upload(
        Bucket=BUCKET, Key=key, UploadId=upload,
        MultipartUpload={"Parts": [{"PartNumber": n, "ETag": e} for n, e in enumerate(etags, 1)]})
    return b"".join(parts)


SIZES = [0, 1, 2, 7, 1023, 100_003, 3 * MIB + 5]

#: (Range header, for an object of `size`: what moto does with it). `None`: no Range header.
def ranges(size: int) -> list[str | None]:
    last = max(size - 1, 0)
    return [None, "bytes=0-0", "bytes=0-", f"bytes={last}-", f"bytes={size // 2}-",
            f"bytes={size // 3}-{size // 2}", f"bytes=1-{size + 100}", f"bytes={last}-{last}",
            "bytes=-1", f"bytes=-{size // 2 + 1}", f"bytes=-{size + 5}", "bytes=-0",
            f"bytes={size}-", f"bytes={size + 10}-{size + 20}",  # begin > last: 416
            f"bytes={size // 2 + 1}-{size // 2}",  # B < A: the whole object, 200
            "bytes=0-1,3-4", "bytes=x-1", "bytes=1-2-3", "bytes= 1-2", "items=0-1", ""]


def test_answers_are_moto_s_own_byte_for_byte(ep: S3FaultEndpoint,
                                              reads: WholeReads) -> None:
    objects = {f"plain-{size}": payload(size) for size in SIZES}
    for key, data in objects.items():
        ep.put_object(BUCKET, key, data)
    objects["multipart"] = put_multipart(ep, "multipart", [payload(5 * MIB, 1), payload(3, 2)])
    objects["multipart-3"] = put_multipart(
        ep, "multipart-3", [payload(5 * MIB, 3), payload(5 * MIB, 4), payload(1001, 5)])
    seen = set()
    for key, data in objects.items():
        for range_header in ranges(len(data)):
            ours, stock, whole = both_ways(ep, reads, key, range_header)
            assert ours == stock, (key, range_header)
            status, headers, body = ours
            seen.add(status)
            if status == 206:
                first, last, total = map(int, re.fullmatch(
                    r"bytes (\d+)-(\d+)/(\d+)", dict(headers)["content-range"]).groups())
                assert (body, total) == (data[first:last + 1], len(data))
                assert dict(headers)["content-length"] == str(len(body))
            elif status == 200:
                assert body == data and "content-range" not in dict(headers)
            one = re.fullmatch(r"bytes=(\d+)-(\d*)", range_header or "")
            if one and (not one[2] or int(one[2]) >= int(one[1])):  # what is read in place
                assert whole == (status == 200), (key, range_header)  # 200: the whole object
    assert seen == {200, 206, 416}


def test_part_number_and_other_answers_are_moto_s_own(ep: S3FaultEndpoint,
                                                      reads: WholeReads) -> None:
    data = put_multipart(ep, "multipart", [payload(5 * MIB, 1), payload(10, 2)])
    ep.put_object(BUCKET, "plain", payload(1000))
    for key, query, range_header in [
            ("plain", "?partNumber=1", "bytes=0-9"), ("plain", "?partNumber=2", "bytes=0-9"),
            ("multipart", "?partNumber=1", "bytes=3-9"), ("plain", "?tagging", "bytes=0-9"),
            ("missing", "", "bytes=0-9"), ("plain", "", "bytes=0-9")]:
        ours, stock, _ = both_ways(ep, reads, key, range_header, query)
        assert ours == stock, (key, query)
    ep.add_fault(S3Fault.no_such_key(op="GetObject", times=2))
    ours, stock, _ = both_ways(ep, reads, "plain", "bytes=0-9")
    assert ours == stock and ours[0] == 404
    assert len(data) == 5 * MIB + 10


@settings(suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(size=st.integers(0, 3000), first=st.integers(0, 3100), last=st.integers(0, 3100),
       form=st.sampled_from(["A-B", "A-", "-N", "A-B,C-D"]))
def test_random_ranges_answer_as_moto_does(ep: S3FaultEndpoint, reads: WholeReads,
                                           size: int, first: int, last: int, form: str) -> None:
    data = payload(size, first)
    ep.put_object(BUCKET, "obj", data)
    range_header = "bytes=" + form.replace("A", str(first)).replace("B", str(last)).replace(
        "N", str(last)).replace("C", str(last)).replace("D", str(last + 3))
    ours, stock, whole = both_ways(ep, reads, "obj", range_header)
    assert ours == stock
    if form == "A-B" and first <= last and first < size:
        assert ours[0] == 206 and ours[2] == data[first:last + 1] and whole == 0


class CountingBuffer:
    """A key's buffer that counts the bytes read from it."""

    def __init__(self, buffer: Any) -> None:
        self._buffer = buffer
        self.read_bytes = 0

    def read(self, *args: Any) -> bytes:
        data = self._buffer.read(*args)
        self.read_bytes += len(data)
        return data

    def __getattr__(self, name: str) -> Any:
        return getattr(self._buffer, name)


@pytest.mark.parametrize("read_ranges_only", [True, False])
def test_eight_ranged_gets_of_a_64_mib_object_read_64_mib(read_ranges_only: bool,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    data = os.urandom(64 * MIB)
    with S3FaultEndpoint(read_ranges_only=read_ranges_only) as ep:
        ep.create_bucket(BUCKET)
        ep.put_object(BUCKET, "big", data)
        key = ep._backend.get_bucket(BUCKET).keys["big"]
        assert key.etag  # moto's md5 of the whole object, once per key: before counting
        key._value_buffer = counting = CountingBuffer(key._value_buffer)
        reads = WholeReads(monkeypatch)
        client = ep.boto3_client()

        def ranged(n: int) -> bytes:
            r = client.get_object(Bucket=BUCKET, Key="big",
                                  Range=f"bytes={n * 8 * MIB}-{(n + 1) * 8 * MIB - 1}")
            assert r["ContentRange"] == f"bytes {n * 8 * MIB}-{(n + 1) * 8 * MIB - 1}/{64 * MIB}"
            return bytes(r["Body"].read())

        with ThreadPoolExecutor(8) as pool:  # in flight together, as retryfs reads a file
            assert b"".join(pool.map(ranged, range(8))) == data
        assert [r.status for r in ep.requests(op="GetObject")] == [206] * 8
    if read_ranges_only:
        assert (reads.count, counting.read_bytes) == (0, 64 * MIB)
    else:  # moto's own: each range read the whole object
        assert (reads.count, counting.read_bytes) == (8, 8 * 64 * MIB)


def test_faults_on_ranged_gets_answer_as_before(ep: S3FaultEndpoint) -> None:
    data = payload(3 * MIB + 1)
    ep.put_object(BUCKET, "obj", data)
    client = ep.boto3_client()
    outcomes: dict[bool, list[Any]] = {}
    for read_ranges_only in (True, False):
        ep.read_ranges_only = read_ranges_only
        ep.reset_record()
        seen = outcomes[read_ranges_only] = []
        ep.add_fault(S3Fault.truncate(op="GetObject", keep_bytes=1000, times=1))
        body = client.get_object(Bucket=BUCKET, Key="obj", Range="bytes=10-2000009")["Body"]
        with pytest.raises(botocore.exceptions.ResponseStreamingError) as raised:
            body.read()
        seen.append(re.search(r"IncompleteRead\([^)]*\)", str(raised.value))[0])  # type: ignore[index]
        ep.add_fault(S3Fault.truncate(op="GetObject", times=1))  # half of the range
        body = client.get_object(Bucket=BUCKET, Key="obj", Range=f"bytes={MIB}-")["Body"]
        with pytest.raises(botocore.exceptions.ResponseStreamingError) as raised:
            body.read()
        seen.append(re.search(r"IncompleteRead\([^)]*\)", str(raised.value))[0])  # type: ignore[index]
        ep.add_fault(S3Fault.reset(op="GetObject", times=1))
        with pytest.raises(botocore.exceptions.ConnectionClosedError):
            client.get_object(Bucket=BUCKET, Key="obj", Range="bytes=5-9")
        ep.add_fault(S3Fault.slow_down(op="GetObject", times=1))
        with pytest.raises(botocore.exceptions.ClientError, match="SlowDown"):
            client.get_object(Bucket=BUCKET, Key="obj", Range="bytes=5-9")
        ep.add_fault(S3Fault.delay(0.05, op="GetObject", times=1))
        r = client.get_object(Bucket=BUCKET, Key="obj", Range="bytes=5-9")
        seen.append((r["ContentRange"], r["Body"].read()))
        seen.append([(r.status, r.response_bytes if r.status != 503 else "xml",
                      r.fault.kind if r.fault else None) for r in ep.requests(op="GetObject")])
    assert outcomes[True] == outcomes[False]
    assert outcomes[True] == [
        "IncompleteRead(1000 bytes read, 1999000 more expected)",
        f"IncompleteRead({(2 * MIB + 1) // 2} bytes read, {2 * MIB + 1 - (2 * MIB + 1) // 2} "
        "more expected)",
        ("bytes 5-9/3145729", data[5:10]),
        [(206, 1000, "truncate"), (206, (2 * MIB + 1) // 2, "truncate"), (None, 0, "reset"),
         (503, "xml", "error"), (206, 5, "delay")]]


@pytest.mark.parametrize("versioned", [True, False])
def test_ranged_gets_of_an_object_being_replaced_each_see_one_object(
        ep: S3FaultEndpoint, versioned: bool) -> None:
    """Each answer is one version's range, its ETag and length that version's. Unversioned,
    moto disposes of the key an overwrite replaces (closes its buffer): a GET that found the old
    key and reads it after that answers 500 (``ValueError: I/O operation on closed file``), the
    same with moto's own reads; a versioned bucket keeps every version, so every answer is one."""
    if versioned:
        ep.boto3_client().put_bucket_versioning(
            Bucket=BUCKET, VersioningConfiguration={"Status": "Enabled"})
    versions = [payload(96 * 1024 + 7, 1), payload(128 * 1024, 2), payload(64 * 1024 + 1, 3)]
    etags = {len(v): hashlib.md5(v).hexdigest() for v in versions}
    # with the ETag given: moto computes a missing one lazily, reading the buffer without the
    # key's lock, which races with any concurrent read of that key (moto's own, as in stock)
    backend = ep._backend
    backend.put_object(BUCKET, "obj", versions[0], etag=etags[len(versions[0])])
    stop = threading.Event()
    replaced = 0

    def replace() -> None:
        nonlocal replaced
        while not stop.is_set() and replaced < 1000:
            version = versions[replaced % len(versions)]
            backend.put_object(BUCKET, "obj", version, etag=etags[len(version)])
            replaced += 1
            time.sleep(0.0005)

    def read(n: int) -> list[int]:
        statuses = []
        for i in range(30):
            first = (n * 7919 + i * 104729) % (48 * 1024)  # the range is in every version
            status, headers, body = get(ep, "obj", f"bytes={first}-{first + 16 * 1024 - 1}")
            statuses.append(status)
            if status == 500 and not versioned:
                continue
            assert status == 206
            found = dict(headers)
            total = int(found["content-range"].rsplit("/", 1)[1])
            version = next(v for v in versions if len(v) == total)
            assert found["etag"] == f'"{etags[total]}"'
            assert body == version[first:first + 16 * 1024]
            assert found["content-length"] == str(len(body)) == str(16 * 1024)
        return statuses

    writer = threading.Thread(target=replace)
    writer.start()
    try:
        with ThreadPoolExecutor(6) as pool:
            statuses = [s for some in pool.map(read, range(6)) for s in some]
    finally:
        stop.set()
        writer.join()
    assert replaced > 1 and len(statuses) == 180
    assert statuses.count(206) > 90  # 500: moto's race, rare


def test_the_view_answers_everything_as_the_bytes_do() -> None:
    data = payload(1000)
    key = FakeKey("k", data, account_id="123456789012", region_name="us-east-1")
    try:
        for first, last in [(10, 19), (0, None), (990, 5000), (999, 999), (1000, None)]:
            view = s3_module._RangeView(key, first, last)
            assert len(view) == 1000 and bool(view)
            for index in (slice(first, None if last is None else last + 1), slice(0, 1),
                          slice(10, 20), slice(990, 2000), slice(-5, None), slice(None, None),
                          slice(20, 10), slice(0, 100, 3), 7, -1):
                assert view[index] == data[index], (first, last, index)
        assert bytes(view) == data and view == data and view != data[1:]
        assert list(view) == list(data) and data[5:9] in view
        assert view + b"x" == data + b"x" and b"x" + view == b"x" + data
        assert view.startswith(data[:3]) and view.hex() == data.hex()
        assert copy.copy(view) == data  # a copy is a view of the same key
        with pytest.raises(TypeError):  # no buffer protocol: moto's regex on bodies skips it
            re.sub("a", "b", view)  # type: ignore[call-overload]
        assert isinstance(key.value, bytes) and key.value == data  # outside a ranged GET
    finally:
        key.dispose()
    empty = FakeKey("e", b"", account_id="123456789012", region_name="us-east-1")
    try:
        view = s3_module._RangeView(empty, 0, None)
        assert not view and len(view) == 0 and view[0:1] == b"" and bytes(view) == b""
    finally:
        empty.dispose()

"""`make bench-quick`'s code runs: one tiny section, its table and its ratios (not timings)."""

from __future__ import annotations

import importlib.util

import pytest

from benchmarks import bench_overhead, run
from benchmarks.common import FLOOR, RAY, RETRYFS, UNWRAPPED, Figure, ratios


def test_per_call_table_names_every_contender_and_its_ratio_to_the_floor():
    get_file_info, small_write = bench_overhead.per_call(calls=20, rounds=4)
    for name in (UNWRAPPED, FLOOR, RETRYFS):
        assert name in get_file_info and name in small_write
    assert f"vs {FLOOR}" in get_file_info.splitlines()[1]
    # Ray Data's wrapper is a contender wherever Ray is installed (not under make test-fast)
    assert (RAY in get_file_info) == (importlib.util.find_spec("ray") is not None)


def test_ratios_are_per_round_against_the_same_round():
    # rounds 2x slower for the baseline alike: the ratio stays exactly 2
    figures = ratios({"base": [1.0, 2.0, 4.0, 8.0], "other": [2.0, 4.0, 8.0, 16.0]}, "base")
    assert figures["other"] == Figure(2.0, 2.0, 2.0)


def test_unknown_section_is_refused(capsys):
    with pytest.raises(SystemExit) as exit:
        run.main(["--only", "nope"])
    assert exit.value.code == 2
    assert "unknown section" in capsys.readouterr().err


def test_the_torch_table_shows_every_contender_against_the_crt_peer():
    from benchmarks import bench_torch

    results = {"s3torchconnector": {"save": [2.0], "load": [1.0], "intact": 1, "rounds": 1},
               "retryfs stream": {"save": [3.0], "load": [1.0], "intact": 1, "rounds": 1},
               "pyarrow S3": {"save": [], "load": [], "intact": 0, "rounds": 1,
                              "errors": ["SystemError"]}}
    text = bench_torch._table("t", results)
    lines = text.splitlines()
    assert "1.50" in lines[3] and "1/1" in lines[3]  # retryfs stream: 3.0 / 2.0
    assert "0/1" in lines[4] and "SystemError" in lines[4]


def test_the_torch_section_s_endpoint_serves_and_faults_from_its_own_process():
    import os

    import pyarrow.fs as pafs

    from benchmarks.remote_endpoint import RemoteFaultEndpoint
    from retryfs.testing.s3 import ACCESS_KEY, SECRET_KEY, S3Fault

    with RemoteFaultEndpoint() as endpoint:
        endpoint.create_bucket("smoke")
        fs = pafs.S3FileSystem(access_key=ACCESS_KEY, secret_key=SECRET_KEY, scheme="http",
                               region=endpoint.region, allow_delayed_open=True,
                               endpoint_override=f"{endpoint.host}:{endpoint.port}",
                               retry_strategy=pafs.AwsStandardS3RetryStrategy(max_attempts=1))
        endpoint.add_fault(S3Fault.slow_down(op="PutObject", times=1))
        with pytest.raises(OSError, match="SLOW_DOWN"), fs.open_output_stream("smoke/a") as f:
            f.write(b"x")
        with fs.open_output_stream("smoke/a") as f:  # the fault fired once, in the server
            f.write(b"x")
        assert fs.open_input_stream("smoke/a").read() == b"x"
        endpoint.clear_faults()
        with pytest.raises(Exception, match="InvalidBucketName|not valid"):
            endpoint.create_bucket("x")  # the server's exception comes back here
        pid = endpoint._process.pid
        assert pid != os.getpid()
    assert not endpoint._process.is_alive()

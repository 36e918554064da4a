"""shoal-bench, the load generator the benchmarks rely on: a closed-loop run reports what it did,
and an open loop (--rate) offers the rate asked for and times each request from when it was due,
so a server that stalls shows the queue it caused instead of hiding it (coordinated omission).
Runs against the server under test (shoal-node, or memcached with SHOAL_TEST_SERVER=memcached)."""

import json
import os
import subprocess
import time

import pytest

from conftest import REPO_ROOT, pause_server, resume_server

BENCH_BIN = REPO_ROOT / os.environ.get("SHOAL_BENCH_BIN", "build/bin/shoal-bench")


def bench(server, *args, timeout=60):
    """Run shoal-bench against `server`; returns (exit code, JSON result or None, stderr)."""
    proc = subprocess.run([str(BENCH_BIN), "--server", f"127.0.0.1:{server.port}", "--json", *args],
                          capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return proc.returncode, (json.loads(lines[-1]) if lines else None), proc.stderr


def bench_through_a_stall(server, args, at, stall):
    """Run shoal-bench with `args` against `server`, stopping the server for `stall` seconds
    `at` seconds into the run; returns its JSON result (after checking it exited cleanly)."""
    proc = subprocess.Popen([str(BENCH_BIN), "--server", f"127.0.0.1:{server.port}", "--json",
                             *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(at)  # into the measured run: a point in time, not a condition to await
        pause_server(server)
        time.sleep(stall)
        resume_server(server)
        out, err = proc.communicate(timeout=30)
    finally:
        resume_server(server)
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    return json.loads([ln for ln in out.splitlines() if ln.startswith("{")][-1])


def test_closed_loop_reports_its_run(server):
    rc, res, err = bench(server, "--keys", "1000", "--prefill", "-d", "0.5", "--warmup", "0",
                         "-c", "4", "-t", "2")
    assert rc == 0, err
    assert res["rate"] == 0 and res["errors"] == 0
    assert res["ops"] > 100 and res["gets"] > res["sets"] > 0
    assert res["hit_ratio"] == 1.0  # prefilled, and nothing is evicted at this size
    assert 0 < res["p50_us"] <= res["p99_us"] <= res["max_us"]


def test_open_loop_offers_the_rate_asked_for(server):
    # a closed loop on loopback does tens of thousands of requests a second; the open loop must
    # hold to the rate whatever the server could do
    rc, res, err = bench(server, "--keys", "1000", "--rate", "400", "-d", "1", "--warmup", "0.2",
                         "-c", "8", "-t", "2")
    assert rc == 0, err
    assert res["rate"] == 400 and res["errors"] == 0
    assert 300 <= res["ops_per_sec"] <= 440, res


def test_open_loop_counts_the_wait_of_requests_due_during_a_stall(server):
    """The server stops for STALL seconds in the middle of a 2 s run at RATE requests/s over 4
    connections. A closed loop would time only the 4 requests in flight from their send; the open
    loop also times the ~RATE*STALL requests that fell due meanwhile from when they were due, so
    about a sixth of all requests carry waits of up to STALL, and its p90 shows the stall."""
    RATE, STALL = 500, 0.4
    res = bench_through_a_stall(server, ["--keys", "1000", "--rate", str(RATE), "-d", "2",
                                         "--warmup", "0", "-c", "4", "-t", "1"], 0.6, STALL)
    assert res["errors"] == 0
    assert res["max_us"] >= STALL * 1e6 * 0.9, res
    # requests due in the stall: RATE*STALL = 200 of ~1000, their waits spread over 0..STALL;
    # the p90 falls among them, at well over 100 ms
    assert res["p90_us"] >= 100_000, res
    # and the run catches up afterwards: the offered rate is still what was served
    assert res["ops_per_sec"] >= RATE * 0.85, res


def test_open_loop_is_for_mixed_runs_only(server):
    rc, res, err = bench(server, "--mode", "cache-aside", "--rate", "100", "-d", "1")
    assert rc == 2 and res is None
    assert "--rate is for --mode mixed" in err


def test_split_puts_a_server_stall_in_the_server_part(server):
    """--split times each reply's arrival in the client's socket. A server that stops for STALL
    seconds mid-run leaves a request waiting that long before its reply arrives: the server part
    carries the stall, the client part (arrival to read) does not."""
    STALL = 0.3
    res = bench_through_a_stall(server, ["--split", "--keys", "1000", "-d", "1.5", "--warmup", "0",
                                         "-c", "1", "-t", "1"], 0.5, STALL)
    assert res["errors"] == 0
    assert res["server_stamped"] == res["ops"] == res["client_stamped"], res
    assert res["server_max_us"] >= STALL * 1e6 * 0.9, res
    assert res["client_max_us"] < STALL * 1e6 / 2, res
    assert res["server_p50_us"] <= res["p50_us"] and res["client_p50_us"] <= res["p50_us"], res


@pytest.mark.shoal_only
@pytest.mark.parametrize("worker_yield", ["0", "1"])
def test_pipelined_load_is_served_with_and_without_the_worker_yield(start_server, worker_yield):
    """--worker-yield only changes when a worker hands its core over between batches, never what
    it answers: a pipelined mixed load over many connections completes without an error."""
    server = start_server("-t", "2", "--worker-yield", worker_yield)
    rc, res, err = bench(server, "--keys", "2000", "--prefill", "-d", "0.5", "--warmup", "0",
                         "-c", "16", "-t", "2", "-p", "8")
    assert rc == 0, err
    assert res["errors"] == 0 and res["ops"] > 1000
    assert res["hit_ratio"] == 1.0

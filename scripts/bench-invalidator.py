#!/usr/bin/env python3
"""bench-invalidator.py — issue 14 point 7: shoal-invalidator under a stream of row updates.

Starts a PostgreSQL like the tests' (tests/integration/pgharness.py: initdb in /tmp,
wal_level=logical, fsync off) but with synchronous_commit on (--pg-opts), a table of ROWS rows, one shoal-node, and
shoal-invalidator mapping the table to `bench:{id}`; then drives RATE row updates a second for
DURATION seconds with Debian's pgbench (a custom script: ROWS_PER_COMMIT random rows per
transaction, rate-limited with -R) and measures:

- the rate achieved: pgbench's transactions a second × rows per commit, and the invalidator's
  own count of changes decoded (changes_total) over the same time;
- commit-to-delete latency, two ways: the invalidator's /metrics summary (PostgreSQL's commit
  timestamp to the delete applied, p50/p99, since its start, which is just before the load),
  and an independent probe: every PROBE_MS a key of a row pgbench does not touch is set in the
  node, the row is updated with `RETURNING clock_timestamp()` (taken before the commit), and the
  node is polled every 0.2 ms until the key is gone;
- the invalidator's CPU per change: utime+stime from /proc/PID/stat over the load ÷ changes.

Prints one line of figures and the commands. Run it on an otherwise idle machine: PostgreSQL,
pgbench, the invalidator and the node share the CPUs. Not part of CI (scripts/bench-invalidator.sh
is the entry point; --quick for a 10 s smoke run).
"""

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "integration"))

from mcraw import McRaw, accepts, free_port, healthz_ok, scrape_metrics, wait_until  # noqa: E402
from pgharness import PgServer, pg_bindir  # noqa: E402


def cpu_ticks(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)


def pct(values, p):
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(round(p / 100 * (len(v) - 1))))]


def start(args, log, **kw):
    return subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                            start_new_session=True, **kw)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rate", type=int, default=10000, help="row updates a second to offer")
    ap.add_argument("--duration", type=int, default=60, help="seconds of load")
    ap.add_argument("--rows", type=int, default=100000, help="rows in the table")
    ap.add_argument("--rows-per-commit", type=int, default=1,
                    help="row updates per transaction (1: one commit per row)")
    ap.add_argument("--clients", type=int, default=8, help="pgbench connections")
    ap.add_argument("--threads", type=int, default=2, help="pgbench threads")
    ap.add_argument("--probe-ms", type=int, default=100, help="probe period")
    ap.add_argument("--pg-opts", default="-c synchronous_commit=on",
                    help="more PostgreSQL -c options")
    ap.add_argument("--quick", action="store_true", help="10 s at 2,000 rows/s: a smoke run")
    ap.add_argument("--node-bin", default=str(REPO / "build/bin/shoal-node"))
    ap.add_argument("--invalidator-bin", default=str(REPO / "build/bin/shoal-invalidator"))
    a = ap.parse_args()
    if a.quick:
        a.rate, a.duration = min(a.rate, 2000), 10
    for b in (a.node_bin, a.invalidator_bin):
        if not os.path.exists(b):
            sys.exit(f"{b} not found: build with make -j2")
    bindir = pg_bindir()
    if bindir is None:
        sys.exit("PostgreSQL not installed: apt-get install postgresql (scripts/deps.sh)")
    pgbench = bindir / "pgbench"

    work = Path(tempfile.mkdtemp(prefix="shoal-bench-inv-"))
    log = open(work / "processes.log", "w")
    procs = []
    pg = None
    try:
        # synchronous_commit on (the harness turns it off): with it off, WAL reaches the WAL
        # sender only when the WAL writer flushes it (wal_writer_delay, 200 ms), which would
        # be most of the latency measured. fsync stays off: no disk in the figures.
        pg = PgServer.start(extra_opts=a.pg_opts)
        nprobe = 1000
        pg.sql(f"CREATE TABLE bench (id int PRIMARY KEY, v bigint NOT NULL DEFAULT 0)")
        pg.sql(f"INSERT INTO bench (id) SELECT g FROM generate_series(1, {a.rows + nprobe}) g")
        pg.sql("VACUUM ANALYZE bench")

        port = free_port()
        node = start([a.node_bin, "-p", str(port), "-l", "127.0.0.1", "-t", "1", "-m", "256",
                      "-U", "0"], log)
        procs.append(node)
        wait_until(lambda: accepts(port), message="shoal-node")

        admin = free_port()
        cfg = work / "invalidator.json"
        cfg.write_text(json.dumps({"clusters": {"local": {"routers": [f"127.0.0.1:{port}"]}},
                                   "tables": {"public.bench": {"keys": ["bench:{id}"]}}}))
        inv_cmd = [a.invalidator_bin, "--pg", pg.conninfo, "--config", str(cfg), "--admin-port",
                   str(admin), "--spill-dir", str(work / "spill")]
        inv = start(inv_cmd, log)
        procs.append(inv)
        wait_until(lambda: healthz_ok(admin), timeout=20, message="shoal-invalidator /healthz")

        script = work / "update.sql"
        body = "".join(f"\\set id{i} random(1, {a.rows})\n" for i in range(a.rows_per_commit))
        if a.rows_per_commit == 1:
            body += "UPDATE bench SET v = v + 1 WHERE id = :id0;\n"
        else:
            body += "BEGIN;\n" + "".join(f"UPDATE bench SET v = v + 1 WHERE id = :id{i};\n"
                                         for i in range(a.rows_per_commit)) + "END;\n"
        script.write_text(body)
        tps = a.rate / a.rows_per_commit
        bench_cmd = [str(pgbench), "-h", "127.0.0.1", "-p", str(pg.port), "-U", "postgres", "-n",
                     "-M", "prepared", "-f", str(script), "-c", str(a.clients), "-j",
                     str(a.threads), "-R", f"{tps:g}", "-T", str(a.duration), "postgres"]

        # the probe: its own rows, its own key
        probe_lat, probe_lost = [], [0]
        stop = threading.Event()

        def probe():
            db = pg.session()
            mc = McRaw("127.0.0.1", port, timeout=10)
            i = 0
            while not stop.is_set():
                row = a.rows + 1 + i % nprobe
                i += 1
                key = f"bench:{row}"
                assert mc.store("set", key, "v") == "STORED"
                rows = db.query(f"UPDATE bench SET v = v + 1 WHERE id = {row} "
                                "RETURNING extract(epoch from clock_timestamp())")
                t0 = float(rows[0][0])
                deadline = time.time() + 5
                while mc.meta(f"mg {key}").code != "EN":
                    if time.time() > deadline:
                        probe_lost[0] += 1
                        break
                    time.sleep(0.0002)
                else:
                    probe_lat.append(time.time() - t0)
                stop.wait(a.probe_ms / 1000)
            db.close()
            mc.close()

        m0 = scrape_metrics(admin)
        c0, t0 = cpu_ticks(inv.pid), time.monotonic()
        th = threading.Thread(target=probe)
        th.start()
        r = subprocess.run(bench_cmd, capture_output=True, text=True)
        stop.set()
        th.join(30)
        t1 = time.monotonic()
        # what pgbench committed is decoded and delivered a moment after it returns
        target = m0["shoal_invalidator_changes_total"]
        wait_until(lambda: scrape_metrics(admin)["shoal_invalidator_lag_seconds"] == 0, timeout=120,
                   interval=0.1, message="the invalidator to catch up")
        c1, t2 = cpu_ticks(inv.pid), time.monotonic()
        m1 = scrape_metrics(admin)
        if r.returncode != 0:
            sys.exit(f"pgbench failed:\n{r.stdout}\n{r.stderr}")
        tps_got = float(re.search(r"tps = ([0-9.]+)", r.stdout).group(1))
        changes = m1["shoal_invalidator_changes_total"] - target
        hz = os.sysconf("SC_CLK_TCK")
        cpu_s = (c1 - c0) / hz
        lab = '{cluster="local"'
        q = lambda qq: m1.get(f'shoal_invalidator_cluster_commit_to_delete_us{lab},quantile="{qq}"}}',
                               float("nan"))
        d = lambda name: m1[f"shoal_invalidator_{name}_total"] - m0[f"shoal_invalidator_{name}_total"]
        txs = d("transactions")
        out = {
            "offered_rows_per_s": a.rate,
            "rows_per_commit": a.rows_per_commit,
            "duration_s": a.duration,
            "pgbench_tps": round(tps_got, 1),
            "achieved_rows_per_s": round(tps_got * a.rows_per_commit, 1),
            "invalidator_changes": int(changes),
            "invalidator_changes_per_s_during_load": round(changes / (t1 - t0), 1),
            "catch_up_s_after_load": round(t2 - t1, 2),
            "commit_to_delete_p50_ms (metrics)": round(q("0.5") / 1000, 2),
            "commit_to_delete_p99_ms (metrics)": round(q("0.99") / 1000, 2),
            "probe_samples": len(probe_lat),
            "probe_lost": probe_lost[0],
            "probe_p50_ms": round(pct(probe_lat, 50) * 1000, 2),
            "probe_p90_ms": round(pct(probe_lat, 90) * 1000, 2),
            "probe_p99_ms": round(pct(probe_lat, 99) * 1000, 2),
            "probe_max_ms": round(max(probe_lat, default=float("nan")) * 1000, 2),
            # where the tail is: PostgreSQL's side (decoding, sending, and the reader) or delivery
            "commit_to_delete_mean_ms (metrics)": round(
                m1[f"shoal_invalidator_cluster_commit_to_delete_us_sum{lab}}}"] /
                max(1, m1[f"shoal_invalidator_cluster_commit_to_delete_us_count{lab}}}"]) / 1000, 2),
            "commit_to_received_mean_ms": round(d("receive_delay_us") / max(1, txs) / 1000, 2),
            "commits_received_over_50ms_pct": round(100 * d("received_late") / max(1, txs), 2),
            "invalidator_cpu_s": round(cpu_s, 2),
            "invalidator_cpu_us_per_change": round(cpu_s * 1e6 / changes, 2) if changes else None,
            "deletes_per_batch": m1.get(f"shoal_invalidator_cluster_deletes_per_batch{lab}}}"),
            "loadavg_after": open("/proc/loadavg").read().split()[:3],
        }
        print(json.dumps(out, indent=1))
        print("pgbench:", " ".join(bench_cmd))
        print("pgbench script:", body.replace("\n", " | "))
        print("invalidator:", " ".join(inv_cmd))
        print("pgbench says:", " / ".join(l.strip() for l in r.stdout.splitlines()
                                          if re.match(r"\s*(tps|latency|rate limit|number of "
                                                      r"transactions actually)", l)))
    finally:
        for p in reversed(procs):
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        if pg is not None:
            pg.stop()
        log.close()
        if os.environ.get("KEEP_LOGS") != "1":
            subprocess.run(["rm", "-rf", str(work)])
        else:
            print("logs:", work)


if __name__ == "__main__":
    main()

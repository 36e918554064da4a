#!/usr/bin/env python3
"""bench-failover.py — issue 15's scenario benchmark: a node dies at peak (run it through
scripts/bench-failover.sh).

Starts on loopback, free ports: shoal-control, three shoal-nodes (pool "main", following control
with --control/--advertise, one zone each), a gutter node (pool "gutter"), a shoal-router
following control; creates namespace "fo" with --copies 1|2; runs `shoal-bench aside-db` (a
cache-aside read load through the router with the counting database stand-in in the bench
process, a writer bumping versions and deleting keys, a staleness check) until the hit ratio is
steady above 95%; kill -9 one node of "main"; keeps the load going AFTER seconds and reports:

  marked down     kill -> the router's shoal_router_nodes_marked_down_total moves
  promotion       kill -> the first topology version (GET /v1/topology, sampled every 50 ms)
                  in which the dead node is no range's "node" (copies 2 only: copies-1 ranges
                  never move, C5)
  errors          client-visible errors (bench: any request answered with an error or not at
                  all) in report intervals that start after the node was marked down, and
                  in all after the kill
  db reads        database reads per second: baseline (mean over the BASELINE s before the
                  kill), and peak and mean over the AFTER s after it, as % over the baseline
  gutter          the gutter node's get hit ratio per second after the kill (`stats`), and
                  when it first passes 35% (copies 1)
  stale           values served older than a version whose delete was acknowledged before
                  the get: after the promotion's replay (copies 2) or after the kill (copies 1),
                  must be 0; and in the whole run

The last line of output is `RESULT {json}` with every figure and the targets met (`targets`);
scripts/bench-failover.sh --json prints only that line. Exit status 0 whether or not targets
are met (1: the harness itself failed); `--check` exits 3 when a target is missed.
"""

import argparse
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def binpath(env, name):
    return os.environ.get(env) or str(ROOT / "build" / "bin" / name)


try:  # the tests' port allocator: outside the ephemeral range, SHOAL_TEST_PORTS honoured
    sys.path.insert(0, str(ROOT / "tests" / "integration"))
    from ports import free_port
except ImportError:
    def free_port():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]


def req(host_port, method, path, body=None, timeout=5.0):
    host, port = host_port.rsplit(":", 1)
    c = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        data = json.dumps(body) if body is not None else None
        c.request(method, path, body=data,
                  headers={"Content-Type": "application/json"} if data else {})
        r = c.getresponse()
        text = r.read().decode()
    finally:
        c.close()
    try:
        return r.status, json.loads(text) if text else None
    except ValueError:
        return r.status, text


def metrics(host_port):
    st, text = req(host_port, "GET", "/metrics", timeout=2.0)
    out = {}
    if st == 200 and isinstance(text, str):
        for line in text.splitlines():
            if line and not line.startswith("#"):
                k, _, v = line.rpartition(" ")
                try:
                    out[k] = float(v)
                except ValueError:
                    pass
    return out


def mc_stats(host_port):
    host, port = host_port.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=2.0) as s:
        s.sendall(b"stats\r\n")
        buf = b""
        while not buf.endswith(b"END\r\n"):
            d = s.recv(65536)
            if not d:
                break
            buf += d
    out = {}
    for line in buf.decode().splitlines():
        p = line.split()
        if len(p) == 3 and p[0] == "STAT":
            out[p[1]] = p[2]
    return out


def wait_until(pred, timeout, what, interval=0.05):
    end = time.time() + timeout
    while time.time() < end:
        try:
            v = pred()
        except OSError:
            v = None
        if v:
            return v
        time.sleep(interval)
    raise RuntimeError(f"timed out after {timeout} s waiting for {what}")


def slot_nodes(doc, pool="main"):
    """(set of primaries, set of replicas) named by the pool's slot ranges."""
    p = (doc or {}).get("pools", {}).get(pool, {})
    prim, repl = set(), set()
    for r in p.get("slots", []) or []:
        if isinstance(r, dict):
            if r.get("node"):
                prim.add(r["node"])
            if r.get("replica"):
                repl.add(r["replica"])
    return prim, repl


class Cluster:
    def __init__(self, work, args):
        self.work, self.args = Path(work), args
        self.procs = []  # (name, Popen)

    def spawn(self, name, argv):
        log = open(self.work / f"{name}.log", "w")
        p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                             start_new_session=True)
        self.procs.append((name, p))
        return p

    def stop(self):
        """SIGTERM everything; {name: exit status} of those that did not exit 0 (the killed
        node excepted), with their logs' last lines: a sanitizer's report shows up here."""
        for _, p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
        bad = {}
        for name, p in reversed(self.procs):
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
                bad[name] = "did not exit within 10 s of SIGTERM"
                continue
            if p.returncode not in (0, -signal.SIGKILL):
                tail = (self.work / f"{name}.log").read_text(errors="replace").splitlines()[-6:]
                bad[name] = f"exit status {p.returncode}: " + " | ".join(tail)
        return bad

    def start(self):
        a = self.args
        cport = free_port()
        self.spawn("control", [binpath("SHOAL_CONTROL_BIN", "shoal-control"), "-p", str(cport),
                               "-l", "127.0.0.1",
                               "--data-dir", str(self.work / "control-data"), *a.control_args])
        self.control = f"127.0.0.1:{cport}"
        self.control_url = "http://" + self.control
        wait_until(lambda: req(self.control, "GET", "/healthz")[0] == 200, 10, "control healthy")

        self.nodes, self.admins, self.node_procs = [], [], []
        for i in range(4):
            port, admin = free_port(), free_port()
            addr = f"127.0.0.1:{port}"
            p = self.spawn(f"node{i}" if i < 3 else "gutter", [
                binpath("SHOAL_NODE_BIN", "shoal-node"), "-l", "127.0.0.1", "-p", str(port),
                "-U", "0", "-t", "1", "-m", str(a.node_mb), "--admin-port", str(admin),
                "--control", self.control_url, "--advertise", addr, *a.node_args])
            self.nodes.append(addr)
            self.admins.append(f"127.0.0.1:{admin}")
            self.node_procs.append(p)
        for i, n in enumerate(self.nodes):
            wait_until(lambda: socket.create_connection(tuple_of(n), 0.5).close() or True, 10,
                       f"node {n}")
        main_nodes = []
        for i in range(3):
            o = {"node": self.nodes[i], "admin": self.admins[i]}
            if a.copies == 2 and a.zones:
                o["zone"] = f"z{i}"
            main_nodes.append(o)
        st, body = req(self.control, "POST", "/v1/pools", {"name": "main", "nodes": main_nodes})
        if st not in (200, 201) and a.zones and a.copies == 2:
            # control without zone labels (before ctlfo): the pool without them
            for o in main_nodes:
                o.pop("zone", None)
            st, body = req(self.control, "POST", "/v1/pools",
                            {"name": "main", "nodes": main_nodes})
        if st not in (200, 201):
            raise RuntimeError(f"POST /v1/pools main: {st} {body}")
        st, body = req(self.control, "POST", "/v1/pools",
                        {"name": "gutter", "gutter": True,
                         "nodes": [{"node": self.nodes[3], "admin": self.admins[3]}]})
        if st not in (200, 201):
            raise RuntimeError(f"POST /v1/pools gutter: {st} {body}")
        r = subprocess.run([binpath("SHOAL_CLI_BIN", "shoal"), "ns", "create", "fo", "--pool",
                            "main", "--copies", str(a.copies), "--control", self.control_url],
                           capture_output=True, text=True, timeout=20)
        if r.returncode != 0:
            raise RuntimeError(f"shoal ns create fo --copies {a.copies}: {r.stdout}{r.stderr}")

        rport, radmin = free_port(), free_port()
        self.router, self.router_admin = f"127.0.0.1:{rport}", f"127.0.0.1:{radmin}"
        self.spawn("router", [binpath("SHOAL_ROUTER_BIN", "shoal-router"), "-l", "127.0.0.1",
                              "-p", str(rport), "--admin-port", str(radmin), "-t",
                              str(a.router_threads), "--control", self.control_url,
                              *a.router_args])
        version = req(self.control, "GET", "/v1/topology")[1]["version"]
        wait_until(lambda: metrics(self.router_admin).get("shoal_router_topology_version", 0)
                   >= version, 15, "the router to hold control's topology")


def tuple_of(addr):
    h, p = addr.rsplit(":", 1)
    return h, int(p)


class Sampler(threading.Thread):
    """Every 50 ms: control's topology version and slot map, the router's marked-down count;
    every second: the gutter node's get hits and misses."""

    def __init__(self, cl):
        super().__init__(daemon=True)
        self.cl, self.stop_ev = cl, threading.Event()
        self.topo = []  # (ts, version, primaries, replicas)
        self.down = []  # (ts, marked_down_total)
        self.router = []  # (ts, router's topology version, replayed deletes or None)
        self.gutter = []  # (ts, get_hits, get_misses)
        self.errors = 0

    def run(self):
        last_g = 0.0
        last_v = None
        while not self.stop_ev.is_set():
            now = time.time()
            try:
                st, doc = req(self.cl.control, "GET", "/v1/topology", timeout=1.0)
                if st == 200 and doc.get("version") != last_v:
                    last_v = doc.get("version")
                    prim, repl = slot_nodes(doc)
                    self.topo.append((now, last_v, prim, repl))
            except (OSError, ValueError, AttributeError):
                self.errors += 1
            try:
                m = metrics(self.cl.router_admin)
                self.down.append((now, m.get("shoal_router_nodes_marked_down_total", 0)))
                self.router.append((now, m.get("shoal_router_topology_version", 0),
                                    m.get("shoal_router_replayed_deletes_total")))
            except OSError:
                self.errors += 1
            if now - last_g >= 1.0:
                last_g = now
                try:
                    s = mc_stats(self.cl.nodes[3])
                    self.gutter.append((now, int(s.get("get_hits", 0)),
                                        int(s.get("get_misses", 0))))
                except OSError:
                    self.errors += 1
            self.stop_ev.wait(0.05)


class Load(threading.Thread):
    """shoal-bench aside-db through the router; collects its JSON lines."""

    def __init__(self, cl, args, duration):
        super().__init__(daemon=True)
        a = args
        self.argv = [os.environ.get("SHOAL_BENCH_BIN") or binpath("BENCH_BIN", "shoal-bench"), "aside-db", "-s", cl.router,
                     "-t", str(a.threads), "--rate", str(a.rate), "--keys", str(a.keys),
                     "--write-rate", str(a.write_rate), "--prefill", "--report-ms", "200",
                     "--timeout-ms", str(a.bench_timeout_ms), "-d", str(duration)]
        self.lines, self.summary, self.prefilled = [], None, threading.Event()
        self.err = open(cl.work / "bench.stderr", "w")

    def run(self):
        self.p = subprocess.Popen(self.argv, stdout=subprocess.PIPE, stderr=self.err, text=True)
        for line in self.p.stdout:
            try:
                d = json.loads(line)
            except ValueError:
                continue
            if "prefilled" in d:
                self.prefilled.set()
            elif d.get("summary"):
                self.summary = d
            else:
                self.lines.append(d)
        self.p.wait()

    def stop(self):
        if getattr(self, "p", None) and self.p.poll() is None:
            self.p.send_signal(signal.SIGINT)
        self.join(30)


def per_second(lines, t0, t1):
    """Bench intervals ending in (t0, t1], summed per whole second since t0."""
    out = {}
    for d in lines:
        if t0 < d["ts"] <= t1:
            s = int(d["ts"] - t0 - 1e-9)
            b = out.setdefault(s, {"gets": 0, "hits": 0, "misses": 0, "errors": 0,
                                   "db_reads": 0, "stale": 0})
            for k in b:
                b[k] += d[k]
    return [out.get(s, {"gets": 0, "hits": 0, "misses": 0, "errors": 0, "db_reads": 0,
                        "stale": 0}) for s in range(int(t1 - t0 + 1e-9))]


def run(a, work):
    cl = Cluster(work, a)
    res = {"copies": a.copies, "quick": a.quick, "rate": a.rate, "keys": a.keys,
           "write_rate": a.write_rate, "baseline_s": a.baseline, "after_s": a.after}
    try:
        cl.start()
        doc = req(cl.control, "GET", "/v1/topology")[1]
        prim, repl = slot_nodes(doc)
        res["replicas_in_slot_map"] = bool(repl)
        if a.copies == 2 and not repl:
            res["copies2_note"] = ("control wrote no \"replica\" in the slot map (needs ctlfo's "
                                   "C1 on this build): the run below is copies 1 in effect")
        sampler = Sampler(cl)
        sampler.start()
        load = Load(cl, a, a.settle_max + a.baseline + a.after + 5)
        load.start()
        if not load.prefilled.wait(60):
            raise RuntimeError("the load's prefill did not finish in 60 s")
        # steady state: BASELINE s of intervals with hit ratio above 95%, after a first second
        t_steady = time.time()

        def steady():
            lines = [d for d in load.lines if d["ts"] > t_steady + 1]
            good = 0.0
            for d in reversed(lines):
                if d["hit_ratio"] < 0.95 or d["errors"]:
                    break
                good += 0.2
            return good >= a.baseline

        wait_until(steady, a.settle_max + a.baseline, "a steady hit ratio above 95%", 0.1)
        victim = 0
        t_kill = time.time()
        cl.node_procs[victim].send_signal(signal.SIGKILL)
        cl.node_procs[victim].wait()
        dead = cl.nodes[victim]
        res["killed"] = dead
        time.sleep(a.after + 0.3)
        t_end = t_kill + a.after
        load.stop()
        # counters at the end, to tell where the gets went (replica reads, gutter, down node)
        try:
            res["router_counters"] = {k: v for k, v in metrics(cl.router_admin).items()
                                      if v and (k.endswith("_total") and "{" not in k)}
        except OSError:
            res["router_counters"] = None
        res["node_gets"] = {}
        for n in cl.nodes:
            try:
                st = mc_stats(n)
                res["node_gets"][n] = [int(st.get("get_hits", 0)), int(st.get("get_misses", 0))]
            except OSError:
                res["node_gets"][n] = None
        sampler.stop_ev.set()
        sampler.join(5)

        base = per_second(load.lines, t_kill - a.baseline, t_kill)
        after = per_second(load.lines, t_kill, t_end)
        gets_b = sum(b["gets"] for b in base)
        res["baseline_gets_per_s"] = round(gets_b / a.baseline, 1)
        res["baseline_hit_ratio"] = round(sum(b["hits"] for b in base) /
                                          max(1, sum(b["hits"] + b["misses"] for b in base)), 4)
        db_base = sum(b["db_reads"] for b in base) / a.baseline
        res["baseline_db_reads_per_s"] = round(db_base, 1)
        dbs = [b["db_reads"] for b in after]
        res["after_db_reads_per_s"] = dbs
        res["db_reads_peak_per_s"] = max(dbs) if dbs else None
        res["db_reads_mean_per_s"] = round(sum(dbs) / max(1, len(dbs)), 1)
        if db_base > 0:
            res["db_reads_peak_over_baseline_pct"] = round(100 * (max(dbs) - db_base) / db_base, 1)
            res["db_reads_mean_over_baseline_pct"] = round(
                100 * (sum(dbs) / len(dbs) - db_base) / db_base, 1)
        res["after_hit_ratio_per_s"] = [round(b["hits"] / max(1, b["hits"] + b["misses"]), 3)
                                        for b in after]

        downs = [ts for ts, n in sampler.down if ts >= t_kill and n > 0]
        t_down = downs[0] if downs else None
        res["marked_down_s"] = round(t_down - t_kill, 3) if t_down else None
        t_promo = None
        for ts, v, p, r in sampler.topo:
            if ts >= t_kill and dead not in p and p:
                t_promo, res["promoted_version"] = ts, v
                break
        res["promotion_s"] = round(t_promo - t_kill, 3) if t_promo else None
        res["topology_versions_after_kill"] = [v for ts, v, p, r in sampler.topo if ts >= t_kill]
        res["errors_after_kill"] = sum(d["errors"] for d in load.lines if d["ts"] > t_kill)
        res["errors_after_marked_down"] = (sum(d["errors"] for d in load.lines
                                               if d["ts"] - 0.2 >= t_down) if t_down else None)
        res["errors_per_s_after_kill"] = [b["errors"] for b in after]
        # "after the replay": once the router holds the promoted version and (when it counts
        # them, C6) its replayed deletes have moved; copies 1 (no promotion): after the kill
        t_replay, t_router = t_kill, None
        if t_promo:
            held = [(ts, rd) for ts, v, rd in sampler.router
                    if ts >= t_kill and v >= res["promoted_version"]]
            if held:
                t_router = held[0][0]
                res["router_switched_s"] = round(t_router - t_promo, 3)
                rd0 = next((rd for ts, v, rd in sampler.router if ts >= t_kill), None)
                moved = [ts for ts, rd in held if rd is not None and rd0 is not None and rd > rd0]
                t_replay = moved[0] if moved else t_router
                res["replayed_deletes"] = (held[-1][1] - rd0) if rd0 is not None else None
            else:
                t_replay = t_end
        res["replay_s"] = round(t_replay - t_kill, 3)
        res["stale_after_kill"] = sum(d["stale"] for d in load.lines if d["ts"] > t_kill)
        res["stale_after_replay"] = sum(d["stale"] for d in load.lines if d["ts"] - 0.2 >= t_replay)
        s = load.summary or {}
        res["stale_total"] = s.get("stale")
        # stale values served with no failure in sight (report intervals ending by the kill)
        res["stale_before_kill"] = sum(d["stale"] for d in load.lines if d["ts"] <= t_kill)
        try:  # the bench's own words on the first few (key, version served, version deleted)
            res["stale_messages"] = [l for l in (cl.work / "bench.stderr").read_text(
                errors="replace").splitlines() if "stale value" in l][:5]
        except OSError:
            res["stale_messages"] = []
        res["unchecked_keys"] = s.get("unchecked")
        res["fill_races"] = s.get("fill_races")
        res["bench_summary"] = s

        g = [(ts, h, m) for ts, h, m in sampler.gutter if ts >= t_kill - 1.5]
        ratios, first35 = [], None
        for (t0, h0, m0), (t1, h1, m1) in zip(g, g[1:]):
            dh, dm = h1 - h0, m1 - m0
            if t1 < t_kill:
                continue
            r = dh / (dh + dm) if dh + dm else None
            ratios.append([round(t1 - t_kill, 1), round(r, 3) if r is not None else None,
                           dh + dm])
            if r is not None and r > 0.35 and first35 is None and dh + dm >= 20:
                first35 = round(t1 - t_kill, 1)
        res["gutter_hit_ratio"] = ratios
        res["gutter_passes_35pct_s"] = first35

        t = {}
        if a.copies == 2 and res["replicas_in_slot_map"]:
            t["promotion_under_3s"] = res["promotion_s"] is not None and res["promotion_s"] < 3
            t["db_reads_at_most_5pct_over_baseline"] = (
                res.get("db_reads_mean_over_baseline_pct", 1e9) <= 5)
        else:
            t["gutter_hit_ratio_over_35pct_within_60s"] = first35 is not None and first35 <= 60
        t["baseline_hit_ratio_over_95pct"] = res["baseline_hit_ratio"] > 0.95
        t["no_errors_after_marked_down"] = res["errors_after_marked_down"] == 0
        t["no_stale_after_replay"] = res["stale_after_replay"] == 0
        res["targets"] = t
        res["sampler_errors"] = sampler.errors
        res["bad_exits"] = cl.stop()
        return res
    finally:
        cl.stop()


def report(res):
    p = print
    p(f"copies {res['copies']}{' (quick)' if res['quick'] else ''}: killed {res.get('killed')}, "
      f"load {res['rate']} gets/s over {res['keys']} keys, {res['write_rate']} writes/s")
    if res.get("copies2_note"):
        p(f"  NOTE: {res['copies2_note']}")
    p(f"  baseline: {res['baseline_gets_per_s']} gets/s, hit ratio {res['baseline_hit_ratio']}, "
      f"{res['baseline_db_reads_per_s']} db reads/s")
    p(f"  marked down by the router after {res['marked_down_s']} s; promotion after "
      f"{res['promotion_s']} s (topology versions after the kill: "
      f"{res['topology_versions_after_kill']})")
    p(f"  client-visible errors: {res['errors_after_marked_down']} after marked down, "
      f"{res['errors_after_kill']} after the kill; per s: {res['errors_per_s_after_kill']}")
    p(f"  db reads/s after the kill: peak {res['db_reads_peak_per_s']} "
      f"({res.get('db_reads_peak_over_baseline_pct')}% over baseline), mean "
      f"{res['db_reads_mean_per_s']} ({res.get('db_reads_mean_over_baseline_pct')}%)")
    p(f"  per s: {res['after_db_reads_per_s']}")
    p(f"  client hit ratio per s after the kill: {res['after_hit_ratio_per_s']}")
    p(f"  gutter hit ratio [s after kill, ratio, gets]: {res['gutter_hit_ratio']}")
    p(f"  gutter passes 35% at {res['gutter_passes_35pct_s']} s")
    p(f"  router held the promoted version {res.get('router_switched_s')} s after it; replay "
      f"counted at {res['replay_s']} s after the kill ({res.get('replayed_deletes')} deletes)")
    p(f"  stale values: {res['stale_after_replay']} after the replay, {res['stale_after_kill']} "
      f"after the kill, {res['stale_before_kill']} before it, {res['stale_total']} in the "
      f"run ({res['unchecked_keys']} keys unchecked, {res['fill_races']} fill races repaired)")
    p(f"  get hits/misses per node at the end (killed, two others, gutter): {res['node_gets']}")
    p(f"  router counters: {res['router_counters']}")
    p(f"  processes that did not exit cleanly: {res['bad_exits'] or 'none'}")
    p(f"  targets: {res['targets']}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--copies", type=int, choices=(1, 2), default=1)
    ap.add_argument("--quick", action="store_true",
                    help="5 s baseline, 20 s after the kill, 4,000 gets/s over 20,000 keys")
    ap.add_argument("--rate", type=int, help="gets/s (default 10000; quick 4000)")
    ap.add_argument("--keys", type=int, help="key space (default 50000; quick 20000)")
    ap.add_argument("--write-rate", type=int, help="writes/s (default 2%% of --rate)")
    ap.add_argument("--baseline", type=float, help="steady seconds before the kill (20; quick 5)")
    ap.add_argument("--after", type=float, help="seconds measured after the kill (60; quick 20)")
    ap.add_argument("--settle-max", type=float, default=60)
    ap.add_argument("--threads", type=int, default=8)
    ap.add_argument("--node-mb", type=int, default=64)
    ap.add_argument("--router-threads", type=int, default=2)
    ap.add_argument("--bench-timeout-ms", type=int, default=2000)
    ap.add_argument("--no-zones", dest="zones", action="store_false",
                    help="copies 2: do not label the three nodes with zones z0..z2")
    ap.add_argument("--node-arg", dest="node_args", action="append", default=[])
    ap.add_argument("--router-arg", dest="router_args", action="append", default=[])
    ap.add_argument("--control-arg", dest="control_args", action="append", default=[])
    ap.add_argument("--json", action="store_true", help="print only the RESULT line")
    ap.add_argument("--check", action="store_true", help="exit 3 when a target is missed")
    ap.add_argument("--keep", action="store_true", help="keep the logs directory")
    a = ap.parse_args()
    a.rate = a.rate or (4000 if a.quick else 10000)
    a.keys = a.keys or (20000 if a.quick else 50000)
    a.write_rate = a.write_rate or max(1, a.rate // 50)
    a.baseline = a.baseline or (5 if a.quick else 20)
    a.after = a.after or (20 if a.quick else 60)
    work = tempfile.mkdtemp(prefix="bench-failover-")
    try:
        res = run(a, work)
    except Exception as e:  # the harness failed: say where, with the logs
        print(f"bench-failover: {e}", file=sys.stderr)
        for f in sorted(Path(work).glob("*.log")) + [Path(work) / "bench.stderr"]:
            if f.exists():
                print(f"--- {f.name} (last lines)\n" + "\n".join(
                    f.read_text(errors="replace").splitlines()[-8:]), file=sys.stderr)
        print(f"logs: {work}", file=sys.stderr)
        return 1
    res["logs"] = work if a.keep else None
    if not a.json:
        report(res)
    print("RESULT " + json.dumps(res))
    if not a.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 3 if a.check and not all(res["targets"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())

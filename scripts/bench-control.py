#!/usr/bin/env python3
"""bench-control.py — shoal-control at scale (issue 13.7); run through scripts/bench-control.sh.

Starts shoal-control (embedded state, or --etcd on a 3-member etcd it starts itself), creates
the pools and namespaces through the API (parallel clients, with progress and the time one
change took as the namespace count grew), then for each follower count starts
bench-control-load (N long-polling followers on one epoll thread) and makes changes at an
interval: each change is a PUT of one namespace, timed from just before the request until the
last follower holds its version. Reports p50/p99/max of that, control's CPU seconds and RSS
(/proc) over the changes, and the load program's own busy time, so a slow follower side shows.
"""

import argparse
import http.client
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NS_PER_POOL = 250  # a pool holds at most 255 namespaces (a node's table), default included
TICK = os.sysconf("SC_CLK_TCK")


def log(msg):
    print(msg, file=sys.stderr, flush=True)


class Api:
    def __init__(self, port):
        self.port = port
        self.conn = None

    def call(self, method, path, body=None):
        for attempt in range(3):
            try:
                if self.conn is None:
                    self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
                data = json.dumps(body) if body is not None else None
                self.conn.request(method, path, body=data,
                                  headers={"Content-Type": "application/json"} if data else {})
                r = self.conn.getresponse()
                text = r.read()
                return r.status, json.loads(text) if text else None
            except (OSError, http.client.HTTPException):
                if self.conn:
                    self.conn.close()
                self.conn = None
                if attempt == 2:
                    raise


def proc_figures(pid):
    """(cpu seconds, rss MiB, peak rss MiB) of a process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / TICK
    rss = hwm = 0
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) / 1024
            elif line.startswith("VmHWM:"):
                hwm = int(line.split()[1]) / 1024
    return cpu, rss, hwm


def pct(xs, p):
    xs = sorted(xs)
    if not xs:
        return float("nan")
    k = min(len(xs) - 1, max(0, int(round(p / 100 * len(xs) + 0.5)) - 1))
    return xs[k]


def free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Etcd:
    """A 3-member etcd (Debian's etcd-server) on loopback, as the tests start one."""

    def __init__(self, tmp):
        ms = [(f"m{i}", f"http://127.0.0.1:{free_port()}", f"http://127.0.0.1:{free_port()}")
              for i in range(3)]
        initial = ",".join(f"{n}={p}" for n, _, p in ms)
        self.urls = ",".join(c for _, c, _ in ms)
        self.procs = [subprocess.Popen(
            ["/usr/bin/etcd", "--name", n, "--data-dir", str(tmp / f"etcd-{n}"),
             "--listen-client-urls", c, "--advertise-client-urls", c, "--listen-peer-urls", p,
             "--initial-advertise-peer-urls", p, "--initial-cluster", initial,
             "--initial-cluster-state", "new", "--initial-cluster-token", f"bench-{os.getpid()}"],
            stdout=open(tmp / f"etcd-{n}.log", "w"), stderr=subprocess.STDOUT) for n, c, p in ms]
        deadline = time.time() + 30
        while time.time() < deadline:
            try:
                for _, c, _ in ms:
                    h = http.client.HTTPConnection(c[7:].split(":")[0], int(c.rsplit(":", 1)[1]),
                                                   timeout=2)
                    h.request("GET", "/health")
                    if b'"true"' not in h.getresponse().read():
                        raise OSError("not healthy")
                return
            except OSError:
                time.sleep(0.2)
        sys.exit("etcd did not start")

    def stop(self):
        for p in self.procs:
            p.terminate()
        for p in self.procs:
            p.wait(10)


def start_control(args, tmp, etcd_urls):
    port_file = tmp / "port"
    cmd = [str(args.control_bin), "-p", "0", "--port-file", str(port_file),
           "--data-dir", str(tmp / "data"), "--poll-timeout", "30",
           # a finished run's followers stay held (suspended: their close is not seen) until
           # --poll-timeout, so the next run's must fit beside them
           "--poll-max", str(sum(args.followers) + 100),
           "--admin-conn-max", str(sum(args.followers) + 200)]
    if etcd_urls:
        cmd += ["--etcd", etcd_urls]
    (tmp / "data").mkdir(exist_ok=True)
    err = open(tmp / "control.log", "w")
    proc = subprocess.Popen(cmd, stderr=err, stdout=err)
    deadline = time.time() + 15
    while time.time() < deadline:
        if port_file.exists() and port_file.read_text().strip():
            port = int(port_file.read_text())
            try:
                st, _ = Api(port).call("GET", "/v1/topology")
                if not etcd_urls or st == 200:
                    # with etcd: wait until it is leader (a write would be forwarded to nobody)
                    if not etcd_urls or "shoal_control_leader 1" in metrics(port):
                        return proc, port
            except OSError:
                pass
        if proc.poll() is not None:
            sys.exit(f"shoal-control exited: see {tmp / 'control.log'}")
        time.sleep(0.1)
    sys.exit("shoal-control did not start")


def metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    return c.getresponse().read().decode()


def populate(args, port, pid):
    """Pools, then namespaces from args.workers clients; returns [(count, ms per change)]."""
    api = Api(port)
    pools = (args.namespaces + 1 + NS_PER_POOL - 1) // NS_PER_POOL
    for p in range(pools):
        nodes = [f"127.0.0.{p % 250 + 1}:{20000 + 3 * (p // 250) + i}" for i in range(3)]
        st, body = api.call("POST", "/v1/pools", {"name": f"p{p}", "nodes": nodes})
        if st != 201:
            sys.exit(f"pool p{p}: {st} {body}")
    names = [f"ns{i}" for i in range(args.namespaces)]
    done = [0]
    lock = threading.Lock()
    curve = []  # (namespaces, median ms of a create around then)
    window = []

    failed = []

    def worker(w):
        a = Api(port)
        for i in range(w, len(names), args.workers):
            if failed:
                return
            t0 = time.monotonic()
            st, body = a.call("POST", "/v1/namespaces",
                              {"name": names[i], "pool": f"p{i // NS_PER_POOL}",
                               "memory": 1 << 20, "team": f"t{i % 50}"})
            dt = (time.monotonic() - t0) * 1000
            if st != 201:
                failed.append(f"namespace {names[i]}: {st} {body}")  # a thread cannot exit
                return
            with lock:
                done[0] += 1
                window.append(dt)
                if done[0] % args.progress == 0 or done[0] == len(names):
                    curve.append((done[0], pct(window, 50)))
                    cpu, rss, _ = proc_figures(pid)
                    log(f"  {done[0]:6d}/{len(names)} namespaces  "
                        f"create p50 {pct(window, 50):7.1f} ms  control cpu {cpu:7.1f} s  "
                        f"rss {rss:6.1f} MiB")
                    window.clear()

    t0 = time.monotonic()
    ts = [threading.Thread(target=worker, args=(w,)) for w in range(args.workers)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    if failed:
        raise SystemExit(failed[0])
    st, body = api.call("GET", "/v1/namespaces")
    if len(body["namespaces"]) != len(names) + 1:  # and "default"
        raise SystemExit(f"control holds {len(body['namespaces'])} namespaces, not "
                         f"{len(names) + 1}")
    log(f"  created {len(names)} namespaces in {pools} pools in "
        f"{time.monotonic() - t0:.1f} s")
    return curve


class Load:
    """bench-control-load with N followers; its lines are read by a thread."""

    def __init__(self, binary, port, n, gzip):
        self.proc = subprocess.Popen([str(binary), "127.0.0.1", str(port), str(n)] +
                                     (["gzip"] if gzip else []),
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.all = {}
        self.lines = queue.Queue()
        self.cv = threading.Condition()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            f = line.split()
            if f and f[0] == "all":
                with self.cv:
                    self.all[int(f[1])] = (int(f[2]), int(f[3]))
                    self.cv.notify_all()
            else:
                self.lines.put(f)

    def wait_line(self, kind, timeout):
        deadline = time.monotonic() + timeout
        while True:
            f = self.lines.get(timeout=max(0.01, deadline - time.monotonic()))
            if f and f[0] == kind:
                return f

    def wait_all(self, version, timeout):
        with self.cv:
            self.cv.wait_for(lambda: version in self.all, timeout)
            return self.all.get(version)

    def stats(self):
        self.proc.stdin.write("stats\n")
        self.proc.stdin.flush()
        f = self.wait_line("stats", 30)
        return [int(x) for x in f[1:]]

    def stop(self):
        self.proc.stdin.close()
        self.proc.wait(10)


def run_followers(args, port, pid, n):
    load = Load(args.load_bin, port, n, not args.no_gzip)
    t0 = time.monotonic()
    load.wait_line("ready", 120)
    log(f"  {n} followers hold the current version ({time.monotonic() - t0:.1f} s)")
    api = Api(port)
    load.stats()
    cpu0, _, _ = proc_figures(pid)
    lcpu0 = proc_figures(load.proc.pid)[0]
    lat, api_ms, spread, missed = [], [], [], 0
    w0 = time.monotonic()
    for i in range(args.changes):
        name = f"ns{(i * 7919) % args.namespaces}"
        t_ns = time.monotonic_ns()
        st, body = api.call("PUT", f"/v1/namespaces/{name}", {"default_ttl": 60 + i % 1000})
        t_ack = time.monotonic_ns()
        if st != 200:
            sys.exit(f"change {i}: {st} {body}")
        v = body["version"]
        got = load.wait_all(v, 10)
        if got is None:
            missed += 1
            log(f"  change {i}: version {v} not at every follower within 10 s")
        else:
            lat.append((got[0] - t_ns) / 1e6)
            spread.append((got[0] - got[1]) / 1e6)
        api_ms.append((t_ack - t_ns) / 1e6)
        time.sleep(max(0.0, args.interval - (time.monotonic_ns() - t_ns) / 1e9))
    wall = time.monotonic() - w0
    cpu1, rss, hwm = proc_figures(pid)
    lcpu1 = proc_figures(load.proc.pid)[0]
    busy, max_loop, nbytes, answers, errors = load.stats()
    load.stop()
    return {
        "followers": n, "changes": args.changes, "missed": missed,
        "p50": pct(lat, 50), "p99": pct(lat, 99), "max": max(lat) if lat else float("nan"),
        "api_p50": pct(api_ms, 50), "spread_p50": pct(spread, 50),
        "cpu_per_change": (cpu1 - cpu0) / args.changes, "cpu_pct": 100 * (cpu1 - cpu0) / wall,
        "rss": rss, "hwm": hwm, "load_cpu_pct": 100 * (lcpu1 - lcpu0) / wall,
        "load_max_loop": max_loop / 1e6, "mb_per_change": nbytes / 1e6 / args.changes,
        "answers": answers, "errors": errors,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--namespaces", type=int, default=10000)
    ap.add_argument("--followers", default="100,300,1000",
                    help="follower counts, run one after another on the same control")
    ap.add_argument("--changes", type=int, default=30)
    ap.add_argument("--interval", type=float, default=1.0, help="seconds between changes")
    ap.add_argument("--workers", type=int, default=4, help="parallel API clients creating")
    ap.add_argument("--progress", type=int, default=1000)
    ap.add_argument("--etcd", action="store_true", help="state in a 3-member etcd")
    ap.add_argument("--no-gzip", action="store_true", help="followers do not ask for gzip")
    ap.add_argument("--control-bin", default=str(ROOT / "build/bin/shoal-control"))
    ap.add_argument("--load-bin", required=True)
    args = ap.parse_args()
    args.followers = [int(x) for x in args.followers.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="bench-control."))
    etcd = proc = None
    try:
        urls = None
        if args.etcd:
            etcd = Etcd(tmp)
            urls = etcd.urls
        proc, port = start_control(args, tmp, urls)
        log(f"shoal-control pid {proc.pid} port {port} ({'etcd' if urls else 'embedded'} "
            f"state); creating {args.namespaces} namespaces with {args.workers} clients")
        curve = populate(args, port, proc.pid)
        cpu, rss, hwm = proc_figures(proc.pid)
        doc = Api(port).call("GET", "/v1/topology")[1]
        doclen = len(json.dumps(doc, separators=(",", ":")))
        log(f"  topology document {doclen / 1e6:.2f} MB, control cpu {cpu:.1f} s, "
            f"rss {rss:.1f} MiB")
        rows = []
        for n in args.followers:
            log(f"{n} followers, {args.changes} changes every {args.interval} s")
            rows.append(run_followers(args, port, proc.pid, n))
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
    finally:
        if proc and proc.poll() is None:  # stopped on an error: do not leave it running
            proc.kill()
            proc.wait(10)
        if etcd:
            etcd.stop()
    print(f"\nshoal-control: {args.namespaces} namespaces, "
          f"{(args.namespaces + NS_PER_POOL) // NS_PER_POOL} pools, "
          f"{'etcd' if args.etcd else 'embedded'} state, document {doclen / 1e6:.2f} MB, "
          f"gzip {'off' if args.no_gzip else 'on'}, nproc {os.cpu_count()}")
    print("create: ms per namespace create (p50) as the count grew: " +
          ", ".join(f"{n}: {ms:.1f}" for n, ms in curve))
    print(f"{'followers':>9} {'changes':>7} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
          f"{'ack ms':>7} {'ctl cpu%':>8} {'cpu s/chg':>9} {'rss MiB':>8} {'peak':>7} "
          f"{'MB/chg':>7} {'load cpu%':>9} {'load loop ms':>12} {'missed':>6}")
    for r in rows:
        print(f"{r['followers']:>9} {r['changes']:>7} {r['p50']:>8.1f} {r['p99']:>8.1f} "
              f"{r['max']:>8.1f} {r['api_p50']:>7.1f} {r['cpu_pct']:>8.1f} "
              f"{r['cpu_per_change']:>9.3f} {r['rss']:>8.1f} {r['hwm']:>7.1f} "
              f"{r['mb_per_change']:>7.1f} {r['load_cpu_pct']:>9.1f} "
              f"{r['load_max_loop']:>12.1f} {r['missed']:>6}")
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()

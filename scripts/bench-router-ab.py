#!/usr/bin/env python3
"""bench-router-ab.py — two or more shoal-router binaries side by side in front of one
shoal-node (build/bin), in alternating rounds (the order reversed every other round), with the
same shoal-bench load (50 connections, 2 threads, gets and sets 9:1 over 100,000 keys, 4 s
measured after 1 s of warm-up) at depths 1 and 16. Prints per binary and depth the median and
range of ops/s over the rounds and the router's CPU time per request (from /proc; warm-up
included). For a change on the router's request path: is it slower than before?

Usage: scripts/bench-router-ab.py ROUTER_BIN ROUTER_BIN [...]   (ROUNDS=N, default 4)"""
import json, os, socket, subprocess, sys, tempfile, time
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NODE = os.path.join(ROOT, "build", "bin", "shoal-node")
BENCH = os.path.join(ROOT, "build", "bin", "shoal-bench")
routers = sys.argv[1:]
if len(routers) < 2 or any(a.startswith("-") for a in routers):
    sys.exit(__doc__)
def free():
    s = socket.socket(); s.bind(("127.0.0.1", 0)); p = s.getsockname()[1]; s.close(); return p
def wait(port):
    for _ in range(200):
        try: socket.create_connection(("127.0.0.1", port), 0.2).close(); return
        except OSError: time.sleep(0.05)
    raise SystemExit(f"port {port}")
def cpu(pid):
    f = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
procs = []
np_ = free()
procs.append(subprocess.Popen([NODE, "-p", str(np_), "-l", "127.0.0.1", "-t", "2", "-m", "256"], stderr=subprocess.DEVNULL))
wait(np_)
d = tempfile.mkdtemp()
cfg = os.path.join(d, "t.json")
json.dump({"version": 1, "pools": {"main": {"nodes": [f"127.0.0.1:{np_}"]}}, "namespaces": {"default": {"pool": "main"}}}, open(cfg, "w"))
rp = []
for r in routers:
    p = free()
    pr = subprocess.Popen([r, "-p", str(p), "-t", "2", "--config", cfg], stderr=subprocess.DEVNULL)
    procs.append(pr); wait(p); rp.append((r, p, pr))
subprocess.run([BENCH, "-s", f"127.0.0.1:{rp[0][1]}", "--prefill", "-d", "0", "--keys", "100000"], capture_output=True)
res = {}
try:
    for depth in (1, 16):
        for rnd in range(int(os.environ.get("ROUNDS", "4"))):
            for r, p, pr in (rp if rnd % 2 == 0 else rp[::-1]):
                c0 = cpu(pr.pid)
                out = subprocess.run([BENCH, "-s", f"127.0.0.1:{p}", "-d", "4", "--warmup", "1", "-p", str(depth), "-c", "50", "-t", "2", "--keys", "100000", "--json"], capture_output=True, text=True).stdout
                c1 = cpu(pr.pid)
                j = json.loads([l for l in out.splitlines() if l.startswith("{")][-1])
                ops = j["ops_per_sec"]
                n = j["ops"] * 5 / 4
                res.setdefault((depth, r), []).append((ops, (c1 - c0) / max(1, n) * 1e6 * 1))
    for (depth, r), v in sorted(res.items()):
        ops = sorted(x[0] for x in v); cpuop = sorted(x[1] for x in v)
        print(f"depth {depth:2d} {os.path.basename(r):14s} ops/s median {ops[len(ops)//2]:9.0f} (range {ops[0]:.0f}-{ops[-1]:.0f})  router CPU µs/request median {cpuop[len(cpuop)//2]:.2f}")
finally:
    for pr in procs: pr.terminate()

#!/usr/bin/python3
"""bench-memory.py — how many items fit in the same memory: shoal-node vs Debian's memcached.

For each server: start it alone on a free 127.0.0.1 port with the same -m and -t, overfill it
with KEYS distinct items (fixed key and value sizes) using shoal-bench --prefill, then read
`stats` (curr_items, evictions, bytes) and the process RSS from /proc. curr_items after an
overfill is the server's capacity: what it holds once it has started evicting. Prints a table,
the ratio of capacities, items per MiB of full RSS and its ratio (what a user pays for: issue 11
point 3), RSS over the -m limit, what -m holds besides items (shoal-node's hash_bytes,
ghost_bytes and reserved_bytes, when it reports them), and the exact commands.

Usage: scripts/bench-memory.py [--memory-mb 64] [--keys 600000] [--key-size 30]
                               [--value-size 100] [--threads 2]
"""
import argparse
import os
import shlex
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stats(port):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(b"stats\r\n")
        data = b""
        while not data.endswith(b"END\r\n"):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    out = {}
    for line in data.decode().split("\r\n"):
        parts = line.split(" ")
        if len(parts) == 3 and parts[0] == "STAT":
            out[parts[1]] = parts[2]
    return out


def rss_kb(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def wait_ready(port, proc, deadline=10.0):
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise SystemExit(f"server exited early with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.02)
    raise SystemExit("server did not start listening within 10 s")


def measure(name, argv, args, bench):
    port = free_port()
    cmd = argv + ["-p", str(port), "-l", "127.0.0.1", "-U", "0", "-m", str(args.memory_mb),
                  "-t", str(args.threads)]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, proc)
        rss0 = rss_kb(proc.pid)
        fill = [bench, "--server", f"127.0.0.1:{port}", "--prefill", "--duration", "0",
                "--keys", str(args.keys), "--key-size", str(args.key_size),
                "--value-size", str(args.value_size), "--conns", "8", "--threads", "2"]
        subprocess.run(fill, check=True, stdout=subprocess.DEVNULL, timeout=300)
        st = stats(port)
        rss1 = rss_kb(proc.pid)
        return {"name": name, "cmd": cmd, "fill": fill, "items": int(st.get("curr_items", 0)),
                "evictions": int(st.get("evictions", 0)), "bytes": int(st.get("bytes", 0)),
                "rss0_mb": rss0 / 1024, "rss_mb": rss1 / 1024,
                "extra": {k: int(st[k]) for k in ("hash_bytes", "ghost_bytes", "reserved_bytes")
                          if k in st}}
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--memory-mb", type=int, default=64)
    ap.add_argument("--keys", type=int, default=600000)
    ap.add_argument("--key-size", type=int, default=30)
    ap.add_argument("--value-size", type=int, default=100)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--shoal-bin", default=os.path.join(ROOT, "build/bin/shoal-node"))
    ap.add_argument("--memcached-bin", default="/usr/bin/memcached")
    ap.add_argument("--bench-bin", default=os.path.join(ROOT, "build/bin/shoal-bench"))
    args = ap.parse_args()
    for b in (args.shoal_bin, args.bench_bin):
        if not os.access(b, os.X_OK):
            sys.exit(f"{b} not found: run `make` first")
    rows = [measure("shoal-node", [args.shoal_bin], args, args.bench_bin),
            measure("memcached", [args.memcached_bin, "-u", "root"], args, args.bench_bin)]
    print(f"{args.keys} items of {args.key_size}-byte keys and {args.value_size}-byte values "
          f"into -m {args.memory_mb}:")
    print(f"{'server':<12}{'items held':>12}{'evictions':>12}{'bytes/item':>12}"
          f"{'RSS idle MB':>13}{'RSS full MB':>13}{'RSS - m MB':>12}{'items/MiB RSS':>15}")
    for r in rows:
        per = args.memory_mb * 1048576 / r["items"] if r["items"] else 0
        print(f"{r['name']:<12}{r['items']:>12}{r['evictions']:>12}{per:>12.1f}"
              f"{r['rss0_mb']:>13.1f}{r['rss_mb']:>13.1f}{r['rss_mb'] - args.memory_mb:>12.1f}"
              f"{r['items'] / r['rss_mb'] if r['rss_mb'] else 0:>15.0f}")
    if rows[1]["items"]:
        print(f"capacity ratio shoal/memcached: {rows[0]['items'] / rows[1]['items']:.3f}")
    if rows[1]["items"] and rows[0]["rss_mb"] and rows[1]["rss_mb"]:
        per = [r["items"] / r["rss_mb"] for r in rows]
        print(f"items per MiB of RSS ratio shoal/memcached: {per[0] / per[1]:.3f}")
    for r in rows:
        if r["extra"]:
            n = r["items"] or 1
            print(f"{r['name']} besides items: " + ", ".join(
                f"{k} {v} ({v / n:.1f} B/item)" for k, v in r["extra"].items()))
    print("commands:")
    for r in rows:
        print("  " + shlex.join(r["cmd"]) + "   # port varies per run")
    print("  " + shlex.join(rows[0]["fill"]))


if __name__ == "__main__":
    main()

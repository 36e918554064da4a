#!/usr/bin/env bash
# bench-lease.sh — what the slot-lease check (src/node/fence.h) costs a node whose pools have no
# replicas: two shoal-node binaries, BEFORE (built without the check) and AFTER (this tree),
# both following one shoal-control, each alone in a pool without replicas (so each owns every
# slot and the AFTER node renews its lease but fences nothing), loaded alike with shoal-bench.
#
# After a prefill of each, for every pipeline depth the two are alternated for ROUNDS rounds of
# DURATION seconds, so the machine's drift falls on both. Prints per depth the median ops/s and
# p50 of each and AFTER's ratio to BEFORE. Build BEFORE from the commit before the change, e.g.
#   mkdir -p /tmp/before && git archive a8eb38a Makefile src | tar -x -C /tmp/before &&
#   make -C /tmp/before build/bin/shoal-node -j2
#   BEFORE_BIN=/tmp/before/build/bin/shoal-node scripts/bench-lease.sh
#
# Settings (environment): BEFORE_BIN (required), AFTER_BIN (build/bin/shoal-node), CONTROL_BIN,
# BENCH_BIN, DEPTHS ("1 16"), ROUNDS (5), DURATION (4), CONNS (50), KEYS (100000).
set -euo pipefail
cd "$(dirname "$0")/.."

BEFORE_BIN=${BEFORE_BIN:?set BEFORE_BIN to a shoal-node built without the lease check}
AFTER_BIN=${AFTER_BIN:-build/bin/shoal-node}
CONTROL_BIN=${CONTROL_BIN:-build/bin/shoal-control}
BENCH_BIN=${BENCH_BIN:-build/bin/shoal-bench}
DEPTHS=${DEPTHS:-"1 16"}
ROUNDS=${ROUNDS:-5}
DURATION=${DURATION:-4}
CONNS=${CONNS:-50}
KEYS=${KEYS:-100000}

work=$(mktemp -d /tmp/bench-lease.XXXXXX)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

"$CONTROL_BIN" -p 0 --port-file "$work/cport" --data-dir "$work/cdata" 2>"$work/control.log" &
pids+=($!)
for _ in $(seq 100); do [ -s "$work/cport" ] && break; sleep 0.05; done
ctl="http://127.0.0.1:$(cat "$work/cport")"

declare -A port pid
for which in before after; do
    bin=$BEFORE_BIN
    [ "$which" = after ] && bin=$AFTER_BIN
    port[$which]=$(free_port)
    "$bin" -p "${port[$which]}" -l 127.0.0.1 -U 0 -m 1024 -t 2 -c 4096 -u root \
        --control "$ctl" 2>"$work/$which.log" &
    pids+=($!)
    pid[$which]=$!
    curl -sf -XPOST "$ctl/v1/pools" \
        -d "{\"name\": \"$which\", \"nodes\": [\"127.0.0.1:${port[$which]}\"]}" >/dev/null
done
sleep 1
bench() { timeout 120 "$BENCH_BIN" --server "127.0.0.1:$1" --threads 2 --conns "$CONNS" \
    --ratio 1:9 --keys "$KEYS" --value-size 100 --dist uniform --seed 1 "${@:2}"; }
for which in before after; do bench "${port[$which]}" --prefill --duration 0 --warmup 0 >/dev/null; done

for depth in $DEPTHS; do
    for r in $(seq "$ROUNDS"); do
        for which in before after; do
            bench "${port[$which]}" --pipeline "$depth" --duration 0.5 --warmup 0 >/dev/null
            # the node's CPU (user + system ticks) over the measured run only
            t0=$(awk '{print $14 + $15}' "/proc/${pid[$which]}/stat")
            bench "${port[$which]}" --pipeline "$depth" --duration "$DURATION" --warmup 0 --json \
                >"$work/$which.$depth.$r.json"
            t1=$(awk '{print $14 + $15}' "/proc/${pid[$which]}/stat")
            echo $((t1 - t0)) >"$work/$which.$depth.$r.cpu"
        done
    done
done

python3 - "$work" "$DEPTHS" "$ROUNDS" <<'EOF'
import json, statistics, sys
work, depths, rounds = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
import os
hz = os.sysconf("SC_CLK_TCK")
def fig(which, d, key):
    out = []
    for r in range(1, rounds + 1):
        lines = open(f"{work}/{which}.{d}.{r}.json").read().splitlines()
        j = json.loads([x for x in lines if x.startswith("{")][-1])
        if key == "cpu":  # node CPU microseconds per request
            ticks = int(open(f"{work}/{which}.{d}.{r}.cpu").read())
            out.append(ticks / hz * 1e6 / max(j["ops"], 1))
        else:
            out.append(j["ops_per_sec"] if key == "ops" else j["p50_us"])
    return statistics.median(out), out
print(f"{'depth':>5} {'binary':>7} {'ops/s':>10} {'p50 us':>8} {'node cpu us/op':>15}   rounds: cpu us/op")
for d in depths:
    r = {}
    for w in ("before", "after"):
        r[w] = fig(w, d, "ops")[0], fig(w, d, "p50")[0], fig(w, d, "cpu")
        print(f"{d:>5} {w:>7} {r[w][0]:>10.0f} {r[w][1]:>8.1f} {r[w][2][0]:>15.3f}   "
              f"{[round(x, 3) for x in r[w][2][1]]}")
    print(f"{d:>5} after/before: ops/s {r['after'][0] / r['before'][0]:.3f}, "
          f"cpu/op {r['after'][2][0] / r['before'][2][0]:.3f}")
EOF
grep -h 'lease' "$work/after.log" | head -3 || true

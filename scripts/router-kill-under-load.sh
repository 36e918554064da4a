#!/usr/bin/env bash
# router-kill-under-load.sh — what clients see when a node dies under load through shoal-router:
# three shoal-nodes and a gutter node behind one router, a steady pipelined shoal-bench load of
# gets and sets through it, one node killed with SIGKILL KILL_AT seconds in and started again
# RESTART_AT seconds in. Prints shoal-bench's summary (its `errors` are the SERVER_ERRORs the
# clients got) and the router's failure counters.
#
# Settings (environment): DURATION (8 s), KILL_AT (2), RESTART_AT (5), CONNS (50), DEPTH (16),
# RATIO (1:9), KEYS (100000), ROUTER_THREADS (2), TIMEOUT_MS (1000), RETRY_MS (100), PROBE_MS
# (100), ROUTER_FLAGS (more router options, e.g. "--upstream-conns 2"), NODE_BIN, ROUTER_BIN,
# BENCH_BIN (default: build/bin/...).
set -euo pipefail
cd "$(dirname "$0")/.."

DURATION=${DURATION:-8}
KILL_AT=${KILL_AT:-2}
RESTART_AT=${RESTART_AT:-5}
CONNS=${CONNS:-50}
DEPTH=${DEPTH:-16}
RATIO=${RATIO:-1:9}
KEYS=${KEYS:-100000}
ROUTER_THREADS=${ROUTER_THREADS:-2}
TIMEOUT_MS=${TIMEOUT_MS:-1000}
RETRY_MS=${RETRY_MS:-100}
PROBE_MS=${PROBE_MS:-100}
NODE_BIN=${NODE_BIN:-build/bin/shoal-node}
ROUTER_BIN=${ROUTER_BIN:-build/bin/shoal-router}
BENCH_BIN=${BENCH_BIN:-build/bin/shoal-bench}

dir=$(mktemp -d)
pids=()
cleanup() {
    for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$dir"
}
trap cleanup EXIT

free_port() {
    python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'
}
wait_port() {
    for _ in $(seq 100); do
        (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
        sleep 0.05
    done
    echo "nothing listens on $1" >&2
    return 1
}
start_node() { # port -> pid in $node_pid
    "$NODE_BIN" -p "$1" -l 127.0.0.1 -U 0 -t 2 -m 64 2>>"$dir/nodes.log" &
    node_pid=$!
    pids+=("$node_pid")
    wait_port "$1"
}

ports=()
for i in 0 1 2 3; do ports+=("$(free_port)"); done
node_pids=()
for i in 0 1 2 3; do start_node "${ports[$i]}"; node_pids+=("$node_pid"); done
cat >"$dir/topology.json" <<EOF
{"version": 1,
 "pools": {"main": {"nodes": ["127.0.0.1:${ports[0]}", "127.0.0.1:${ports[1]}", "127.0.0.1:${ports[2]}"]},
           "gutter": {"nodes": ["127.0.0.1:${ports[3]}"]}},
 "gutter_pool": "gutter",
 "namespaces": {"default": {"pool": "main"}}}
EOF
rport=$(free_port)
aport=$(free_port)
"$ROUTER_BIN" -p "$rport" -t "$ROUTER_THREADS" --admin-port "$aport" --config "$dir/topology.json" \
    --timeout-ms "$TIMEOUT_MS" --retry-ms "$RETRY_MS" --probe-ms "$PROBE_MS" ${ROUTER_FLAGS:-} \
    2>"$dir/router.log" &
pids+=("$!")
wait_port "$rport"

timeout $((DURATION + 30)) "$BENCH_BIN" -s "127.0.0.1:$rport" -c "$CONNS" -p "$DEPTH" \
    --ratio "$RATIO" --keys "$KEYS" --warmup 0 -d "$DURATION" >"$dir/bench.out" 2>&1 &
bench=$!
sleep "$KILL_AT"
{ kill -9 "${node_pids[2]}"; wait "${node_pids[2]}"; } 2>/dev/null || true
echo "killed node 127.0.0.1:${ports[2]} at ${KILL_AT} s"
sleep $((RESTART_AT - KILL_AT))
start_node "${ports[2]}"
echo "restarted it at ${RESTART_AT} s"
wait "$bench" || true
cat "$dir/bench.out"
echo "router ($ROUTER_BIN):"
curl -s "http://127.0.0.1:$aport/metrics" |
    grep -E '^shoal_router_(upstream_errors|upstream_timeouts|gutter_requests|gutter_retries|nodes_marked_down|nodes_marked_up|down_node_requests)_total ' || true
grep -E 'marked down|answers again|back in use' "$dir/router.log" || true

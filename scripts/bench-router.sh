#!/usr/bin/env bash
# bench-router.sh — one shoal-node loaded three ways in one run: directly, through shoal-router,
# and through Debian's nutcracker (twemproxy), with identical shoal-bench load.
#
# The node, the router (topology of that one node) and nutcracker (one server, one connection)
# run side by side on free 127.0.0.1 ports. After a prefill, for every pipeline depth the script
# alternates the three targets for ROUNDS rounds (a short unmeasured warmup and a measured run
# each), so the machine's drift spreads over all three alike. Prints per depth and target the
# median ops/s and p50 latency over the rounds, the router's and twemproxy's ratio to direct,
# the added p50, the CPU time the node and the proxy spent per operation (from /proc, both
# together: the cost of serving a request by that path) and the errors the clients saw.
# Under a closed loop at saturation a proxy's p50 mostly restates its throughput (Little's
# law), so two more phases measure the latency a proxy adds below saturation, alternated the
# same way: the same CONNS connections at depth 1 in an open loop (shoal-bench --rate) offered
# RATE_PCTS percent of the direct path's depth-1 throughput, timed from when each request was
# due; and LAT_CONNS connections at depth 1 in a closed loop. Then the exact commands. Run it on an otherwise
# idle machine: on 2 cores the node, the proxy and the load generator already share the CPUs. Every step is bounded by `timeout`; all processes are
# stopped on any exit.
#
# Settings (environment): DEPTHS ("1 16"), DURATION (5 s), ROUNDS (3), WARMUP (1 s), CONNS (50),
# BENCH_THREADS (2), RATIO (1:9), KEYS (100000), VALUE_SIZE (100), NODE_THREADS (2),
# ROUTER_THREADS (1: nutcracker is single-threaded), RATE_PCTS ("5 10 25"; "" skips the open-loop
# phase, which needs depth 1 in DEPTHS), LAT_CONNS (4; 0 skips the light-load phase), NODE_BIN, ROUTER_BIN, BENCH_BIN,
# NUTCRACKER_BIN (/usr/sbin/nutcracker), KEEP_LOGS=1 to keep the logs.
set -euo pipefail
cd "$(dirname "$0")/.."

DEPTHS=${DEPTHS:-"1 16"}
DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-3}
WARMUP=${WARMUP:-1}
CONNS=${CONNS:-50}
BENCH_THREADS=${BENCH_THREADS:-2}
RATIO=${RATIO:-1:9}
KEYS=${KEYS:-100000}
VALUE_SIZE=${VALUE_SIZE:-100}
NODE_THREADS=${NODE_THREADS:-2}
ROUTER_THREADS=${ROUTER_THREADS:-1}
NODE_BIN=${NODE_BIN:-build/bin/shoal-node}
ROUTER_BIN=${ROUTER_BIN:-build/bin/shoal-router}
BENCH_BIN=${BENCH_BIN:-build/bin/shoal-bench}
NUTCRACKER_BIN=${NUTCRACKER_BIN:-/usr/sbin/nutcracker}
KEEP_LOGS=${KEEP_LOGS:-0}
LAT_CONNS=${LAT_CONNS:-4}
RATE_PCTS=${RATE_PCTS-"5 10 25"}

die() { echo "bench-router.sh: $*" >&2; exit 1; }
[ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ] && { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0; }
for b in "$NODE_BIN" "$ROUTER_BIN" "$BENCH_BIN"; do
    [ -x "$b" ] || die "$b not found: build it with 'make'"
done
[ -x "$NUTCRACKER_BIN" ] || die "$NUTCRACKER_BIN not found: apt-get install nutcracker (or set NUTCRACKER_BIN)"

WORK=$(mktemp -d /tmp/bench-router.XXXXXX)
PIDS=()
COMMANDS=()
cleanup() {
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
    if [ "$KEEP_LOGS" = 1 ]; then echo "logs kept in $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
wait_port() { # wait_port PORT NAME
    for _ in $(seq 200); do
        if python3 -c "import socket,sys; socket.create_connection(('127.0.0.1',$1),0.2)" 2>/dev/null; then return 0; fi
        sleep 0.05
    done
    die "$2 did not listen on port $1; log: $(cat "$WORK/$2.log" 2>/dev/null)"
}
start() { # start NAME CMD...: run in the background, log to $WORK/NAME.log
    local name=$1; shift
    COMMANDS+=("$name: $*")
    "$@" >"$WORK/$name.log" 2>&1 &
    PIDS+=($!)
}
json_field() { grep '^{' "$1" | tail -1 | grep -o "\"$2\":[-0-9.e+]*" | head -1 | cut -d: -f2; }

NODE_PORT=$(free_port)
start node "$NODE_BIN" -p "$NODE_PORT" -l 127.0.0.1 -t "$NODE_THREADS" -m 1024 -c 4096
wait_port "$NODE_PORT" node

ROUTER_PORT=$(free_port)
cat >"$WORK/topology.json" <<JSON
{"version": 1, "pools": {"main": {"nodes": ["127.0.0.1:$NODE_PORT"]}},
 "namespaces": {"default": {"pool": "main"}}}
JSON
start router "$ROUTER_BIN" -p "$ROUTER_PORT" -t "$ROUTER_THREADS" --config "$WORK/topology.json"
wait_port "$ROUTER_PORT" router

TW_PORT=$(free_port)
TW_STATS=$(free_port)
cat >"$WORK/nutcracker.yml" <<YML
shoal:
  listen: 127.0.0.1:$TW_PORT
  hash: fnv1a_64
  distribution: ketama
  timeout: 5000
  server_connections: 1
  preconnect: true
  auto_eject_hosts: false
  servers:
   - 127.0.0.1:$NODE_PORT:1
YML
start twemproxy "$NUTCRACKER_BIN" -c "$WORK/nutcracker.yml" -s "$TW_STATS"
wait_port "$TW_PORT" twemproxy

declare -A PORT=([direct]=$NODE_PORT [router]=$ROUTER_PORT [twemproxy]=$TW_PORT)
# the processes serving each path: the node, plus the proxy in front of it
declare -A SERVING=([direct]="${PIDS[0]}" [router]="${PIDS[0]} ${PIDS[1]}"
                    [twemproxy]="${PIDS[0]} ${PIDS[2]}")
cpu_ticks() { # cpu_ticks PID...: user+system clock ticks of those processes, all threads
    local sum=0 p
    for p in "$@"; do
        sum=$(( sum + $(awk '{print $14 + $15}' "/proc/$p/stat") ))
    done
    echo "$sum"
}
HZ=$(getconf CLK_TCK)
bench() { # bench LABEL PORT ARGS...
    local label=$1 port=$2; shift 2
    local cmd=("$BENCH_BIN" --server "127.0.0.1:$port" --threads "$BENCH_THREADS" --conns "$CONNS"
               --ratio "$RATIO" --keys "$KEYS" --value-size "$VALUE_SIZE" --seed 1 "$@")
    COMMANDS+=("$label: ${cmd[*]}")
    timeout -k 5 600 "${cmd[@]}" >"$WORK/$label.out" 2>"$WORK/$label.err" ||
        die "$label failed: $(tail -3 "$WORK/$label.err")"
}
echo "== prefill through the node directly" >&2
bench prefill "$NODE_PORT" --prefill --duration 0 --warmup 0

declare -A OPS P50 P99 MEAN ERRS CPU
measure() { # measure TARGET LABEL KEY ARGS...: one measured run, its figures kept under KEY
    local t=$1 label=$2 key=$3; shift 3
    local before after out="$WORK/$label.out"
    before=$(cpu_ticks ${SERVING[$t]})
    bench "$label" "${PORT[$t]}" "$@" --warmup 0 --json
    after=$(cpu_ticks ${SERVING[$t]})
    ERRS[$key]=$(( ${ERRS[$key]:-0} + $(json_field "$out" errors) ))
    OPS[$key]="${OPS[$key]:-} $(json_field "$out" ops_per_sec)"
    P50[$key]="${P50[$key]:-} $(json_field "$out" p50_us)"
    P99[$key]="${P99[$key]:-} $(json_field "$out" p99_us)"
    MEAN[$key]="${MEAN[$key]:-} $(json_field "$out" mean_us)"
    CPU[$key]="${CPU[$key]:-} $(awk -v t=$((after - before)) -v hz="$HZ" -v n="$(json_field "$out" ops)" \
        'BEGIN{print (n > 0) ? 1e6 * t / hz / n : 0}')"
    printf '   %-9s %-12s: %10.0f ops/s  p50 %7.1f us  p99 %8.1f us\n' "$t" "$label" \
        "$(json_field "$out" ops_per_sec)" "$(json_field "$out" p50_us)" "$(json_field "$out" p99_us)" >&2
}
for d in $DEPTHS; do
    for r in $(seq "$ROUNDS"); do
        for t in direct router twemproxy; do
            if [ "$WARMUP" != 0 ]; then
                bench "$t-warm-d$d-r$r" "${PORT[$t]}" --pipeline "$d" --duration "$WARMUP" --warmup 0
            fi
            measure "$t" "$t-d$d-r$r" "$t.$d" --pipeline "$d" --duration "$DURATION"
        done
    done
done
median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END{print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
if [ -n "$RATE_PCTS" ] && [ -n "${OPS[direct.1]:-}" ]; then
    DIRECT_D1=$(echo "${OPS[direct.1]}" | median)
    for pct in $RATE_PCTS; do
        rate=$(awk -v o="$DIRECT_D1" -v p="$pct" 'BEGIN{printf "%d", o * p / 100}')
        echo "== open loop: $CONNS connections at depth 1 offered $rate requests/s ($pct% of direct)" >&2
        for r in $(seq "$ROUNDS"); do
            for t in direct router twemproxy; do
                measure "$t" "$t-rate$pct-r$r" "$t.rate$pct" --pipeline 1 --duration "$DURATION" \
                    --rate "$rate"
            done
        done
    done
elif [ -n "$RATE_PCTS" ]; then
    echo "== open-loop phase skipped: it offers a share of the depth-1 throughput, and DEPTHS has no 1" >&2
fi
if [ "$LAT_CONNS" != 0 ]; then
    echo "== light load: $LAT_CONNS connections at depth 1" >&2
    for r in $(seq "$ROUNDS"); do
        for t in direct router twemproxy; do
            measure "$t" "$t-lat-r$r" "$t.lat" --pipeline 1 --duration "$DURATION" \
                --conns "$LAT_CONNS" --threads $(( LAT_CONNS < BENCH_THREADS ? LAT_CONNS : BENCH_THREADS ))
        done
    done
fi

echo
printf '%-11s %-10s %10s %13s %10s %12s %10s %10s %11s %10s %7s\n' load target "ops/s" \
    "vs direct" "p50 us" "added p50" "p99 us" "mean us" "added mean" "CPU us/op" errors
rows=""
for d in $DEPTHS; do rows="$rows $d"; done
[ -n "${OPS[direct.rate${RATE_PCTS%% *}]:-}" ] && for pct in $RATE_PCTS; do rows="$rows rate$pct"; done
[ "$LAT_CONNS" != 0 ] && rows="$rows lat"
for d in $rows; do
    dops=$(echo "${OPS[direct.$d]}" | median)
    dp50=$(echo "${P50[direct.$d]}" | median)
    dmean=$(echo "${MEAN[direct.$d]}" | median)
    case "$d" in
    lat) load="c$LAT_CONNS,d1" ;;
    rate*) load="c$CONNS,d1@${d#rate}%" ;;
    *) load="c$CONNS,d$d" ;;
    esac
    for t in direct router twemproxy; do
        ops=$(echo "${OPS[$t.$d]}" | median)
        p50=$(echo "${P50[$t.$d]}" | median)
        mean=$(echo "${MEAN[$t.$d]}" | median)
        printf '%-11s %-10s %10.0f %12.1f%% %10.1f %9.1f us %10.1f %10.1f %8.1f us %10.2f %7s\n' \
            "$load" "$t" "$ops" "$(awk -v a="$ops" -v b="$dops" 'BEGIN{print 100*a/b}')" "$p50" \
            "$(awk -v a="$p50" -v b="$dp50" 'BEGIN{print a-b}')" "$(echo "${P99[$t.$d]}" | median)" \
            "$mean" "$(awk -v a="$mean" -v b="$dmean" 'BEGIN{print a-b}')" \
            "$(echo "${CPU[$t.$d]}" | median)" "${ERRS[$t.$d]}"
    done
done
for d in $DEPTHS; do
    echo "router/direct ops/s per round at c$CONNS,d$d: $(paste -d' ' <(echo "${OPS[direct.$d]}" | tr ' ' '\n' | grep -v '^$') \
        <(echo "${OPS[router.$d]}" | tr ' ' '\n' | grep -v '^$') | awk '{printf "%.2f ", $2 / $1}')"
done
echo
echo "load cN,dD: N connections with D requests in flight each; @P%: open loop offered P% of the"
echo "direct path's cN,d1 ops/s, latency from when each request was due. CPU us/op: user+system time of the"
echo "node and of the proxy in front of it, per operation served (medians over rounds)."
echo "medians over $ROUNDS alternated rounds of ${DURATION}s; machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
echo "commands:"
printf '  %s\n' "${COMMANDS[@]}" | grep -v -- '-warm-\|-r[2-9]:' | sed 's/-r1:/:/'

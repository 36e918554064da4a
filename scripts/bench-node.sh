#!/usr/bin/env bash
# bench-node.sh — compare shoal-node with Debian's memcached under identical shoal-bench load.
#
# Both servers run side by side on free 127.0.0.1 ports with the same memory and thread flags
# (an idle server costs nothing). After a prefill of each, for every pipeline depth the script
# alternates them for ROUNDS rounds: a short unmeasured warmup run and a measured run each,
# sampling the server's CPU time (utime + stime from /proc/<pid>/stat) around the measured run.
# Alternating spreads the machine's drift over both servers alike. Prints each round's
# throughput, p50, p99 and p99.9 as it goes; then per depth the throughput of both (sums over
# the rounds), their ratio and its range over rounds, server CPU seconds per million operations
# and that ratio; then per depth the median over rounds of each server's p50, p99 and p99.9
# with the min..max over rounds and the ratio of the medians; then the exact commands used.
# Every step is bounded by `timeout`; servers are stopped on any exit.
#
# What the latencies are: shoal-bench is a closed loop. Each connection has --pipeline requests
# in flight and sends the next only when a reply comes, so a latency is the time from a
# request's send() to the read() that brought its reply, as the client thread saw it: server
# time plus both kernels' loopback work plus any time the client thread itself waited for a
# CPU before reading. A stall does not pile requests up behind it (coordinated omission): the
# client stops sending while it waits, so a stall of S ms shows as about one late reply per
# connection, not as S ms worth of late requests. Percentiles therefore describe service time
# under a fixed concurrency, not what an open-loop arrival stream would see (shoal-bench --rate
# measures that). The histogram buckets are at most 0.78% wide (see src/bench/hist.h).
#
# Settings come from flags or, for unattended use, from the environment (flags win):
#   --depths "1 16"     DEPTHS          pipeline depths to run
#   --duration S        DURATION        measured seconds per run (default 5)
#   --rounds N          ROUNDS          alternated runs per server and depth (default 5)
#   --warmup S          WARMUP          unmeasured seconds before each run (default 1; 0: none)
#   --conns N           CONNS           client connections (default 50)
#   --bench-threads N   BENCH_THREADS   client threads (default 2)
#   --ratio S:G         RATIO           set:get ratio (default 1:9)
#   --keys N            KEYS            key space, prefilled (default 100000)
#   --value-size N      VALUE_SIZE      bytes per value (default 100)
#   --dist D            DIST            uniform or zipf (default uniform)
#   --server-threads N  SERVER_THREADS  -t for both servers (default 2)
#   --memory MB         SERVER_MEM      -m for both servers (default 1024)
#   --shoal-bin PATH    SHOAL_NODE_BIN  default build/bin/shoal-node
#   --memcached-bin P   MEMCACHED_BIN   default /usr/bin/memcached
#   --bench-bin PATH    BENCH_BIN       default build/bin/shoal-bench
#   --bench-cpus LIST   BENCH_CPUS      run shoal-bench under `taskset -c LIST` (default: unpinned)
#   --server-cpus LIST  SERVER_CPUS     run both servers under `taskset -c LIST` (default: unpinned)
#   --keep-logs         KEEP_LOGS=1     keep server and bench output (path is printed)
# SHOAL_NODE_BIN=/usr/bin/memcached runs memcached in both roles, to check the script itself.
set -euo pipefail
cd "$(dirname "$0")/.."

DEPTHS=${DEPTHS:-"1 16"}
DURATION=${DURATION:-5}
ROUNDS=${ROUNDS:-5}
WARMUP=${WARMUP:-1}
CONNS=${CONNS:-50}
BENCH_THREADS=${BENCH_THREADS:-2}
RATIO=${RATIO:-1:9}
KEYS=${KEYS:-100000}
VALUE_SIZE=${VALUE_SIZE:-100}
DIST=${DIST:-uniform}
SERVER_THREADS=${SERVER_THREADS:-2}
SERVER_MEM=${SERVER_MEM:-1024}
SHOAL_NODE_BIN=${SHOAL_NODE_BIN:-build/bin/shoal-node}
MEMCACHED_BIN=${MEMCACHED_BIN:-/usr/bin/memcached}
BENCH_BIN=${BENCH_BIN:-build/bin/shoal-bench}
BENCH_CPUS=${BENCH_CPUS:-}
SERVER_CPUS=${SERVER_CPUS:-}
KEEP_LOGS=${KEEP_LOGS:-0}

die() { echo "bench-node.sh: $*" >&2; exit 1; }

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

need_arg() { [ $# -ge 2 ] || die "option $1 needs a value (see --help)"; }
while [ $# -gt 0 ]; do
    case "$1" in
    --depths) need_arg "$@"; DEPTHS=$2; shift 2 ;;
    --duration) need_arg "$@"; DURATION=$2; shift 2 ;;
    --rounds) need_arg "$@"; ROUNDS=$2; shift 2 ;;
    --warmup) need_arg "$@"; WARMUP=$2; shift 2 ;;
    --conns) need_arg "$@"; CONNS=$2; shift 2 ;;
    --bench-threads) need_arg "$@"; BENCH_THREADS=$2; shift 2 ;;
    --ratio) need_arg "$@"; RATIO=$2; shift 2 ;;
    --keys) need_arg "$@"; KEYS=$2; shift 2 ;;
    --value-size) need_arg "$@"; VALUE_SIZE=$2; shift 2 ;;
    --dist) need_arg "$@"; DIST=$2; shift 2 ;;
    --server-threads) need_arg "$@"; SERVER_THREADS=$2; shift 2 ;;
    --memory) need_arg "$@"; SERVER_MEM=$2; shift 2 ;;
    --shoal-bin) need_arg "$@"; SHOAL_NODE_BIN=$2; shift 2 ;;
    --memcached-bin) need_arg "$@"; MEMCACHED_BIN=$2; shift 2 ;;
    --bench-bin) need_arg "$@"; BENCH_BIN=$2; shift 2 ;;
    --bench-cpus) need_arg "$@"; BENCH_CPUS=$2; shift 2 ;;
    --server-cpus) need_arg "$@"; SERVER_CPUS=$2; shift 2 ;;
    --keep-logs) KEEP_LOGS=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
    esac
done

is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }
is_secs() { [[ $1 =~ ^[0-9]+([.][0-9]+)?$ ]]; }
for d in $DEPTHS; do
    if ! is_uint "$d" || [ "$d" -lt 1 ]; then die "--depths: '$d' is not a depth >= 1"; fi
done
[ -n "${DEPTHS// /}" ] || die "--depths is empty; e.g. --depths \"1 16\""
if ! is_secs "$DURATION" || [ "$(awk -v d="$DURATION" 'BEGIN{print (d > 0)}')" != 1 ]; then
    die "--duration: '$DURATION' must be seconds > 0"
fi
is_secs "$WARMUP" || die "--warmup: '$WARMUP' must be seconds >= 0"
for v in CONNS BENCH_THREADS KEYS VALUE_SIZE SERVER_THREADS SERVER_MEM; do
    is_uint "${!v}" || die "$v: '${!v}' is not a whole number"
done

[ -x "$BENCH_BIN" ] || die "$BENCH_BIN not found or not executable: build it with 'make $BENCH_BIN' (or set BENCH_BIN)"
[ -x "$SHOAL_NODE_BIN" ] || die "$SHOAL_NODE_BIN does not exist yet: build it with 'make build/bin/shoal-node', or point SHOAL_NODE_BIN (--shoal-bin) at another memcached-compatible server, e.g. SHOAL_NODE_BIN=/usr/bin/memcached to check this script"
[ -x "$MEMCACHED_BIN" ] || die "$MEMCACHED_BIN not found: install Debian's memcached (apt-get install memcached) or set MEMCACHED_BIN"

CLK_TCK=$(getconf CLK_TCK)
WORK=$(mktemp -d /tmp/bench-node.XXXXXX)
SERVER_PID=""
CHILD_PID=""
COMMANDS=()

ALL_PIDS=()
stop_all() {
    for SERVER_PID in "${ALL_PIDS[@]}"; do stop_server; done
    ALL_PIDS=()
}
cleanup() {
    if [ -n "$CHILD_PID" ]; then
        kill -TERM "$CHILD_PID" 2>/dev/null || true # timeout passes it on to shoal-bench
        wait "$CHILD_PID" 2>/dev/null || true
    fi
    stop_server
    stop_all
    if [ "$KEEP_LOGS" = 1 ]; then echo "logs kept in $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
SERVER_EXTRA_FLAGS=(-c 4096)
# shellcheck source=lib/servers.sh
. scripts/lib/servers.sh
trap 'exit 130' INT TERM


# utime + stime of the whole process (all threads), in clock ticks.
cpu_ticks() {
    local stat rest
    stat=$(cat "/proc/$1/stat") || die "server pid $1 vanished"
    rest=${stat##*) } # the command name may contain spaces; fields resume after the last ')'
    # shellcheck disable=SC2086
    set -- $rest
    echo $((${12} + ${13}))
}


bench_common() {
    echo --server "127.0.0.1:$PORT" --threads "$BENCH_THREADS" --conns "$CONNS" --ratio "$RATIO" \
        --keys "$KEYS" --value-size "$VALUE_SIZE" --dist "$DIST" --seed 1
}

# run_bench LABEL TIMEOUT ARGS...: run shoal-bench, output in $WORK/LABEL.out, die on failure.
run_bench() {
    local label=$1 limit=$2
    shift 2
    local cmd=("$BENCH_BIN" "$@")
    [ -z "$BENCH_CPUS" ] || cmd=(taskset -c "$BENCH_CPUS" "${cmd[@]}")
    COMMANDS+=("$label: ${cmd[*]}")
    # In the background so that `wait` returns at once on INT/TERM and the trap can clean up.
    timeout -k 5 "$limit" "${cmd[@]}" >"$WORK/$label.out" 2>"$WORK/$label.err" &
    CHILD_PID=$!
    if ! wait "$CHILD_PID"; then
        CHILD_PID=""
        cat "$WORK/$label.out" "$WORK/$label.err" >&2
        die "$label failed (exit status above); command: ${cmd[*]}"
    fi
    CHILD_PID=""
}


# prepare NAME BIN: start the server and prefill it; remembers its pid and port.
declare -A SPID SPORT
prepare() {
    local name=$1 bin=$2
    start_server "$name" "$bin"
    COMMANDS+=("$name server: ${SERVER_CMD[*]}")
    ALL_PIDS+=("$SERVER_PID")
    if [ -n "$SERVER_CPUS" ]; then
        taskset -a -c -p "$SERVER_CPUS" "$SERVER_PID" >/dev/null || die "taskset -c $SERVER_CPUS failed"
        COMMANDS+=("$name server pinned: taskset -a -c -p $SERVER_CPUS <pid>")
    fi
    SPID[$name]=$SERVER_PID
    SPORT[$name]=$PORT
    echo "== $name: $bin on 127.0.0.1:$PORT (pid $SERVER_PID)" >&2
    # shellcheck disable=SC2046
    run_bench "$name-prefill" 600 $(bench_common) --prefill --duration 0 --warmup 0
    grep prefill: "$WORK/$name-prefill.err" | tail -1 | sed 's/^.*\r//; s/^/   /' >&2
}

# run_round NAME DEPTH ROUND: one warmup + one measured run; adds to the totals.
run_round() {
    local name=$1 depth=$2 round=$3 before after
    PORT=${SPORT[$name]}
    if [ "$(awk -v w="$WARMUP" 'BEGIN{print (w > 0)}')" = 1 ]; then
        # shellcheck disable=SC2046
        run_bench "$name-warmup-d$depth-r$round" "$(awk -v w="$WARMUP" 'BEGIN{print int(w) + 60}')" \
            $(bench_common) --pipeline "$depth" --duration "$WARMUP" --warmup 0
    fi
    before=$(cpu_ticks "${SPID[$name]}")
    # shellcheck disable=SC2046
    run_bench "$name-d$depth-r$round" "$(awk -v d="$DURATION" 'BEGIN{print int(d) + 60}')" \
        $(bench_common) --pipeline "$depth" --duration "$DURATION" --warmup 0 --json
    after=$(cpu_ticks "${SPID[$name]}")
    local out="$WORK/$name-d$depth-r$round.out" ops secs
    ops=$(json_field "$out" ops)
    secs=$(json_field "$out" duration_s)
    OPS[$name.$depth]=$(( ${OPS[$name.$depth]:-0} + ops ))
    SECS[$name.$depth]=$(awk -v a="${SECS[$name.$depth]:-0}" -v b="$secs" 'BEGIN{print a + b}')
    TICKS[$name.$depth]=$(( ${TICKS[$name.$depth]:-0} + after - before ))
    ERRS[$name.$depth]=$(( ${ERRS[$name.$depth]:-0} + $(json_field "$out" errors) ))
    local q
    for q in p50 p99 p999; do LAT[$name.$depth.$q]="${LAT[$name.$depth.$q]:-} $(json_field "$out" ${q}_us)"; done
    ROUND_OPS[$name.$depth.$round]=$(json_field "$out" ops_per_sec)
    printf '   %-9s depth %-3s round %s: %10.0f ops/s  p50 %8.1f  p99 %8.1f  p99.9 %8.1f us  server cpu %s ticks\n' \
        "$name" "$depth" "$round" "${ROUND_OPS[$name.$depth.$round]}" "$(json_field "$out" p50_us)" \
        "$(json_field "$out" p99_us)" "$(json_field "$out" p999_us)" $((after - before)) >&2
}

declare -A OPS SECS TICKS ERRS LAT ROUND_OPS
MC_VERSION=$("$MEMCACHED_BIN" -V 2>/dev/null | head -1 || true)
prepare shoal "$SHOAL_NODE_BIN"
prepare memcached "$MEMCACHED_BIN"
for depth in $DEPTHS; do
    for round in $(seq "$ROUNDS"); do
        # alternate which server goes first, so neither always follows the other's load
        if [ $((round % 2)) = 1 ]; then order="shoal memcached"; else order="memcached shoal"; fi
        for name in $order; do run_round "$name" "$depth" "$round"; done
    done
done
stop_all

median() { tr ' ' '\n' | grep -v '^$' | sort -g | awk '{a[NR]=$1} END{print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
spread() { tr ' ' '\n' | grep -v '^$' | sort -g | awk 'NR==1{lo=$1} {hi=$1} END{printf "%.0f..%.0f", lo, hi}'; }
# cpu-s per million ops; "-" when there were no ops.
per_mop() { awk -v c="$1" -v n="$2" 'BEGIN{ if (n > 0) printf "%.3f", c / (n / 1e6); else print "-" }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN{ if (b > 0 && a != "-" && b != "-") printf "%.2f", a / b; else print "-" }'; }

echo
echo "shoal-node ($SHOAL_NODE_BIN) vs ${MC_VERSION:-memcached} ($MEMCACHED_BIN)"
echo "servers: -t $SERVER_THREADS -m $SERVER_MEM, side by side on 127.0.0.1, measured alternately;" \
    "load: $CONNS conns, $BENCH_THREADS bench threads, set:get $RATIO, $KEYS keys ($DIST, prefilled)," \
    "$VALUE_SIZE B values, $ROUNDS rounds of ${DURATION} s per server and depth after ${WARMUP} s warmup" \
    "${BENCH_CPUS:+; bench on CPUs $BENCH_CPUS}${SERVER_CPUS:+; servers on CPUs $SERVER_CPUS}"
echo "ops/s = all measured ops / all measured seconds; cpu/Mop = server CPU seconds per million ops;"
echo "round ratios = min..max of the per-round throughput ratio"
echo
printf '%-6s %12s %12s %7s %12s %13s %12s %7s %8s\n' depth "shoal ops/s" "mc ops/s" ratio \
    "round ratios" "shoal cpu/Mop" "mc cpu/Mop" ratio errors
for depth in $DEPTHS; do
    s_ops=$(awk -v o="${OPS[shoal.$depth]}" -v t="${SECS[shoal.$depth]}" 'BEGIN{printf "%.0f", o / t}')
    m_ops=$(awk -v o="${OPS[memcached.$depth]}" -v t="${SECS[memcached.$depth]}" 'BEGIN{printf "%.0f", o / t}')
    s_cpu=$(awk -v t="${TICKS[shoal.$depth]}" -v hz="$CLK_TCK" 'BEGIN{print t / hz}')
    m_cpu=$(awk -v t="${TICKS[memcached.$depth]}" -v hz="$CLK_TCK" 'BEGIN{print t / hz}')
    s_mop=$(per_mop "$s_cpu" "${OPS[shoal.$depth]}")
    m_mop=$(per_mop "$m_cpu" "${OPS[memcached.$depth]}")
    rr=""
    for round in $(seq "$ROUNDS"); do
        rr="$rr $(ratio "${ROUND_OPS[shoal.$depth.$round]}" "${ROUND_OPS[memcached.$depth.$round]}")"
    done
    rmin=$(echo "$rr" | tr ' ' '\n' | grep -v '^$' | sort -n | head -1)
    rmax=$(echo "$rr" | tr ' ' '\n' | grep -v '^$' | sort -n | tail -1)
    printf '%-6s %12s %12s %7s %12s %13s %12s %7s %8s\n' "$depth" "$s_ops" "$m_ops" \
        "$(ratio "$s_ops" "$m_ops")" "$rmin..$rmax" "$s_mop" "$m_mop" "$(ratio "$s_mop" "$m_mop")" \
        "${ERRS[shoal.$depth]}/${ERRS[memcached.$depth]}"
done
echo "(throughput ratio = shoal/memcached, higher is better; cpu ratio = shoal/memcached, lower is better;"
echo " errors = shoal/memcached)"
echo
echo "latency in us: median over the $ROUNDS rounds of each round's percentile, [min..max over rounds];"
echo "ratio = shoal median / memcached median (lower is better for shoal)"
printf '%-6s %-6s %10s %15s %10s %15s %6s\n' depth pctl "shoal" "(rounds)" "mc" "(rounds)" ratio
for depth in $DEPTHS; do
    for q in p50 p99 p999; do
        s_med=$(echo "${LAT[shoal.$depth.$q]}" | median)
        m_med=$(echo "${LAT[memcached.$depth.$q]}" | median)
        printf '%-6s %-6s %10.1f %15s %10.1f %15s %6s\n' "$depth" "${q/p999/p99.9}" "$s_med" \
            "[$(echo "${LAT[shoal.$depth.$q]}" | spread)]" "$m_med" \
            "[$(echo "${LAT[memcached.$depth.$q]}" | spread)]" "$(ratio "$s_med" "$m_med")"
    done
done
echo
echo "commands:"
for c in "${COMMANDS[@]}"; do echo "  $c"; done

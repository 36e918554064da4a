#!/usr/bin/env bash
# bench-hitratio.sh — compare the miss ratio applications see from shoal-node and memcached.
#
# Both servers get the same -m and -t and are started fresh, one at a time, on a free
# 127.0.0.1 port for every (workload, server) pair. shoal-bench replays the same cache-aside
# sequence against each (get; on a miss, set the key with its own value size), the same seed
# and count of gets, with one client thread so the order of requests is the same too:
#   zipf   zipf(THETA) gets over KEYS keys, values VALUE_SIZE bytes (log-uniform per key)
#   scan   the same, and after every SCAN_EVERY key gets a one-pass scan of SCAN_LENGTH keys
#          of a cold range of SCAN_KEYS keys nothing else reads (the next scan goes on where
#          the last stopped), so scans are SCAN_LENGTH / (SCAN_EVERY + SCAN_LENGTH) of gets
# WARMUP_GETS gets fill the cache first and are not counted. Prints, per workload, the miss
# ratio of the key (non-scan) gets on both servers and (mc - shoal) / mc (positive: shoal
# misses less), the miss ratio of all gets, each server's `stats` evictions and curr_items at
# the end, the mean value size, and the exact commands. Every step is bounded by `timeout`;
# servers are stopped on any exit.
#
# Settings come from flags or, for unattended use, from the environment (flags win):
#   --workloads "zipf scan"  WORKLOADS      which workloads to run
#   --gets N            GETS            measured gets per run (default 2000000)
#   --warmup-gets N     WARMUP_GETS     unmeasured gets before them (default 1500000)
#   --keys N            KEYS            key space (default 1000000)
#   --value-size R      VALUE_SIZE      MIN-MAX or N bytes (default 100-2048)
#   --theta F           THETA           zipf skew (default 0.99)
#   --scan-every N      SCAN_EVERY      key gets between scans (default 100000)
#   --scan-length N     SCAN_LENGTH     gets per scan (default 35000, ~26% of gets)
#   --scan-keys N       SCAN_KEYS       cold range the scans walk (default: KEYS)
#   --conns N           CONNS           client connections, one client thread (default 4)
#   --pipeline N        PIPELINE        requests in flight per connection (default 1: a
#                                       miss's set goes out before that connection's next get)
#   --seed N            SEED            sequence seed (default 1)
#   --memory MB         SERVER_MEM      -m for both servers (default 64)
#   --server-threads N  SERVER_THREADS  -t for both servers (default 2)
#   --run-timeout S     RUN_TIMEOUT     limit per shoal-bench run (default 400)
#   --shoal-bin PATH    SHOAL_NODE_BIN  default build/bin/shoal-node
#   --memcached-bin P   MEMCACHED_BIN   default /usr/bin/memcached
#   --bench-bin PATH    BENCH_BIN       default build/bin/shoal-bench
#   --policies "P ..."  POLICIES        run shoal once per eviction policy of the default
#                                       namespace (lru, lfu, s3fifo; default: the node's own)
#   --ns-quota MB       NS_QUOTA        shoal runs with -m NS_NODE_MEM and the keys in a namespace
#                                       ("key", the bench's key prefix) with a quota of MB;
#                                       memcached runs with -m MB (default: off)
#   --ns-node-memory MB NS_NODE_MEM     -m of the shoal node holding that namespace (default 64)
#   --keep-logs         KEEP_LOGS=1     keep server and bench output (path is printed)
# At the defaults a run takes about 2 minutes (~30k gets/s at pipeline 1 on 2 cores), the
# whole script about 8. 3M gets after 2M warm-up takes about 12 minutes at --pipeline 1, or
# about 5 at --pipeline 4 (a miss's set may then trail up to 3 later gets of its connection).
# SHOAL_NODE_BIN=/usr/bin/memcached runs memcached in both roles, to check the script itself.
set -euo pipefail
cd "$(dirname "$0")/.."

WORKLOADS=${WORKLOADS:-"zipf scan"}
GETS=${GETS:-2000000}
WARMUP_GETS=${WARMUP_GETS:-1500000}
KEYS=${KEYS:-1000000}
VALUE_SIZE=${VALUE_SIZE:-100-2048}
THETA=${THETA:-0.99}
SCAN_EVERY=${SCAN_EVERY:-100000}
SCAN_LENGTH=${SCAN_LENGTH:-35000}
SCAN_KEYS=${SCAN_KEYS:-}
CONNS=${CONNS:-4}
PIPELINE=${PIPELINE:-1}
SEED=${SEED:-1}
SERVER_MEM=${SERVER_MEM:-64}
SERVER_THREADS=${SERVER_THREADS:-2}
RUN_TIMEOUT=${RUN_TIMEOUT:-400}
SHOAL_NODE_BIN=${SHOAL_NODE_BIN:-build/bin/shoal-node}
MEMCACHED_BIN=${MEMCACHED_BIN:-/usr/bin/memcached}
BENCH_BIN=${BENCH_BIN:-build/bin/shoal-bench}
KEEP_LOGS=${KEEP_LOGS:-0}
POLICIES=${POLICIES:-}
NS_QUOTA=${NS_QUOTA:-}
NS_NODE_MEM=${NS_NODE_MEM:-64}

die() { echo "bench-hitratio.sh: $*" >&2; exit 1; }

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

need_arg() { [ $# -ge 2 ] || die "option $1 needs a value (see --help)"; }
while [ $# -gt 0 ]; do
    case "$1" in
    --workloads) need_arg "$@"; WORKLOADS=$2; shift 2 ;;
    --gets) need_arg "$@"; GETS=$2; shift 2 ;;
    --warmup-gets) need_arg "$@"; WARMUP_GETS=$2; shift 2 ;;
    --keys) need_arg "$@"; KEYS=$2; shift 2 ;;
    --value-size) need_arg "$@"; VALUE_SIZE=$2; shift 2 ;;
    --theta) need_arg "$@"; THETA=$2; shift 2 ;;
    --scan-every) need_arg "$@"; SCAN_EVERY=$2; shift 2 ;;
    --scan-length) need_arg "$@"; SCAN_LENGTH=$2; shift 2 ;;
    --scan-keys) need_arg "$@"; SCAN_KEYS=$2; shift 2 ;;
    --conns) need_arg "$@"; CONNS=$2; shift 2 ;;
    --pipeline) need_arg "$@"; PIPELINE=$2; shift 2 ;;
    --seed) need_arg "$@"; SEED=$2; shift 2 ;;
    --memory) need_arg "$@"; SERVER_MEM=$2; shift 2 ;;
    --server-threads) need_arg "$@"; SERVER_THREADS=$2; shift 2 ;;
    --run-timeout) need_arg "$@"; RUN_TIMEOUT=$2; shift 2 ;;
    --shoal-bin) need_arg "$@"; SHOAL_NODE_BIN=$2; shift 2 ;;
    --memcached-bin) need_arg "$@"; MEMCACHED_BIN=$2; shift 2 ;;
    --bench-bin) need_arg "$@"; BENCH_BIN=$2; shift 2 ;;
    --policies) need_arg "$@"; POLICIES=$2; shift 2 ;;
    --ns-quota) need_arg "$@"; NS_QUOTA=$2; shift 2 ;;
    --ns-node-memory) need_arg "$@"; NS_NODE_MEM=$2; shift 2 ;;
    --keep-logs) KEEP_LOGS=1; shift ;;
    -h | --help) usage; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
    esac
done

SCAN_KEYS=${SCAN_KEYS:-$KEYS}
is_uint() { [[ $1 =~ ^[0-9]+$ ]]; }
if [ -n "$NS_QUOTA" ]; then
    for v in NS_QUOTA NS_NODE_MEM; do
        is_uint "${!v}" && [ "${!v}" -ge 1 ] || die "$v: '${!v}' is not a whole number >= 1"
    done
    [ "$NS_NODE_MEM" -ge "$NS_QUOTA" ] || die "--ns-node-memory must be at least --ns-quota"
    SERVER_MEM=$NS_QUOTA # memcached's -m; shoal's node gets NS_NODE_MEM
fi
for v in GETS WARMUP_GETS KEYS SCAN_EVERY SCAN_LENGTH SCAN_KEYS CONNS PIPELINE SEED SERVER_MEM \
    SERVER_THREADS RUN_TIMEOUT; do
    is_uint "${!v}" || die "$v: '${!v}' is not a whole number"
done
for v in GETS KEYS SCAN_EVERY SCAN_LENGTH CONNS PIPELINE SERVER_MEM SERVER_THREADS RUN_TIMEOUT; do
    [ "${!v}" -ge 1 ] || die "$v must be at least 1"
done
[[ $VALUE_SIZE =~ ^[0-9]+(-[0-9]+)?$ ]] || die "--value-size: '$VALUE_SIZE' is not N or MIN-MAX"
[[ $THETA =~ ^0?[.][0-9]+$|^0$ ]] || die "--theta: '$THETA' must be in [0, 1), e.g. 0.99"
for wl in $WORKLOADS; do
    case "$wl" in zipf | scan) ;; *) die "--workloads: unknown workload '$wl' (zipf, scan)" ;; esac
done
[ -n "${WORKLOADS// /}" ] || die "--workloads is empty; e.g. --workloads \"zipf scan\""
for p in $POLICIES; do
    case "$p" in lru | lfu | s3fifo) ;; *) die "--policies: unknown policy '$p' (lru, lfu, s3fifo)" ;; esac
done

[ -x "$BENCH_BIN" ] || die "$BENCH_BIN not found or not executable: build it with 'make $BENCH_BIN' (or set BENCH_BIN)"
[ -x "$SHOAL_NODE_BIN" ] || die "$SHOAL_NODE_BIN not found: build it with 'make build/bin/shoal-node' (or set SHOAL_NODE_BIN)"
[ -x "$MEMCACHED_BIN" ] || die "$MEMCACHED_BIN not found: install Debian's memcached (apt-get install memcached) or set MEMCACHED_BIN"

WORK=$(mktemp -d /tmp/bench-hitratio.XXXXXX)
SERVER_PID=""
CHILD_PID=""
COMMANDS=()

cleanup() {
    if [ -n "$CHILD_PID" ]; then
        kill -TERM "$CHILD_PID" 2>/dev/null || true # timeout passes it on to its command
        wait "$CHILD_PID" 2>/dev/null || true
    fi
    stop_server
    if [ "$KEEP_LOGS" = 1 ]; then echo "logs kept in $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT
# shellcheck source=lib/servers.sh
. scripts/lib/servers.sh
trap 'exit 130' INT TERM



# server_stats FILE: the running server's `stats` reply, one "STAT name value" per line.
server_stats() {
    # shellcheck disable=SC2016
    timeout -k 2 10 bash -c '
        exec 3<>"/dev/tcp/127.0.0.1/$1" || exit 1
        printf "stats\r\n" >&3
        while IFS= read -r line <&3; do
            line=${line%$'"'"'\r'"'"'}
            [ "$line" = END ] && break
            printf "%s\n" "$line"
        done' _ "$PORT" >"$1" || die "could not read stats from the server on 127.0.0.1:$PORT"
}
stat_field() { awk -v n="$2" '$1 == "STAT" && $2 == n { print $3; exit }' "$1"; }


bench_args() { # bench_args WORKLOAD: shoal-bench's workload options, port excluded
    echo --mode cache-aside --threads 1 --conns "$CONNS" --pipeline "$PIPELINE" --keys "$KEYS" \
        --dist zipf --zipf-theta "$THETA" --value-size "$VALUE_SIZE" --seed "$SEED" \
        --requests "$GETS" --warmup-requests "$WARMUP_GETS"
    if [ "$1" = scan ]; then
        echo --scan-every "$SCAN_EVERY" --scan-length "$SCAN_LENGTH" --scan-keys "$SCAN_KEYS"
    fi
}

# measure WORKLOAD NAME BIN [POLICY]: fresh server (shoal with POLICY for its default namespace),
# one replay, its stats; results in the arrays below.
measure() {
    local wl=$1 name=$2 bin=$3 policy=${4:-} label="$1-$2" t0=$SECONDS
    local saved=("${SERVER_EXTRA_FLAGS[@]}") saved_mem=$SERVER_MEM
    if [ -n "$NS_QUOTA" ] && [ "$name" != memcached ]; then
        # the bench's keys are "key:<n>": their namespace is "key"
        printf '{"key": {"memory": %d%s}}\n' $((NS_QUOTA * 1048576)) \
            "${policy:+, \"eviction\": \"$policy\"}" >"$WORK/ns-$label.json"
        SERVER_EXTRA_FLAGS+=(--namespaces "$WORK/ns-$label.json")
        SERVER_MEM=$NS_NODE_MEM
    elif [ -n "$policy" ]; then
        printf '{"default": {"eviction": "%s"}}\n' "$policy" >"$WORK/ns-$policy.json"
        SERVER_EXTRA_FLAGS+=(--namespaces "$WORK/ns-$policy.json")
    fi
    start_server "$name" "$bin"
    SERVER_EXTRA_FLAGS=("${saved[@]}")
    SERVER_MEM=$saved_mem
    COMMANDS+=("$label server: ${SERVER_CMD[*]}")
    local args
    read -r -a args <<<"$(bench_args "$wl" | tr '\n' ' ')"
    local cmd=("$BENCH_BIN" --server "127.0.0.1:$PORT" "${args[@]}" --json)
    COMMANDS+=("$label bench:  ${cmd[*]}")
    echo "== $label: $bin on 127.0.0.1:$PORT (pid $SERVER_PID)" >&2
    # In the background so that `wait` returns at once on INT/TERM and the trap can clean up.
    timeout -k 5 "$RUN_TIMEOUT" "${cmd[@]}" >"$WORK/$label.out" 2>"$WORK/$label.err" &
    CHILD_PID=$!
    if ! wait "$CHILD_PID"; then
        CHILD_PID=""
        cat "$WORK/$label.out" "$WORK/$label.err" >&2
        die "$label: shoal-bench failed or hit --run-timeout $RUN_TIMEOUT s (output above); command: ${cmd[*]}"
    fi
    CHILD_PID=""
    server_stats "$WORK/$label.stats"
    stop_server
    local out="$WORK/$label.out"
    MISS[$label]=$(json_field "$out" miss_ratio)
    MISS_ALL[$label]=$(json_field "$out" miss_ratio_all)
    GETS_DONE[$label]=$(json_field "$out" gets)
    SCAN_GETS[$label]=$(json_field "$out" scan_gets)
    ERRS[$label]=$(json_field "$out" errors)
    OPS_S[$label]=$(json_field "$out" ops_per_sec)
    VALUE_MEAN=$(json_field "$out" value_mean)
    EVICT[$label]=$(stat_field "$WORK/$label.stats" evictions)
    ITEMS[$label]=$(stat_field "$WORK/$label.stats" curr_items)
    BYTES[$label]=$(stat_field "$WORK/$label.stats" bytes)
    SECS[$label]=$((SECONDS - t0))
    printf '   miss ratio %.4f (all gets %.4f)  %s gets  %.0f ops/s  errors %s  evictions %s  curr_items %s  %s s\n' \
        "${MISS[$label]}" "${MISS_ALL[$label]}" "${GETS_DONE[$label]}" "${OPS_S[$label]}" \
        "${ERRS[$label]}" "${EVICT[$label]:-?}" "${ITEMS[$label]:-?}" "${SECS[$label]}" >&2
}

declare -A MISS MISS_ALL GETS_DONE SCAN_GETS ERRS OPS_S EVICT ITEMS BYTES SECS
VALUE_MEAN=""
MC_VERSION=$("$MEMCACHED_BIN" -V 2>/dev/null | head -1 || true)
START=$SECONDS
SHOALS=()
if [ -n "${POLICIES// /}" ]; then
    for p in $POLICIES; do SHOALS+=("shoal-$p"); done
else
    SHOALS=(shoal)
fi
for wl in $WORKLOADS; do
    for s in "${SHOALS[@]}"; do
        p=""; [ "$s" = shoal ] || p=${s#shoal-}
        measure "$wl" "$s" "$SHOAL_NODE_BIN" "$p"
    done
    measure "$wl" memcached "$MEMCACHED_BIN"
done

rel() { awk -v s="$1" -v m="$2" 'BEGIN{ if (m > 0) printf "%+.2f%%", 100 * (m - s) / m; else print "-" }'; }
pct() { awk -v r="$1" 'BEGIN{ printf "%.2f%%", 100 * r }'; }

echo
echo "cache-aside miss ratio: shoal-node ($SHOAL_NODE_BIN) vs ${MC_VERSION:-memcached} ($MEMCACHED_BIN)"
if [ -n "$NS_QUOTA" ]; then
    echo "servers: shoal -m $NS_NODE_MEM with the keys' namespace \"key\" quota'd to $NS_QUOTA MiB;" \
        "memcached -m $NS_QUOTA; -t $SERVER_THREADS, each run on a fresh server on 127.0.0.1"
else
    echo "servers: -m $SERVER_MEM -t $SERVER_THREADS, each run on a fresh server on 127.0.0.1"
fi
echo "load: zipf $THETA over $KEYS keys, values $VALUE_SIZE B (log-uniform per key, mean ${VALUE_MEAN:-?} B," \
    "so the key space holds about $(awk -v k="$KEYS" -v v="${VALUE_MEAN:-0}" 'BEGIN{printf "%.0f", k * v / 1048576}') MB of values);"
echo "      $GETS measured gets after $WARMUP_GETS warm-up gets, 1 client thread, $CONNS conns, pipeline $PIPELINE, seed $SEED"
case " $WORKLOADS " in *" scan "*)
    echo "scan: after every $SCAN_EVERY key gets, a one-pass scan of $SCAN_LENGTH keys of a $SCAN_KEYS-key cold range" ;;
esac
echo
printf '%-8s %-13s %10s %10s %14s %12s %11s %9s\n' workload server miss "all gets" \
    "(mc-x)/mc" evictions items "item MB"
for wl in $WORKLOADS; do
    m="$wl-memcached"
    for name in "${SHOALS[@]}" memcached; do
        x="$wl-$name"
        printf '%-8s %-13s %10s %10s %14s %12s %11s %9s\n' "$wl" "$name" "$(pct "${MISS[$x]}")" \
            "$(pct "${MISS_ALL[$x]}")" "$(rel "${MISS[$x]}" "${MISS[$m]}")" \
            "${EVICT[$x]:-?}" "${ITEMS[$x]:-?}" \
            "$(awk -v b="${BYTES[$x]:-0}" 'BEGIN{printf "%.2f", b / 1048576}')"
    done
done
echo "(miss = misses / gets of the zipf keys, scans excluded; all = over every get, scans included;"
echo " (mc-x)/mc > 0: that server misses less than memcached; evictions/items = the servers' stats"
echo " evictions and curr_items after the run; item MB = their stats bytes: memcached gives every"
echo " size class its first 1 MiB page even past -m, so at a small -m it holds more than -m)"
for wl in $WORKLOADS; do
    for name in "${SHOALS[@]}" memcached; do
        l="$wl-$name"
        if [ "${ERRS[$l]}" != 0 ]; then echo "note: $l had ${ERRS[$l]} request errors (see --keep-logs)"; fi
    done
    if [ "$wl" = scan ]; then # the same sequence for both servers
        echo "scan: scans were $(pct "$(awk -v a="${SCAN_GETS[$wl-memcached]}" -v b="${GETS_DONE[$wl-memcached]}" 'BEGIN{print a / b}')") of measured gets"
    fi
done
echo
echo "commands:"
for c in "${COMMANDS[@]}"; do echo "  $c"; done
echo "total time: $((SECONDS - START)) s"

#!/usr/bin/env bash
# run.sh — the main job: install what is needed, build, and run a whole local cluster in the
# foreground on embedded defaults: three shoal-nodes in pool "main", one in the gutter pool, and
# a shoal-router in front of them on port 11211, the memcached port applications already use.
# Every process has its admin HTTP (/healthz, /metrics) on 127.0.0.1. The topology (pools main
# and gutter; namespaces default and catalog, see docs/router.md) is written to a file the
# router reads, so editing it and sending the router SIGHUP applies a change. Ctrl-C (or SIGTERM) stops everything; if any
# process dies, the others are stopped and the script exits 1. Log lines are prefixed with the
# process's name. Extra arguments go to shoal-router, e.g. scripts/run.sh -t 4.
#
# Settings (environment): SHOAL_PORT (router data port, 11211), SHOAL_ADMIN_PORT (router admin,
# 11411), SHOAL_BASE_PORT (21000: node i listens on BASE+i, the gutter node on BASE+9, their
# admin ports are those plus 100), SHOAL_NODE_ARGS (more flags for every node, e.g. "-m 256"),
# SHOAL_RUN_DIR (where the topology file goes; default a fresh directory under /tmp),
# SHOAL_NO_BUILD=1 (skip deps and make: use the binaries in build/bin as they are).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    echo "shoal-router flags (extra arguments): build/bin/shoal-router --help"
    exit 0
fi

ROUTER_PORT=${SHOAL_PORT:-11211}
ROUTER_ADMIN=${SHOAL_ADMIN_PORT:-11411}
BASE=${SHOAL_BASE_PORT:-21000}
NODE_ARGS=${SHOAL_NODE_ARGS:-}
if [ "${SHOAL_NO_BUILD:-0}" != 1 ]; then
    scripts/deps.sh
    make -j"$(nproc)" >/dev/null
fi
RUN_DIR=${SHOAL_RUN_DIR:-$(mktemp -d /tmp/shoal-run.XXXXXX)}
mkdir -p "$RUN_DIR"

die() { echo "run.sh: $*" >&2; exit 1; }
# bash's /dev/tcp: no interpreter start-up per check
listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }
port_free() { ! listening "$1"; }

NAMES=(node1 node2 node3 gutter)
PORTS=($((BASE + 1)) $((BASE + 2)) $((BASE + 3)) $((BASE + 9)))
for p in "${PORTS[@]}" $((BASE + 101)) $((BASE + 102)) $((BASE + 103)) $((BASE + 109)) \
         "$ROUTER_PORT" "$ROUTER_ADMIN"; do
    port_free "$p" || die "port $p on 127.0.0.1 is in use: stop what holds it, or pick other ports with SHOAL_PORT, SHOAL_ADMIN_PORT or SHOAL_BASE_PORT"
done

cat >"$RUN_DIR/topology.json" <<JSON
{"version": 1,
 "pools": {"main": {"nodes": ["127.0.0.1:${PORTS[0]}", "127.0.0.1:${PORTS[1]}", "127.0.0.1:${PORTS[2]}"]},
           "gutter": {"nodes": ["127.0.0.1:${PORTS[3]}"]}},
 "gutter_pool": "gutter",
 "namespaces": {"default": {"pool": "main"},
                "catalog": {"pool": "main", "default_ttl": 600, "max_ttl": 86400}}}
JSON

PIDS=()
stopping=0
stop_all() {
    stopping=1
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
    for p in "${PIDS[@]}"; do wait "$p" 2>/dev/null || true; done
}
trap stop_all EXIT
trap 'exit 0' INT TERM

start() { # start NAME CMD...: in the background, each log line prefixed with [NAME]
    local name=$1; shift
    "$@" > >(sed -u "s/^/[$name] /") 2>&1 &
    PIDS+=($!)
}
await() { # await PORT NAME: until it accepts connections (10 s at most)
    for _ in $(seq 500); do
        listening "$1" && return 0
        kill -0 "${PIDS[-1]}" 2>/dev/null || die "$2 exited at start (its log is above)"
        sleep 0.02
    done
    die "$2 did not listen on 127.0.0.1:$1 within 10 s"
}

for i in 0 1 2 3; do
    # shellcheck disable=SC2086 # NODE_ARGS is a list of flags
    start "${NAMES[$i]}" build/bin/shoal-node -l 127.0.0.1 -p "${PORTS[$i]}" \
        --admin-port $((PORTS[i] + 100)) $NODE_ARGS
    await "${PORTS[$i]}" "${NAMES[$i]}"
done
start router build/bin/shoal-router -l 127.0.0.1 -p "$ROUTER_PORT" --admin-port "$ROUTER_ADMIN" \
    --config "$RUN_DIR/topology.json" "$@"
await "$ROUTER_PORT" router

{
    echo
    echo "shoal local cluster is up — applications connect to 127.0.0.1:$ROUTER_PORT"
    printf '  %-8s %-16s %-18s %-8s %s\n' process data admin pid role
    for i in 0 1 2 3; do
        role="pool main"; [ "$i" = 3 ] && role="gutter pool"
        printf '  %-8s %-16s %-18s %-8s %s\n' "${NAMES[$i]}" "127.0.0.1:${PORTS[$i]}" \
            "127.0.0.1:$((PORTS[i] + 100))" "${PIDS[$i]}" "$role"
    done
    printf '  %-8s %-16s %-18s %-8s %s\n' router "127.0.0.1:$ROUTER_PORT" "127.0.0.1:$ROUTER_ADMIN" \
        "${PIDS[4]}" "routes by slot; namespaces default, catalog (TTL 600 s default, 1 day max)"
    echo "  topology: $RUN_DIR/topology.json (edit, raise \"version\", then kill -HUP ${PIDS[4]})"
    echo "  try: python3 -c \"from pymemcache.client.base import Client; c = Client(('127.0.0.1', $ROUTER_PORT)); c.set('k', 'hi'); print(c.get('k'))\""
    echo "  Ctrl-C stops the cluster."
    echo
} >&2

# Foreground until a signal, or until one process dies (then the rest are stopped).
set +e
wait -n "${PIDS[@]}"
rc=$?
[ "$stopping" = 1 ] && exit 0
for i in "${!PIDS[@]}"; do
    if ! kill -0 "${PIDS[$i]}" 2>/dev/null; then
        name=router; [ "$i" -lt 4 ] && name=${NAMES[$i]}
        echo "run.sh: $name (pid ${PIDS[$i]}) exited with status $rc; stopping the cluster" >&2
    fi
done
exit 1

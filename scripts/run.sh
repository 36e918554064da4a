#!/usr/bin/env bash
# run.sh — the main job: install what is needed, build, and run a whole local cluster in the
# foreground with `shoal up --foreground`: shoal-control (the control plane, on 11500), three
# shoal-nodes in pool "main", one in the gutter pool, and a shoal-router on port 11211 (the
# memcached port applications already use) that follows the control plane. Every process has its
# admin HTTP (/healthz, /metrics) on 127.0.0.1 and its log under the cluster's directory. The
# pools, and the namespaces default and catalog, live in the control plane: change them with
# `build/bin/shoal ns create|update|delete`, `shoal node add|remove`, and watch with
# `shoal status` and `shoal top`. Ctrl-C (or SIGTERM) stops everything; if any process dies,
# the others are stopped and the script exits 1. Extra arguments go to shoal-router, e.g.
# scripts/run.sh -t 4.
#
# Settings (environment): SHOAL_PORT (router data port, 11211), SHOAL_ADMIN_PORT (router admin,
# 11411), SHOAL_CONTROL_PORT (shoal-control, 11500), SHOAL_BASE_PORT (21000: node i listens on
# BASE+i, the gutter node on BASE+9, their admin ports are those plus 100), SHOAL_NODE_ARGS
# (more flags for every node, e.g. "-m 256"), SHOAL_RUN_DIR (the cluster's directory: control
# state, logs, pids; default the CLI's, ~/.local/state/shoal, so `shoal status` and `shoal down`
# find it), SHOAL_NO_BUILD=1 (skip deps and make: use the binaries in build/bin as they are).
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "-h" ] || [ "${1:-}" = "--help" ]; then
    sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    echo "shoal-router flags (extra arguments): build/bin/shoal-router --help"
    echo "shoal up's own flags: build/bin/shoal up --help"
    exit 0
fi

if [ "${SHOAL_NO_BUILD:-0}" != 1 ]; then
    scripts/deps.sh
    make -j"$(nproc)" >/dev/null
fi
args=(--foreground --port "${SHOAL_PORT:-11211}" --admin-port "${SHOAL_ADMIN_PORT:-11411}"
      --control-port "${SHOAL_CONTROL_PORT:-11500}" --base-port "${SHOAL_BASE_PORT:-21000}")
[ -n "${SHOAL_RUN_DIR:-}" ] && args+=(--dir "$SHOAL_RUN_DIR")
[ -n "${SHOAL_NODE_ARGS:-}" ] && args+=(--node-args "$SHOAL_NODE_ARGS")
exec build/bin/shoal up "${args[@]}" -- "$@"

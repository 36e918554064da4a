#!/usr/bin/env bash
# bench-failover.sh — issue 15's scenario benchmark: a node of a three-node pool is killed
# (SIGKILL) under a steady cache-aside read load; measures time to promotion, client-visible
# errors, database reads over the baseline, the gutter's hit ratio and stale values served.
# Everything runs on loopback, free ports; the work is in scripts/bench-failover.py (its
# docstring says what each figure is). Usage:
#   scripts/bench-failover.sh [--copies 1|2] [--quick] [--json] [--check] [--keep] [...]
#   scripts/bench-failover.sh --help
# Binaries: build/bin/* unless SHOAL_CONTROL_BIN, SHOAL_NODE_BIN, SHOAL_ROUTER_BIN,
# SHOAL_CLI_BIN, SHOAL_BENCH_BIN (or BENCH_BIN) say otherwise. The last line printed is `RESULT {json}`.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 scripts/bench-failover.py "$@"

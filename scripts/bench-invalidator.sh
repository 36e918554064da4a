#!/usr/bin/env bash
# bench-invalidator.sh — issue 14 point 7: shoal-invalidator under 10,000 row updates a second.
#
# A PostgreSQL started like the tests' (tests/integration/pgharness.py), one shoal-node, and
# shoal-invalidator mapping a table of 100,000 rows to keys; Debian's pgbench offers RATE row
# updates a second for DURATION seconds (a custom script, ROWS_PER_COMMIT rows per transaction).
# Prints the rate achieved (pgbench's and the invalidator's count), commit-to-delete p50/p99 (the
# invalidator's /metrics and an independent probe that polls the node for its key), and the
# invalidator's CPU per change. The work is in scripts/bench-invalidator.py (see its --help).
#
#   scripts/bench-invalidator.sh                    # 10,000 rows/s, 60 s, one commit per row
#   scripts/bench-invalidator.sh --quick            # 2,000 rows/s for 10 s: a smoke run
#   scripts/bench-invalidator.sh --rate 5000 --rows-per-commit 10
#
# Needs a build (make -j2) and Debian's postgresql (scripts/deps.sh). Not run in CI: it takes the
# machine for a minute and its figures mean something only on an otherwise idle one.
set -euo pipefail
cd "$(dirname "$0")/.."
exec timeout 900 /usr/bin/python3 scripts/bench-invalidator.py "$@"

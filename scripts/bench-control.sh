#!/bin/sh
# bench-control.sh — shoal-control at scale (issue 13.7): 10,000 namespaces and up to 1,000
# long-polling followers; each change's time until every follower holds it (p50/p99/max), and
# control's CPU and RSS. Builds shoal-control and the load program first.
#
#   scripts/bench-control.sh                       # 10,000 namespaces; 100, 300, 1000 followers
#   scripts/bench-control.sh --etcd                # the same with the state in a 3-member etcd
#   scripts/bench-control.sh --namespaces 2000 --followers 1000 --changes 20
# Options go to scripts/bench-control.py (--help lists them).
set -eu
cd "$(dirname "$0")/.."
make -j2 build/bin/shoal-control >/dev/null
mkdir -p build/bench
cc -O2 -Wall -Wextra -o build/bench/bench-control-load scripts/bench-control-load.c
# 1,000 followers need as many descriptors in control and in the load program
ulimit -n 8192 2>/dev/null || ulimit -n "$(ulimit -H -n)"
exec python3 scripts/bench-control.py --load-bin build/bench/bench-control-load "$@"

#!/usr/bin/env bash
# run.sh — the main job: install what is needed, build, and run a shoal-node in the foreground
# on port 11211 with its embedded defaults (admin HTTP on 127.0.0.1:11311). Extra arguments go
# to shoal-node, e.g. scripts/run.sh -m 1024 -t 2.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
make -j"$(nproc)" >/dev/null
exec build/bin/shoal-node -p 11211 --admin-port 11311 -v "$@"

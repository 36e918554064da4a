#!/usr/bin/env bash
# test.sh — every test: installs what is needed, builds the normal and the ASAN+UBSAN trees,
# runs the C unit tests and the integration suite against both, and a bounded fuzz run of every
# fuzz target. Ends with one line "N passed, N failed". Exit status 0 only if nothing failed.
#
# Time: the two integration suites run at once (each waits on sockets and timers far more than
# it computes), on separate port ranges (tests/integration/ports.py) and temp directories;
# IT_WORKERS=N runs each in N pytest-xdist processes, a test file per process at a time (its
# module fixtures stay shared): measured, two each brought the phase from 1453 s to 1183 s,
# but with both CPUs saturated two load-sensitive tests timed out (a thousand replication
# handshakes, a hundred never-reading clients), so the default is one. INTEGRATION_SERIAL=1
# runs the suites one after the other. Tests bound by wall-clock time run after them, alone
# and in one process.
#
# The sanitized tree skips SAN_SKIP: files whose time goes to other programs (PostgreSQL,
# etcd, Chromium, memcached and the client tools compared against) or to a benchmark, whose
# paths through shoal's code the rest of the sanitized suite, the sanitized unit tests and the
# fuzz targets already take. They run in the normal tree.
#
# Unit test binaries run UNIT_JOBS and fuzz targets FUZZ_JOBS (default: the CPU count) at a
# time. Each phase's wall time is printed before the last line.
set -uo pipefail
cd "$(dirname "$0")/.."
t0=$(date +%s)
scripts/deps.sh || { echo "0 passed, 1 failed"; exit 1; }
log=$(mktemp -d)
passed=0
failed=0
phases=()
phase_start=$(date +%s)
took() { # phase name: record the time since the previous call
  local now; now=$(date +%s)
  phases+=("$1 $((now - phase_start))s"); phase_start=$now
}
took deps

count_cmocka() { # file
  local p f
  p=$(grep -Eo '\[  PASSED  \] [0-9]+' "$1" | awk '{s+=$4} END {print s+0}')
  f=$(grep -Eo '\[  FAILED  \] [0-9]+ test' "$1" | awk '{s+=$4} END {print s+0}')
  passed=$((passed + p)); failed=$((failed + f))
}
count_pytest() { # junit xml
  local t f e s
  if [ ! -s "$1" ]; then echo "integration: FAILED (no junit report $1)"; failed=$((failed + 1)); return; fi
  read -r t f e s < <(/usr/bin/python3 - "$1" <<'PY'
import sys, xml.etree.ElementTree as ET
r = ET.parse(sys.argv[1]).getroot()
suites = [r] if r.tag == "testsuite" else list(r)
t = sum(int(s.get("tests", 0)) for s in suites)
f = sum(int(s.get("failures", 0)) for s in suites)
e = sum(int(s.get("errors", 0)) for s in suites)
k = sum(int(s.get("skipped", 0)) for s in suites)
print(t, f, e, k)
PY
)
  echo "integration: $t tests, $f failures, $e errors, $s skipped"
  passed=$((passed + t - f - e - s)); failed=$((failed + f + e))
}
bindir() { [ "$1" = san ] && echo build-san || echo build; }
SAN_SKIP=(
  test_tool_matrix.py        # every client library and tool against every server: compatibility
  test_parity.py             # shoal and memcached side by side: compatibility
  test_control_dashboard.py  # the dashboard in Chromium
  test_control_etcd.py       # etcd clusters started and stopped; its JSON is fuzzed (control)
  test_invalidator_edge.py   # PostgreSQL's unusual events; pgoutput is fuzzed, test_invalidator stays
  test_bench_failover.py     # the failover benchmark's figures (wall-clock bound)
)
integration() { # variant ports marks tag [workers]: the suite's tests selected by the marker
  # expression against that tree, in `workers` xdist processes (default: one, no xdist), output
  # to $log/it-$tag.txt and $log/it-$tag.xml
  local par=() f
  [ "${5:-1}" -gt 1 ] && par=(-n "$5" --dist loadfile)
  if [ "$1" = san ]; then for f in "${SAN_SKIP[@]}"; do par+=(--ignore="tests/integration/$f"); done; fi
  local b; b="$PWD/$(bindir "$1")/bin"
  # the lossy-link test's 40 s of loss are for confidence in its timing; in the sanitised
  # tree, which looks for memory errors on the same paths, 20 s do
  local loss_s=${SHOAL_PARTITION_LOSS_S:-40}
  [ "$1" = san ] && loss_s=${SHOAL_PARTITION_LOSS_S:-20}
  SHOAL_PARTITION_LOSS_S="$loss_s" SHOAL_TEST_PORTS="$2" SHOAL_NODE_BIN="$b/shoal-node" SHOAL_ROUTER_BIN="$b/shoal-router" \
    SHOAL_BENCH_BIN="$b/shoal-bench" SHOAL_CONTROL_BIN="$b/shoal-control" SHOAL_CLI_BIN="$b/shoal" SHOAL_INVALIDATOR_BIN="$b/shoal-invalidator" \
    ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
    /usr/bin/python3 -m pytest tests/integration -q -p no:cacheprovider --confcutdir=tests \
    -m "$3" "${par[@]}" --basetemp="$log/tmp-$4" --durations=10 --junitxml="$log/it-$4.xml" >"$log/it-$4.txt" 2>&1
}

built=()
for variant in normal san; do
  if [ "$variant" = san ]; then mk=(make SAN=1); else mk=(make); fi
  echo "== build ($variant)"
  if ! "${mk[@]}" -j"$(nproc)" all unit-build >"$log/build-$variant.txt" 2>&1; then
    cat "$log/build-$variant.txt"; echo "build ($variant) FAILED"; failed=$((failed + 1))
    took "build-$variant"; continue
  fi
  took "build-$variant"
  built+=("$variant")
done

# The unit test binaries of both trees, UNIT_JOBS (default: the CPU count) at a time, the
# longest first (most are one thread: one after the other they took three minutes); each
# one's output is printed whole, in order, once all have run.
units=()
for pattern in 'test_seg*' 'test_*'; do
  for variant in "${built[@]}"; do
    for t in "$(bindir "$variant")"/tests/$pattern; do
      [ -x "$t" ] && [[ " ${units[*]} " != *" $t "* ]] && units+=("$t")
    done
  done
done
running=0
for i in "${!units[@]}"; do
  if [ "$running" -ge "${UNIT_JOBS:-$(nproc)}" ]; then wait -n; running=$((running - 1)); fi
  ( "${units[$i]}" >"$log/unit-$i.txt" 2>&1; echo $? >"$log/unit-$i.rc" ) & running=$((running + 1))
done
wait
for i in "${!units[@]}"; do
  echo "== ${units[$i]}"
  cat "$log/unit-$i.txt"; count_cmocka "$log/unit-$i.txt"
  if [ "$(cat "$log/unit-$i.rc")" != 0 ] && ! grep -q 'FAILED' "$log/unit-$i.txt"; then
    echo "unit ${units[$i]}: FAILED (exit status $(cat "$log/unit-$i.rc") with no failed test reported)"
    failed=$((failed + 1))
  fi
done
took unit

pids=()
workers=${IT_WORKERS:-1}
for variant in "${built[@]}"; do
  if [ "$variant" = san ]; then ports=26000-31999; else ports=20000-25999; fi
  if [ "${INTEGRATION_SERIAL:-0}" = 1 ]; then integration "$variant" "$ports" "not wallclock" "$variant" "$workers"
  else integration "$variant" "$ports" "not wallclock" "$variant" "$workers" & pids+=($!); fi
done
[ ${#pids[@]} -gt 0 ] && wait "${pids[@]}"
for variant in "${built[@]}"; do
  echo "== integration tests ($variant)"
  tail -n 40 "$log/it-$variant.txt"
  count_pytest "$log/it-$variant.xml"
done
took integration
# tests that bound wall-clock time (marked wallclock) run alone, one tree after the other, so
# the other suite's load cannot break their bounds
for variant in "${built[@]}"; do
  echo "== integration tests bound by wall-clock time ($variant)"
  integration "$variant" 20000-31999 "wallclock" "wallclock-$variant"
  tail -n 15 "$log/it-wallclock-$variant.txt"
  count_pytest "$log/it-wallclock-$variant.xml"
done
took integration-wallclock

if make -j"$(nproc)" fuzz >"$log/fuzz-build.txt" 2>&1; then
  took fuzz-build
  # one fuzzing budget (FUZZ_TOTAL_SECONDS of CPU, default 240) split over the targets, unless
  # FUZZ_SECONDS fixes each target's share; FUZZ_JOBS targets run at a time
  ntargets=$(ls build/fuzz/fuzz_* 2>/dev/null | wc -l)
  FUZZ_SECONDS=${FUZZ_SECONDS:-$(( ${FUZZ_TOTAL_SECONDS:-240} / (ntargets > 0 ? ntargets : 1) ))}
  jobs=${FUZZ_JOBS:-$(nproc)}
  echo "== fuzz (${FUZZ_SECONDS}s per target, $ntargets targets, $jobs at a time)"
  fuzz_one() { # target: runs it, its status in $log/fuzz-NAME.rc
    local f=$1 name corpus
    name=$(basename "$f" | sed 's/^fuzz_//')
    corpus=$(mktemp -d); cp -r tests/fuzz/corpus/"$name"/. "$corpus"/ 2>/dev/null || true
    # undefined behaviour fails a target too, as in the ASAN+UBSAN build
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 "$f" -max_total_time="$FUZZ_SECONDS" \
      -rss_limit_mb=2048 "$corpus" >"$log/fuzz-$name.txt" 2>&1
    echo $? >"$log/fuzz-$name.rc"
    rm -rf "$corpus"
  }
  running=0
  for f in build/fuzz/fuzz_*; do
    [ -x "$f" ] || continue
    if [ "$running" -ge "$jobs" ]; then wait -n; running=$((running - 1)); fi
    fuzz_one "$f" & running=$((running + 1))
  done
  wait
  for f in build/fuzz/fuzz_*; do
    [ -x "$f" ] || continue
    name=$(basename "$f" | sed 's/^fuzz_//')
    if [ "$(cat "$log/fuzz-$name.rc" 2>/dev/null)" = 0 ]; then
      echo "fuzz $name: ok ($(grep -Eo 'Done [0-9]+ runs in [0-9]+ second' "$log/fuzz-$name.txt" | tail -1))"
      passed=$((passed + 1))
    else
      tail -n 30 "$log/fuzz-$name.txt"; echo "fuzz $name: FAILED"; failed=$((failed + 1))
    fi
  done
  took fuzz
else
  cat "$log/fuzz-build.txt"; echo "fuzz build FAILED"; failed=$((failed + 1))
  took fuzz-build
fi

rm -rf "$log"
echo "phases: ${phases[*]}; total $(( $(date +%s) - t0 ))s"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

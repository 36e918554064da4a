#!/usr/bin/env bash
# test.sh — every test: installs what is needed, builds the normal and the ASAN+UBSAN trees,
# runs the C unit tests and the integration suite against both, and a bounded fuzz run of every
# fuzz target. Ends with one line "N passed, N failed". Exit status 0 only if nothing failed.
set -uo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh || { echo "0 passed, 1 failed"; exit 1; }
log=$(mktemp -d)
passed=0
failed=0

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

for variant in normal san; do
  if [ "$variant" = san ]; then mk=(make SAN=1); bdir=build-san; else mk=(make); bdir=build; fi
  echo "== build ($variant)"
  if ! "${mk[@]}" -j"$(nproc)" all unit-build >"$log/build-$variant.txt" 2>&1; then
    cat "$log/build-$variant.txt"; echo "build ($variant) FAILED"; failed=$((failed + 1)); continue
  fi
  echo "== unit tests ($variant)"
  for t in "$bdir"/tests/test_*; do
    [ -x "$t" ] || continue
    "$t" >"$log/unit.txt" 2>&1; rc=$?
    cat "$log/unit.txt"; count_cmocka "$log/unit.txt"
    if [ $rc -ne 0 ] && ! grep -q 'FAILED' "$log/unit.txt"; then
      echo "unit $t: FAILED (exit status $rc with no failed test reported)"; failed=$((failed + 1))
    fi
  done
  echo "== integration tests ($variant)"
  SHOAL_NODE_BIN="$PWD/$bdir/bin/shoal-node" SHOAL_ROUTER_BIN="$PWD/$bdir/bin/shoal-router" SHOAL_BENCH_BIN="$PWD/$bdir/bin/shoal-bench" SHOAL_CONTROL_BIN="$PWD/$bdir/bin/shoal-control" SHOAL_CLI_BIN="$PWD/$bdir/bin/shoal" SHOAL_INVALIDATOR_BIN="$PWD/$bdir/bin/shoal-invalidator" ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 \
    /usr/bin/python3 -m pytest tests/integration -q -p no:cacheprovider --confcutdir=tests \
    --junitxml="$log/it-$variant.xml" 2>&1 | tail -n 40
  count_pytest "$log/it-$variant.xml"
done

if make fuzz >"$log/fuzz-build.txt" 2>&1; then
  # one fuzzing budget (FUZZ_TOTAL_SECONDS, default 240) split over the targets, unless
  # FUZZ_SECONDS fixes each target's share
  ntargets=$(ls build/fuzz/fuzz_* 2>/dev/null | wc -l)
  FUZZ_SECONDS=${FUZZ_SECONDS:-$(( ${FUZZ_TOTAL_SECONDS:-240} / (ntargets > 0 ? ntargets : 1) ))}
  echo "== fuzz (${FUZZ_SECONDS}s per target, $ntargets targets)"
  for f in build/fuzz/fuzz_*; do
    [ -x "$f" ] || continue
    name=$(basename "$f" | sed 's/^fuzz_//')
    corpus=$(mktemp -d); cp -r tests/fuzz/corpus/"$name"/. "$corpus"/ 2>/dev/null || true
    # undefined behaviour fails a target too, as in the ASAN+UBSAN build
    if UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 "$f" -max_total_time="$FUZZ_SECONDS" -rss_limit_mb=2048 "$corpus" >"$log/fuzz.txt" 2>&1; then
      echo "fuzz $name: ok ($(grep -Eo 'Done [0-9]+ runs in [0-9]+ second' "$log/fuzz.txt" | tail -1))"
      passed=$((passed + 1))
    else
      tail -n 30 "$log/fuzz.txt"; echo "fuzz $name: FAILED"; failed=$((failed + 1))
    fi
    rm -rf "$corpus"
  done
else
  cat "$log/fuzz-build.txt"; echo "fuzz build FAILED"; failed=$((failed + 1))
fi

rm -rf "$log"
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]

#!/usr/bin/env bash
# Runs every fuzz target (or those named) for FUZZ_SECONDS each and prints one summary line per target:
# executions, libFuzzer's final `cov:` and `ft:`, corpus size, and the crash artifact if any. Exit 1 on any crash,
# invariant failure, timeout or out-of-memory (libFuzzer's own exit codes), after running every target.
set -uo pipefail
cd "$(dirname "$0")/.."
BIN=${FUZZ_BIN:-.build-fuzz/debug/fleet-fuzz}
SECONDS_EACH=${FUZZ_SECONDS:-60}
TARGETS=${FUZZ_TARGETS:-"jws base64 receipt event catalogue config ingest"}
OUT=.build-fuzz/out
mkdir -p "$OUT"
export SWIFT_BACKTRACE=${SWIFT_BACKTRACE:-enable=no}
export ASAN_OPTIONS=${ASAN_OPTIONS:-"detect_leaks=0:abort_on_error=1:symbolize=1"}
status=0
printf '%-10s %10s %8s %8s %7s %s\n' target execs cov ft corpus result
for t in $TARGETS; do
  mkdir -p ".build-fuzz/corpus/$t" "$OUT/crashes"
  log="$OUT/$t.log"
  rm -f "$OUT"/crashes/"$t"-*
  FLEET_FUZZ_TARGET=$t "$BIN" ".build-fuzz/corpus/$t" "Fuzz/corpus/$t" \
    -max_total_time="$SECONDS_EACH" -timeout=20 -rss_limit_mb=3072 -print_final_stats=1 \
    -artifact_prefix="$OUT/crashes/$t-" >"$log" 2>&1
  rc=$?
  execs=$(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | tail -1 | awk '{print $2}')
  last=$(grep -E '^#[0-9]+' "$log" | tail -1)
  cov=$(sed -n 's/.* cov: \([0-9]*\).*/\1/p' <<<"$last")
  ft=$(sed -n 's/.* ft: \([0-9]*\).*/\1/p' <<<"$last")
  corp=$(sed -n 's/.* corp: \([0-9]*\/[0-9A-Za-z]*\).*/\1/p' <<<"$last")
  if [ $rc -eq 0 ]; then result=ok; else
    result="FAILED (exit $rc): $(ls -t "$OUT"/crashes/"$t"-* 2>/dev/null | head -1) log $log"; status=1
    grep -m3 -E 'invariant violated|ERROR: (AddressSanitizer|libFuzzer)|Fatal error' "$log" | sed 's/^/    /'
  fi
  printf '%-10s %10s %8s %8s %7s %s\n' "$t" "${execs:-?}" "${cov:-?}" "${ft:-?}" "${corp:-?}" "$result"
done
exit $status

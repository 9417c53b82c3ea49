#!/usr/bin/env bash
# scripts/fuzz.sh [SECONDS]: builds the libFuzzer targets with clang (build/fuzz, the whole project
# instrumented) and runs each for an equal share of SECONDS (default 60 in all) from the seed corpus in
# tests/fuzz/corpus. FUZZ_SEED fixes libFuzzer's seed (scripts/test.sh uses 1, so CI walks the same
# inputs each run; unset or 0: a new seed each run, for exploring). On a crash it prints the
# reproducer's bytes (base64) and exits non-zero, leaving it (crash-*) in build/fuzz/work/TARGET;
# reproduce with build/fuzz/tests/fuzz/fuzz_TARGET FILE. New inputs go to build/fuzz/work, never
# into the repository (add a reproducer to tests/fuzz/corpus/TARGET once it is fixed).
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
if [ ! -f build/fuzz/build.ninja ]; then
  CC=clang meson setup build/fuzz -Dfuzz=enabled -Dtests=disabled -Db_lundef=false >/dev/null
fi
ninja -C build/fuzz >/dev/null
targets=(header plan config view)
per=$(( secs / ${#targets[@]} > 1 ? secs / ${#targets[@]} : 1 ))
for t in "${targets[@]}"; do
  work="build/fuzz/work/$t"
  mkdir -p "$work/corpus"
  rm -f "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-* # an earlier run's: only this run's are shown
  cp -n tests/fuzz/corpus/$t/* "$work/corpus/" 2>/dev/null || true
  if [ "$t" = view ]; then  # the built-in views are the seeds of the view target
    for f in views/*/*.json; do cp -n "$f" "$work/corpus/$(basename "$(dirname "$f")")-$(basename "$f")"; done
  fi
  echo "fuzzing $t for ${per}s (seed ${FUZZ_SEED:-0})" >&2
  rc=0
  (cd "$work" && "$OLDPWD/build/fuzz/tests/fuzz/fuzz_$t" -seed="${FUZZ_SEED:-0}" -max_total_time="$per" \
      -print_final_stats=1 -rss_limit_mb=2048 -max_len=65536 corpus > log 2>&1) || rc=$?
  grep -E "^stat::number_of_executed_units|^stat::peak_rss|Done|ERROR|SUMMARY" "$work/log" >&2 || true
  if [ "$rc" != 0 ]; then
    grep -E -A 30 "ERROR|runtime error" "$work/log" | head -n 60 >&2 || true
    for f in "$work"/crash-* "$work"/leak-* "$work"/timeout-* "$work"/oom-*; do
      [ -f "$f" ] || continue
      echo "reproducer $f ($(stat -c %s "$f") bytes), base64:" >&2
      head -c 4096 "$f" | base64 >&2
    done
    echo "fuzz_$t failed (exit $rc)" >&2
    exit "$rc"
  fi
done

#!/usr/bin/env bash
# scripts/fuzz.sh [SECONDS]: builds the libFuzzer targets with clang (build/fuzz) and runs each for
# a third of SECONDS (default 60 in all) from the seed corpus in tests/fuzz/corpus. Exits non-zero on
# a crash, leaving the reproducer (crash-*) in build/fuzz/work. New inputs go to build/fuzz/work,
# never into the repository.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
if [ ! -f build/fuzz/build.ninja ]; then
  CC=clang meson setup build/fuzz -Dfuzz=enabled -Dtests=disabled -Db_lundef=false >/dev/null
fi
ninja -C build/fuzz >/dev/null
per=$(( secs / 3 > 1 ? secs / 3 : 1 ))
for t in header plan config; do
  work="build/fuzz/work/$t"
  mkdir -p "$work/corpus"
  cp -n tests/fuzz/corpus/$t/* "$work/corpus/" 2>/dev/null || true
  echo "fuzzing $t for ${per}s" >&2
  (cd "$work" && "$OLDPWD/build/fuzz/tests/fuzz/fuzz_$t" -max_total_time="$per" -print_final_stats=1 \
      -rss_limit_mb=2048 -max_len=65536 corpus 2>&1) | grep -E "^stat::number_of_executed_units|^stat::peak_rss|Done|ERROR|SUMMARY" >&2
done

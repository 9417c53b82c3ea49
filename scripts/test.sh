#!/usr/bin/env bash
# scripts/test.sh: installs what is needed, builds, and runs every test.
#
#   1. build/      the normal build (-Wall -Wextra -Werror), all tests: unit (cmocka), mount and
#                  loader tests (FUSE + the safetensors package), CLI tests, and vLLM's sharded_state
#                  loader on the --view vllm files (the second venv, scripts/setup.sh --vllm), and
#                  SGLang's on the --view sglang files (the third, scripts/setup.sh --sglang).
#   2. build/asan  the same tests with AddressSanitizer + UndefinedBehaviorSanitizer, mount tests
#                  included (the daemon runs sanitized).
#   3. smoke runs of the benchmarks (seconds), then fuzzing of the header parser, plan
#      resolution, the rank config rewrite and view files for FUZZ_SECONDS (default 60), with a fixed seed
#      (FUZZ_SEED, default 1) so that every run walks the same inputs.
# Exits non-zero on the first failure. Mount tests skip (exit 77, with the reason) only where
# /dev/fuse is missing. At the end (and on a failure) it prints how long each part and each test took,
# so that growth is seen.
#
#   scripts/test.sh --full   also runs vLLM's tokens for every view family the CPU backend runs, and the
#                            wrong view's (TPFS_VLLM_TOKENS=all; by default a few families: tests/py/test_vllm.py)
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = --full ]; then
  export TPFS_VLLM_TOKENS=all
fi
t_start=$SECONDS t_part=$SECONDS parts=()
part() {  # part NAME: closes the running part under NAME
  parts+=("$(printf '%-34s %5d s' "$1" $((SECONDS - t_part)))")
  t_part=$SECONDS
}
print_times() {
  echo "== times" >&2
  printf '%s\n' "${parts[@]}" >&2
  for b in build build/asan; do
    [ -f "$b/meson-logs/testlog.json" ] || continue
    python3 - "$b" >&2 <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1] + "/meson-logs/testlog.json")]
print("  %s: %s" % (sys.argv[1], ", ".join("%s %.0f s" % (r["name"], r["duration"])
                                          for r in sorted(rows, key=lambda r: -r["duration"]) if r["duration"] >= 5)))
PY
  done
  printf '%-34s %5d s\n' "total" $((SECONDS - t_start)) >&2
}
trap print_times EXIT
# Each tpfs daemon watches its sources with one inotify instance, and tests/py/test_vllm.py holds every view
# family mounted at T=2 and 4 at once (120 daemons with 60 families): above fs.inotify.max_user_instances
# (128 by default, for all of root's processes) a daemon warns that it cannot watch its sources and the test
# fails on that warning. Raised where this user may (root), never lowered.
if [ "$(cat /proc/sys/fs/inotify/max_user_instances 2>/dev/null || echo 1024)" -lt 1024 ] && [ "$(id -u)" = 0 ]; then
  sysctl -qw fs.inotify.max_user_instances=1024 || echo "test.sh: could not raise fs.inotify.max_user_instances" >&2
fi
bash scripts/setup.sh build
part "setup (test venv, packages)"
bash scripts/setup.sh --vllm build   # the second venv, for tests/py/test_vllm.py (cached after the first run)
part "setup (vLLM venv)"
bash scripts/setup.sh --sglang build  # the third venv, layered on the vLLM one, for tests/py/test_sglang.py
part "setup (SGLang venv)"
venv="$PWD/build/venv"

echo "== normal build" >&2
bash scripts/build.sh build -Dvenv="$venv"
meson test -C build --print-errorlogs --num-processes 2
part "normal build + tests"

echo "== benchmark smoke runs (seconds; the real runs are scripts/bench.sh, build/bench/gather_bench)" >&2
build/venv/bin/python bench/bench.py --smoke --tpfs build/src/tpfs > build/bench-smoke.log
tail -n 3 build/bench-smoke.log >&2
# the CUDA module lies next to tpfs, not next to gather_bench (empty: none built)
TPFS_CUDA_MODULE="$([ -f build/src/tpfs-cuda.so ] && echo "$PWD/build/src/tpfs-cuda.so")" \
  build/bench/gather_bench 4 > build/gather-bench-smoke.log
head -n 1 build/gather-bench-smoke.log >&2
part "benchmark smoke runs"

echo "== sanitized build (ASan + UBSan)" >&2
bash scripts/setup.sh --vllm build/asan   # only links the cached venv
bash scripts/setup.sh --sglang build/asan # the same
bash scripts/build.sh build/asan -Dvenv="$venv" -Db_sanitize=address,undefined -Db_lundef=false \
  -Dc_args=-fno-sanitize-recover=all
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  meson test -C build/asan --print-errorlogs --num-processes 2 --timeout-multiplier 3
part "sanitized build + tests"

if [ -x scripts/fuzz.sh ] && [ "${FUZZ_SECONDS:-60}" != 0 ]; then
  echo "== fuzzing" >&2
  FUZZ_SEED=${FUZZ_SEED:-1} bash scripts/fuzz.sh "${FUZZ_SECONDS:-60}"
  part "fuzzing"
fi
echo "all tests passed" >&2

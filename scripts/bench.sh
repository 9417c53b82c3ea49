#!/usr/bin/env bash
# scripts/bench.sh [--reps N] [--smoke] [--out FILE] [--work DIR] [--only storage]
#                  [--storage-rate MBPS] [--storage-iops N]: the read-path benchmark.
# Builds tpfs if needed, generates the workloads (kept in build/bench), measures every contender
# side by side, prints the table and writes docs/PERFORMANCE.md (--smoke: a tiny run, seconds,
# written to build/bench-smoke.md). Needs root or fusermount3, like any mount. The slow-storage
# part (bench/io_bench.py: a loop device read-limited by a cgroup, bytes a node fetches for its
# --ranks) needs root and runs alone with --only storage, replacing its section of the report.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh build
bash scripts/build.sh build
exec build/venv/bin/python bench/bench.py --tpfs build/src/tpfs "$@"

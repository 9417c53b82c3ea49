#!/usr/bin/env bash
# scripts/build.sh [BUILD_DIR] [MESON_OPTIONS...]: configures (once) and builds tpfs.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
shift || true
if [ ! -f "$build/build.ninja" ]; then
  meson setup "$build" "$@" >/dev/null
else
  meson configure "$build" "$@" >/dev/null 2>&1 || true
fi
ninja -C "$build" > "$build/ninja.log" || { cat "$build/ninja.log" >&2; exit 1; } # quiet unless it fails
echo "built $build/src/tpfs" >&2

#!/usr/bin/env bash
# scripts/setup.sh [BUILD_DIR]: installs what tpfs needs to build and test, idempotently.
#
# Debian packages (apt-get, only those missing; `apt-get update` first when any is missing) and,
# in a virtual environment at BUILD_DIR/venv (default build/venv), the Python packages the
# loader-compatibility tests use (safetensors and numpy, from PyPI). Downloads nothing else.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}

pkgs=(gcc clang meson ninja-build pkg-config libfuse3-dev fuse3 libcjson-dev libcmocka-dev
      python3 python3-venv valgrind libclang-rt-14-dev)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  if [ "$(id -u)" != 0 ]; then sudo="sudo"; fi
  echo "setup: installing ${missing[*]}" >&2
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

venv="$build/venv"
if ! "$venv/bin/python" -c "import safetensors, numpy" 2>/dev/null; then
  echo "setup: creating $venv with safetensors and numpy" >&2
  mkdir -p "$build"
  python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "safetensors>=0.4" "numpy>=1.24"
fi

#!/usr/bin/env bash
# scripts/setup.sh [BUILD_DIR]: installs what tpfs needs to build and test, idempotently.
#
# Debian packages (apt-get, only those missing; `apt-get update` first when any is missing) and,
# in a virtual environment, the Python packages the tests use (scripts/requirements-test.txt:
# safetensors, numpy, and torch + transformers for the real-model tests, from PyPI). torch is
# several GB, so the environment lives outside the checkout, in TPFS_TEST_VENV (default
# $XDG_CACHE_HOME/tpfs/venv-<hash of the requirements>, i.e. under ~/.cache), where a second run on
# the same machine, from any clone, reuses it; BUILD_DIR/venv (default build/venv) links to it.
# Downloads nothing else.
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

req=scripts/requirements-test.txt
tag=$(sha256sum "$req" | cut -c1-12)
venv_real=${TPFS_TEST_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/tpfs/venv-$tag}
if ! [ -f "$venv_real/.tpfs-complete" ]; then
  echo "setup: creating $venv_real with $(grep -v '^#' "$req" | tr '\n' ' ')(torch is large: minutes)" >&2
  rm -rf "$venv_real"
  mkdir -p "$(dirname "$venv_real")"
  python3 -m venv "$venv_real"
  "$venv_real/bin/pip" install -q --disable-pip-version-check -r "$req"
  "$venv_real/bin/python" -c "import safetensors, numpy, torch, transformers"
  touch "$venv_real/.tpfs-complete"
fi
mkdir -p "$build"
if [ "$(readlink "$build/venv" 2>/dev/null)" != "$venv_real" ]; then
  rm -rf "$build/venv"
  ln -s "$venv_real" "$build/venv"
fi

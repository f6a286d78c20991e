#!/usr/bin/env bash
# Build .whl/: the wheels that scripts/gpu_check.sh installs on a GPU machine without network access
# (its own Python 3.12 with torch, sentencepiece, sacrebleu, pandas, matplotlib, pyyaml, pytest, but no
# dvc, dvclive, soundfile or espeakng-loader). Run it here, where pip reaches a package registry:
#
#   bash scripts/gpu_wheels.sh            # then carry .whl/ (ignored by git) with the tree
#
# It downloads dvc, dvclive, soundfile and espeakng-loader with their dependencies as CPython 3.12
# manylinux wheels, builds the one dependency published only as source (antlr4-python3-runtime, pure
# Python), and removes the packages the GPU machine already has, which keeps .whl/ near 33 MB (a device
# call carries at most 64 MiB). The versions are requirements.txt's.
set -euo pipefail
cd "$(dirname "$0")/.."
pin() {  # the version requirements.txt pins for package $1
  local v
  v=$(grep -i -E "^$1==" requirements.txt | head -1 | cut -d= -f3)
  [ -n "$v" ] || { echo "error: requirements.txt pins no version of $1" >&2; exit 1; }
  echo "$1==$v"
}
pkgs=""
for name in dvc dvclive soundfile espeakng-loader; do  # one at a time: a failed $(...) inside a longer
  p=$(pin "$name")                                     # word would not stop the script
  pkgs="$pkgs $p"
done
py=${PYTHON:-python3}
rm -rf .whl.tmp && mkdir -p .whl.tmp
"$py" -m pip wheel -q --no-deps antlr4-python3-runtime==4.9.3 -w .whl.tmp
"$py" -m pip download -q --find-links .whl.tmp --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  --platform manylinux_2_27_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux1_x86_64 --platform any \
  -d .whl.tmp $pkgs
# what the GPU machine already has (its torch's dependencies and the packages listed above)
have=" numpy networkx pygments setuptools pyyaml rich tqdm requests certifi idna urllib3 charset_normalizer
  packaging psutil nvidia_ml_py typing_extensions filelock six markdown_it_py mdurl attrs click python_dateutil
  fsspec pyparsing tabulate "
for wheel in .whl.tmp/*.whl; do  # a wheel's name as the registry spells it (PyYAML-…, markdown_it_py-…)
  name=$(basename "$wheel" | cut -d- -f1 | tr 'A-Z.-' 'a-z__')
  case "$(echo $have)" in *" $name "*|"$name "*|*" $name") rm -f "$wheel" ;; esac
done
rm -rf .whl && mv .whl.tmp .whl
echo "$(ls .whl/*.whl | wc -l) wheels, $(du -sh .whl | cut -f1) in .whl/ for: $pkgs"

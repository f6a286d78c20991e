#!/usr/bin/env bash
# The GPU check of docs/gpu.md, in one prepared run on a CUDA machine without network access
# (its own python3 with torch, sentencepiece, sacrebleu, pandas, matplotlib, pyyaml, pytest).
#
#   bash scripts/gpu_check.sh [OUT_DIR]      # OUT_DIR defaults to $OUT, else gpu-check/ in the repository
#
# Environment: GPU_CHECK_SECONDS (560) bounds the whole script; GPU_CHECK_PARTS (all: "tests bench loop
# paper_profile") runs only the parts named, e.g. a quick rerun of one that failed; GPU_CHECK_CPU=1 goes
# on when torch sees no CUDA device (a check of the script on a CPU), where it otherwise stops at once.
#
# 1. installs the wheels of .whl/ (dvc, dvclive, soundfile, espeakng-loader and what they need that
#    the machine lacks; built beforehand by scripts/gpu_wheels.sh where pip reaches a registry)
#    into a temporary folder, and puts `python` and `dvc` on PATH;
# 2. the tests that need CUDA, plus every test of the files for the CUDA paths
#    (tests/model/test_attention_paths.py, tests/train/test_fold_update.py)      -> tests.log
# 3. python benchmarks/gpu.py (at most ~2.5 min)                                    -> bench.jsonl, bench.err
# 4. python benchmarks/gpu_loop.py --sync-check --oom-check: the real training loop, data loading
#    included, on a synthetic corpus with MuST-C-like lengths; the syncs per update, a folded update run
#    out of memory under a capped memory fraction and the run going on, ms per update per mode -> loop.jsonl
# 5. tests/test_paper_profile.py: the paper profile through real `dvc repro` on CUDA -> paper.log
#    (the tests copy the project with `git ls-files`: a tree that arrives without .git is made a
#    git repository of one commit first)
# Each part runs under its own `timeout`, so a hang costs that part only; the limits add up to 540 s,
# 580 s with each part's 10 s --kill-after, and the whole script keeps to GPU_CHECK_SECONDS (560 s;
# one device call may take 600): a part gets what is left when that is less, or is skipped.
# summary.txt gets one line per part with its exit status and seconds, after a first line when torch
# sees no CUDA device (the script then stops, exit status 2) or dvc, dvclive or soundfile cannot be
# imported, and a last line with the script's seconds.
set -uo pipefail
out="${1:-${OUT:-}}"
if [ -n "$out" ]; then  # relative to where the script was started
  mkdir -p "$out" && out=$(cd "$out" && pwd) || { echo "gpu_check.sh: cannot write to $out" >&2; exit 1; }
fi
cd "$(dirname "$0")/.." || exit 1
out="${out:-$PWD/gpu-check}"
mkdir -p "$out"
all_parts="tests bench loop paper_profile"
parts="${GPU_CHECK_PARTS:-$all_parts}"
for name in $parts; do
  case " $all_parts " in *" $name "*) ;; *) echo "gpu_check.sh: GPU_CHECK_PARTS: no part '$name' (parts: $all_parts)" >&2; exit 1 ;; esac
done
export PYTHONUNBUFFERED=1
summary="$out/summary.txt"
: >"$summary"

seconds="${GPU_CHECK_SECONDS:-560}"
case "$seconds" in ''|*[!0-9]*) echo "gpu_check.sh: GPU_CHECK_SECONDS must be a whole number of seconds" >&2; exit 1 ;; esac
deadline=$((SECONDS + seconds))  # the whole script, preamble included
part() {  # part NAME SECONDS LOG COMMAND...: run with a time limit, log, record status and time
  local name=$1 limit=$2 log=$3
  shift 3
  case " $parts " in *" $name "*) ;; *) echo "$name not selected (GPU_CHECK_PARTS)" >>"$summary"; return ;; esac
  local left=$((deadline - SECONDS - 10))
  [ "$limit" -gt "$left" ] && limit=$left
  if [ "$limit" -lt 20 ]; then echo "$name SKIPPED: ${left}s left" | tee -a "$summary"; return; fi
  local t0=$SECONDS
  timeout --kill-after=10 "$limit" "$@" >"$log" 2>&1
  local rc=$?
  echo "$name rc=$rc seconds=$((SECONDS - t0)) limit=$limit$({ [ $rc = 124 ] || [ $rc = 137 ]; } && echo ' TIMED OUT')" | tee -a "$summary"
}

{
  timeout 30 nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1
  timeout 90 python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, torch.cuda.get_device_name(0) if torch.cuda.is_available() else "NO CUDA")'
  timeout 60 python3 -c 'import torch; print(torch.ops.aten._flash_attention_forward.default._schema); print(torch.ops.aten._flash_attention_backward.default._schema)'
} >"$out/env.txt" 2>&1
cat "$out/env.txt"
if ! timeout 90 python3 -c 'import torch, sys; sys.exit(not torch.cuda.is_available())' 2>>"$out/env.txt"; then
  echo "NO CUDA: torch sees no CUDA device (env.txt), so every figure would be void" | tee -a "$summary"
  [ "${GPU_CHECK_CPU:-0}" = 1 ] || { echo "stopped (GPU_CHECK_CPU=1 goes on, on the CPU)" | tee -a "$summary"; exit 2; }
fi

# 1. wheels -> a temporary site folder; `python` (the stages call it) and `dvc` on PATH
tmp=$(mktemp -d -t gpu-check.XXXXXX)
trap 'rm -rf "$tmp"' EXIT  # the wheels' site folder is this run's only
site="$tmp/site" bin="$tmp/bin"
if ls .whl/*.whl >/dev/null 2>&1; then
  timeout 180 python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" .whl/*.whl \
    >>"$out/env.txt" 2>&1 || echo "wheel install failed (env.txt; the wheels are CPython 3.12's)" | tee -a "$summary"
else
  echo "no .whl/ here: dvc, dvclive and soundfile must already be installed" | tee -a "$summary"
fi
mkdir -p "$bin" && printf '#!/bin/sh\nexec %s "$@"\n' "$(command -v python3)" >"$bin/python" && chmod +x "$bin/python"
export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}" PATH="$bin:$site/bin:$PATH"
timeout 90 python3 -c 'import soundfile, dvclive, dvc' 2>>"$out/env.txt" || echo "soundfile/dvclive/dvc not importable: tests and paper_profile will fail (env.txt)" | tee -a "$summary"

# the project as a git repository (tests/dvc_repo.py copies it with `git ls-files`)
if ! git rev-parse --git-dir >/dev/null 2>&1; then
  timeout 60 git init -q . && printf '/.whl/\n/gpu-check/\n' >>.git/info/exclude && timeout 120 git add -A \
    && timeout 60 git -c user.name=gpu-check -c user.email=gpu-check@localhost commit -qm "gpu check snapshot" \
    || echo "could not make the tree a git repository: test_paper_profile will fail" | tee -a "$summary"
fi

# 2. CUDA tests (the CUDA twins are named *cuda*) and every test of the CUDA-path files
part tests 80 "$out/tests.log" python3 -m pytest -v -p no:cacheprovider -o addopts= -o faulthandler_timeout=60 -rsP --durations=10 \
  tests/model/test_attention_paths.py tests/train/test_fold_update.py \
  tests/model/test_local_attention.py tests/model/test_attention.py tests/model/test_s2t_transformer.py \
  tests/decode/test_beam_search.py tests/train/test_objectives.py tests/model/test_head_selection.py -k "cuda or attention_paths or fold_update"

# 3. the benchmark (its own budget: 120 s of parts, then it skips the rest; it took 62 s on an H200)
part bench 150 "$out/bench.jsonl" python3 benchmarks/gpu.py --budget 120
[ -f "$out/bench.jsonl" ] && { grep -v '^{' "$out/bench.jsonl" >"$out/bench.err" || true; }

# 4. the real loop with data loading, and its syncs per update
part loop 150 "$out/loop.jsonl" python3 benchmarks/gpu_loop.py --updates 8 --warmup 3 --sync-check --oom-check

# 5. the paper profile through `dvc repro` on CUDA
part paper_profile 160 "$out/paper.log" python3 -m pytest -v -p no:cacheprovider -o addopts= -o faulthandler_timeout=120 -rs --durations=10 tests/test_paper_profile.py

echo "total seconds=$SECONDS" >>"$summary"
cat "$summary"

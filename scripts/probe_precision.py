"""Measure `amp: probe`'s training probe again, without reading or writing its cache: for each pair,
the ST baseline model (or, with `--task asr`, the ASR model) timed in fp32 and bf16 on the run's
first training batches exactly as a pipeline run's probe times them (`lib.train.precision.probe_step_times`:
each precision in its own process, bf16 on batches padded as a bf16 run pads them), `--repeats`
times, and the choice the probe's rule would make.

    python scripts/probe_precision.py [--pairs en-de en-es en-it] [--task st] [--threads N] [--repeats 2]

Needs the prepared data (`data/prepared/<pair>`, stage `prepare`). `--threads` defaults to what a
pipeline run of that task uses on this machine: a per-pair / per-seed ST run `parallel.jobs`'s
share of the cores, the shared ASR model all of them. The machine should be quiet: a probe timed
beside another training run is what this script exists to check.
"""
from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lib.cli import run_tool  # noqa: E402
from lib.data.dataset import SpeechDataset, first_batches  # noqa: E402
from lib.model.s2t_transformer import model_config  # noqa: E402
from lib.parallel import available_cores, threads_per_run  # noqa: E402
from lib.params import load_params  # noqa: E402
from lib.train.precision import (BF16_MIN_SPEEDUP, PROBE_BATCHES, PROBE_CONFIRM_BAND, baseline_model_config,  # noqa: E402
                                 probe_step_times, resolve_padding)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairs", nargs="+", default=None, help="default: params.yaml's pairs")
    ap.add_argument("--task", choices=["st", "asr"], default="st")
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--repeats", type=int, default=2, help="probes per pair (default 2)")
    ap.add_argument("--params", default=str(ROOT / "params.yaml"), help="its folder is the workspace (default: this repo)")
    args = ap.parse_args(argv)
    p = load_params(Path(args.params))
    cfg = p.train_st if args.task == "st" else p.train_asr
    threads = args.threads or (threads_per_run(p.parallel.jobs, cuda=False) if args.task == "st" else available_cores())
    torch.set_num_threads(threads)
    cpu = torch.device("cpu")
    pad_fp32 = resolve_padding(cfg.pad_frames_to, cfg.pad_tokens_to, "none", cpu)
    pad_bf16 = resolve_padding(cfg.pad_frames_to, cfg.pad_tokens_to, "bf16", cpu)
    print(f"torch {torch.__version__}, {threads} thread(s); {args.task.upper()} model, {PROBE_BATCHES} batches of "
          f"max_frames {cfg.max_frames}; bf16 batches padded to {pad_bf16[0]} frames / {pad_bf16[1]} tokens; "
          f"bf16 is chosen at a median speedup >= {BF16_MIN_SPEEDUP}x (a first probe within {PROBE_CONFIRM_BAND} "
          "of it is measured twice more)\n")
    print("| pair | fp32 ms/step | bf16 ms/step | median per-batch speedup | choice |")
    print("|---|---|---|---|---|")
    for pair in args.pairs or list(p.pairs):
        prepared = Path(args.params).resolve().parent / p.data.prepared_dir / pair  # the params' workspace
        if not (prepared / "train.tsv").is_file():
            raise SystemExit(f"error: {prepared / 'train.tsv'}: missing; run `dvc repro prepare@{pair}` first")
        ds = SpeechDataset(prepared, "train", args.task, max_frames=cfg.max_frames_train,
                           max_target_tokens=cfg.max_target_tokens)
        mcfg = model_config(p.model.size, vocab_size=ds.vocab_size,
                            ctc_vocab_size=ds.vocab_size if cfg.ctc_weight > 0 else None, **p.model.overrides)
        model = baseline_model_config(mcfg.to_dict())
        b32 = first_batches(ds, cfg.max_frames, PROBE_BATCHES, pad_frames_to=pad_fp32[0], pad_tokens_to=pad_fp32[1])
        b16 = first_batches(ds, cfg.max_frames, PROBE_BATCHES, pad_frames_to=pad_bf16[0], pad_tokens_to=pad_bf16[1])
        speedups = []
        for _ in range(args.repeats):
            t = probe_step_times(model, b32, cfg.ctc_weight, bf16_batches=b16 if pad_bf16 != pad_fp32 else None)
            speedups.append(t["speedup"])
            choice = "bf16" if t["speedup"] >= BF16_MIN_SPEEDUP else "fp32"
            print(f"| {pair} | {1e3 * t['none']:.1f} | {1e3 * t['bf16']:.1f} | {t['speedup']:.2f}x | {choice} |", flush=True)
        if len(speedups) > 1:
            print(f"| {pair}: median of {len(speedups)} | | | {statistics.median(speedups):.2f}x | |", flush=True)


if __name__ == "__main__":
    run_tool(main)

"""Training update time on the pipeline's real batches: fp32 with the for-loop Adam (the pipeline
before fused Adam and the measured `amp: auto`), fp32 with fused Adam, bf16 autocast with fused
Adam (and, with `--compile`, fp32 + fused Adam under `torch.compile`), each row in its own
process over the same batches in the same order; which row `amp: auto` picks on this machine
(`lib.train.precision.resolve_train_amp`); then beam-5 decoding of tst-COMMON in fp32 and in bf16, each
in its own process. The ASR batches (`train_asr.max_frames`, CTC weight `train_asr.ctc_weight`)
and the ST batches (`train_st.max_frames`) come from the prepared en-de training data; the demo
model with params.yaml's `model.overrides`; SpecAugment off.

One process per row because that is how the pipeline runs, and because oneDNN compiles a bf16
kernel per new shape and caches it for the process: a second bf16 row in the same process, or
batches repeated, would run on warm kernels that a real run (new batch shapes every update) never
has (on a 2-core Intel Xeon with AMX, ST batches seen before ran 1.15x faster in bf16 than in fp32,
new ones 0.8-1.0x: the reason for `amp: auto`'s probe on the run's own, new batches).

    python benchmarks/train_real_batches.py [--updates 30] [--pair en-de] [--compile]
        [--pad-frames 64 --pad-tokens 8] [--tasks asr st] [--no-decode]
"""
from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lib.cli import run_tool  # noqa: E402
from lib.data.dataset import SpeechDataset, first_batches  # noqa: E402
from lib.model.s2t_transformer import ModelConfig, S2TTransformer, model_config  # noqa: E402
from lib.params import Params, TrainConfig, load_params  # noqa: E402
from lib.precision import autocast, resolve_amp, resolve_padding  # noqa: E402
from lib.train.precision import PROBE_BATCHES, resolve_train_amp  # noqa: E402
from lib.train.loop import Criterion  # noqa: E402

def pipeline_data(task: str, pair: str) -> tuple[Params, TrainConfig, SpeechDataset, ModelConfig]:
    """(params.yaml, the task's training config (`train_asr` for "asr", `train_st` for "st"), the
    pair's prepared training set, the demo model's config with `model.overrides`)."""
    p = load_params(ROOT / "params.yaml")
    cfg = p.train_asr if task == "asr" else p.train_st
    ds = SpeechDataset(ROOT / p.data.prepared_dir / pair, "train", task, max_frames=cfg.max_frames_train)
    mcfg = model_config(p.model.size, vocab_size=ds.vocab_size,
                        ctc_vocab_size=ds.vocab_size if cfg.ctc_weight > 0 else None, **p.model.overrides)
    return p, cfg, ds, mcfg


# row -> (amp, fused Adam, torch.compile, padded): "padded" rounds every batch's frames and target
# tokens up to --pad-frames / --pad-tokens (train_*.pad_frames_to / pad_tokens_to): fewer distinct
# shapes for oneDNN's per-shape kernels.
ROWS = {"fp32, Adam for-loop": ("none", False, False, False), "fp32, fused Adam": ("none", True, False, False),
        "bf16, fused Adam": ("bf16", True, False, False),
        "fp32, fused Adam, padded": ("none", True, False, True),
        "bf16, fused Adam, padded": ("bf16", True, False, True),
        "fp32, fused Adam, torch.compile": ("none", True, True, False)}


def one_row(task: str, pair: str, row: str, n: int, pad: tuple[int, int] = (64, 8)) -> dict[str, float]:
    """In this process: mean ms per update over ``n`` updates after 3 warm-up ones (first-update
    seconds, distinct batch shapes and padded frames too)."""
    p, cfg, ds, mcfg = pipeline_data(task, pair)
    amp, fused, comp, padded = ROWS[row]
    pf, pt = pad if padded else (1, 1)
    batches = first_batches(ds, cfg.max_frames, n + 3, seed=1, pad_frames_to=pf, pad_tokens_to=pt)
    torch.manual_seed(0)
    model = S2TTransformer(mcfg).train()
    crit = Criterion(model, cfg.label_smoothing, cfg.ctc_weight)
    fwd = torch.compile(crit, dynamic=True) if comp else crit
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, fused=fused or None)
    times = []
    for b in batches:
        t0 = time.perf_counter()
        with autocast(torch.device("cpu"), amp):
            loss, _ = fwd(b)
        opt.zero_grad()
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
    return {"ms": 1e3 * statistics.mean(times[3:]), "first_s": times[0],
            "shapes": len({(b.feats.shape[:2], b.target.shape[1]) for b in batches[3:]}),
            "frames": sum(b.feats.shape[0] * b.feats.shape[1] for b in batches[3:])}


def one_decode(pair: str, amp: str) -> dict[str, float]:
    from lib.decode.beam_search import BeamSearchConfig, translate_dataset
    from lib.model.checkpoint import load_model

    p = load_params(ROOT / "params.yaml")
    model, _ = load_model(ROOT / "runs/baseline" / pair / "seed1/model.pt")
    ds = SpeechDataset(ROOT / p.data.prepared_dir / pair, "tst-COMMON", "st")
    d = p.decode
    cfg = BeamSearchConfig(beam=d.beam, len_penalty=d.len_penalty, max_len_a=d.max_len_a, max_len_b=d.max_len_b)
    t0 = time.perf_counter()
    translate_dataset(model, ds, d.batch_frames, cfg, "cpu", progress=False, amp=amp)
    return {"s": time.perf_counter() - t0, "sentences": len(ds), "beam": d.beam}


def child(args: list[str]) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], cwd=ROOT, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(args)} failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--updates", type=int, default=30)
    ap.add_argument("--pair", default="en-de")
    ap.add_argument("--compile", action="store_true", help="add a torch.compile row (compiles for about a minute)")
    ap.add_argument("--pad-frames", type=int, default=64, help="the padded rows' frame multiple (default 64)")
    ap.add_argument("--pad-tokens", type=int, default=8, help="the padded rows' target-token multiple (default 8)")
    ap.add_argument("--tasks", nargs="+", default=["asr", "st"], choices=["asr", "st"])
    ap.add_argument("--no-decode", action="store_true", help="skip the decoding rows")
    ap.add_argument("--row", help=argparse.SUPPRESS)
    ap.add_argument("--task", help=argparse.SUPPRESS)
    ap.add_argument("--decode", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.row:
        print(json.dumps(one_row(args.task, args.pair, args.row, args.updates, (args.pad_frames, args.pad_tokens))))
        return
    if args.decode:
        print(json.dumps(one_decode(args.pair, args.decode)))
        return
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {args.updates} updates per row after 3 "
          f"warm-up updates, the same {args.pair} batches in the same order, one process per row; padded rows: "
          f"frames to a multiple of {args.pad_frames}, target tokens of {args.pad_tokens}")
    rows = [r for r in ROWS if args.compile or "compile" not in r]
    for task in args.tasks:
        p, cfg, ds, mcfg = pipeline_data(task, args.pair)
        default = resolve_train_amp("auto", torch.device("cpu"), mcfg.to_dict(), cfg.max_frames,
                                    ctc_weight=cfg.ctc_weight, data_id=f"benchmark:{args.pair}:{task}",
                                    probe_batches=lambda: first_batches(ds, cfg.max_frames, PROBE_BATCHES))
        res = {r: child(["--row", r, "--task", task, "--pair", args.pair, "--updates", str(args.updates),
                         "--pad-frames", str(args.pad_frames), "--pad-tokens", str(args.pad_tokens)]) for r in rows}
        base = res["fp32, Adam for-loop"]["ms"]
        print(f"\n{task.upper()} batches (max_frames {cfg.max_frames}, ctc {cfg.ctc_weight}); "
              f"amp: auto picks {'bf16' if default == 'bf16' else 'fp32'} on this machine")
        print(f"  {'row':<34} {'ms/update':>10} {'vs fp32 for-loop':>17} {'vs default':>11} {'shapes':>7} "
              f"{'padded frames':>14}")
        # the pipeline's row: its precision and its padding (pad_*_to: auto pads bf16 batches on a CPU)
        pads = resolve_padding(cfg.pad_frames_to, cfg.pad_tokens_to, default, torch.device("cpu"))
        default_row = ("bf16, fused Adam" if default == "bf16" else "fp32, fused Adam") + \
            ("" if pads == (1, 1) else ", padded")
        if pads not in ((1, 1), (args.pad_frames, args.pad_tokens)):
            print(f"  (the pipeline pads to {pads[0]} frames / {pads[1]} tokens, not as the padded rows: the "
                  f"nearest row, {default_row!r}, stands for it)")
        for r in rows:
            mark = "  <- the default" if r == default_row else ""
            print(f"  {r:<34} {res[r]['ms']:>10.1f} {base / res[r]['ms']:>16.2f}x "
                  f"{res[default_row]['ms'] / res[r]['ms']:>10.2f}x {res[r]['shapes']:>7} {res[r]['frames']:>14}{mark}")
            if "compile" in r:
                print(f"  (torch.compile: the first update, compiling, took {res[r]['first_s']:.1f} s)")
    if args.no_decode:
        return
    if not (ROOT / "runs/baseline" / args.pair / "seed1/model.pt").is_file():
        print("\ndecoding: no trained model at runs/baseline/<pair>/seed1/model.pt (run `dvc repro train_baseline`)")
        return
    dec = {amp: child(["--decode", amp, "--pair", args.pair]) for amp in ("none", "bf16")}
    n = dec["none"]["sentences"]
    print(f"\ndecoding runs/baseline/{args.pair}/seed1/model.pt, {n} tst-COMMON sentences, beam {dec['none']['beam']}, "
          f"one process each; amp: auto decodes in {resolve_amp('auto', torch.device('cpu'))}")
    for amp, r in dec.items():
        print(f"  {'fp32' if amp == 'none' else amp:<6} {r['s']:6.2f} s  {n / r['s']:6.1f} sentences/s")
    print(f"  bf16 over fp32: {dec['none']['s'] / dec['bf16']['s']:.2f}x")


if __name__ == "__main__":
    run_tool(main)

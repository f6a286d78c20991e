"""Cost of attention head selection (Gong et al.; docs/variants.md): training step time, decoding speed, and the eval
encoder's time and FLOPs, for the shared H-head model, the H'-head model, and head selection with
H' in {H, 2H, 4H} candidates (H = the demo model's 4 heads), side by side in one run.

    python benchmarks/head_selection_speed.py [--reps 5] [--json FILE]

The paper's claim (its Tables 1-5): selection models decode within ~1.5 % of the H = 4 model while
H = 8 is 4.5-7.7 % slower, because inference computes only the H selected heads. Targets here: eval
encoder FLOPs exactly equal for every H' (torch.utils.flop_counter), eval encoder time within ±5 %
of H' = H. Models are randomly initialised (3 tasks, group selection in encoder and decoder
self-attention with params.yaml's estimator, the demo size and model.overrides); decoding runs greedy and beam 5
on random features to a fixed length (max_len_b), so every model does the same number of steps.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lib.cli import run_tool  # noqa: E402
from lib.decode.beam_search import BeamSearchConfig, beam_search, greedy_search  # noqa: E402
from lib.io import atomic_write_json  # noqa: E402
from lib.model.s2t_transformer import S2TTransformer, model_config  # noqa: E402
from lib.model.spec import decoder_head_selection_spec, head_selection_spec  # noqa: E402
from lib.params import load_params  # noqa: E402
import lib.params.multi  # noqa: E402,F401 (parses the params' multi section)
from lib.precision import autocast, resolve_amp  # noqa: E402
from lib.train.objectives import label_smoothed_nll_loss  # noqa: E402

TASKS = 3


def build(name: str, candidates: int | None, overrides: dict, estimator: str, vocab: int = 400) -> S2TTransformer:
    base = model_config("demo", vocab_size=vocab, **overrides)
    extra: dict = {}
    if name == "H'":
        extra = {"n_heads": candidates}
    elif name == "select":
        hdef = {"strategy": "group", "candidates": candidates, "apply_to": ["encoder_self", "decoder_self"],
                "estimator": estimator}
        extra = {"encoder_attention": head_selection_spec([{"type": "full"}] * base.encoder_layers, hdef,
                                                          base.encoder_layers, n_heads=base.n_heads, tasks=TASKS),
                 **decoder_head_selection_spec(hdef, base.decoder_layers, n_heads=base.n_heads, tasks=TASKS)}
    torch.manual_seed(0)
    return S2TTransformer(model_config("demo", vocab_size=vocab, **overrides, **extra))


def median_time(fn, reps: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--tokens", type=int, default=15)
    ap.add_argument("--decode-len", type=int, default=30)
    ap.add_argument("--estimator", choices=["paper", "gumbel"],
                    help="the selection's training estimator (default: params.yaml's multi.head_selection.estimator)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    p = load_params(ROOT / "params.yaml")
    overrides = dict(p.model.overrides)
    estimator = args.estimator or p.multi.head_selection.estimator
    amp = resolve_amp("auto", torch.device("cpu"))
    H = model_config("demo", **overrides).n_heads
    torch.manual_seed(1)
    feats = torch.randn(args.batch, args.frames, 80)
    lengths = torch.full((args.batch,), args.frames)
    task = torch.arange(args.batch) % TASKS
    prev = torch.randint(7, 400, (args.batch, args.tokens))
    target = torch.randint(7, 400, (args.batch, args.tokens))
    one_task = torch.zeros(args.batch, dtype=torch.long)
    configs = [("H", "shared", None), ("H'", f"shared, {2 * H} heads", 2 * H)] + \
              [("select", f"group, H'={c}", c) for c in (H, 2 * H, 4 * H)]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, precision {amp}; demo model, H = {H}; "
          f"batch {args.batch} x {args.frames} frames x {args.tokens} tokens; {TASKS} tasks (mixed in training); "
          f"selection estimator {estimator}")
    print(f"\n{'model':<20} {'params':>9} {'train ms':>9} {'enc eval ms':>12} {'enc eval GFLOP':>15} "
          f"{'greedy sent/s':>14} {'beam5 sent/s':>13}")
    rows = {}
    for kind, label, c in configs:
        model = build(kind, c, overrides, estimator)
        opt = torch.optim.Adam(model.parameters(), lr=1e-5)
        selecting = kind == "select"

        def step() -> None:
            model.train()
            with autocast(torch.device("cpu"), amp):
                enc = model.encode(feats, lengths, task=task if selecting else None)
                logits = model.decode(prev, enc)
            loss, _ = label_smoothed_nll_loss(logits.float(), target, 0.1, 1)
            opt.zero_grad()
            loss.backward()
            opt.step()

        t_train = median_time(step, args.reps)
        model.eval()
        t_arg = one_task if selecting else None

        def encode() -> None:
            with torch.no_grad(), autocast(torch.device("cpu"), amp):
                model.encode(feats, lengths, task=t_arg)

        t_enc = median_time(encode, args.reps)
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model.encode(feats, lengths, task=t_arg)
        flops = counter.get_total_flops()
        cfg_b = BeamSearchConfig(beam=5, max_len_b=args.decode_len, min_len=args.decode_len)
        speeds = {}
        for name, fn in (("greedy", lambda: greedy_search(model, feats, lengths, max_len_b=args.decode_len,
                                                          min_len=args.decode_len, task=t_arg)),
                         ("beam5", lambda: beam_search(model, feats, lengths, cfg_b, task=t_arg))):
            def run() -> None:
                with torch.no_grad(), autocast(torch.device("cpu"), amp):
                    fn()
            speeds[name] = args.batch / median_time(run, max(1, args.reps // 2))
        rows[label] = {"params": model.num_parameters(), "train_ms": round(t_train * 1e3, 1),
                       "encoder_eval_ms": round(t_enc * 1e3, 1), "encoder_eval_flops": flops,
                       "greedy_sent_per_s": round(speeds["greedy"], 1), "beam5_sent_per_s": round(speeds["beam5"], 1)}
        r = rows[label]
        print(f"{label:<20} {r['params']:>9,} {r['train_ms']:>9.1f} {r['encoder_eval_ms']:>12.1f} "
              f"{flops / 1e9:>15.3f} {r['greedy_sent_per_s']:>14.1f} {r['beam5_sent_per_s']:>13.1f}")
    ref = rows[f"group, H'={H}"]
    print(f"\neval encoder, head selection vs H' = {H} (target: FLOPs equal, time within ±5 %):")
    for c in (2 * H, 4 * H):
        r = rows[f"group, H'={c}"]
        print(f"  H' = {c}: FLOPs {'equal' if r['encoder_eval_flops'] == ref['encoder_eval_flops'] else 'DIFFER'} "
              f"({r['encoder_eval_flops']:,} vs {ref['encoder_eval_flops']:,}), time "
              f"{r['encoder_eval_ms'] / ref['encoder_eval_ms']:.3f}x")
    shared = rows["shared"]
    print(f"decoding (beam 5) relative to the shared H = {H} model: " + ", ".join(
        f"{k} {shared['beam5_sent_per_s'] / v['beam5_sent_per_s']:.3f}x the time" for k, v in rows.items()
        if k != "shared"))
    if args.json:
        atomic_write_json(args.json, rows)


if __name__ == "__main__":
    run_tool(main)

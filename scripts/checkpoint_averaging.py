"""Does averaging more of the last ST checkpoints shrink the seed spread or the local - baseline gap?

fairseq's MuST-C recipe averages the last 10 checkpoints (profiles/paper.yaml: average_last 10); the
demo averages the last 5 snapshots, 20 updates apart (train_st.save_every 20 with 720 updates, so
updates 640-720). This script decodes tst-COMMON with the average of the last k snapshots, for
each k, for the baseline and the local model of every seed of one pair, and prints / writes BLEU per
seed, mean ± std over seeds, the mean gap and the seeds where sacreBLEU's paired bootstrap finds
p < 0.05 (the pipeline's report uses the same test, lib/decode/metrics.py).

The runs must have kept their snapshots: train them again keeping more of them, without touching
anything else (the local runs keep the committed windows and ASR models; `-s` stops DVC from
re-running the stages upstream of them), then run this script:

    # in a clone holding the default's outputs (`dvc checkout`), with params.yaml's
    # train_st.average_last set to 10 (snapshots 540, 560, ..., 720 kept; save_every stays 20):
    for s in 1 2 3 4 5; do dvc repro -s train_baseline@en-it-$s train_local@en-it-$s; done
    python scripts/checkpoint_averaging.py en-it --ks 1 2 5 10 --check-k 5

Keeping snapshots does not change the training trajectory: k = 5 (updates 640-720) reproduces
the default's BLEU per seed exactly, which the script checks against the committed (git HEAD)
metrics/<system>/<pair>/seed<n>.json when ``--check-k`` names that k.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lib.cli import run_tool  # noqa: E402
from lib.data.dataset import SpeechDataset  # noqa: E402
from lib.decode.beam_search import BeamSearchConfig, translate_dataset  # noqa: E402
from lib.decode.metrics import bleu, paired_bootstrap  # noqa: E402
from lib.io import atomic_write_json, atomic_write_text  # noqa: E402
from lib.model.checkpoint import build_model, read_model_state  # noqa: E402
from lib.params import load_params  # noqa: E402
from lib.precision import resolve_amp  # noqa: E402
from lib.stats import mean_std  # noqa: E402
from lib.train.checkpoint import average_state_dicts, averaged_updates, snapshot_path  # noqa: E402
from lib.train.run import auto_device  # noqa: E402

SYSTEMS = ("baseline", "local")


def snapshots(run: Path, save_every: int, max_updates: int, k: int) -> list[Path]:
    """The snapshots of the run's last ``k`` saves on its schedule (every ``save_every`` updates and the
    last), oldest first; exits naming the first one missing (a run that kept fewer, or lost one)."""
    snap_dir = run / "checkpoints" / "snapshots"
    snaps = [snapshot_path(snap_dir, u) for u in averaged_updates(save_every, max_updates, k, max_updates)]
    missing = [p for p in snaps if not p.is_file()]
    if len(snaps) < k or missing:
        sys.exit(f"error: k = {k} needs the snapshots of {run}'s last {k} saves, but "
                 + (f"its schedule has {len(snaps)} saves" if len(snaps) < k else f"{missing[0]} is missing")
                 + " (train with train_st.average_last large enough to keep them; see this script's docstring)")
    return snaps


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pair")
    ap.add_argument("--ks", type=int, nargs="+", default=[1, 2, 5, 10])
    ap.add_argument("--check-k", type=int, default=None,
                    help="the k that equals the committed default (train_st.average_last, 5): "
                         "fail unless its BLEU per seed equals git HEAD's metrics/<system>/<pair>/seed<n>.json")
    ap.add_argument("--out", type=Path, default=None, help="also write the table (markdown) and the raw JSON here")
    args = ap.parse_args()
    p = load_params(ROOT / "params.yaml")
    if args.pair not in p.pairs:
        sys.exit(f"error: {args.pair!r} is not in params.yaml's pairs {p.pairs}")
    d = p.decode
    cfg = BeamSearchConfig(beam=d.beam, len_penalty=d.len_penalty, max_len_a=d.max_len_a, max_len_b=d.max_len_b)
    device = auto_device()
    amp = resolve_amp(p.train_st.amp, device)
    test = SpeechDataset(ROOT / p.data.prepared_dir / args.pair, "tst-COMMON", "st")
    refs = [test.reference(i) for i in range(len(test))]
    runs = {(system, seed): ROOT / "runs" / system / args.pair / f"seed{seed}" for system in SYSTEMS for seed in p.seeds}
    if min(args.ks) < 1:
        sys.exit(f"error: --ks must be >= 1, got {args.ks}")
    schedule = (p.train_st.save_every, p.train_st.max_updates)
    for run in runs.values():  # every run checked before the first (slow) decode
        snapshots(run, *schedule, max(args.ks))
    bleus: dict[tuple[str, int, int], float] = {}
    pvals: dict[tuple[int, int], float] = {}
    for seed in p.seeds:
        hyps: dict[tuple[str, int], list[str]] = {}
        for system in SYSTEMS:
            run = runs[system, seed]
            mcfg = read_model_state(run / "model.pt")["model_config"]
            for k in args.ks:
                snaps = snapshots(run, *schedule, k)
                model = build_model(mcfg).to(device)
                model.load_state_dict(average_state_dicts(snaps))
                model.eval()
                hyps[system, k] = translate_dataset(model, test, d.batch_frames, cfg, device, progress=False, amp=amp)
                bleus[system, seed, k] = round(bleu(hyps[system, k], refs), 2)
                print(f"{args.pair} {system} seed {seed} k {k} ({snaps[0].stem}..{snaps[-1].stem}): "
                      f"BLEU {bleus[system, seed, k]}", flush=True)
        for k in args.ks:
            pvals[seed, k] = paired_bootstrap(hyps["baseline", k], hyps["local", k], refs)["p_value"]
    lines = ["| k (snapshots averaged) | baseline BLEU | local BLEU | local − baseline | per seed | seeds p < 0.05 |",
             "|---|---|---|---|---|---|"]
    for k in args.ks:
        b = [bleus["baseline", s, k] for s in p.seeds]
        loc = [bleus["local", s, k] for s in p.seeds]
        gaps = " ".join(f"{y - x:+.2f}" for x, y in zip(b, loc))
        sig = sum(pvals[s, k] < 0.05 for s in p.seeds)
        (mb, sb), (ml, sl) = mean_std(b), mean_std(loc)  # the std is 0 with one seed
        lines.append(f"| {k} | {mb:.2f} ± {sb:.2f} | {ml:.2f} ± {sl:.2f} | {ml - mb:+.2f} | {gaps} | {sig} / {len(p.seeds)} |")
    table = "\n".join(lines)
    print(table)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(args.out.with_suffix(".md"), f"# Checkpoint averaging, {args.pair} "
                          f"(`python scripts/checkpoint_averaging.py {args.pair}`)\n\n{table}\n")
        atomic_write_json(args.out.with_suffix(".json"),
                          {"bleu": {f"{s}/{seed}/k{k}": v for (s, seed, k), v in bleus.items()},
                           "p_value": {f"{seed}/k{k}": v for (seed, k), v in pvals.items()}})
    if args.check_k is not None:  # after the table is written: the runs overwrote metrics/, so compare with git's
        for system in SYSTEMS:
            for seed in p.seeds:
                rel = f"metrics/{system}/{args.pair}/seed{seed}.json"
                committed = json.loads(subprocess.run(["git", "show", f"HEAD:{rel}"], cwd=ROOT, check=True,
                                                      capture_output=True, text=True).stdout)["bleu"]
                if bleus[system, seed, args.check_k] != committed:
                    sys.exit(f"error: k = {args.check_k}, {system} seed {seed}: BLEU {bleus[system, seed, args.check_k]}, "
                             f"the committed {rel}: {committed}")
        print(f"k = {args.check_k} equals the committed BLEU (git HEAD's metrics/) of every system and seed")


if __name__ == "__main__":
    run_tool(main)

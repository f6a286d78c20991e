"""Cost of attention-weight smoothing with priors (Maekaku et al.; docs/variants.md): training step
time and decoding speed of every definition in params.yaml's ``smoothing.defs`` against plain
attention, side by side in one run; optionally (``--baseline-rev REV``) the plain (default) path of
this code against the code of another git revision, e.g. one from before smoothing existed, to check
that adding the variant left the default path's speed alone.

    python benchmarks/smoothing_speed.py [--reps 5] [--decode-reps 3] [--json FILE] [--baseline-rev REV]

The paper claims no speed; this reports the overhead. Smoothed layers take the explicit-weights path
(A' must be formed), plain layers PyTorch's SDPA kernel. Training step: forward + backward + Adam on
one demo-size batch (``--batch`` x ``--frames`` frames, ``--tokens`` target tokens), the pipeline's
default precision (``amp: auto``), median over ``--reps`` steps after two warm-up steps. Decoding:
beam 5 (median of ``--decode-reps`` passes, after a warm-up pass) on the first ``--sentences`` tst-COMMON sentences of the prepared en-de demo data with the
trained baseline's weights (runs/baseline/en-de/seed1/model.pt) loaded into each configuration
(smoothing parameters at their initialisation), when that model exists.

The default-path comparison (only with ``--baseline-rev``) runs each tree in its own subprocess,
alternating ``--rounds`` times, and reports the ratio of medians (target: within 3 %). Decoding needs
the pipeline's en-de data and baseline (`dvc repro train_baseline`); without them only the training
steps are timed.
"""
from __future__ import annotations

import argparse
import io
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lib.cli import run_tool  # noqa: E402
from lib.io import atomic_write_json  # noqa: E402
from lib.model.s2t_transformer import ModelConfig, S2TTransformer, model_config  # noqa: E402
from lib.model.spec import smoothing_model_specs  # noqa: E402
from lib.params import load_params  # noqa: E402
import lib.params.smoothing  # noqa: E402,F401 (parses the params' smoothing section)
from lib.precision import resolve_amp  # noqa: E402

sys.path.insert(0, str(ROOT / "benchmarks"))
from train_throughput import step_time  # noqa: E402  (forward + backward + Adam, median after 2 warm-ups)

# One training-step measurement of the plain model, run inside a given source tree (argv[1]).
PLAIN_STEP = r"""
import statistics, sys, time, torch
sys.path.insert(0, sys.argv[1])
from lib.model.s2t_transformer import S2TTransformer, model_config
from lib.precision import autocast, resolve_amp
from lib.train.objectives import label_smoothed_nll_loss
b, f, t, reps = map(int, sys.argv[2:6])
overrides = eval(sys.argv[6])
torch.manual_seed(0)
cfg = model_config("demo", vocab_size=200, **overrides)
model = S2TTransformer(cfg).train()
feats, lengths = torch.randn(b, f, cfg.n_mels), torch.full((b,), f)
prev, target = torch.randint(4, 200, (b, t)), torch.randint(4, 200, (b, t))
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
amp = resolve_amp("auto", torch.device("cpu"))
times = []
for i in range(reps + 2):
    t0 = time.perf_counter()
    with autocast(torch.device("cpu"), amp):
        logits = model(feats, lengths, prev)
    loss, _ = label_smoothed_nll_loss(logits.float(), target, 0.1, 1)
    opt.zero_grad(); loss.backward(); opt.step()
    if i >= 2:
        times.append(time.perf_counter() - t0)
print(statistics.median(times))
"""

# Beam-5 decoding of the trained baseline with a given source tree's model and search (argv[1]).
PLAIN_DECODE = r"""
import sys, time, torch
sys.path.insert(0, sys.argv[1])
from lib.data.dataset import SpeechDataset
from lib.decode.beam_search import BeamSearchConfig, translate_dataset
from lib.model.s2t_transformer import ModelConfig, S2TTransformer
from lib.precision import resolve_amp
state = torch.load(sys.argv[2], weights_only=True)
model = S2TTransformer(ModelConfig.from_dict(state["model_config"]))
model.load_state_dict(state["model"])
ds = SpeechDataset(sys.argv[3], "tst-COMMON", "st")
amp = resolve_amp("auto", torch.device("cpu"))
cfg = BeamSearchConfig(beam=5, max_len_b=100)
translate_dataset(model.eval(), ds, 20000, cfg, "cpu", progress=False, amp=amp)  # warm-up
t0 = time.perf_counter()
translate_dataset(model.eval(), ds, 20000, cfg, "cpu", progress=False, amp=amp)
print(len(ds) / (time.perf_counter() - t0))
"""


def configs(overrides: dict) -> dict[str, dict]:
    """name -> ModelConfig overrides: plain attention, then every definition of smoothing.defs."""
    p = load_params(ROOT / "params.yaml")
    cfg = model_config("demo", **overrides)
    out = {"plain": {}}
    for name, sdef in p.smoothing.defs.items():
        encoder, decoder = smoothing_model_specs([{"type": "full"}] * cfg.encoder_layers, sdef, cfg.decoder_layers,
                                                 key=f"smoothing.defs.{name}")
        out[name] = {"encoder_attention": encoder, **{k: v for k, v in decoder.items() if v is not None}}
    return out


def plain_step_in_tree(tree: Path, args: argparse.Namespace, overrides: dict) -> float:
    out = subprocess.run([sys.executable, "-c", PLAIN_STEP, str(tree), str(args.batch), str(args.frames),
                          str(args.tokens), str(args.reps), repr(overrides)],
                         capture_output=True, text=True, check=True).stdout
    return float(out.strip().splitlines()[-1])


def default_path_vs_rev(args: argparse.Namespace, overrides: dict, results: dict) -> None:
    """The plain (default) training step, and beam-5 decoding when the pipeline's en-de baseline exists,
    of this code against ``args.baseline_rev``'s lib/ (git archive into a temporary folder), each in its
    own subprocess, alternating ``args.rounds`` times; adds ``results["default_path"]``."""
    with tempfile.TemporaryDirectory() as tmp:
        old = Path(tmp) / "old"
        old.mkdir()
        archive = subprocess.run(["git", "archive", "--format=tar", args.baseline_rev, "lib"], cwd=ROOT,
                                 capture_output=True, check=True).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tf:
            tf.extractall(old, filter="data")
        now_t, old_t = [], []
        for _ in range(args.rounds):
            old_t.append(plain_step_in_tree(old, args, overrides))
            now_t.append(plain_step_in_tree(ROOT, args, overrides))
        ratio = statistics.median(now_t) / statistics.median(old_t)
        print(f"\nplain (default) training step, this code vs {args.baseline_rev}: "
              f"{statistics.median(now_t) * 1e3:.1f} ms vs {statistics.median(old_t) * 1e3:.1f} ms "
              f"(medians of {args.rounds} alternating rounds) = {ratio:.3f}x (target: within 3 %)")
        results["default_path"] = {"now_ms": round(statistics.median(now_t) * 1e3, 1),
                                   "baseline_rev": args.baseline_rev,
                                   "baseline_ms": round(statistics.median(old_t) * 1e3, 1), "ratio": round(ratio, 3)}
        model_path, prepared = ROOT / "runs/baseline/en-de/seed1/model.pt", ROOT / "data/prepared/en-de"
        if model_path.is_file() and (prepared / "tst-COMMON.tsv").is_file():
            now_d, old_d = [], []
            for _ in range(args.rounds):
                for tree, out in ((old, old_d), (ROOT, now_d)):
                    res = subprocess.run([sys.executable, "-c", PLAIN_DECODE, str(tree), str(model_path), str(prepared)],
                                         capture_output=True, text=True, check=True).stdout
                    out.append(float(res.strip().splitlines()[-1]))
            d_ratio = statistics.median(old_d) / statistics.median(now_d)
            print(f"plain (default) beam-5 decoding of {model_path.relative_to(ROOT)} on en-de tst-COMMON, this code "
                  f"vs {args.baseline_rev}: {statistics.median(now_d):.1f} vs {statistics.median(old_d):.1f} "
                  f"sentences/s = {d_ratio:.3f}x the time (target: within 3 %)")
            results["default_path"].update(decode_now=round(statistics.median(now_d), 2),
                                           decode_baseline=round(statistics.median(old_d), 2),
                                           decode_time_ratio=round(d_ratio, 3))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--tokens", type=int, default=15)
    ap.add_argument("--sentences", type=int, default=200)
    ap.add_argument("--decode-reps", type=int, default=3, help="decoding passes per system (median)")
    ap.add_argument("--baseline-rev", help="also time the plain training step (and decoding) of this git "
                    "revision's lib/ against this code's (default: skipped)")
    ap.add_argument("--json", type=Path, help="also write the figures here")
    args = ap.parse_args()
    p = load_params(ROOT / "params.yaml")
    overrides = dict(p.model.overrides)
    amp = resolve_amp("auto", torch.device("cpu"))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, precision {amp}; demo model "
          f"(model.overrides {overrides}); batch {args.batch} x {args.frames} frames x {args.tokens} tokens")
    results: dict[str, dict] = {}

    # 1. The default path against another revision's code, alternating subprocesses (opt-in).
    if args.baseline_rev:
        default_path_vs_rev(args, overrides, results)

    # 2. Every smoothing definition against plain attention: training step and beam-5 decoding.
    torch.manual_seed(0)
    batch = (torch.randn(args.batch, args.frames, 80), torch.full((args.batch,), args.frames),
             torch.randint(4, 200, (args.batch, args.tokens)), torch.randint(4, 200, (args.batch, args.tokens)))
    model_path = ROOT / "runs/baseline/en-de/seed1/model.pt"
    prepared = ROOT / "data/prepared/en-de"
    decode = model_path.is_file() and (prepared / "tst-COMMON.tsv").is_file()
    if decode:
        from lib.data.dataset import SpeechDataset
        from lib.decode.beam_search import BeamSearchConfig, translate_dataset
        from lib.model.checkpoint import read_model_state

        state = read_model_state(model_path)
        base_cfg = state["model_config"]
        ds = SpeechDataset(prepared, "tst-COMMON", "st")

        class First:  # the first n sentences
            def __init__(self, n: int) -> None:
                self.n = min(n, len(ds))
                self.n_frames, self.rows, self.targets = ds.n_frames[: self.n], ds.rows[: self.n], ds.targets[: self.n]

            def __len__(self) -> int:
                return self.n

            def features(self, i: int):
                return ds.features(i)

            def decode(self, ids):
                return ds.decode(ids)

        subset = First(args.sentences)
    print(f"\n{'system':<14} {'train ms/step':>14} {'x plain':>8}" + (f" {'decode sent/s':>14} {'x plain':>8}"
                                                                         if decode else ""))
    rows = {}
    for name, extra in configs(overrides).items():
        torch.manual_seed(0)
        cfg = model_config("demo", vocab_size=200, **overrides, **extra)
        t = step_time(S2TTransformer(cfg).train(), batch, args.reps, amp)
        row = {"train_ms": round(t * 1e3, 1)}
        if decode:
            cfg_d = ModelConfig.from_dict({**base_cfg, **extra})
            model = S2TTransformer(cfg_d)
            model.load_state_dict(state["model"], strict=False)  # smoothing params stay at their init
            if name == "plain":  # warm-up (first calls of the kernels, allocator)
                translate_dataset(model.eval(), subset, 20000, BeamSearchConfig(beam=5, max_len_b=100), "cpu",
                                  progress=False, amp=amp)
            times = []
            for _ in range(args.decode_reps):
                t0 = time.perf_counter()
                translate_dataset(model.eval(), subset, 20000, BeamSearchConfig(beam=5, max_len_b=100), "cpu",
                                  progress=False, amp=amp)
                times.append(time.perf_counter() - t0)
            row["decode_sent_per_s"] = round(len(subset) / statistics.median(times), 2)
        rows[name] = row
        plain = rows["plain"]
        line = f"{name:<14} {row['train_ms']:>14.1f} {row['train_ms'] / plain['train_ms']:>8.2f}"
        if decode:
            line += f" {row['decode_sent_per_s']:>14.2f} {plain['decode_sent_per_s'] / row['decode_sent_per_s']:>8.2f}"
        print(line)
    if not decode:
        print("decoding: no trained model at runs/baseline/en-de/seed1/model.pt (run `dvc repro train_baseline`)")
    else:
        print(f"(decoding: beam 5, first {subset.n} tst-COMMON sentences of en-de, median of {args.decode_reps} passes; "
              "'x plain' = time relative to plain)")
    results["systems"] = rows
    if args.json:
        atomic_write_json(args.json, results)


if __name__ == "__main__":
    run_tool(main)

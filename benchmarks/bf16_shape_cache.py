"""Why bf16 autocast wins on fixed batches and loses in training on some CPUs: oneDNN compiles a
bf16 kernel per matrix shape and caches it per process. Times ST training updates (demo model,
fused Adam, the prepared en-de batches) in blocks of `--block` batches, fp32 then bf16, four
rounds; `seen`: every round repeats the same batches (shapes cached after round 0), `new`:
every round takes new batches (as a training run does). Prints the median ms per update of each
block after its first update.

    python benchmarks/bf16_shape_cache.py [--block 10] [--task st]
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lib.data.dataset import SpeechDataset, batch_by_frames, collate  # noqa: E402
from lib.model.s2t_transformer import S2TTransformer, model_config  # noqa: E402
from lib.params import load_params  # noqa: E402
from lib.precision import autocast  # noqa: E402
from lib.train.loop import Criterion  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--block", type=int, default=10)
    ap.add_argument("--task", default="st", choices=["asr", "st"])
    args = ap.parse_args()
    p = load_params(ROOT / "params.yaml")
    cfg = p.train_asr if args.task == "asr" else p.train_st
    ds = SpeechDataset(ROOT / p.data.prepared_dir / "en-de", "train", args.task, max_frames=cfg.max_frames_train)
    order = batch_by_frames(ds.n_frames, cfg.max_frames, shuffle=True, seed=1)
    mcfg = model_config(p.model.size, vocab_size=ds.vocab_size,
                        ctc_vocab_size=ds.vocab_size if cfg.ctc_weight > 0 else None, **p.model.overrides)
    print(f"{args.task.upper()} batches (max_frames {cfg.max_frames}), blocks of {args.block}, median ms per update "
          "after each block's first")
    for mode in ("seen", "new"):
        # A fresh process per mode would be cleaner; `new` runs second and uses batches `seen` never did.
        offset = 0 if mode == "seen" else 4 * args.block
        torch.manual_seed(0)
        base = S2TTransformer(mcfg).train()
        runs = {}
        for amp in ("none", "bf16"):
            m = copy.deepcopy(base)
            runs[amp] = (Criterion(m, cfg.label_smoothing, cfg.ctc_weight),
                         torch.optim.Adam(m.parameters(), lr=1e-4, fused=True))
        cells = []
        for rnd in range(4):
            start = offset + (0 if mode == "seen" else rnd * args.block)
            block = [collate(ds, idx) for idx in order[start:start + args.block]]
            for amp, (crit, opt) in runs.items():
                times = []
                for b in block:
                    t0 = time.perf_counter()
                    with autocast(torch.device("cpu"), amp):
                        loss, _ = crit(b)
                    opt.zero_grad()
                    loss.backward()
                    opt.step()
                    times.append(time.perf_counter() - t0)
                cells.append(f"{'fp32' if amp == 'none' else amp} {1e3 * statistics.median(times[1:]):.0f}")
        print(f"  {mode:<5} " + " | ".join(", ".join(cells[i:i + 2]) for i in range(0, len(cells), 2)))


if __name__ == "__main__":
    main()

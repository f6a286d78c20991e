"""Training update time on the pipeline's real batches, fp32 against the default precision (`amp:
auto`, bf16 autocast where the CPU has it), side by side in one run: the ASR batches
(`train_asr.max_frames`, English targets, CTC weight `train_asr.ctc_weight`) and the ST batches
(`train_st.max_frames`), both from the prepared en-de training data, the demo model with
params.yaml's `model.overrides`. Unlike train_throughput.py's fixed 20 x 300 batch, this is what
the pipeline's training stages actually run (SpecAugment off, same batches for both precisions).

    python benchmarks/train_real_batches.py [--updates 30] [--pair en-de]
"""
from __future__ import annotations

import argparse
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
from lib.precision import autocast, resolve_amp  # noqa: E402
from lib.train.loop import Criterion  # noqa: E402


def update_times(task: str, cfg, p, pair: str, amp: str, n: int) -> list[float]:
    ds = SpeechDataset(ROOT / p.data.prepared_dir / pair, "train", task, max_frames=cfg.max_frames_train)
    batches = [collate(ds, idx) for idx in batch_by_frames(ds.n_frames, cfg.max_frames, shuffle=True, seed=1)[:n + 3]]
    torch.manual_seed(0)
    mcfg = model_config(p.model.size, vocab_size=ds.vocab_size,
                        ctc_vocab_size=ds.vocab_size if cfg.ctc_weight > 0 else None, **p.model.overrides)
    model = S2TTransformer(mcfg).train()
    criterion = Criterion(model, cfg.label_smoothing, cfg.ctc_weight)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    times = []
    for i, b in enumerate(batches):
        t0 = time.perf_counter()
        with autocast(torch.device("cpu"), amp):
            loss, _ = criterion(b)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i >= 3:  # warm-up
            times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--updates", type=int, default=30)
    ap.add_argument("--pair", default="en-de")
    args = ap.parse_args()
    p = load_params(ROOT / "params.yaml")
    default = resolve_amp("auto", torch.device("cpu"))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; default precision (amp: auto): {default}; "
          f"{args.updates} updates per row after 3 warm-up updates, same batches for both precisions")
    print(f"{'batches':<34} {'fp32 ms/upd':>12} {default + ' ms/upd':>12} {'speed-up':>9}")
    for task, cfg in (("asr", p.train_asr), ("st", p.train_st)):
        fp32 = statistics.mean(update_times(task, cfg, p, args.pair, "none", args.updates))
        fast = statistics.mean(update_times(task, cfg, p, args.pair, default, args.updates))
        label = f"{task.upper()} (max_frames {cfg.max_frames}, ctc {cfg.ctc_weight})"
        print(f"{label:<34} {fp32 * 1e3:>12.1f} {fast * 1e3:>12.1f} {fp32 / fast:>8.2f}x")


if __name__ == "__main__":
    main()

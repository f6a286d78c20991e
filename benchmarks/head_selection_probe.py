"""Can head selection learn a selection? A CPU probe of the two estimators (docs/variants.md).

One encoder head-selection layer (d 32, H 4 of H' 8 candidates, 3 tasks, float32) with random,
distinct candidate heads learns only its selection logits φ: its q/k/v/out projections are frozen
and equal to a teacher's, whose per-task selection is known. The teacher's selection differs from
the student's initial one in about half of the (task, slot) pairs (per slot: the other member of the
group / another candidate of the slot), and the loss is the mean squared difference of the two
layers' outputs on fresh random inputs each update. Adam on φ with the multilingual run's schedule
(inverse_sqrt, warm-up 60, 3 x 360 updates) at peak lr ``--lr`` (the default ``variant_lr``) and at
the encoder group's 0.2 x 1.5e-3 of before. A control run has the teacher select the student's
initial selection (nothing should move: the noise floor).

Per estimator, strategy and lr, over ``--seeds``: the share of (task, slot) where the final eval
selection is the teacher's ("right"), the share of the slots the teacher changed that the student
changed to the teacher's ("found"), and in the control the share that moved ("moved in control").

    python benchmarks/head_selection_probe.py             # about a minute on 2 cores
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from lib.model.attention import build_attention, set_head_selection_noise, set_head_selection_tau  # noqa: E402
from lib.train.head_selection import head_selection_noise  # noqa: E402
from lib.train.objectives import learning_rate  # noqa: E402

D, H, CAND, TASKS = 32, 4, 8, 3


def teacher_selection(init: torch.Tensor, strategy: str, change: bool, gen: torch.Generator) -> torch.Tensor:
    """(tasks, H) sorted candidate ids, one per slot s (candidates {s, s + H}): the student's initial
    member of the slot, swapped for the other with probability 1/2 when ``change``."""
    out = []
    for t in range(init.shape[0]):
        # the initial member of each slot (group: its selection; subset: aligned at init, one per slot)
        member = {int(c) % H: int(c) for c in init[t]}
        if len(member) != H:
            raise RuntimeError("subset's initial selection is not aligned (one candidate per slot)")
        row = []
        for s in range(H):
            c = member[s]
            if change and torch.rand((), generator=gen) < 0.5:
                c = c + H if c < H else c - H
            row.append(c)
        out.append(sorted(row))
    return torch.tensor(out)


def run(strategy: str, estimator: str, lr: float, seed: int, *, change: bool, updates: int, warmup: int) -> dict:
    torch.manual_seed(seed)
    m = build_attention({"type": "head_select", "strategy": strategy, "candidates": CAND, "tasks": TASKS,
                         "estimator": estimator}, D, H, 0.0)
    init = m.selector.eval_selection().clone()
    want = teacher_selection(init, strategy, change, torch.Generator().manual_seed(1000 + seed))
    teacher = build_attention({"type": "head_select", "strategy": strategy, "candidates": CAND, "tasks": TASKS},
                              D, H, 0.0).eval()
    teacher.load_state_dict(m.state_dict())
    with torch.no_grad():  # the teacher's logits select `want`: +5 on it, -5 elsewhere
        teacher.selector.head_logits.fill_(-5.0).scatter_(1, want, 5.0)
    assert torch.equal(teacher.selector.eval_selection().sort(dim=-1).values, want)
    for name, p in m.named_parameters():
        p.requires_grad_(name == "selector.head_logits")
    opt = torch.optim.Adam([m.selector.head_logits], lr=lr, betas=(0.9, 0.98))
    m.train()
    gen = torch.Generator().manual_seed(seed)
    for u in range(updates):
        set_head_selection_tau(m, 5.0)
        set_head_selection_noise(m, head_selection_noise(u, 1.0, 0.1, updates))
        for g in opt.param_groups:
            g["lr"] = learning_rate(u, "inverse_sqrt", lr, warmup, updates)
        x = torch.randn(12, 10, D, generator=gen)
        task = torch.randint(0, TASKS, (12,), generator=gen)
        with torch.no_grad():
            target = teacher(x, None, task=task).out
        loss = (m(x, None, task=task).out - target).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    final = m.selector.eval_selection()
    right = found = moved = new = 0
    for t in range(TASKS):  # as sets: a subset's slots may collide
        f, w, i = set(final[t].tolist()), set(want[t].tolist()), set(init[t].tolist())
        right += len(f & w)
        found += len(f & (w - i))
        new += len(w - i)
        moved += len(f - i)
    return {"right": right / (TASKS * H), "found": found / new if new else float("nan"), "moved": moved / (TASKS * H)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--updates", type=int, default=1080)
    ap.add_argument("--lr", type=float, default=0.025, help="peak lr of the logits (multi.head_selection.variant_lr)")
    args = ap.parse_args()
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    print("| strategy | estimator | peak lr | right | found | moved in control |")
    print("|---|---|---|---|---|---|")
    for strategy in ("group", "subset"):
        for estimator in ("paper", "gumbel"):
            for lr in (args.lr, 0.2 * 1.5e-3):
                res = [run(strategy, estimator, lr, s, change=True, updates=args.updates, warmup=60)
                       for s in range(1, args.seeds + 1)]
                ctl = [run(strategy, estimator, lr, s, change=False, updates=args.updates, warmup=60)
                       for s in range(1, args.seeds + 1)]
                print(f"| {strategy} | {estimator} | {lr:g} | {statistics.fmean(r['right'] for r in res):.0%} | "
                      f"{statistics.fmean(r['found'] for r in res):.0%} | "
                      f"{statistics.fmean(r['moved'] for r in ctl):.0%} |", flush=True)
    print(f"\n{args.seeds} seeds x {args.updates} updates each; {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()

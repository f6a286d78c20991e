"""The report's section on multilingual ST with attention head selection (Gong et al.; docs/variants.md): per system, BLEU per pair and on average (mean ± std over ``multi.seeds``), Δ average vs the
multilingual baseline next to the paper's Table 4 deltas, params, decoding speed, the bilingual
baselines of the same pairs and seeds for reference, and the head-sharing heatmaps. Reads only small
outputs (metrics/variants/multi, data/decoded/variants/multi, metrics/baseline). No torch."""
from __future__ import annotations

import itertools
import math
import statistics
from collections import Counter
from pathlib import Path
from typing import Sequence

from lib import layout
from lib.layout import RunPaths
from lib.params.multi import MultiParams
from lib.report.figures import Figures
from lib.stats import ci_cell, mean_ci
from lib.io import read_json
from lib.stats import mean_std

# Seed 004's Table 4 (multilingual ST on mTEDx, AVG-A BLEU): deltas vs its shared H = 4 baseline.
PAPER_TABLE4 = {"baseline": 13.2, "baseline_h8": 13.7, "group": 15.2, "subset": 13.3}
SYSTEM_NAMES = {"baseline": "H heads, tag only", "subset": "subset selection", "group": "group selection",
                "baseline_h8": "H' heads, no selection"}


def selection_agreement(selections: Sequence[dict], which: str = "final") -> float | None:
    """Cross-seed agreement of head selections: over every pair of seeds and every (side, task, layer),
    the share of the H selected candidates that both seeds selected, |S_a ∩ S_b| / H, averaged.
    ``selections``: each seed's selection.json (``{"init": ..., "final": ...}``); ``which``: compare the
    ``init`` or the ``final`` selections. None with fewer than two seeds or no selecting layer.

    Chance (:func:`chance_agreement`): two independent uniformly random selections share H / H' of
    their heads in expectation, for ``subset`` (E|S_a ∩ S_b| = H · H / H') and for ``group`` (each of
    the H groups of H' / H candidates agrees with probability H / H')."""
    shares = []
    for a in range(len(selections)):
        for b in range(a + 1, len(selections)):
            sa, sb = selections[a][which], selections[b][which]
            for side, d in sa.items():
                for t, layers in enumerate(d["selected"]):
                    for li, sel in enumerate(layers):
                        other = sb[side]["selected"][t][li]
                        shares.append(len(set(sel) & set(other)) / len(sel))
    return statistics.fmean(shares) if shares else None


def chance_agreement(n_heads: int, candidates: int) -> float:
    """H / H': the expected share of heads that two independent uniformly random selections share."""
    return n_heads / candidates


def _slot_pattern(per_task: Sequence[Sequence[int]], slot: int, n_heads: int, candidates: int) -> tuple:
    """How the tasks use one out_proj slot, up to relabelling that slot's candidates {slot, slot + H, ...}:
    per task the set of the slot's candidates it selected, as local indices, in the canonical
    (smallest) form over every permutation of those indices."""
    members = list(range(slot, candidates, n_heads))
    local = [[members.index(c) for c in sel if c % n_heads == slot] for sel in per_task]
    return min(tuple(tuple(sorted(perm[i] for i in chosen)) for chosen in local)
               for perm in itertools.permutations(range(len(members))))


def sharing_agreement(selections: Sequence[dict], candidates: int, which: str = "final") -> float | None:
    """Cross-seed agreement of how the tasks share heads, invariant to which copy a task picked: over every
    pair of seeds and every (side, layer, out_proj slot), whether both seeds have the same
    :func:`_slot_pattern` (e.g. for group with 2 candidates per group and 3 languages: all three on one
    candidate, or which language stands alone). None with fewer than two seeds.

    Why this and not :func:`selection_agreement`: the candidates of a slot start as copies of the same
    ASR head (``expand_candidate_heads``), so which copy a seed ends on is a coin toss that says nothing;
    which languages share a head, and which get one of their own, is what the paper's heatmaps read."""
    hits = []
    for a, b in itertools.combinations(range(len(selections)), 2):
        sa, sb = selections[a][which], selections[b][which]
        for side, d in sa.items():
            tasks_a, tasks_b = d["selected"], sb[side]["selected"]
            for li in range(len(tasks_a[0])):
                per_a = [tasks_a[t][li] for t in range(len(tasks_a))]
                per_b = [tasks_b[t][li] for t in range(len(tasks_b))]
                n_heads = len(per_a[0])
                for slot in range(n_heads):
                    hits.append(_slot_pattern(per_a, slot, n_heads, candidates)
                                == _slot_pattern(per_b, slot, n_heads, candidates))
    return statistics.fmean(hits) if hits else None


def _chance_pattern_law(n_heads: int, candidates: int, n_tasks: int, strategy: str) -> Counter:
    """The law of one slot's :func:`_slot_pattern` when the tasks select independently and uniformly at
    random (``group``: one candidate per group; ``subset``: an H-subset of the H' candidates). A task's
    choice within one slot is independent of the other tasks', so the law is a product of per-task
    marginals; every slot has the same law."""
    slot0 = list(range(0, candidates, n_heads))
    if strategy == "group":
        marginal = Counter({(i,): 1 for i in range(len(slot0))})
    elif strategy == "subset":
        marginal = Counter(tuple(slot0.index(c) for c in sub if c in slot0)
                           for sub in itertools.combinations(range(candidates), n_heads))
    else:
        raise ValueError(f"unknown head-selection strategy {strategy!r}")
    total = sum(marginal.values())
    law: Counter = Counter()
    for combo in itertools.product(marginal, repeat=n_tasks):
        weight = 1.0
        for choice in combo:
            weight *= marginal[choice] / total
        law[_slot_pattern([[slot0[i] for i in choice] for choice in combo], 0, n_heads, candidates)] += weight
    return law


def chance_sharing_agreement(n_heads: int, candidates: int, n_tasks: int, strategy: str) -> float:
    """:func:`sharing_agreement` of two seeds whose tasks select uniformly at random: Σ p(pattern)²."""
    return sum(p * p for p in _chance_pattern_law(n_heads, candidates, n_tasks, strategy).values())


def partition(pattern: tuple, tasks: Sequence[str]) -> str:
    """A slot pattern as the partition of the tasks by identical choice, e.g. ``de | es it``."""
    blocks: dict[tuple, list[str]] = {}
    for task, chosen in zip(tasks, pattern):
        blocks.setdefault(chosen, []).append(task)
    return " | ".join(" ".join(b) for b in sorted(blocks.values(), key=lambda b: (-len(b), tasks.index(b[0]))))


def partition_shares(selections: Sequence[dict], candidates: int, tasks: Sequence[str], which: str) -> Counter:
    """Share of (seed, side, layer, slot) with each :func:`partition` of the tasks."""
    counts: Counter = Counter()
    for sel in selections:
        for d in sel[which].values():
            chosen = d["selected"]
            for li in range(len(chosen[0])):
                per = [chosen[t][li] for t in range(len(chosen))]
                for slot in range(len(per[0])):
                    counts[partition(_slot_pattern(per, slot, len(per[0]), candidates), tasks)] += 1
    n = sum(counts.values())
    return Counter({k: v / n for k, v in counts.items()})


def chance_partition_shares(n_heads: int, candidates: int, tasks: Sequence[str], strategy: str) -> Counter:
    out: Counter = Counter()
    for pattern, p in _chance_pattern_law(n_heads, candidates, len(tasks), strategy).items():
        out[partition(pattern, tasks)] += p
    return out


def multi_section(root: Path, mp: MultiParams, pairs: Sequence[str], seeds: Sequence[int],
                  figures: Figures | None = None) -> tuple[str, dict]:
    """(Markdown, flat summary keys ``multi/<system>/<pair>/bleu``, ``multi/<system>/avg_bleu``);
    ("", {}) when ``multi.systems`` is empty."""
    if not mp.systems:
        return "", {}
    rows, flat = {}, {}
    for system in mp.systems:
        runs = []
        for seed in mp.seeds:
            run = RunPaths(root, "multi", None, seed, variant=system)
            m = read_json(run.metrics, f"train_multi@{system}-{seed}")
            speed = read_json(run.decoded / "timing.json", f"train_multi@{system}-{seed}")
            sel = read_json(run.decoded / "selection.json", f"train_multi@{system}-{seed}") \
                if system in ("subset", "group") else None
            runs.append({"metrics": m, "speed": speed["decode_sents_per_s"], "selection": sel})
        rows[system] = runs
    bilingual = {}
    for pair in pairs:
        vals = [read_json(RunPaths(root, "baseline", pair, s).metrics, f"train_baseline@{pair}-{s}", keys=("bleu",))["bleu"]
                for s in mp.seeds if s in seeds and RunPaths(root, "baseline", pair, s).metrics.is_file()]
        bilingual[pair] = vals
    base_avg = statistics.fmean(r["metrics"]["avg_bleu"] for r in rows["baseline"]) if "baseline" in rows else None
    head = ("| system | " + " | ".join(pairs) + " | avg BLEU | avg chrF | Δ avg vs multilingual baseline [95 % CI] | paper Δ "
            "(Table 4, AVG-A) | params | decoding sent/s (beam 5) | selections changed | mean abs. Δφ |")
    lines = [head, "|" + "---|" * (len(pairs) + 9)]
    moved = []
    for system, runs in rows.items():
        cells = []
        for pair in pairs:
            m, s = mean_std([r["metrics"][pair]["bleu"] for r in runs])
            cells.append(f"{m:.2f} ± {s:.2f}")
            flat[f"multi/{system}/{pair}/bleu"] = round(m, 2)
        am, as_ = mean_std([r["metrics"]["avg_bleu"] for r in runs])
        cm, _ = mean_std([r["metrics"]["avg_chrf"] for r in runs])
        flat[f"multi/{system}/avg_bleu"] = round(am, 2)
        flat[f"multi/{system}/avg_bleu_std"] = round(as_, 2)
        flat[f"multi/{system}/avg_chrf"] = round(cm, 2)
        delta = ""
        if base_avg is not None and system != "baseline":
            # per seed against the multilingual baseline of the same seed (mp.seeds order in both)
            dm, dh = mean_ci([r["metrics"]["avg_bleu"] - b["metrics"]["avg_bleu"] for r, b in zip(runs, rows["baseline"])])
            delta = ci_cell(dm, dh)
            flat[f"multi/{system}/delta_avg_bleu"] = round(am - base_avg, 2)
            if not math.isnan(dh):
                flat[f"multi/{system}/delta_avg_bleu_ci95"] = round(dh, 2)
        paper = "" if system == "baseline" else f"{PAPER_TABLE4[system] - PAPER_TABLE4['baseline']:+.1f}"
        changed = [r["metrics"].get("selection_changed_fraction") for r in runs]
        changed_s = "–" if any(c is None for c in changed) else f"{statistics.fmean(changed):.0%}"
        dphi = [r["metrics"].get("head_logits_mean_abs_change") for r in runs]
        dphi_s = "–" if any(c is None for c in dphi) else f"{statistics.fmean(dphi):.3f}"
        if changed_s != "–":
            flat[f"multi/{system}/selection_changed"] = round(statistics.fmean(changed), 4)
        if dphi_s != "–":
            flat[f"multi/{system}/mean_abs_dphi"] = round(statistics.fmean(dphi), 4)
        speed = statistics.fmean(r["speed"] for r in runs)
        lines.append(f"| {system} ({SYSTEM_NAMES[system]}) | " + " | ".join(cells) + f" | {am:.2f} ± {as_:.2f} | "
                     f"{cm:.2f} | {delta} | {paper} | {runs[0]['metrics']['params']:,} | {speed:.1f} | {changed_s} | "
                     f"{dphi_s} |")
        sels = [r["selection"] for r in runs if r["selection"]]
        if sels:
            n_heads = len(next(iter(sels[0]["final"].values()))["selected"][0][0])
            chance = chance_agreement(n_heads, mp.head_selection.candidates)
            final, init = selection_agreement(sels, "final"), selection_agreement(sels, "init")
            n_tasks = len(next(iter(sels[0]["final"].values()))["selected"])
            cands = mp.head_selection.candidates
            share_final, share_init = sharing_agreement(sels, cands, "final"), sharing_agreement(sels, cands, "init")
            share_chance = chance_sharing_agreement(n_heads, cands, n_tasks, system)
            langs = [pair.split("-")[-1] for pair in pairs]
            shares = {w: partition_shares(sels, cands, langs, w) for w in ("final", "init")}
            chance_shares = chance_partition_shares(n_heads, cands, langs, system)
            top = sorted(set(shares["final"]) | set(shares["init"]), key=lambda k: -shares["final"].get(k, 0.0))[:5]
            patterns = ", ".join(f"`{k}` {shares['final'].get(k, 0.0):.0%} ({shares['init'].get(k, 0.0):.0%}; "
                                 f"{chance_shares.get(k, 0.0):.0%})" for k in top)
            side_moves = "; ".join(
                f"{side}: {statistics.fmean(r['metrics']['movement'][side]['changed'] for r in runs):.0%} changed, "
                f"mean abs. Δφ {statistics.fmean(r['metrics']['movement'][side]['mean_abs_dphi'] for r in runs):.3f}"
                for side in runs[0]["metrics"].get("movement", {}))
            if final is None:
                moved.append(f"* {system}: {side_moves}; one seed, no cross-seed agreement.")
            else:
                flat[f"multi/{system}/agreement"] = round(final, 4)
                flat[f"multi/{system}/sharing_agreement"] = round(share_final, 4)
                moved.append(f"* {system}: {side_moves}; cross-seed agreement of the selected candidates "
                             f"{final:.0%} at the end ({init:.0%} at initialisation; chance H/H' = {chance:.0%}); "
                             f"of the sharing pattern {share_final:.0%} ({share_init:.0%} at initialisation; "
                             f"chance {share_chance:.0%}). Sharing patterns over (seed, side, layer, slot), at the "
                             f"end (at initialisation; uniformly random): {patterns}.")
    bil = [f"{statistics.fmean(v):.2f}" if v else "–" for v in bilingual.values()]
    lines.append("| bilingual baselines (reference; one model per pair, same seeds) | " + " | ".join(bil) +
                 " | | | | | | | | |")
    updates = sorted({r["metrics"].get("updates") for runs in rows.values() for r in runs} - {None})
    hs = mp.head_selection
    parts = ["\n## Multilingual ST with attention head selection (Gong et al.)\n",
             f"One model for {', '.join(pairs)} (target-language tag as the decoder's start token, joint vocabulary), "
             f"encoder from runs/asr/{mp.asr_init}; head selection keyed on the target language in "
             f"{' and '.join(mp.head_selection.apply_to)}: H of H' = {mp.head_selection.candidates} candidate heads per "
             f"layer; {', '.join(map(str, updates)) or '?'} updates (`train_st` settings otherwise); estimator "
             f"{hs.estimator}, logits at peak lr {hs.variant_lr}; seeds {mp.seeds}. BLEU on each pair's "
             "tst-COMMON (mean ± std over seeds). 'selections changed': share of (task, layer) whose selection at "
             "the end differs from the one at initialisation (near 0: the heatmaps mostly show the random "
             "initialisation of the selection logits); 'mean abs. Δφ': the logits' mean absolute change from "
             "initialisation.\n",
             "\n".join(lines) + "\n",
             *(["\nWhat moved, per side (mean over seeds), and whether the seeds agree: the share of selected heads "
                "two seeds both selected, over every pair of seeds and (side, language, layer), against H/H', the "
                "share two independent uniformly random selections share; and, since a slot's candidates start as "
                "copies of one ASR head, the share of (side, layer, slot) where two seeds have the same sharing "
                "pattern (which languages use the same candidate, up to relabelling the copies), against the same "
                "share for uniformly random selections.\n\n" + "\n".join(moved) + "\n"]
               if moved else []),
             "\nThe paper's Table 4 (mTEDx, 13 directions, 400 epochs): group +2.0, subset +0.1, H = 8 +0.5 BLEU over the "
             "shared H = 4 model. Here the three languages have equal (synthetic) data, so the paper's resource "
             "effects (low-resource languages sharing more heads with high-resource ones) cannot be tested.\n"]
    for system in mp.systems:
        for seed in mp.seeds:
            folder = layout.multi_plots(root, system, seed)
            for png in sorted(folder.glob("*.png")) if folder.is_dir() else []:
                if png.name == "head_sharing_none.png":  # a system without head selection: nothing to show here
                    continue
                parts.append((figures or Figures(root)).link(png, f"{system} seed {seed} {png.stem}"))
    return "\n".join(parts), flat

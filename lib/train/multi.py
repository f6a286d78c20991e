"""One multilingual ST run (Gong et al.; docs/variants.md): one model over all ``pairs``, the
target-language tag as the decoder's start token, head selection keyed on the target language.

Systems (``multi.systems``):

    baseline     H heads (the model size's n_heads), tag only: the paper's shared "S2T H=4" row
    subset       H' = head_selection.candidates candidate heads per layer, each task selects H (top-H)
    group        the same with H strided groups of H'/H candidates, one head per group
    baseline_h8  H' heads, all used (the paper's "H = 8" row: twice the heads at the same width)

All start from the ASR model of ``multi.asr_init`` (runs/asr/<pair>/model.pt; the demo's pairs share
one synthetic English, so any pair's ASR model speaks for all). Selection systems tile the ASR's H
heads into the H' candidates (``expand_candidate_heads``), so every group selection reproduces the
ASR encoder at initialisation; with ``train_st.init_decoder`` (a demo deviation) the decoder's layers
start from the ASR decoder's, tiled the same way in selecting decoder layers. Training settings are
``train_st``'s with ``multi.max_updates`` (null: 3 × ``train_st.max_updates``) and, for the selection
systems, the logits at ``multi.head_selection.variant_lr`` in a group of their own; dev BLEU during training is the mean over the pairs of a
greedy decode of each pair's first dev sentences (``decode.dev_sentences`` split evenly).

Outputs (lib/layout.py, run ``variants/multi/<system>/seed<k>``): model.pt (+ tasks), timing.json,
data/decoded/.../hyps.<pair>.tst-COMMON.txt and refs, selection.json (the eval selections and
logits at initialisation and at the end), metrics/<run>.json (per pair BLEU/chrF, averages, params,
what moved: the share of (task, layer) selections that changed from initialisation and the mean
|Δφ| of the logits, overall and per side), training curves, and the
head-sharing heatmaps of the paper's Fig. 3 (plots/variants/multi/<system>/seed<k>/).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import torch

from lib import layout
from lib.data.dataset import first_batches
from lib.data.multilingual import JOINT_SPM, MultiSpeechDataset, load_tasks
from lib.decode.beam_search import BeamSearchConfig, translate_dataset
from lib.decode.metrics import bleu, bleu_signature, chrf
from lib.io import atomic_write_json, atomic_write_text
from lib.layout import RunPaths
from lib.model.attention.head_selection import set_subset_lead
from lib.model import checkpoint as model_file
from lib.model.s2t_transformer import S2TTransformer, model_config
from lib.params import Params
from lib.precision import resolve_amp
from lib.train.precision import PROBE_BATCHES, resolve_train_precision
from lib.train import checkpoint as ckpt
from lib.train.distributed import dist_info
from lib.train.loop import OPTIMIZER, train
from lib.train.resume import decide_resume
from lib.train.head_selection import HeadSelectionTraining
from lib.train.run import FINAL_CHECKPOINTS, LIVE_PLOTS, _truncate_live_logs, auto_device, copy_curves, file_digest

SELECTION_SYSTEMS = ("subset", "group")


class PairView:
    """The items of one pair inside a :class:`MultiSpeechDataset` (optionally the first ``n``), as
    ``translate_dataset`` reads a dataset."""

    def __init__(self, ds: MultiSpeechDataset, pair: str, n: int | None = None) -> None:
        idx = ds.indices_of(pair)
        self.ds, self.idx = ds, idx if n is None else idx[:n]
        self.n_frames = ds.n_frames[self.idx]
        self.rows = [ds.rows[i] for i in self.idx]
        self.targets = [ds.targets[i] for i in self.idx]
        self.task_id, self.start_id = ds.task_of_pair[pair], ds.tag_id_of_pair[pair]

    def __len__(self) -> int:
        return len(self.idx)

    def features(self, i: int) -> torch.Tensor:
        return self.ds.features(self.idx[i])

    def decode(self, ids: list[int]) -> str:
        return self.ds.decode(ids)

    def reference(self, i: int) -> str:
        return self.ds.reference(self.idx[i])


def model_overrides(p: Params, system: str, tasks: int) -> dict[str, Any]:
    """ModelConfig overrides of one multilingual system (on top of ``model.overrides``)."""
    from lib.model.spec import decoder_head_selection_spec, head_selection_spec

    base = model_config(p.model.size, **p.model.overrides)
    hs = dataclasses.asdict(p.multi.head_selection)
    hs.pop("subset_init_lead")  # set on the built model (train_multi), not part of the layer spec
    if system == "baseline":
        return {}
    if system == "baseline_h8":
        return {"n_heads": hs["candidates"]}
    if system not in SELECTION_SYSTEMS:
        raise ValueError(f"multi.systems: unknown system {system!r}")
    hdef = {**hs, "strategy": system}
    enc = head_selection_spec([{"type": "full"}] * base.encoder_layers, hdef, base.encoder_layers,
                              n_heads=base.n_heads, tasks=tasks)
    dec = decoder_head_selection_spec(hdef, base.decoder_layers, n_heads=base.n_heads, tasks=tasks)
    return {"encoder_attention": enc, **{k: v for k, v in dec.items() if v is not None}}


def _tiled_decoder_state(model: S2TTransformer, source: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The source's decoder entries with the q/k/v rows of selecting decoder self-attention layers
    tiled to the target's H' candidate heads (candidate j <- source head j mod H), as the encoder's
    ``expand_candidate_heads`` does."""
    target = model.state_dict()
    out = dict(source)
    for key, val in source.items():
        if not key.startswith("decoder.") or ".self_attn." not in key or key not in target:
            continue
        tgt = target[key]
        if (tgt.shape != val.shape and tgt.dim() == val.dim() and tgt.shape[1:] == val.shape[1:]
                and tgt.shape[0] % val.shape[0] == 0):
            out[key] = val.repeat(tgt.shape[0] // val.shape[0], *([1] * (val.dim() - 1)))
    return out


def _selection_changed(init: dict, final: dict, sides: list[str] | None = None) -> float | None:
    """Share of (side, task, layer) whose eval selection (as a set of candidates) differs between init
    and the end; ``sides`` restricts to those sides. None without any selecting layer."""
    changed = total = 0
    for side, d in final.items():
        if sides is not None and side not in sides:
            continue
        for t, layers in enumerate(d["selected"]):
            for li, sel in enumerate(layers):
                total += 1
                changed += sorted(sel) != sorted(init[side]["selected"][t][li])
    return None if total == 0 else changed / total


def _logit_movement(init: dict, final: dict, sides: list[str] | None = None) -> float | None:
    """Mean |φ_end − φ_init| over every (side, task, layer, candidate) logit (``sides``: only those)."""
    diffs = [abs(b - a)
             for side, d in final.items() if sides is None or side in sides
             for t, layers in enumerate(d["head_logits"]) for li, row in enumerate(layers)
             for a, b in zip(init[side]["head_logits"][t][li], row)]
    return None if not diffs else sum(diffs) / len(diffs)


def movement_metrics(init: dict, final: dict) -> dict[str, Any]:
    """What moved between two :meth:`S2TTransformer.head_selections` (selection.json's ``init`` and
    ``final``): ``selection_changed_fraction`` and ``head_logits_mean_abs_change`` over both sides, and
    per side under ``movement`` (``{side: {"changed": share, "mean_abs_dphi": mean}}``)."""
    return {"selection_changed_fraction": _selection_changed(init, final),
            "head_logits_mean_abs_change": _logit_movement(init, final),
            "movement": {side: {"changed": _selection_changed(init, final, [side]),
                                "mean_abs_dphi": _logit_movement(init, final, [side])} for side in final}}


def head_sharing(selected: list[list[list[int]]]) -> list[list[int]]:
    """S[t][u] = Σ_layers |S_{t,l} ∩ S_{u,l}| (the paper's Fig. 3) from ``selected[task][layer]``."""
    n = len(selected)
    return [[sum(len(set(a) & set(b)) for a, b in zip(selected[t], selected[u])) for u in range(n)] for t in range(n)]


def plot_head_sharing(selections: dict, pairs: list[str], n_heads: int, candidates: int, out_dir: Path,
                      title: str) -> list[Path]:
    """One heatmap per side: heads shared between languages, with the chance level L·H²/H'."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for side, d in selections.items():
        m = head_sharing(d["selected"])
        n_layers = len(d["layers"])
        chance = n_layers * n_heads * n_heads / candidates
        fig, ax = plt.subplots(figsize=(3.8, 3.4))
        im = ax.imshow(m, cmap="viridis", vmin=0, vmax=n_layers * n_heads)
        for t in range(len(m)):
            for u in range(len(m)):
                ax.text(u, t, str(m[t][u]), ha="center", va="center", color="w" if m[t][u] < chance * 1.5 else "k",
                        fontsize=9)
        labels = [p.split("-")[1] for p in pairs]
        ax.set_xticks(range(len(labels)), labels)
        ax.set_yticks(range(len(labels)), labels)
        fig.colorbar(im, ax=ax)
        ax.set_title(f"{title}\n{side}: {n_layers} layers x {n_heads} heads; chance {chance:.0f}", fontsize=8)
        fig.tight_layout()
        path = out_dir / f"head_sharing_{side}.png"
        tmp = out_dir / f".head_sharing_{side}.tmp.png"
        fig.savefig(tmp, dpi=110)
        plt.close(fig)
        tmp.replace(path)
        written.append(path)
    return written


def run_multi(p: Params, root: Path, system: str, seed: int, progress: bool = True) -> dict[str, Any]:
    """Train (or resume), decode every pair's tst-COMMON and write the outputs; returns the metrics."""
    from dvclive import Live

    rank, world = dist_info()
    device = auto_device()
    pairs = list(p.pairs)
    vocab_dir = root / layout.PREPARED_MULTI
    tasks = load_tasks(vocab_dir)
    if tasks["pairs"] != pairs:
        raise ValueError(f"{vocab_dir / 'tasks.json'}: built for pairs {tasks['pairs']}, params have {pairs}; "
                         f"run `dvc repro prepare_multi`")
    prepared = root / p.data.prepared_dir
    selecting = system in SELECTION_SYSTEMS
    hs = p.multi.head_selection
    # the logits' own optimizer group (lib.train.loop.make_optimizer); the other systems have no logits
    # and keep train_st's config exactly (and their runs' fingerprints)
    cfg = dataclasses.replace(p.train_st, seed=seed, max_updates=p.multi.run_updates(p.train_st.max_updates),
                              variant_lr=hs.variant_lr if selecting else None)
    anneal = hs.anneal_updates if hs.anneal_updates is not None else cfg.max_updates
    train_ds = MultiSpeechDataset(prepared, pairs, "train", vocab_dir, max_frames=cfg.max_frames_train,
                                  max_target_tokens=cfg.max_target_tokens)
    dev_ds = MultiSpeechDataset(prepared, pairs, "dev", vocab_dir)
    test_ds = MultiSpeechDataset(prepared, pairs, layout.TEST_SPLIT, vocab_dir)
    overrides = {**p.model.overrides, **model_overrides(p, system, len(pairs))}
    mcfg = model_config(p.model.size, vocab_size=train_ds.vocab_size, **overrides)
    torch.manual_seed(cfg.seed)
    model = S2TTransformer(mcfg)
    if system == "subset" and hs.subset_init_lead is not None:
        set_subset_lead(model, hs.subset_init_lead)
    init_path = RunPaths(root, "asr", p.multi.asr_init).model
    if not init_path.is_file():
        raise FileNotFoundError(f"{init_path}: missing; it is written by the train_asr@{p.multi.asr_init} stage")
    state = ckpt.load(init_path)["model"]
    report = model_file.load_encoder(model, state, expand_candidate_heads=selecting)
    if cfg.init_decoder:
        model_file.load_decoder_layers(model, _tiled_decoder_state(model, state) if selecting else state)
    if rank == 0 and (report.missing or getattr(report, "expanded", None)):
        print(f"init from {init_path}: tiled to candidate heads: {len(getattr(report, 'expanded', []))} tensors; "
              f"kept at initialisation: {', '.join(report.missing) or 'nothing'}", file=sys.stderr)
    init_selection = model.head_selections()

    kl_weight: float | dict = hs.kl_weight if not isinstance(hs.kl_weight, str) else \
        model.elbo_kl_weights([sum(len(t) for t, k in zip(train_ds.targets, train_ds.task_ids) if k == task)
                               for task in range(len(pairs))])
    gumbel = hs.estimator == "gumbel"
    hst = HeadSelectionTraining(tau_start=hs.tau_start, tau_end=hs.tau_end, anneal_updates=anneal, kl_weight=kl_weight,
                                noise_start=hs.noise_start if gumbel else 1.0,
                                noise_end=hs.noise_end if gumbel else 1.0) if selecting else None
    data_digest = file_digest(*[prepared / pr / "train.tsv" for pr in pairs],
                              *[prepared / pr / "dev.tsv" for pr in pairs], vocab_dir / JOINT_SPM)
    amp, pad = resolve_train_precision(cfg, device, mcfg.to_dict(), data_id=data_digest, batches=lambda pad: first_batches(
        train_ds, cfg.max_frames, PROBE_BATCHES, pad_frames_to=pad[0], pad_tokens_to=pad[1]))
    cfg = dataclasses.replace(cfg, pad_frames_to=pad[0], pad_tokens_to=pad[1])  # `auto` resolved
    decode_amp = resolve_amp(cfg.amp, device)
    if rank == 0:
        print(f"precision: training {amp}, decoding {decode_amp}; multilingual system {system!r} over {pairs}, {model.num_parameters():,} params",
              file=sys.stderr)
    run_config = {
        "task": "st_multi", "system": system, "model": mcfg.to_dict(), "init_encoder": file_digest(init_path),
        "precision": amp, "world_size": world, "pairs": pairs,
        "head_selection": {**dataclasses.asdict(hs), "anneal_updates": anneal} if selecting else None,
        "optimizer": OPTIMIZER, "data": data_digest,
    }
    d = p.decode
    dev_cfg = BeamSearchConfig(beam=1, max_len_a=d.max_len_a, max_len_b=d.max_len_b)
    test_cfg = BeamSearchConfig(beam=d.beam, len_penalty=d.len_penalty, max_len_a=d.max_len_a, max_len_b=d.max_len_b)
    per_pair_dev = max(1, d.dev_sentences // len(pairs))
    dev_views = {pr: PairView(dev_ds, pr, per_pair_dev) for pr in pairs}

    def evaluate(m: torch.nn.Module) -> dict[str, float]:
        scores = []
        for view in dev_views.values():
            hyps = translate_dataset(m, view, d.batch_frames, dev_cfg, device, progress=False, amp=decode_amp,
                                     task=view.task_id, bos=view.start_id)
            scores.append(bleu(hyps, [view.reference(i) for i in range(len(view))]))
        return {"bleu": round(sum(scores) / len(scores), 2)}

    paths = RunPaths(root, "multi", None, seed, variant=system)
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    resume = decide_resume(paths.checkpoints, cfg, run_config)
    live = None
    if rank == 0:
        if resume.state is not None:
            _truncate_live_logs(paths.live, resume.state["run_state"]["update"])
        elif paths.live.exists():
            shutil.rmtree(paths.live)
        live = Live(dir=str(paths.live), resume=resume.state is not None, dvcyaml=False, save_dvc_exp=False,
                    report=None)
    t0 = time.perf_counter()
    summary = train(model, cfg, train_ds, dev_ds, paths.run_dir, run_config=run_config, evaluate=evaluate,
                    device=device, progress=progress, live=live, resume=resume, amp=amp,
                    kl_weight=hst.kl_weight if hst is not None else 0.0,
                    update_hooks=[functools.partial(hst.set_num_updates, model)] if hst is not None else ())
    train_seconds = time.perf_counter() - t0
    if rank != 0:
        return {}
    live.end()
    copy_curves(paths.live / LIVE_PLOTS, paths.curves)

    final = ckpt.load(paths.checkpoints / FINAL_CHECKPOINTS[d.final_checkpoint])
    model.load_state_dict(final["model"])
    model.eval()
    model_file.save_model(paths.model, model, mcfg, task="st_multi", system=system, tasks=tasks,
                          checkpoint=d.final_checkpoint)
    metrics: dict[str, Any] = {}
    t1 = time.perf_counter()
    n_sent = 0
    for pr in pairs:
        view = PairView(test_ds, pr)
        hyps = translate_dataset(model, view, d.batch_frames, test_cfg, device, progress=progress, amp=decode_amp,
                                 task=view.task_id, bos=view.start_id)
        refs = [view.reference(i) for i in range(len(view))]
        atomic_write_text(paths.hyps(pair=pr), "".join(h + "\n" for h in hyps))
        atomic_write_text(paths.refs(pair=pr), "".join(r + "\n" for r in refs))
        metrics[pr] = {"bleu": round(bleu(hyps, refs), 2), "chrf": round(chrf(hyps, refs), 2), "sentences": len(hyps)}
        n_sent += len(hyps)
    decode_seconds = time.perf_counter() - t1
    final_selection = model.head_selections()
    atomic_write_json(paths.decoded / "selection.json", {"init": init_selection, "final": final_selection})
    metrics.update({
        "avg_bleu": round(sum(metrics[pr]["bleu"] for pr in pairs) / len(pairs), 2),
        "avg_chrf": round(sum(metrics[pr]["chrf"] for pr in pairs) / len(pairs), 2),
        "params": model.num_parameters(),
        **movement_metrics(init_selection, final_selection),
        "dev_best": summary["best"], "updates": summary["updates"], "precision": amp, "decode_precision": decode_amp,
        "bleu_signature": bleu_signature(),
    })
    atomic_write_json(paths.metrics, metrics)
    # decoding speed is a wall time: kept with the timings (and beside the hypotheses for the report),
    # out of the metrics, which are deterministic
    timing = {"train_seconds": round(train_seconds, 1), "decode_seconds": round(decode_seconds, 1),
              "decode_sents_per_s": round(n_sent / decode_seconds, 2)}
    atomic_write_json(paths.timing, timing)
    atomic_write_json(paths.decoded / "timing.json", timing)  # the report's copy (it never reads runs/)
    plots = layout.multi_plots(root, system, seed)
    if plots.exists():
        shutil.rmtree(plots)
    plot_head_sharing(final_selection, pairs, model_config(p.model.size, **p.model.overrides).n_heads,
                      p.multi.head_selection.candidates, plots, f"{system}, seed {seed}: heads shared")
    if not final_selection:  # the plots output must exist
        plots.mkdir(parents=True, exist_ok=True)
        atomic_write_text(plots / "README.md", f"{system} selects no heads: no head-sharing heatmap.\n")
    return metrics

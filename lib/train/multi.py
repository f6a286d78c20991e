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
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from lib import layout
from lib.data.multilingual import JOINT_SPM, MultiSpeechDataset, load_tasks
from lib.decode.beam_search import BeamSearchConfig, translate_dataset
from lib.decode.metrics import bleu, bleu_signature, chrf
from lib.io import atomic_write_json, atomic_write_text
from lib.layout import RunPaths
from lib.model.attention.head_selection import set_subset_lead
from lib.model import checkpoint as model_file
from lib.model.s2t_transformer import S2TTransformer, model_config
from lib.params import Params
from lib.params.multi import SELECTION_SYSTEMS
from lib.train import checkpoint as ckpt
from lib.train.loop import OPTIMIZER
from lib.train.head_selection import HeadSelectionTraining, elbo_kl_weights, head_selections
from lib.train.run import RunTask, execute, file_digest


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
    """What moved between two :func:`lib.train.head_selection.head_selections` (selection.json's ``init`` and
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


def plot_no_selection(out_dir: Path, text: str) -> Path:
    """The figure of a system without head selection: its text in place of the heatmaps."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out_dir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(3.8, 1.2))
    ax.axis("off")
    ax.text(0.5, 0.5, text, ha="center", va="center", fontsize=9)
    path, tmp = out_dir / "head_sharing_none.png", out_dir / ".head_sharing_none.tmp.png"
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)
    return path


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


class MultilingualTask(RunTask):
    """One multilingual system and seed over every pair (the module's docstring), for :func:`execute`."""

    def __init__(self, p: Params, root: Path, system: str, seed: int) -> None:
        self.p, self.root, self.system = p, root, system
        self.pairs = list(p.pairs)
        self.selecting = system in SELECTION_SYSTEMS
        hs = self.hs = p.multi.head_selection
        # the logits' own optimizer group (lib.train.loop.make_optimizer); the other systems have no logits
        # and keep train_st's config exactly (and their runs' fingerprints)
        self.cfg = dataclasses.replace(p.train_st, seed=seed, max_updates=p.multi.run_updates(p.train_st.max_updates),
                                       variant_lr=hs.variant_lr if self.selecting else None)
        self.anneal = hs.anneal_updates if hs.anneal_updates is not None else self.cfg.max_updates
        self.paths = RunPaths(root, "multi", None, seed, variant=system)
        self.final_checkpoint = p.decode.final_checkpoint
        self.vocab_dir = root / layout.PREPARED_MULTI
        self.prepared = root / p.data.prepared_dir
        self.init_path = RunPaths(root, "asr", p.multi.asr_init).model

    def setup(self, device: torch.device, rank: int) -> None:
        p, pairs, hs, cfg = self.p, self.pairs, self.hs, self.cfg
        self.tasks = load_tasks(self.vocab_dir)
        if self.tasks["pairs"] != pairs:
            raise ValueError(f"{self.vocab_dir / 'tasks.json'}: built for pairs {self.tasks['pairs']}, params have "
                             f"{pairs}; run `dvc repro prepare_multi`")
        self.train_ds = train_ds = MultiSpeechDataset(self.prepared, pairs, "train", self.vocab_dir,
                                                      max_frames=cfg.max_frames_train,
                                                      max_target_tokens=cfg.max_target_tokens)
        self.dev_ds = MultiSpeechDataset(self.prepared, pairs, "dev", self.vocab_dir)
        self.test_ds = MultiSpeechDataset(self.prepared, pairs, layout.TEST_SPLIT, self.vocab_dir)
        overrides = {**p.model.overrides, **model_overrides(p, self.system, len(pairs))}
        self.mcfg = model_config(p.model.size, vocab_size=train_ds.vocab_size, **overrides)
        torch.manual_seed(cfg.seed)
        self.model = model = S2TTransformer(self.mcfg)
        if self.system == "subset" and hs.subset_init_lead is not None:
            set_subset_lead(model, hs.subset_init_lead)
        if not self.init_path.is_file():
            raise FileNotFoundError(f"{self.init_path}: missing; it is written by the train_asr@{p.multi.asr_init} stage")
        state = ckpt.load(self.init_path)["model"]
        report = model_file.load_encoder(model, state, expand_candidate_heads=self.selecting)
        if cfg.init_decoder:
            model_file.load_decoder_layers(model, state, expand_candidate_heads=self.selecting)
        if rank == 0 and (report.missing or getattr(report, "expanded", None)):
            print(f"init from {self.init_path}: tiled to candidate heads: {len(getattr(report, 'expanded', []))} "
                  f"tensors; kept at initialisation: {', '.join(report.missing) or 'nothing'}", file=sys.stderr)
        self.init_selection = head_selections(model)

        self.hst = None
        if self.selecting:
            kl_weight: float | dict = hs.kl_weight if not isinstance(hs.kl_weight, str) else \
                elbo_kl_weights(model, [sum(len(t) for t, k in zip(train_ds.targets, train_ds.task_ids) if k == task)
                                       for task in range(len(pairs))])
            gumbel = hs.estimator == "gumbel"
            self.hst = HeadSelectionTraining(tau_start=hs.tau_start, tau_end=hs.tau_end, anneal_updates=self.anneal,
                                             kl_weight=kl_weight, noise_start=hs.noise_start if gumbel else 1.0,
                                             noise_end=hs.noise_end if gumbel else 1.0)
        d = p.decode
        self.dev_cfg = BeamSearchConfig(beam=1, max_len_a=d.max_len_a, max_len_b=d.max_len_b)
        self.test_cfg = BeamSearchConfig(beam=d.beam, len_penalty=d.len_penalty, max_len_a=d.max_len_a,
                                         max_len_b=d.max_len_b)
        per_pair_dev = max(1, d.dev_sentences // len(pairs))
        self.dev_views = {pr: PairView(self.dev_ds, pr, per_pair_dev) for pr in pairs}

    def data_digest(self) -> str:
        pairs, prepared = self.pairs, self.prepared
        return file_digest(*[prepared / pr / "train.tsv" for pr in pairs],
                           *[prepared / pr / "dev.tsv" for pr in pairs], self.vocab_dir / JOINT_SPM)

    def describe(self, amp: str, decode_amp: str, pad: tuple[int, int], device: torch.device) -> str:
        return (f"precision: training {amp}, decoding {decode_amp}; multilingual system {self.system!r} over "
                f"{self.pairs}, {self.model.num_parameters():,} params")

    def run_config(self, amp: str, world: int, data_digest: str, threads: int | None) -> dict[str, Any]:
        return {
            "task": "st_multi", "system": self.system, "model": self.mcfg.to_dict(),
            "init_encoder": file_digest(self.init_path), "precision": amp, "world_size": world, "pairs": self.pairs,
            "head_selection": {**dataclasses.asdict(self.hs), "anneal_updates": self.anneal} if self.selecting else None,
            "optimizer": OPTIMIZER, "data": data_digest,
        }

    def evaluate(self, model: torch.nn.Module, device: torch.device, decode_amp: str) -> dict[str, float]:
        scores = []
        for view in self.dev_views.values():
            hyps = translate_dataset(model, view, self.p.decode.batch_frames, self.dev_cfg, device, progress=False,
                                     amp=decode_amp, task=view.task_id, bos=view.start_id)
            scores.append(bleu(hyps, [view.reference(i) for i in range(len(view))]))
        return {"bleu": round(sum(scores) / len(scores), 2)}

    def train_options(self) -> dict[str, Any]:
        if self.hst is None:
            return {"kl_weight": 0.0}
        return {"kl_weight": self.hst.kl_weight, "update_hooks": [functools.partial(self.hst.set_num_updates, self.model)]}

    def model_fields(self) -> dict[str, Any]:
        return {"task": "st_multi", "system": self.system, "tasks": self.tasks, "checkpoint": self.final_checkpoint}

    def test(self, model: S2TTransformer, device: torch.device, decode_amp: str, progress: bool) -> Any:
        per_pair: dict[str, Any] = {}
        for pr in self.pairs:
            view = PairView(self.test_ds, pr)
            hyps = translate_dataset(model, view, self.p.decode.batch_frames, self.test_cfg, device, progress=progress,
                                     amp=decode_amp, task=view.task_id, bos=view.start_id)
            refs = [view.reference(i) for i in range(len(view))]
            atomic_write_text(self.paths.hyps(pair=pr), "".join(h + "\n" for h in hyps))
            atomic_write_text(self.paths.refs(pair=pr), "".join(r + "\n" for r in refs))
            per_pair[pr] = {"bleu": round(bleu(hyps, refs), 2), "chrf": round(chrf(hyps, refs), 2), "sentences": len(hyps)}
        return per_pair

    def metrics(self, decoded: Any, summary: dict[str, Any], amp: str, decode_amp: str, threads: int) -> dict[str, Any]:
        pairs = self.pairs
        self.final_selection = head_selections(self.model)
        atomic_write_json(self.paths.decoded / "selection.json", {"init": self.init_selection, "final": self.final_selection})
        return {
            **decoded,
            "avg_bleu": round(sum(decoded[pr]["bleu"] for pr in pairs) / len(pairs), 2),
            "avg_chrf": round(sum(decoded[pr]["chrf"] for pr in pairs) / len(pairs), 2),
            "params": self.model.num_parameters(),
            **movement_metrics(self.init_selection, self.final_selection),
            "dev_best": summary["best"], "updates": summary["updates"], "precision": amp, "decode_precision": decode_amp,
            "bleu_signature": bleu_signature(),
        }

    def timing(self, decoded: Any, train_seconds: float, decode_seconds: float) -> dict[str, Any]:
        # decoding speed is a wall time: kept with the timings (and beside the hypotheses for the report),
        # out of the metrics, which are deterministic
        n_sent = sum(r["sentences"] for r in decoded.values())
        return {**super().timing(decoded, train_seconds, decode_seconds),
                "decode_sents_per_s": round(n_sent / decode_seconds, 2)}

    def extra_outputs(self, decoded: Any, timing: dict[str, Any]) -> None:
        atomic_write_json(self.paths.decoded / "timing.json", timing)  # the report's copy (it never reads runs/)
        plots = layout.multi_plots(self.root, self.system, self.paths.seed)
        if plots.exists():
            shutil.rmtree(plots)
        p = self.p
        plot_head_sharing(self.final_selection, self.pairs, model_config(p.model.size, **p.model.overrides).n_heads,
                          p.multi.head_selection.candidates, plots, f"{self.system}, seed {self.paths.seed}: heads shared")
        if not self.final_selection:  # the plots output must exist, and hold only images (a DVC plots folder)
            plot_no_selection(plots, f"{self.system}, seed {self.paths.seed}: selects no heads,\nno head-sharing heatmap")


def run_multi(p: Params, root: Path, system: str, seed: int, progress: bool = True) -> dict[str, Any]:
    """Train (or resume), decode every pair's tst-COMMON and write the outputs; returns the metrics."""
    return execute(MultilingualTask(p, root, system, seed), progress)

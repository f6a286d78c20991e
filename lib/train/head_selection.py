"""Head selection's training terms (Gong et al. 2021; docs/variants.md): the τ and noise schedules and
what the run hands the loop for them: a per-update hook (fairseq's ``set_num_updates``) and the KL
weight for the criterion (:func:`elbo_kl_weights`), and the selections a run writes
(:func:`head_selections`). Imported by the runs that select heads only (lib/train/multi.py)."""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from lib.model.attention.head_selection import set_head_selection_noise, set_head_selection_tau


def head_selection_tau(update: int, tau_start: float = 5.0, tau_end: float = 5.0, anneal_updates: int = 0) -> float:
    """Temperature of the head-selection Gumbel-sigmoid after ``update`` completed updates
    (docs/variants.md): τ(u) = max(τ_end, τ_start · (τ_end / τ_start)^(u / U)),
    a geometric decay from ``tau_start`` to ``tau_end`` over U = ``anneal_updates`` updates, then
    constant (U = 0: ``tau_end`` at once). The default τ_start = τ_end = 5 is the paper's public code
    (constant). With the hard straight-through estimator τ only scales the gradient of the logits:
    which heads are sampled does not depend on it."""
    if anneal_updates <= 0 or tau_start == tau_end:
        return float(tau_end)
    return max(float(tau_end), tau_start * (tau_end / tau_start) ** (update / anneal_updates))


def head_selection_noise(update: int, noise_start: float = 1.0, noise_end: float = 0.1, anneal_updates: int = 0) -> float:
    """Scale s of the ``gumbel`` estimator's Gumbel noise after ``update`` completed updates
    (docs/variants.md): s(u) = noise_start · (noise_end / noise_start)^(u / U), a geometric decay over
    U = ``anneal_updates`` updates, then ``noise_end`` (U = 0: ``noise_end`` at once; a zero end or
    start decays linearly instead). From about 1 (std 1.28 logit units, against an initial spread of the
    logits of 4.6) to about 0.1 (std 0.13): the draws of late training are the selection that is evaluated."""
    if anneal_updates <= 0 or noise_start == noise_end or update >= anneal_updates:
        return float(noise_end)
    frac = update / anneal_updates
    if noise_start <= 0 or noise_end <= 0:
        return float(noise_start + (noise_end - noise_start) * frac)
    return float(noise_start * (noise_end / noise_start) ** frac)


@dataclass
class HeadSelectionTraining:
    """What the training loop needs for head-selection models (docs/variants.md): the τ
    schedule (:func:`head_selection_tau`), the ``gumbel`` estimator's noise schedule
    (:func:`head_selection_noise`; this class's default 1.0 -> 1.0 is constant unit noise, params.yaml's
    1.0 -> 0.1 anneals it) and the KL weight λ, a float for every side and task or
    ``{side: [λ per task]}`` (:func:`elbo_kl_weights` for ``kl_weight: elbo``). Default λ
    0: the KL is computed and logged (``train/kl``) but not optimised, as in the paper's recipe."""

    tau_start: float = 5.0
    tau_end: float = 5.0
    anneal_updates: int = 0
    kl_weight: float | dict[str, list[float]] = 0.0
    noise_start: float = 1.0  # the gumbel estimator's noise scale (head_selection_noise); paper: unused
    noise_end: float = 1.0

    def tau(self, update: int) -> float:
        return head_selection_tau(update, self.tau_start, self.tau_end, self.anneal_updates)

    def noise(self, update: int) -> float:
        return head_selection_noise(update, self.noise_start, self.noise_end, self.anneal_updates)

    def set_num_updates(self, model: nn.Module, update: int) -> None:
        """The per-update hook (fairseq's ``set_num_updates``): τ(u) and s(u) on every head-selection
        module of ``model``, u = the updates completed so far (so a resumed run continues the schedule).
        The loop calls it before each update through ``train(update_hooks=...)``."""
        set_head_selection_tau(model, self.tau(update))
        set_head_selection_noise(model, self.noise(update))


def elbo_kl_weights(model: nn.Module, train_tokens_per_task: Sequence[int]) -> dict[str, list[float]]:
    """λ_{side,t} = C_s / N_t (``kl_weight: elbo``, reading B4): with C_s the number of selection
    logits of side s per task (Σ over its selecting layers of H'; L_s · H') and N_t the train
    target tokens of task t, summing λ n_t K_t over an epoch gives C_s K_t = Σ_{l,h} KL, the
    seed's Eq. 3 (one KL per task for the whole data set). ``model``: an S2TTransformer."""
    out: dict[str, list[float]] = {}
    for side, mods in model.head_selection_layers().items():
        tasks = mods[0][1].tasks
        if len(train_tokens_per_task) != tasks:
            raise ValueError(f"elbo_kl_weights: {len(train_tokens_per_task)} token counts for {tasks} tasks")
        if any(n <= 0 for n in train_tokens_per_task):
            raise ValueError(f"elbo_kl_weights: token counts must be positive, got {list(train_tokens_per_task)}")
        logits = sum(m.candidates for _, m in mods)
        out[side] = [logits / n for n in train_tokens_per_task]
    return out


def head_selections(model: nn.Module) -> dict[str, dict[str, list]]:
    """Evaluation selections and logits per side of an S2TTransformer, JSON-ready: ``{side: {"layers":
    [l, ...], "selected": [task][layer index] -> [candidate, ...] (slot order), "head_logits": [task][layer
    index] -> [φ_h, ...]}}`` (selection.json of the pipeline, docs/variants.md)."""
    out: dict[str, dict[str, list]] = {}
    for side, mods in model.head_selection_layers().items():
        sel = [m.eval_selection().tolist() for _, m in mods]  # [layer][task][slot]
        phi = [m.head_logits.detach().cpu().tolist() for _, m in mods]  # [layer][task][candidate]
        tasks = mods[0][1].tasks
        out[side] = {"layers": [layer for layer, _ in mods],
                     "selected": [[s[t] for s in sel] for t in range(tasks)],
                     "head_logits": [[p[t] for p in phi] for t in range(tasks)]}
    return out

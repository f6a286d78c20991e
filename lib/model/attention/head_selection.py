"""``head_select``: per-task selection of H of H' candidate heads (Gong et al. 2021; docs/variants.md).
The selection is one module, :class:`HeadSelector`, composed into the encoder's and the decoder's attention."""
from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from lib.model.config import HeadSelectionOptions, odd_window
from lib.model.attention.full import FullAttention
from lib.model.attention.local import LocalAttention
from lib.model.attention.base import (AttentionOutput, SelfAttention, VariantParameter, register_attention,
                                     renamed_parameter_key)
from lib.model.attention.decoder import MultiheadAttention


# ----------------------------------------------------------------------------------------
# Attention head selection (Gong et al. 2021; docs/variants.md)
# ----------------------------------------------------------------------------------------

#: The selector temperature of the paper's public code (its constructor default); reading B5.
DEFAULT_HEAD_SELECTION_TAU = 5.0


def logistic_noise(shape: tuple[int, ...], *, device: torch.device, dtype: torch.dtype) -> Tensor:
    """ε = log u − log(1 − u), u ~ U(0, 1) from the global torch RNG (so a resumed run replays it).

    This is the difference of two independent Gumbel(0, 1) draws (a Logistic(0, 1) variable), i.e.
    exactly the noise of the paper's two-class Gumbel-softmax (its Eq. 4) once the two logits are
    folded into one, φ = φ(1) − φ(0) (docs/variants.md). u = 0 (possible: ``torch.rand`` is in [0, 1)) is
    nudged to the smallest normal number so that ε stays finite."""
    u = torch.rand(shape, device=device, dtype=dtype).clamp_min_(torch.finfo(dtype).tiny)
    return torch.log(u) - torch.log1p(-u)


def select_heads(scores: Tensor, n_heads: int, strategy: str) -> Tensor:
    """Selected candidates per task in output-slot order: (T, H') scores -> (T, H) long.

    * ``subset`` (the paper's Eq. 5): the H highest scores, ordered by their out_proj slot c mod H,
      then by index (each candidate feeds its own slot, :func:`merge_slots`; an aligned subset, one
      candidate per slot, then lists slot j's candidate j-th, the order of the source heads, so its
      projections are the source layer's rows in the source's order). The order no longer decides a
      slot: the paper's "sorted ascending, slot j <- the j-th smallest index" (reading B6) did, and the
      public code's order by value made the slot layout flip under tiny logit changes.
    * ``group`` (Eq. 6-7): strided groups G_g = {g, g + H, ..., g + (r − 1) H} (reading B7, as the
      public code's ``view(r, H).max(0)``); slot g <- the best member of G_g.

    Ties go to the lower index in both (a stable descending sort; ``argmax`` returns the first
    maximum), so the selection is a deterministic function of the scores. The scores are the
    noisy logits φ + ε in training and φ at evaluation: since σ(· / τ) is increasing, ranking the
    logits is ranking the posteriors σ((φ + ε) / τ) for any τ, without ties from saturation."""
    T, n_cand = scores.shape
    if strategy == "subset":
        top = torch.sort(scores, dim=-1, descending=True, stable=True).indices[:, :n_heads]
        return top.gather(1, ((top % n_heads) * n_cand + top).argsort(dim=-1))  # by (slot, index)
    if strategy == "group":
        member = scores.view(T, n_cand // n_heads, n_heads).argmax(dim=1)  # (T, H): r-index within each group
        return member * n_heads + torch.arange(n_heads, device=scores.device)
    raise ValueError(f"unknown head-selection strategy {strategy!r}")


def straight_through(y: Tensor) -> Tensor:
    """The straight-through weights w = 1 − stopgrad(y) + y: forward value exactly 1.0, gradient
    ∂w/∂y = 1 (so ∂w/∂φ = σ'((φ + ε)/τ)/τ). Computed as (y − stopgrad(y)) + 1, whose forward is
    exactly 1 in floating point (1 − y + y is not, for y < 0.5)."""
    return (y - y.detach()) + 1.0


#: Subset's aligned initialisation (:func:`aligned_subset_logits_`): the leading candidate of each
#: out_proj slot starts at least this far (in logit units) above every other candidate.
SUBSET_INIT_GAP = 1.0


def gumbel_noise(shape: tuple[int, ...], *, device: torch.device, dtype: torch.dtype) -> Tensor:
    """g = −log(−log u) ~ Gumbel(0, 1), u ~ U(0, 1) from the global torch RNG (one uniform per element,
    as :func:`logistic_noise`); u = 0 is nudged to the smallest normal number so that g stays finite."""
    u = torch.rand(shape, device=device, dtype=dtype).clamp_min_(torch.finfo(dtype).tiny)
    return -torch.log(-torch.log(u))


def relaxed_selection(scores: Tensor, n_heads: int, strategy: str) -> Tensor:
    """The Gumbel-softmax relaxation of :func:`select_heads` (estimator ``gumbel``): (T, H') scores
    (φ + s·g) / τ -> (T, H') weights: ``group`` a softmax within each strided group {g, g + H, ...}
    (one member per group is selected; each group's weights sum to 1), ``subset`` H · softmax over
    all H' candidates (H are selected; the weights sum to H). Their gradient reaches every candidate."""
    T, n = scores.shape
    if strategy == "group":
        return torch.softmax(scores.view(T, n // n_heads, n_heads), dim=1).reshape(T, n)
    if strategy == "subset":
        return n_heads * torch.softmax(scores, dim=-1)
    raise ValueError(f"unknown head-selection strategy {strategy!r}")


def candidate_slots(n_candidates: int, n_heads: int, device: torch.device | None = None) -> Tensor:
    """(H',) long: candidate c's ``out_proj`` slot, c mod H -- the slot of the source head it is tiled
    from (``expand_candidate_heads``), and for ``group`` the slot of its group."""
    return torch.arange(n_candidates, device=device) % n_heads


def merge_slots(ctx: Tensor, slots: Tensor, n_heads: int) -> Tensor:
    """Heads into their ``out_proj`` slots: ctx (B, K, N, dh) with slots (B, K) or (K,) long in [0, H)
    -> (B, H, N, dh), slot s the sum of the heads whose slot is s (0 where none). One head per slot gives
    exactly those heads (x + 0 = x): a group selection, an aligned subset."""
    B, K, N, dh = ctx.shape
    slots = slots.expand(B, K) if slots.dim() == 1 else slots
    return ctx.new_zeros(B, n_heads, N, dh).scatter_add(1, slots[:, :, None, None].expand(B, K, N, dh), ctx)


def aligned_subset_logits_(phi: Tensor, n_heads: int, gap: float = SUBSET_INIT_GAP) -> Tensor:
    """Subset's aligned initialisation, in place on φ (T, H') drawn U(ln 0.01, 0): per task the highest
    logit of each slot's candidates {s, s + H, ...} is raised by −ln 0.01 + ``gap``, to [gap, gap + ln 100),
    above every other candidate (< 0) by at least ``gap``. The evaluated top-H is then one candidate per
    slot: with the tiled ASR initialisation (candidate c a copy of source head c mod H) exactly the ASR
    layer. Returns φ."""
    with torch.no_grad():
        rows = torch.arange(phi.shape[0], device=phi.device)
        for slot in range(n_heads):
            members = torch.arange(slot, phi.shape[1], n_heads, device=phi.device)
            best = members[phi[:, members].argmax(dim=1)]  # (T,)
            phi[rows, best] += gap - math.log(0.01)
    return phi


def bernoulli_kl(logits: Tensor, prior: float) -> Tensor:
    """KL(Bernoulli(σ(φ)) || Bernoulli(π)) elementwise (docs/variants.md, reading B3):
    q ln(q / π) + (1 − q) ln((1 − q) / (1 − π)), q = σ(φ), with ln q = logsigmoid(φ) so that
    saturated logits stay finite. π = 1 (H' = H: every head is always selected, nothing to
    learn) gives 0 by definition instead of the infinite divergence of a degenerate prior."""
    if prior >= 1.0:
        return torch.zeros_like(logits)
    q = torch.sigmoid(logits)
    return q * (F.logsigmoid(logits) - math.log(prior)) + (1 - q) * (F.logsigmoid(-logits) - math.log1p(-prior))


def gather_heads(t: Tensor, idx: Tensor) -> Tensor:
    """Per-sample head gather: t (B, H', N, dh), idx (B, H) long -> (B, H, N, dh)."""
    return t.gather(1, idx[:, :, None, None].expand(-1, -1, t.shape[2], t.shape[3]))


def head_rows(idx: Tensor, head_dim: int) -> Tensor:
    """Row indices of the selected heads in a (H' · dh, d) projection: (T, H) -> (T, H · dh)."""
    return (idx[..., None] * head_dim + torch.arange(head_dim, device=idx.device)).flatten(-2)


def pruned_linear(x: Tensor, weight: Tensor, bias: Tensor, task: Tensor, single: int | None) -> Tensor:
    """Projection with per-task pruned weights: x (B, N, d), weight (T, H · dh, d), bias (T, H · dh).

    One task in the batch (``single``, the decoding case): a plain ``F.linear`` with that task's
    rows, i.e. exactly the cost of an H-head projection. Mixed tasks: a batched matmul with each
    sample's own rows, the same FLOPs per sample."""
    if single is not None:
        return F.linear(x, weight[single], bias[single])
    return torch.baddbmm(bias[task][:, None, :], x, weight[task].transpose(1, 2))


def set_subset_lead_(phi: Tensor, n_heads: int, lead: float) -> Tensor:
    """In place on subset logits φ (T, H'): per task, its top-H candidates (the aligned subset right after
    :func:`aligned_subset_logits_`) are set to exactly ``lead`` above the task's best other candidate,
    the others kept. The top-H selection is unchanged; only its margin is. Returns φ."""
    with torch.no_grad():
        top = phi.topk(n_heads, dim=1).indices  # (T, H)
        rest = phi.scatter(1, top, float("-inf"))
        phi.scatter_(1, top, (rest.max(dim=1, keepdim=True).values + lead).expand_as(top).contiguous())
    return phi


def set_subset_lead(model: nn.Module, lead: float) -> int:
    """:func:`set_subset_lead_` on every subset head selector of ``model``; how many."""
    selectors = [m for m in model.modules() if isinstance(m, HeadSelector) and m.strategy == "subset"]
    for m in selectors:
        set_subset_lead_(m.head_logits.data, m.n_heads, lead)
    return len(selectors)


Projections = tuple[nn.Linear, nn.Linear, nn.Linear]


class HeadSelector(nn.Module):
    """Per-task selection of H out of H' candidate heads, composed into a role's attention (as
    fairseq's ``AttnHeadSelector`` in ``examples/attention_head_selection``): the encoder's
    :class:`HeadSelectionAttention` and the decoder's :class:`HeadSelectionMultiheadAttention` each hold
    one as ``selector`` and hand :meth:`context` how they project the candidates and how they attend
    (the encoder's full or local kernel; the decoder's causal attention with its cache). The one flow
    here decides which heads are projected, which attend, and which ``out_proj`` slot each output
    reaches. docs/variants.md

    * ``head_logits`` φ (tasks, H') -- one logit per task and candidate (φ(1) − φ(0) of the paper's
      Eq. 4), initialised U(ln 0.01, ln 1) as the public code; ``subset`` then raises the best
      candidate of each out_proj slot above the rest (:func:`aligned_subset_logits_`).
    * Slots: a selected candidate c feeds ``out_proj`` slot c mod H (:func:`candidate_slots`), the slot
      of the source head it is tiled from. For ``group`` that is its group's slot; for ``subset`` two
      selected candidates of one slot add up and a slot without any is 0 (:func:`merge_slots`), so a
      selection never moves a head to another head's slot -- the paper's index-ordered slots (B6)
      reshuffled them at every change of the selection.
    * Training, ``estimator: paper`` (:meth:`sample`): one draw ε per (task, head) of this layer per
      forward pass, shared by all samples of a task; selection by rank of φ + ε (:func:`select_heads`);
      the selected heads are scaled by the straight-through weights w = 1 − sg(y) + y,
      y = σ((φ + ε) / τ). Which heads are drawn does not depend on τ (the ranking of φ + ε); τ only
      scales the gradient of φ; unselected candidates get no gradient.
    * Training, ``estimator: gumbel``: Gumbel noise g scaled by ``noise_scale`` s, selection by rank of
      φ + s·g as above, and every candidate attends: candidate c's output enters its slot scaled by
      w_c = hard_c − sg(y_c) + y_c with y = :func:`relaxed_selection` ((φ + s·g) / τ) -- forward exactly
      the drawn selection (unselected candidates × 0), backward ∂L/∂w_c = ⟨∂L/∂slot, head_c⟩ for every
      candidate. Costs H' heads of attention in training (H at evaluation, pruned as for ``paper``).
    * Evaluation (:meth:`eval_selection`): no noise, selection by φ; the gathered q/k/v rows of each
      task's selected heads are cached (:meth:`pruned_projections`) and only those H heads are
      projected and attended (``pruned_inference``; False = project all H' then gather, the reference
      the tests compare with).
    * :meth:`kl`: per-head KL of Bernoulli(σ(φ)) to the prior p(z = 1) = H / H' (reading B2); the
      training criterion collects it from every selector of the model (lib.train.criterion).

    ``tau`` and ``noise_scale`` are plain attributes, not state: the run's per-update hook
    (``HeadSelectionTraining.set_num_updates``, lib/train/head_selection.py) sets them from its
    schedules, which a resumed run recomputes. ``computed_heads`` reports how many heads per sample
    the last forward pass projected (H' in training, H at pruned evaluation).

    φ is created after the host's projections (the initialisation draws of earlier runs), and
    :func:`compose_selector` puts the selector first among the host's submodules: φ is the host's first
    parameter, where it stood when it was the host's own, so the optimizer's state, the gradient norm's
    sum and a checkpoint's key order are those of earlier runs (whose ``<attn>.head_logits`` keys still
    load, :func:`_upgrade_head_logits_key`).
    """

    #: Marks a head selector for code that must not import this module (the model, the criterion).
    selects_heads = True

    def __init__(self, opts: HeadSelectionOptions, n_heads: int, head_dim: int) -> None:
        super().__init__()
        self.n_heads, self.head_dim = n_heads, head_dim
        self.strategy: str = opts.strategy
        self.candidates: int = opts.candidates
        self.tasks: int = opts.tasks
        self.estimator: str = opts.estimator
        self.tau: float = DEFAULT_HEAD_SELECTION_TAU
        self.noise_scale: float = 1.0  # s of the gumbel estimator (set each update by set_head_selection_noise)
        self.pruned_inference: bool = True
        self.computed_heads: int = 0
        self.last_selection: Tensor | None = None  # (tasks, H) of the last training forward pass
        self._pruned: tuple[tuple, tuple[Tensor, ...]] | None = None
        self.head_logits = VariantParameter(torch.empty(self.tasks, self.candidates).uniform_(math.log(0.01), 0.0))
        if self.strategy == "subset":
            aligned_subset_logits_(self.head_logits.data, self.n_heads)

    @property
    def prior(self) -> float:
        """π = p(z = 1) = H / H' (the paper prints H'/H, a typo; reading B2)."""
        return self.n_heads / self.candidates

    def task_ids(self, task: Tensor | None, batch: int, device: torch.device) -> Tensor:
        """(B,) long task ids; None is task 0 for a single-task model and an error otherwise."""
        if task is None:
            if self.tasks == 1:
                return torch.zeros(batch, dtype=torch.long, device=device)
            raise ValueError(f"head selection with {self.tasks} tasks needs task ids (model.encode(..., task=...))")
        if task.shape != (batch,):
            raise ValueError(f"task ids must have shape ({batch},), got {tuple(task.shape)}")
        return task.to(device=device, dtype=torch.long)

    def sample(self, noise: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """Training draw: selected candidates (tasks, H) in :func:`select_heads` order and the
        straight-through weights w. ``paper``: w (tasks, H) of the selected heads (value 1.0, gradient
        σ'((φ + ε)/τ)/τ into φ of the selected heads), ε logistic. ``gumbel``: w (tasks, H') of every
        candidate (value exactly 1.0 selected, 0.0 not; gradient that of :func:`relaxed_selection`
        ((φ + s·g)/τ), which reaches every candidate), g Gumbel, s = ``noise_scale``. ``noise``
        (tasks, H'), ε or g, replaces the draw from the global RNG (tests)."""
        phi = self.head_logits
        gumbel = self.estimator == "gumbel"
        if noise is None:
            noise = (gumbel_noise if gumbel else logistic_noise)(tuple(phi.shape), device=phi.device, dtype=phi.dtype)
        if not gumbel:
            z = phi + noise.to(phi.dtype)
            idx = select_heads(z.detach(), self.n_heads, self.strategy)
            w = straight_through(torch.sigmoid(z / self.tau)).gather(1, idx)
        else:
            z = phi + self.noise_scale * noise.to(phi.dtype)
            idx = select_heads(z.detach(), self.n_heads, self.strategy)
            y = relaxed_selection(z / self.tau, self.n_heads, self.strategy)
            w = (y - y.detach()) + torch.zeros_like(y).scatter_(1, idx, 1.0)  # forward exactly 0 / 1
        self.last_selection = idx
        return idx, w

    def eval_selection(self) -> Tensor:
        """Deterministic selection by φ (no noise): (tasks, H) long, slot order."""
        return select_heads(self.head_logits.detach(), self.n_heads, self.strategy)

    def kl(self) -> Tensor:
        """(tasks, H') Bernoulli KL of the posterior σ(φ) to the prior π = H / H'."""
        return bernoulli_kl(self.head_logits, self.prior)

    def _cache_key(self, projections: Projections) -> tuple:
        params = (self.head_logits,) + tuple(t for p in projections for t in (p.weight, p.bias))
        return (torch.is_inference_mode_enabled(),) + tuple(
            (p.data_ptr(), p._version, p.dtype, p.device) for p in params)

    def pruned_projections(self, projections: Projections) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
        """(Wq, bq, Wk, bk, Wv, bv) of the host's ``projections`` (its q/k/v_proj): each task's selected
        rows, weights (tasks, H · dh, d) and biases (tasks, H · dh). Cached while nothing they depend on
        changes: the cache is dropped by ``train()``, and keyed on the parameters' version counters (an
        optimizer step or ``load_state_dict`` bumps them) and storage. With autograd recording the rows
        are gathered afresh (differentiable, nothing cached)."""
        key = self._cache_key(projections)
        if self._pruned is not None and self._pruned[0] == key and not torch.is_grad_enabled():
            return self._pruned[1]  # type: ignore[return-value]
        rows = head_rows(self.eval_selection(), self.head_dim)  # (tasks, H * dh)
        out = tuple(t for proj in projections for t in (proj.weight[rows], proj.bias[rows]))
        if not torch.is_grad_enabled():
            self._pruned = (key, out)
        return out  # type: ignore[return-value]

    def project_pruned(self, x: Tensor, task: Tensor, projections: Projections) -> tuple[Tensor, Tensor, Tensor]:
        """Only the selected heads of each sample's task: x (B, N, d) -> q, k, v (B, H, N, dh)."""
        lo, hi = torch.stack([task.min(), task.max()]).tolist()
        single = int(lo) if lo == hi else None
        wq, bq, wk, bk, wv, bv = self.pruned_projections(projections)
        B, N, _ = x.shape

        def split(t: Tensor) -> Tensor:
            return t.view(B, N, self.n_heads, self.head_dim).transpose(1, 2)

        return tuple(split(pruned_linear(x, w, b, task, single)) for w, b in ((wq, bq), (wk, bk), (wv, bv)))  # type: ignore[return-value]

    def train(self, mode: bool = True) -> "HeadSelector":
        self._pruned = None
        return super().train(mode)

    def extra_repr(self) -> str:
        return (f"strategy={self.strategy}, candidates={self.candidates}, tasks={self.tasks}, tau={self.tau}"
                + (f", estimator={self.estimator}, noise_scale={self.noise_scale}" if self.estimator != "paper" else ""))

    def slot_merge(self, ctx: Tensor, idx: Tensor) -> Tensor:
        """ctx (B, H, N, dh) of the selected heads idx (B, H) -> the H out_proj slots: unchanged for
        ``group`` (the selected head of group g already sits in slot g), :func:`merge_slots` by c mod H
        for ``subset``."""
        if self.strategy == "group":
            return ctx
        return merge_slots(ctx, idx % self.n_heads, self.n_heads)

    def all_candidates(self, ctx: Tensor, w: Tensor, task: Tensor) -> Tensor:
        """The ``gumbel`` estimator's merge: ctx (B, H', N, dh) of every candidate, w (tasks, H') ->
        (B, H, N, dh), candidate c × w_c into slot c mod H."""
        slots = candidate_slots(self.candidates, self.n_heads, ctx.device)
        return merge_slots(ctx * w[task][:, :, None, None], slots, self.n_heads)

    def context(self, x: Tensor, task: Tensor, projections: Projections,
                project_all: Callable[[Tensor], tuple[Tensor, Tensor, Tensor]],
                attend: Callable[[Tensor, Tensor, Tensor], tuple[Tensor, Tensor | None]]
                ) -> tuple[Tensor, Tensor | None]:
        """The selection around a role's attention, the one flow of both roles: which candidates are
        projected (all H', or at pruned evaluation only each task's H rows of ``projections``), which
        heads attend, and how their outputs reach the H ``out_proj`` slots. ``project_all(x)`` gives the
        role's q, k, v of all H' candidates (B, H', N, dh); ``attend(q, k, v)`` its attention (the
        encoder's kinds, or the decoder's causal attention with its cache) -> (ctx, weights | None).
        Returns the context in the H slots (B, H, N, dh) and the selected heads' weights (slot order)
        when ``attend`` gave any."""
        w: Tensor | None = None
        if self.training and self.estimator == "gumbel":  # every candidate attends, x its 0 / 1 weight
            q, k, v = project_all(x)  # (B, H', N, dh)
            sel, w = self.sample()
            ctx, weights = attend(q, k, v)
            if weights is not None:
                weights = gather_heads(weights, sel[task])
            self.computed_heads = self.candidates
            return self.all_candidates(ctx, w, task), weights
        if self.training or not self.pruned_inference:
            q, k, v = project_all(x)  # (B, H', N, dh)
            sel, w = self.sample() if self.training else (self.eval_selection(), None)
            idx = sel[task]  # (B, H)
            q, k, v = gather_heads(q, idx), gather_heads(k, idx), gather_heads(v, idx)
            self.computed_heads = self.candidates
        else:
            q, k, v = self.project_pruned(x, task, projections)  # (B, H, N, dh)
            idx = self.eval_selection()[task] if self.strategy == "subset" else None
            self.computed_heads = self.n_heads
        ctx, weights = attend(q, k, v)
        if w is not None:
            ctx = ctx * w[task][:, :, None, None]
        if idx is not None:
            ctx = self.slot_merge(ctx, idx)
        return ctx, weights


def _upgrade_head_logits_key(module: nn.Module, state_dict: dict, prefix: str, *args) -> None:
    """Load-state-dict pre-hook of a selecting attention: a checkpoint written while φ was the
    attention's own parameter (``<attn>.head_logits``) loads into ``<attn>.selector.head_logits``, by
    the rule that ``lib.model.checkpoint.upgrade_state_dict`` also applies (:func:`renamed_parameter_key`)."""
    for old in [k for k in state_dict if k.startswith(prefix)]:
        new = renamed_parameter_key(old)
        if new is not None and new not in state_dict:
            state_dict[new] = state_dict.pop(old)


def compose_selector(host: nn.Module, selector: HeadSelector) -> HeadSelector:
    """``host.selector = selector``, placed first among ``host``'s submodules (see :class:`HeadSelector`
    for why the order), with the pre-hook that loads checkpoints of earlier runs. Returns the selector."""
    host.selector = selector
    rest = {name: m for name, m in host._modules.items() if name != "selector"}
    host._modules.clear()
    host._modules.update({"selector": selector, **rest})
    host.register_load_state_dict_pre_hook(_upgrade_head_logits_key)
    return selector


@register_attention("head_select")
class HeadSelectionAttention(SelfAttention):
    """Encoder self-attention with per-task head selection (Gong et al. 2021;
    docs/variants.md): H of H' candidate heads per task (target language id), strategies
    ``subset`` and ``group`` (see :func:`select_heads`); in training Gumbel-sigmoid latent variables
    with the straight-through estimator (``estimator: paper``) or a straight-through Gumbel-softmax
    over the candidates (``gumbel``, :meth:`HeadSelector.weights`); deterministic and pruned at evaluation. The selection is
    its composed :class:`HeadSelector` (``selector``); this module is the encoder's attention around it.

    Spec keys: ``strategy``, ``candidates`` (H'), ``tasks``, ``window`` (None = full attention over
    the selected heads, else local attention with that window: the MAY of docs/variants.md).

    Parameters: q/k/v_proj map d -> H' · dh (``proj_heads = H'``), ``out_proj`` H · dh -> d, plus the
    selector's variant-only ``head_logits`` (tasks, H'). An H-head checkpoint (the ASR encoder) loads
    with ``lib.model.checkpoint.load_encoder(..., expand_candidate_heads=True)``: candidate j <- head
    j mod H, after which any group selection reproduces the source layer exactly.

    Forward for a sample of task t: x^(h) = softmax(q_h k_h^T / sqrt(dh) + pad) v_h for the selected
    h in slot order, scaled by w (training; 1 at evaluation), concatenated, ``out_proj``.
    Training projects all H' candidates; with ``estimator: paper`` it gathers each sample's H heads by
    its task before the attention (cost: H heads of attention, H' of projections), with ``gumbel`` every
    candidate attends, weighted 0 / 1, so the backward pass reaches every candidate's logit (cost: H'
    heads of attention); evaluation projects only the H
    selected rows (pruned: the cost of a plain H-head layer for any H'). Mixed-task batches give
    each sample what it gets alone; ``need_weights`` returns the selected heads' weights
    (B, H, N, N) in slot order (what was merged).

    Where this code departs from the paper (and from its public code): no noise and real
    pruning at inference (reading B8); subset slots by candidate, c mod H, instead of index order (B6,
    :func:`merge_slots`); strided groups (B7); prior
    H / H' (B2); exact Bernoulli KL (B3). ``rel_pos_max`` (a diagnostic control) is not implemented.
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        dropout: float,
        *,
        strategy: str,
        candidates: int,
        tasks: int,
        estimator: str = "paper",
        window: int | None = None,
        rel_pos_max: int = 0,
    ) -> None:
        if rel_pos_max:
            raise ValueError("head_select: the relative-position bias (model.overrides.rel_pos_bias) is not "
                             "implemented for head selection")
        odd_window(window, "head_select.window:", optional=True)
        opts = HeadSelectionOptions.validated(strategy=strategy, candidates=candidates, tasks=tasks,
                                              n_heads=n_heads, estimator=estimator, key="head_select")
        super().__init__(d_model, n_heads, dropout, proj_heads=opts.candidates)
        self.window: int | None = window
        self.selector = compose_selector(self, HeadSelector(opts, n_heads, self.head_dim))

    def attend(self, q, k, v, key_padding_mask, *, prev_attn=None, task=None, need_weights=False):
        """The attention core on the *selected* heads (q, k, v (B, H, N, dh)): full attention (SDPA
        fast path) or local attention with ``window``, the very code of those variants."""
        plain = FullAttention if self.window is None else LocalAttention
        return plain.attend(self, q, k, v, key_padding_mask, need_weights=need_weights)

    def forward(
        self,
        x: Tensor,
        key_padding_mask: Tensor | None,
        *,
        prev_attn: Tensor | None = None,
        task: Tensor | None = None,
        need_weights: bool = False,
    ) -> AttentionOutput:
        task = self.selector.task_ids(task, x.shape[0], x.device)
        ctx, weights = self.selector.context(
            x, task, (self.q_proj, self.k_proj, self.v_proj), self._project,
            lambda q, k, v: self.attend(q, k, v, key_padding_mask, need_weights=need_weights))
        out = self.out_proj(self._merge(ctx))
        if not need_weights:
            return AttentionOutput(out=out, weights=None, carry=None)
        return AttentionOutput(out=out, weights=weights, carry=weights)

    def extra_repr(self) -> str:
        return super().extra_repr() + (f", window={self.window}" if self.window is not None else "")


def set_head_selection_noise(model: nn.Module, scale: float) -> int:
    """Set the Gumbel noise scale s of every head selector in ``model`` (the ``gumbel`` estimator's;
    the run's per-update hook calls it with its schedule's value,
    lib.train.head_selection.head_selection_noise); returns how many selectors were set. s >= 0."""
    if not scale >= 0:
        raise ValueError(f"head-selection noise scale must be >= 0, got {scale!r}")
    return _set_on_head_selection(model, "noise_scale", float(scale))


def _set_on_head_selection(model: nn.Module, attr: str, value: float) -> int:
    """Set ``attr`` on every head selector of ``model``; how many were set."""
    selectors = [m for m in model.modules() if isinstance(m, HeadSelector)]
    for m in selectors:
        setattr(m, attr, value)
    return len(selectors)


def set_head_selection_tau(model: nn.Module, tau: float) -> int:
    """Set the Gumbel-sigmoid temperature τ of every head selector in ``model`` (the run's per-update
    hook calls it with its schedule's value); returns how many selectors were set. τ > 0 (ValueError
    otherwise)."""
    if not tau > 0:
        raise ValueError(f"head-selection temperature must be > 0, got {tau!r}")
    return _set_on_head_selection(model, "tau", float(tau))


@register_attention("head_select")
class HeadSelectionMultiheadAttention(MultiheadAttention):
    """Decoder self-attention with per-task head selection (Gong et al.; docs/variants.md, B1):
    the encoder's :class:`HeadSelector` composed into the decoder's causal self-attention, keyed on
    the target language (the paper's O2M configuration).

    q/k/v_proj project H' candidates; the selector's ``head_logits`` (tasks, H'). Training: all H'
    projected, one draw per forward pass, straight-through weights on the head outputs; each sample's
    H heads gathered by its task (``estimator: paper``) or every candidate attending, weighted 0 / 1
    (``gumbel``). Evaluation: deterministic selection and only the selected rows
    projected; the incremental cache ("k", "v" (B, H, t, dh), "pad") holds the H selected heads only,
    so incremental decoding equals full-sequence decoding and costs what a plain H-head layer costs.
    Incremental decoding in training mode is refused (each call would draw a new selection while
    the cache holds the old one). Self-attention only (``memory`` must be None).
    """

    def __init__(self, d_model: int, n_heads: int, dropout: float, *, strategy: str, candidates: int,
                 tasks: int, estimator: str = "paper") -> None:
        opts = HeadSelectionOptions.validated(strategy=strategy, candidates=candidates, tasks=tasks,
                                              n_heads=n_heads, estimator=estimator, key="decoder head_select")
        super().__init__(d_model, n_heads, dropout, proj_heads=opts.candidates)
        self.selector = compose_selector(self, HeadSelector(opts, n_heads, self.head_dim))

    def forward(
        self,
        query: Tensor,
        memory: Tensor | None,
        *,
        key_padding_mask: Tensor | None = None,
        causal: bool = False,
        cache: dict[str, Tensor] | None = None,
        prev_attn: Tensor | None = None,
        task: Tensor | None = None,
        need_weights: bool = False,
    ) -> AttentionOutput:
        if memory is not None:
            raise ValueError("head selection is implemented for decoder self-attention only")
        task = self.selector.task_ids(task, query.shape[0], query.device)
        if self.training and cache is not None:
            raise ValueError("decoder head selection: incremental decoding runs in eval mode (a training "
                             "forward draws a new selection, the cache holds the previous one)")
        candidates = self.selector.candidates

        def project_all(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
            return tuple(self._split(p(x), candidates) for p in (self.q_proj, self.k_proj, self.v_proj))  # type: ignore[return-value]

        def attend(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor | None]:
            k, v, pad = self._extend_cache(k, v, key_padding_mask, cache)
            return self._attend_masked(q, k, v, self._forbidden(q, k, pad, causal), need_weights)

        ctx, weights = self.selector.context(query, task, (self.q_proj, self.k_proj, self.v_proj), project_all, attend)
        return AttentionOutput(out=self.out_proj(self._merge(ctx)), weights=weights, carry=weights)

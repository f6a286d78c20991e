"""How the pipeline's systems are set up from params, around the one run skeleton (lib/train/run.py):
the RunSpec of every system (:func:`spec_from_params`; smoothing's :func:`smoothing_spec_from_params`),
the ASR forks (``local.asr_pretraining: fork``, ``local.fork: shared``) and the controls' own forks,
the local model's per-layer attention, and the shared ASR model adopted per pair (``asr.mode: shared``).
"""
from __future__ import annotations

import dataclasses
import shutil
import time
from pathlib import Path
from typing import Any

from lib.data.dataset import SpeechDataset
from lib.decode.beam_search import BeamSearchConfig, translate_dataset
from lib.io import InputError, atomic_write_bytes, atomic_write_json, atomic_write_text, read_json
from lib.layout import SHARED_SYSTEMS, RunPaths, windows_json
from lib.model import checkpoint as model_file
from lib.model.s2t_transformer import model_config
from lib.params import Params
from lib.precision import resolve_amp
from lib.train import checkpoint as ckpt
from lib.train.run import RunSpec, auto_device, copy_curves, score, write_decoded


def spec_from_params(p: Params, root: Path, system: str, pair: str, seed: int | None = None,
                     encoder_attention: list[dict] | None = None) -> RunSpec:
    """The RunSpec of one pipeline run from params: ``system`` is ``asr`` (per pair), ``asr_shared``
    (the one English ASR model of ``asr.mode: shared``, trained on ``asr.shared_pair``; ``pair`` is
    ignored), ``asr_local`` (per pair: ASR pretraining with the local-attention spec, when
    ``local.asr_pretraining`` is ``local``; :func:`asr_fork_spec_from_params` adapts it for ``fork``),
    ``baseline`` or ``local`` (per pair and seed). Baseline
    and local runs take the ``train_st`` hyperparameters with their seed and the pair's ASR encoder,
    so they differ in attention only: ``baseline`` starts from runs/asr/<pair>/model.pt, ``local``
    from runs/asr_local/<pair>/model.pt (a copy of the former when ``local.asr_pretraining`` is
    ``shared``)."""
    d = p.decode
    test = BeamSearchConfig(beam=d.beam, len_penalty=d.len_penalty, max_len_a=d.max_len_a, max_len_b=d.max_len_b)
    dev = BeamSearchConfig(beam=1, max_len_a=d.max_len_a, max_len_b=d.max_len_b)
    if system in SHARED_SYSTEMS:  # one model for every pair (asr.mode: shared; local.fork: shared)
        pair = p.asr.shared_pair
        paths, train_cfg, init = RunPaths(root, system), p.train_asr, None
    elif system in ("asr", "asr_local"):
        paths, train_cfg, init = RunPaths(root, system, pair), p.train_asr, None
    else:
        paths = RunPaths(root, system, pair, seed)  # ValueError for an unknown system or a missing seed
        train_cfg = dataclasses.replace(p.train_st, seed=seed)
        init = RunPaths(root, "asr_local" if system == "local" else "asr", pair).model
    from lib.parallel import threads_per_run

    # the shared ASR model trains alone (every core: nothing else is ready then); every other run, the
    # one shared fork included (local runs and baselines of later seeds are ready beside it), shares
    # them (lib/parallel.py)
    threads = None if system == "asr_shared" else threads_per_run(p.parallel.jobs)
    return RunSpec(task="asr" if system.startswith("asr") else "st", pair=pair, threads=threads,
                   prepared_dir=root / p.data.prepared_dir / pair, paths=paths, train=train_cfg,
                   model_size=p.model.size, model_overrides=p.model.overrides, encoder_attention=encoder_attention,
                   init_encoder=init, decode=test, dev_decode=dev, decode_batch_frames=d.batch_frames,
                   final_checkpoint=d.final_checkpoint, max_dev_decode=d.dev_sentences)


def asr_fork_at(p: Params) -> int | None:
    """The update after which an ASR run keeps its training state (``asr.fork_updates`` before its
    end) for ``local.asr_pretraining: fork``; None when ``asr.fork_updates`` is 0."""
    if p.asr.fork_updates == 0:
        return None
    return p.train_asr.max_updates - p.asr.fork_updates


def asr_fork_spec_from_params(p: Params, root: Path, pair: str, encoder_attention: list[dict]) -> RunSpec:
    """``local.asr_pretraining: fork``: the RunSpec (system ``asr_local``) that continues the pair's
    ASR training from its fork state (runs/asr/<pair>/fork.pt: weights, Adam moments, RNG, data
    position and update count ``asr.fork_updates`` before the end) to ``train_asr.max_updates``
    with the local-attention spec ``encoder_attention``: same data (``asr.shared_pair``'s English under
    ``asr.mode: shared``), schedule, batches and precision as the baseline's ASR model, so the two
    ASR models differ only in the attention of their last ``asr.fork_updates`` updates. Its WER is
    measured on that data's tst-COMMON.

    A demo option, not in the paper (whose local model starts from the full-attention ASR model,
    ``shared``): it lets the encoder learn to work inside its windows before ST, at the cost of
    ``asr.fork_updates`` ASR updates per pair and without more ASR training than the baseline had."""
    spec = spec_from_params(p, root, "asr_local", pair, encoder_attention=encoder_attention)
    if p.asr.mode == "shared":
        spec.prepared_dir = root / p.data.prepared_dir / p.asr.shared_pair
    spec.start_from = RunPaths(root, "asr", pair).fork_state
    return spec


def shared_fork_spec_from_params(p: Params, root: Path, encoder_attention: list[dict]) -> RunSpec:
    """``local.fork: shared``: the one fork (system ``asr_local_shared``, runs/asr_local_shared) that
    finishes the shared English ASR training (runs/asr_shared/fork.pt, ``asr.shared_pair``'s data)
    with ``encoder_attention`` (:func:`shared_fork_attention`); every pair's asr_local is a copy of it.
    Like :func:`asr_fork_spec_from_params`, but trained once instead of once per pair."""
    spec = spec_from_params(p, root, "asr_local_shared", p.asr.shared_pair, encoder_attention=encoder_attention)
    spec.start_from = RunPaths(root, "asr_shared").fork_state
    return spec


def shared_fork_attention(p: Params, root: Path) -> list[dict]:
    """The encoder attention of the ``local.fork: shared`` fork: per layer the widest of every pair's
    local-attention spec (:func:`local_encoder_attention`; ``local.windows`` when set, which is the
    same for all pairs). ValueError names the missing windows file."""
    from lib.model.spec import widest_spec

    return widest_spec([local_encoder_attention(p, root, pair) for pair in p.pairs], key="local.fork: shared")


def control_fork_attention(p: Params, root: Path, system: str) -> list[dict]:
    """The encoder attention of control ``system``'s own fork (stage train_asr_control): per layer the
    widest of every pair's control windows (lib.model.spec.control_attention_spec of that pair's
    local spec), as :func:`shared_fork_attention` is for Algorithm 1's. ValueError names what is missing."""
    from lib.model.spec import control_attention_spec, widest_spec

    specs = [control_attention_spec(local_encoder_attention(p, root, pair), system,
                                    shuffle_seed=p.controls.shuffle_seed, key=f"{system} of {pair}'s local windows")
             for pair in p.pairs]
    return widest_spec(specs, key=f"controls.asr_systems: {system}")


def control_fork_spec_from_params(p: Params, root: Path, system: str, encoder_attention: list[dict]) -> RunSpec:
    """Control ``system``'s own fork (``controls.asr_systems``, runs/variants/controls_asr/<system>): the
    shared English ASR training finished from its fork state with ``encoder_attention``
    (:func:`control_fork_attention`), exactly as :func:`shared_fork_spec_from_params` finishes it with
    Algorithm 1's windows for the local system; so a control and `local` start their ST runs from ASR
    models that differ only in the windows of the last ``asr.fork_updates`` updates."""
    spec = shared_fork_spec_from_params(p, root, encoder_attention)
    spec.paths = RunPaths(root, "controls_asr", variant=system)
    return spec


def control_asr_model(p: Params, root: Path, system: str, pair: str) -> Path:
    """The ASR model control ``system``'s ST run starts from: its own fork when it is in
    ``controls.asr_systems``, else the local system's runs/asr_local/<pair>/model.pt."""
    if system in p.controls.asr_systems:
        return RunPaths(root, "controls_asr", variant=system).model
    return RunPaths(root, "asr_local", pair).model


def uses_shared_fork(p: Params) -> bool:
    """Whether train_local's ASR models come from the one shared fork (stage train_asr_local_shared)."""
    return p.local.asr_pretraining == "fork" and p.local.fork == "shared"


def write_no_fork(paths: RunPaths) -> None:
    """The fork-state output of an ASR run that takes no fork: a placeholder naming the mode."""
    ckpt.save(paths.fork_state, {"unused": "no fork state: asr.fork_updates is 0"})


def local_encoder_attention(p: Params, root: Path, pair: str) -> list[dict]:
    """Per-layer encoder attention of the local-attention model: layers 1..analysis.full_layers
    full, the rest local with ``local.windows`` when that list is non-empty, else with the windows
    that select_windows wrote to data/windows/<pair>/windows.json. ValueError names the param or file."""
    from lib.model.spec import local_attention_spec, validate_spec

    n_layers = model_config(p.model.size, **p.model.overrides).encoder_layers
    if p.local.windows:
        return local_attention_spec(n_layers, p.analysis.full_layers, p.local.windows, key="local.windows")
    path = windows_json(root, pair)
    if not path.is_file():
        raise ValueError(f"{path}: missing; it is written by the select_windows stage (or set local.windows)")
    spec = read_json(path, f"select_windows@{pair}", keys=("encoder_attention",))["encoder_attention"]
    return validate_spec(spec, n_layers, key=f"{path}: encoder_attention")


def _adopt_run(src: RunPaths, dst: RunPaths, hyps: str | None = None) -> None:
    """Make ``dst`` hold ``src``'s model.pt, its decoded test set (or ``hyps`` when given: decoded
    elsewhere; the references are then ``dst``'s own, written by the caller) and its training curves.
    ``dst``'s resume state is removed (it belongs to an earlier run of another model)."""
    dst.run_dir.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(dst.model, src.model.read_bytes())
    if hyps is None:
        atomic_write_bytes(dst.hyps(), src.hyps().read_bytes())
        atomic_write_bytes(dst.refs(), src.refs().read_bytes())
    else:
        atomic_write_text(dst.hyps(), hyps)
    for stale in (dst.checkpoints, dst.live):
        if stale.exists():
            shutil.rmtree(stale)
    copy_curves(src.curves, dst.curves)


def share_asr_run(src: RunPaths, dst: RunPaths) -> dict[str, Any]:
    """``local.asr_pretraining: shared``: make ``dst`` (runs/asr_local/<pair>) a faithful copy of the
    baseline's ASR run ``src`` -- model.pt, decoded test set and training curves -- with its metrics
    marked ``"asr_pretraining": "shared"``, so that train_local always starts from
    runs/asr_local/<pair>/model.pt and the copy says where it came from. Every file is written
    atomically, and only once every input has been read: a missing, damaged or placeholder model or
    metrics file stops it before ``dst`` changes (a damaged model.pt is not passed on as a good one);
    returns the metrics written."""
    producer = f"train_asr@{src.pair}" if src.pair else "train_asr"
    for path in (src.model, src.hyps(), src.refs()):
        if not path.is_file():
            raise FileNotFoundError(f"{path}: missing; it is written by the train_asr stage")
    model_file.read_model_state(src.model, producer=producer)  # InputError unless a loadable model file
    source_metrics = read_json(src.metrics, producer)
    if not isinstance(source_metrics, dict):
        raise InputError(f"{src.metrics}: not a mapping of metrics (written by the {producer} stage); rerun {producer}")
    _adopt_run(src, dst)
    atomic_write_json(dst.timing, {"train_seconds": 0.0, "decode_seconds": 0.0})  # a copy: nothing ran
    metrics = {**source_metrics, "asr_pretraining": "shared"}
    atomic_write_json(dst.metrics, metrics)
    return metrics


def adopt_shared_asr(p: Params, root: Path, pair: str, *, progress: bool = True, source: str = "asr_shared",
                     system: str = "asr") -> dict[str, Any]:
    """``asr.mode: shared``: make runs/asr/<pair> the shared English ASR model (runs/asr_shared,
    trained on ``asr.shared_pair``): model.pt and training curves copied, its tst-COMMON
    hypotheses decoded on *this* pair's test audio (with the shared model's vocabulary) and scored
    against this pair's English references, so metrics/asr/<pair>.json is the shared model's WER
    here. Written atomically. With ``source="asr_local_shared", system="asr_local"`` the same for
    the one fork of ``local.fork: shared`` (no fork state is copied then: a fork has none)."""
    src = RunPaths(root, source)
    stage = {"asr_shared": "train_asr_shared", "asr_local_shared": "train_asr_local_shared"}[source]
    if not src.model.is_file():
        raise FileNotFoundError(f"{src.model}: missing; it is written by the {stage} stage")
    state = ckpt.load(src.model)
    if not isinstance(state, dict) or "model" not in state:
        what = state.get("unused", "a placeholder") if isinstance(state, dict) else f"a {type(state).__name__}"
        raise InputError(f"{src.model}: not a model ({what}); run `dvc repro {stage}` again")
    shared_metrics = read_json(src.metrics, stage)  # read before decoding: nothing is written when it is damaged
    if not isinstance(shared_metrics, dict):
        raise InputError(f"{src.metrics}: not a mapping of metrics (written by the {stage} stage); rerun {stage}")
    spec = spec_from_params(p, root, system, pair)
    device = auto_device()
    amp = resolve_amp(spec.train.amp, device)
    model, _ = model_file.model_from_state(state, device=device)  # the state read above: one read
    test_ds = SpeechDataset(spec.prepared_dir, spec.test_split, "asr",
                            vocab_dir=root / p.data.prepared_dir / p.asr.shared_pair)
    t0 = time.perf_counter()
    hyps = translate_dataset(model, test_ds, spec.decode_batch_frames, spec.decode, device, progress=progress, amp=amp)
    refs = [test_ds.reference(i) for i in range(len(test_ds))]
    _adopt_run(src, spec.paths, "".join(h + "\n" for h in hyps))
    if system == "asr":  # an ASR run keeps a fork state (or its placeholder); a fork does not
        if src.fork_state.is_file():
            atomic_write_bytes(spec.paths.fork_state, src.fork_state.read_bytes())
        else:
            write_no_fork(spec.paths)
    write_decoded(spec.paths, spec.test_split, hyps, refs)
    metrics = {**score("asr", hyps, refs), "asr_mode": "shared", "trained_on": p.asr.shared_pair,
               "dev_best": shared_metrics.get("dev_best"), "updates": shared_metrics.get("updates"),
               "sentences": len(hyps), "params": model.num_parameters(),
               "precision": shared_metrics.get("precision"), "decode_precision": amp}
    if source == "asr_local_shared":
        metrics.update({k: shared_metrics[k] for k in ("asr_pretraining", "fork", "forked_at", "windows")
                        if k in shared_metrics})
    atomic_write_json(spec.paths.metrics, metrics)
    atomic_write_json(spec.paths.timing, {"train_seconds": 0.0, "decode_seconds": round(time.perf_counter() - t0, 1)})
    return metrics


def write_unused_shared_asr(root: Path, system: str = "asr_shared", why: str | None = None,
                            metrics: dict[str, Any] | None = None) -> dict[str, Any]:
    """``asr.mode: per_pair``: train_asr_shared has nothing to train; it writes placeholders for its
    outputs (a model.pt with no weights that names the mode) so the DVC graph is the same in both modes.
    ``system="asr_local_shared"`` (with ``why`` and ``metrics``): the same for train_asr_local_shared
    when ``local.fork`` is not ``shared`` (no fork-state output there)."""
    paths = RunPaths(root, system)
    paths.run_dir.mkdir(parents=True, exist_ok=True)
    ckpt.save(paths.model, {"unused": why or "asr.mode is per_pair: every pair trains its own ASR model (train_asr)"})
    write_decoded(paths, "tst-COMMON", [], [])
    copy_curves(None, paths.curves)
    # a curve with no rows, not an empty folder: git keeps no empty folder, and a fresh clone must
    # find this (git-tracked) plots output or DVC reports the stage as changed
    atomic_write_text(paths.curves / "train" / "loss.tsv", "step\tloss\n")
    if system == "asr_shared":
        write_no_fork(paths)
    atomic_write_json(paths.timing, {"train_seconds": 0.0, "decode_seconds": 0.0})
    metrics = metrics if metrics is not None else {"asr_mode": "per_pair"}
    atomic_write_json(paths.metrics, metrics)
    return metrics


def smoothing_spec_from_params(p: Params, root: Path, name: str, pair: str, seed: int | None = None) -> RunSpec:
    """The RunSpec of one smoothing run (docs/variants.md): ``seed=None`` is the ASR
    pretraining of definition ``name`` (stage train_asr_smoothing, ``train_asr`` hyperparameters, into
    runs/variants/smoothing_asr/<name>/<pair>); with a seed it is the ST run (stage train_smoothing,
    ``train_st`` with that seed), whose encoder starts from that smoothed ASR model when ``name`` is in
    ``smoothing.asr_systems`` and from the baseline's runs/asr/<pair>/model.pt otherwise -- so a
    smoothed ST model differs from the baseline of the same seed in its attention only (and in the
    priors' own parameters, trained at ``smoothing.variant_lr`` outside the encoder's lr scale).

    The definition ``smoothing.defs.<name>`` overlays the encoder's full attention (or, with
    ``base: local``, the local-attention model's spec of :func:`local_encoder_attention`) and sets
    the decoder's self-/cross-attention for the places its ``where`` names. ValueError names the key."""
    from lib.model.spec import smoothing_model_specs

    if name not in p.smoothing.defs:
        raise ValueError(f"smoothing.defs: no system {name!r}; defined: {sorted(p.smoothing.defs)}")
    sdef = p.smoothing.defs[name]
    mcfg = model_config(p.model.size, **p.model.overrides)
    if sdef.get("base", "full") == "local":
        base = local_encoder_attention(p, root, pair)
    else:
        base = [{"type": "full"} for _ in range(mcfg.encoder_layers)]
    encoder, decoder = smoothing_model_specs(base, sdef, mcfg.decoder_layers, key=f"smoothing.defs.{name}")
    overrides = {**p.model.overrides, **{k: v for k, v in decoder.items() if v is not None}}
    if seed is None:
        spec = spec_from_params(p, root, "asr", pair, encoder_attention=encoder)
        spec.paths = RunPaths(root, "smoothing_asr", pair, variant=name)
    else:
        spec = spec_from_params(p, root, "baseline", pair, seed, encoder_attention=encoder)
        spec.paths = RunPaths(root, "smoothing", pair, seed, variant=name)
        if name in p.smoothing.asr_systems:
            spec.init_encoder = RunPaths(root, "smoothing_asr", pair, variant=name).model
    spec.model_overrides = overrides
    # the priors' own parameters (band logits, gate vector and bias) in an optimizer group of their own
    spec.train = dataclasses.replace(spec.train, variant_lr=p.smoothing.variant_lr)
    return spec

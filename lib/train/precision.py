"""``amp: probe``: the training precision measured on this machine (``amp: auto`` is lib/precision.py's
CPU-kind rule; this module is its measured alternative, for a CPU kind the rule has not seen).

The probe (:func:`resolve_train_amp`) times training steps of the run's own model on its first
training batches in both precisions, each batch shape new to each precision as in a real run (oneDNN
compiles and caches a bf16 kernel per shape: repeated or synthetic equal-length batches flatter bf16),
and keeps bf16 only when the median of its per-batch speedups is at least 15 % (fp32 is the more
accurate one, so it wins ties and near-ties; the median, because single steps on 2 cores vary
0.8-1.6x). A probe's median within 0.15 of that threshold is measured twice more and the median of
the three decides (``scripts/probe_precision.py`` runs it alone).

The answer is cached under ``~/.cache/locality-st/precision/`` (``LOCALITY_ST_CACHE`` moves it), keyed
by CPU (:func:`cpu_identity`: model name, family, model, stepping), torch version, thread count, model
and batch size, so every run on a machine gets the same answer: same seed, same machine, same metrics.
The model is the *baseline's* (:func:`baseline_model_config`): a local-attention (smoothing,
head-selection) run trains in the precision measured for its baseline, so the two differ in the
attention only.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

import torch

from lib import precision as cpu_precision
from lib.precision import BF16_PAD_TO, autocast, resolve_amp, resolve_padding  # noqa: F401 (BF16_PAD_TO re-exported)

# bf16 must beat fp32 by this factor (the probe's median) to be chosen for training: clearly, not by
# noise, and by more than bf16 loses later in a long run (ASR bf16 steps: 275-281 ms over updates 1-32,
# 325-338 ms over 49-64; fp32 steady at 295; 2-core Xeon with AMX). The AMD EPYC's 1.66x passes.
BF16_MIN_SPEEDUP = 1.15
PROBE_BATCHES = 17  # distinct training batches of the probe: 1 warm-up + 16 timed, each in both precisions
# Version of the probe's method, part of the cache key: a cached answer of an older probe is measured again.
# 2: each precision in its own process, the median of per-batch speedups over 16 batches
# (1: both precisions interleaved in one process, the ratio of the mean step times over 8 batches: it
# picked bf16 for ST at 1.12-1.18x, and those runs trained 0.82x as fast as fp32 ones).
# 3: a median within PROBE_CONFIRM_BAND of the threshold is measured twice more and the
# median of the three decides (2 kept en-it's ST runs in fp32 on a probe of 1.06x, most likely taken
# beside another training stage; alone, `python scripts/probe_precision.py` gives 1.40x and 1.47x).
PROBE_VERSION = 3
# A probe whose median speedup lies this close to BF16_MIN_SPEEDUP is measured PROBE_REPEATS times in
# all: on 2 cores one probe's median has varied by 0.3 or more (en-it's ST model: 1.06x, then 1.40x and
# 1.47x; en-de's 1.30x and 1.53x in one run of scripts/probe_precision.py), enough to flip a choice near
# the threshold.
PROBE_CONFIRM_BAND = 0.15
PROBE_REPEATS = 3
# Fewer training batches than this (1 warm-up + 8 timed): a toy set, too small for a median that
# means anything; the run keeps the CPU-flag answer (bf16 where the CPU has it), uncached.
PROBE_MIN_BATCHES = 9


def cache_dir() -> Path:
    """Where machine-level measurements are kept (``LOCALITY_ST_CACHE`` or ~/.cache/locality-st)."""
    return Path(os.environ.get("LOCALITY_ST_CACHE") or Path.home() / ".cache" / "locality-st")


def cpu_identity(cpuinfo: str | Path = "/proc/cpuinfo") -> str:
    """The CPU as the probe cache knows it: the model name plus family, model and stepping, e.g.
    ``AMD EPYC (family 26, model 2, stepping 1)``. Virtual machines often report a bare model
    name ("AMD EPYC") for different CPU generations, whose bf16 speed-ups differ, and a home
    directory (hence the cache) may be shared between hosts; the numbers tell them apart. (The
    default run's probes on two machines that both report "AMD EPYC" gave ASR 1.52x / ST 1.35-1.40x
    and ASR 1.75x / ST 1.73-1.80x; the name alone cannot tell such machines apart.)"""
    fields: dict[str, str] = {}
    try:
        with open(cpuinfo, encoding="utf-8") as f:
            for line in f:
                if not line.strip():
                    break  # the first processor's block is enough
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor() or platform.machine()
    numbers = [f"{k if k != 'cpu family' else 'family'} {fields[k]}" for k in ("cpu family", "model", "stepping")
               if fields.get(k)]
    return f"{name} ({', '.join(numbers)})" if numbers else name


def _batch_to_dict(batch: Any) -> dict[str, Any]:
    return {k: getattr(batch, k) for k in ("ids", "feats", "feat_lengths", "prev_tokens", "target", "target_lengths",
                                           "src_texts", "tgt_texts", "task")}


def time_training_steps(model_config: dict[str, Any], batches: list, amp: str, ctc_weight: float = 0.0,
                        warm: bool = False) -> list[float]:
    """Seconds of each training step (forward, backward, fused Adam) of a fresh model built from
    ``model_config`` on ``batches``, in ``amp``, in this process; ``batches[0]``'s step is the warm-up
    and is not returned. ``warm``: time a second pass over ``batches`` instead, every shape's kernels
    built by the first (padded batches, whose few shapes a run meets again and again). Under
    ``torch.random.fork_rng``: the caller's RNG state is untouched."""
    from lib.model.s2t_transformer import ModelConfig, S2TTransformer
    from lib.train.criterion import Criterion

    steps = []
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = S2TTransformer(ModelConfig(**model_config)).train()
        crit = Criterion(model, 0.1, ctc_weight)
        opt = torch.optim.Adam(model.parameters(), lr=1e-5, fused=True)
        for i, batch in enumerate(list(batches) * 2 if warm else batches):
            t0 = time.perf_counter()
            with autocast(torch.device("cpu"), amp):
                loss, _ = crit(batch)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if i > (len(batches) if warm else 0):
                steps.append(time.perf_counter() - t0)
    return steps


def _child_step_times(model_config: dict[str, Any], batches: list, amp: str, ctc_weight: float,
                      warm: bool = False) -> list[float]:
    """:func:`time_training_steps` in a fresh Python process (``python -m lib.train.precision``), as a
    training stage runs: nothing of the other precision in it. Same thread count as this process."""
    import subprocess
    import tempfile

    root = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory(prefix="amp-probe-") as tmp:
        job = Path(tmp) / "job.pt"
        torch.save({"model_config": model_config, "amp": amp, "ctc_weight": float(ctc_weight), "warm": warm,
                    "threads": torch.get_num_threads(), "batches": [_batch_to_dict(b) for b in batches]}, job)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
        out = subprocess.run([sys.executable, "-m", "lib.train.precision", str(job)], cwd=root, env=env,
                             capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(f"the amp probe's {amp} process failed:\n{out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def probe_step_times(model_config: dict[str, Any], batches: list, ctc_weight: float = 0.0,
                     bf16_batches: list | None = None) -> dict[str, float]:
    """Mean seconds of one training step (forward, backward, fused Adam) of a fresh model built from
    ``model_config`` (``ModelConfig.to_dict()``) on ``batches`` (collated ``Batch``es of the run's
    own training data, all different), in fp32 (``none``) and bf16 autocast, and ``speedup``: the
    median over the timed batches of fp32 time / bf16 time of the same batch, which decides.
    ``bf16_batches``: the same items collated as a bf16 run would train on them (padded to fewer
    shapes, ``pad_*: auto``), timed in bf16 instead of ``batches``. Then both precisions are timed
    on a second pass over their batches (``warm``): a padded run meets its few dozen shapes again and
    again, so nearly all its updates run on kernels already built (ASR padded to 64 frames: 22
    shapes in 60 updates), and the first pass would charge bf16 a kernel build per batch that a
    run pays once per shape. fp32's second pass flatters fp32, if anything: the choice stays
    conservative.

    Measured as a run experiences it (all on a 2-core Xeon with AMX, demo model):
    - Every precision sees every batch shape once. oneDNN builds a bf16 kernel per new shape and
      caches it, so repeated batches flatter bf16 (ST batches seen before: bf16 1.16x faster than
      fp32; new batches, as in a real run: 0.9x).
    - Each precision in its own fresh process (:func:`_child_step_times`), fp32 first. In one
      process, bf16 steps slow the fp32 steps after them: ASR fp32 296 ms per step before any bf16
      step, 333 ms after bf16 ones; interleaved per batch, the probe measured bf16 1.12-1.21x
      faster where separate processes measured 1.07x.
    - The median of per-batch ratios: single steps vary 0.8-1.6x on 2 cores (an allocator or
      scheduler hiccup); the ratio of the means over 8 batches once followed such steps to bf16
      at 1.12-1.18x for ST runs that then trained 0.82x as fast as fp32 ones.
    ``batches[0]`` is each process's warm-up."""
    if len(batches) < 3:
        raise ValueError(f"the precision probe needs at least 3 training batches, got {len(batches)}")
    if bf16_batches is not None and len(bf16_batches) != len(batches):
        raise ValueError(f"the probe's bf16 batches must be the same {len(batches)} batches, got {len(bf16_batches)}")
    per_amp = {"none": batches, "bf16": batches if bf16_batches is None else bf16_batches}
    warm = bf16_batches is not None
    steps = {amp: _child_step_times(model_config, per_amp[amp], amp, ctc_weight, warm=warm) for amp in ("none", "bf16")}
    return {"none": statistics.fmean(steps["none"]), "bf16": statistics.fmean(steps["bf16"]),
            "speedup": statistics.median(f / b for f, b in zip(steps["none"], steps["bf16"]))}


def baseline_model_config(model_config: dict[str, Any]) -> dict[str, Any]:
    """The model config that ``amp: auto``'s probe times and keys its cache on: ``model_config`` with
    every attention variant replaced by the baseline's (full encoder self-attention, plain decoder
    attention). So every system of a pair and data (local attention, smoothing, head selection)
    trains in the precision measured for its baseline, and a comparison with the baseline differs in
    the attention only, never in the precision: when each system had its own probe, en-de's baselines
    trained in bf16 and its local models in fp32 in one run. A full-attention model's config is returned unchanged (its cache key too)."""
    d = dict(model_config)
    if d.get("encoder_attention") is not None:
        d["encoder_attention"] = [{"type": "full"} for _ in d["encoder_attention"]]
    d.pop("decoder_self_attention", None)
    d.pop("cross_attention", None)
    return d


def resolve_train_amp(amp: str, device: torch.device, model_config: dict[str, Any], max_frames: int,
                      probe_batches: Callable[[], list], ctc_weight: float = 0.0, data_id: str = "",
                      pad_to: tuple[int, int] = (1, 1), bf16_pad_to: tuple[int, int] | None = None,
                      bf16_probe_batches: Callable[[], list] | None = None) -> str:
    """The precision a training run uses: :func:`resolve_amp`, except on a CPU with native bf16: ``auto``
    follows :func:`cpu_trains_faster_in_bf16`, and ``probe`` is measured (:func:`probe_step_times` on ``probe_batches()``, a few of the run's
    training batches; ``data_id`` names that data in the cache key) once per machine, model,
    data, batch size and batch padding (``pad_to``: the run's ``pad_frames_to, pad_tokens_to``)
    and cached (module docstring); the model is the baseline of ``model_config``
    (:func:`baseline_model_config`): ``bf16`` when it is at least ``BF16_MIN_SPEEDUP`` x faster,
    else ``none``. When a bf16 run would pad its batches otherwise (``bf16_pad_to``, with
    ``bf16_probe_batches()``: the same batches so padded), bf16 is timed on those: each precision as
    it would train. The choice and its figures go to stderr."""
    resolved = resolve_amp(amp, device)
    if amp not in ("auto", "probe") or device.type != "cpu" or resolved != "bf16":
        return resolved
    if amp == "auto":  # the CPU-kind rule: stable from run to run and host to host
        choice = "bf16" if cpu_precision.cpu_trains_faster_in_bf16() else "none"
        print(f"precision (amp: auto, training): {choice} on this CPU kind ("
              + ("AVX-512 BF16 without AMX" if choice == "bf16" else "AMX: bf16 trains slower on the demo's shapes")
              + "; lib/precision.py)", file=sys.stderr)
        return choice
    model_config = baseline_model_config(model_config)  # every system of a pair: its baseline's precision
    ident = {"cpu": cpu_identity(), "torch": torch.__version__, "threads": torch.get_num_threads(),
             "probe": PROBE_VERSION, "model": model_config, "max_frames": int(max_frames),
             "ctc_weight": float(ctc_weight), "data": data_id}
    if tuple(pad_to) != (1, 1):  # (only when set: the caches of unpadded runs keep their keys)
        ident["pad_to"] = [int(x) for x in pad_to]
    if bf16_pad_to is not None and tuple(bf16_pad_to) != tuple(pad_to):
        if bf16_probe_batches is None:
            raise ValueError("bf16_pad_to differs from pad_to: the probe needs bf16_probe_batches")
        ident["bf16_pad_to"] = [int(x) for x in bf16_pad_to]
    else:
        bf16_probe_batches = None
    key = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
    path = cache_dir() / "precision" / f"train-{key}.json"
    try:
        cached = json.loads(path.read_text(encoding="utf-8"))
        if cached.get("ident") == ident and cached.get("choice") in ("none", "bf16"):
            print(f"precision (amp: probe, training): {cached['choice']}, measured on this machine before "
                  f"(fp32 {cached['fp32_ms']:.0f} ms vs bf16 {cached['bf16_ms']:.0f} ms per step; {path})",
                  file=sys.stderr)
            return cached["choice"]
    except (OSError, ValueError, KeyError, TypeError):
        pass
    # One measurement per machine even when runs start in parallel (the 5-seed sweep): the first
    # holds the lock and measures, the others wait and read its answer.
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        with contextlib.suppress(ImportError, OSError):
            import fcntl
            fcntl.flock(lock, fcntl.LOCK_EX)
        if path.exists():
            with contextlib.suppress(OSError, ValueError, KeyError):
                cached = json.loads(path.read_text(encoding="utf-8"))
                if cached.get("ident") == ident and cached.get("choice") in ("none", "bf16"):
                    return cached["choice"]
        print("precision (amp: probe, training): timing fp32 and bf16 training steps on this CPU (once per "
              "machine, model, data and batch size) ...", file=sys.stderr)
        batches = probe_batches()
        if len(batches) < PROBE_MIN_BATCHES:  # a toy training set: nothing to measure, keep the CPU-flag answer
            print(f"precision (amp: probe, training): bf16 (only {len(batches)} training batches: too few to "
                  "measure; not cached)", file=sys.stderr)
            return "bf16"
        started = time.perf_counter()
        bf16_batches = bf16_probe_batches() if bf16_probe_batches is not None else None
        rounds = [probe_step_times(model_config, batches, ctc_weight, bf16_batches=bf16_batches)]
        if abs(rounds[0]["speedup"] - BF16_MIN_SPEEDUP) < PROBE_CONFIRM_BAND:  # too close to call on one probe
            print(f"precision (amp: probe, training): median speedup {rounds[0]['speedup']:.2f}x is within "
                  f"{PROBE_CONFIRM_BAND} of {BF16_MIN_SPEEDUP}x; measuring {PROBE_REPEATS - 1} more times",
                  file=sys.stderr)
            rounds += [probe_step_times(model_config, batches, ctc_weight, bf16_batches=bf16_batches)
                       for _ in range(PROBE_REPEATS - 1)]
        t = {"none": statistics.fmean(r["none"] for r in rounds), "bf16": statistics.fmean(r["bf16"] for r in rounds),
             "speedup": statistics.median(r["speedup"] for r in rounds)}
        choice = "bf16" if t["speedup"] >= BF16_MIN_SPEEDUP else "none"
        record = {"ident": ident, "choice": choice, "fp32_ms": 1e3 * t["none"], "bf16_ms": 1e3 * t["bf16"],
                  "median_speedup": t["speedup"], "min_speedup": BF16_MIN_SPEEDUP,
                  "probe_speedups": [round(r["speedup"], 4) for r in rounds],
                  "loadavg": [round(x, 2) for x in os.getloadavg()] if hasattr(os, "getloadavg") else None,
                  "probe_seconds": round(time.perf_counter() - started, 1)}
        from lib.io import atomic_write_json
        atomic_write_json(path, record)
    padded = f" padded to {ident['bf16_pad_to'][0]} frames / {ident['bf16_pad_to'][1]} tokens" if "bf16_pad_to" in ident else ""
    over = f" (the median of {len(rounds)} probes)" if len(rounds) > 1 else ""
    print(f"precision (amp: probe, training): {choice} (fp32 {record['fp32_ms']:.0f} ms vs bf16{padded} "
          f"{record['bf16_ms']:.0f} ms per step on average, median speedup {t['speedup']:.2f}x{over}; bf16 needs >= "
          f"{BF16_MIN_SPEEDUP}x; measured in {record['probe_seconds']} s, cached in {path})", file=sys.stderr)
    return choice


def resolve_train_precision(cfg: Any, device: torch.device, model_config: dict[str, Any],
                            batches: Callable[[tuple[int, int]], list], data_id: str = "") -> tuple[str, tuple[int, int]]:
    """A training run's precision and batch padding, ``(amp, (pad_frames_to, pad_tokens_to))``, for
    its ``TrainConfig`` ``cfg``: :func:`resolve_train_amp` with each precision probed on the batches
    it would train on (``batches(pad)``: the run's first :data:`PROBE_BATCHES` training batches
    collated with that padding), then :func:`resolve_padding` for the precision chosen."""
    pad_fp32 = resolve_padding(cfg.pad_frames_to, cfg.pad_tokens_to, "none", device)
    pad_bf16 = resolve_padding(cfg.pad_frames_to, cfg.pad_tokens_to, "bf16", device)
    amp = resolve_train_amp(cfg.amp, device, model_config, cfg.max_frames, ctc_weight=cfg.ctc_weight,
                            data_id=data_id, pad_to=pad_fp32, probe_batches=lambda: batches(pad_fp32),
                            bf16_pad_to=pad_bf16, bf16_probe_batches=lambda: batches(pad_bf16))
    return amp, resolve_padding(cfg.pad_frames_to, cfg.pad_tokens_to, amp, device)


def _probe_child(job_path: str) -> None:
    """Entry of :func:`_child_step_times`' process: prints the step times as one JSON line."""
    from lib.data.dataset import Batch

    job = torch.load(job_path, weights_only=True)
    torch.set_num_threads(job["threads"])
    batches = [Batch(**b) for b in job["batches"]]
    print(json.dumps(time_training_steps(job["model_config"], batches, job["amp"], job["ctc_weight"],
                                         warm=job.get("warm", False))))


if __name__ == "__main__":
    _probe_child(sys.argv[1])

"""Benchmark: local vs full attention -- the attention op and the whole 12-layer encoder, on CPU.

Side by side, in one run, for N in {166, 512, 1052} (MuST-C mean / - / max length after the
conv subsampler), batch 8, fp32, forward (under ``torch.no_grad``) and forward + backward:

1. the attention op (B=8, H=4, dh=64): full SDPA vs band-masked SDPA vs materialised scores vs
   ``lib.model.local_attention`` for w in {5, 13, 25} -- by calling
   ``benchmarks/local_attention.py``'s ``run`` (its timing and memory code, unchanged);
2. the stack of the 12 ``EncoderLayer`` modules at paper size (d=256, 4 heads, FFN 2048), input
   (B, N, d) directly (i.e. after the conv subsampler, identical for every model), with the
   pipeline's all-False padding mask, for three per-layer attention configurations:
   ``full`` (12 x full), ``paper`` (layers 1-3 full, 4-12 local with the paper's En-De windows
   5 5 9 13 11 15 19 17 21) and ``own`` (the ``encoder_attention`` list of
   ``data/windows/<pair>/windows.json`` written by select_windows; skipped with a note when the
   file is absent).  All three share the same weights (loaded from the full stack).

Time: median over at least ``reps`` repetitions after warm-up (op: more until 0.5 s of samples per
method; encoder: until 2 s per configuration, i.e. ~10 reps at N = 166), the configurations of one N interleaved
round-robin (``benchmarks.local_attention.time_interleaved``) so that load from other
processes hits them alike.  Forward+backward = ``torch.autograd.grad`` of the output with a
fixed upstream gradient w.r.t. the input and all parameters (what training needs: the conv
subsampler below also gets its gradient).  Modules in eval mode (no dropout: both models
would pay for it alike, and SDPA with dropout leaves its fused kernel).

Memory: peak extra resident memory of one step, each (configuration, N) in a fresh
subprocess with ``MALLOC_MMAP_THRESHOLD_=65536`` -- the method of benchmarks/local_attention.py
(``_peak_extra``: VmRSS before, VmHWM reset via /proc/self/clear_refs, VmHWM after), reused.

FLOP bounds (benchmarks/efficiency_report.py): op N / w; encoder MACs(full) / MACs(config) counting
projections 4 N d^2, FFN 2 N d f, attention 2 N N_eff d per layer.

Usage:
    python benchmarks/encoder_efficiency.py [--quick] [--pair en-de | --windows-json PATH]
        [--metrics metrics/efficiency.json --md metrics/efficiency.md
         --plot plots/efficiency/time_vs_N.png --raw-json PATH]
Options left out (N, op windows, reps, quick, pair) come from the ``efficiency`` section of
params.yaml (``load_params("params.yaml").efficiency``, lib.params.EfficiencyParams; its defaults
N = 166 512 1052, op w = 5 13 25, 7 op / 5 encoder reps, pair en-de when the section is absent).
Default: ~8 min on 2 shared CPU cores; --quick (N in {166, 512}, op w = 13, 3 op reps, 1 encoder
rep, encoder memory at N = 512 only: a smoke test, its ratios are noisy) under a minute.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

import torch
from torch import Tensor, nn

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import efficiency_report as eff  # noqa: E402
from benchmarks import local_attention as op_bench  # noqa: E402
from lib.model.s2t_transformer import EncoderLayer, model_config  # noqa: E402
from lib.params import EfficiencyParams, ParamError, load_params  # noqa: E402

BATCH = op_bench.BATCH  # 8
SIZE = "s"  # paper size: d = 256, 4 heads, FFN 2048, 12 encoder layers
DEFAULT_NS = (166, 512, 1052)
DEFAULT_OP_WINDOWS = (5, 13, 25)
ENCODER_MIN_SECONDS = 2.0  # at least this much measured time per configuration (more reps at N = 166)
WARMUP_N = 32  # sequence length of the memory child's fwd+bwd warm-up
# --quick: a smoke test of the whole benchmark (its ratios are noisy): encoder memory only at N = 512,
# encoder warm-up at N = WARMUP_N only.
QUICK = {"ns": (166, 512), "op_windows": (13,), "op_reps": 3, "encoder_reps": 1}

METHOD_NOTES = [
    "Time: median wall time (time.perf_counter) of one step over the repetitions, in the main process, "
    "after warm-up (op: 2 per method; encoder: one fwd+bwd per configuration at full size, which also warms "
    "the forward; --quick: at N = 32). The methods / configurations of one (N, w) / N are timed interleaved "
    "round-robin so that load from other processes hits them alike. fwd = forward under torch.no_grad; "
    "fwd+bwd = forward + torch.autograd.grad with a fixed upstream gradient (op: w.r.t. q, k, v; encoder: "
    "w.r.t. the input and every parameter). Eval mode, no dropout. torch's default thread count.",
    "Memory: every (method, N, w) of the op and every (configuration, N) of the encoder runs once more in "
    "a fresh subprocess (MALLOC_MMAP_THRESHOLD_=65536, so large tensors are mmapped and returned on free); "
    "after warm-up, peak extra memory = VmHWM after the step (peak mark reset through /proc/self/clear_refs) "
    "minus VmRSS before it: temporaries, saved activations, output and gradients beyond the inputs "
    "(and, for the encoder, beyond the weights). Encoder child warm-up: fwd at full size, fwd+bwd at N = 32.",
    "Encoder input: (B, N, d) random, all-False padding mask (what S2TTransformerEncoder passes: full layers "
    "call SDPA with a (B, 1, 1, N) zero bias -- about 2 % slower than no mask for the op at N = 1052 -- local "
    "layers local_attention with the mask); the conv subsampler and final layer norm are left out "
    "(identical for both).",
    "FLOP bound: multiply-adds of q/k/v/out projections 4 N d^2, FFN 2 N d f and attention 2 N N_eff d per "
    "layer; N_eff = N (full), w (local, ideal) or blk + w - 1 (local, what the blocked kernel computes: impl. "
    "bound); layer norm / softmax / ReLU / bias / residual not counted (< 2 % of the MACs, listed above); "
    "the backward is 2x the forward for every term, so the bound holds for fwd and fwd+bwd alike.",
    "Load: os.getloadavg() at start / end, and the CPU share of the encoder timing loops (process CPU time "
    "/ (wall x threads)); contention from other processes slows the local kernel (many small parallel "
    "regions) much more than SDPA, so a run on a busy machine is flagged.",
]


# ----------------------------------------------------------------------------------------------- encoder


class EncoderStack(nn.Module):
    """The encoder's layers only: (B, N, d) -> (B, N, d) through ``EncoderLayer``s."""

    def __init__(self, specs: Sequence[dict], size: str = SIZE) -> None:
        super().__init__()
        cfg = model_config(size, encoder_attention=[dict(s) for s in specs])
        self.cfg = cfg
        self.layers = nn.ModuleList(EncoderLayer(cfg, s) for s in cfg.encoder_attention)

    def forward(self, x: Tensor, padding_mask: Tensor) -> Tensor:
        for layer in self.layers:
            x, _, _ = layer(x, padding_mask)
        return x


def build_stacks(configs: dict[str, list[dict]], seed: int = 0) -> dict[str, EncoderStack]:
    """One stack per configuration, all with the weights of the first (same parameter names)."""
    torch.manual_seed(seed)
    stacks: dict[str, EncoderStack] = {}
    ref = None
    for name, specs in configs.items():
        st = EncoderStack(specs).eval()
        if ref is None:
            ref = st.state_dict()
        else:
            st.load_state_dict(ref)
        stacks[name] = st
    return stacks


def encoder_inputs(n: int, d: int, seed: int = 0) -> tuple[Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(BATCH, n, d, generator=g).requires_grad_(True)
    mask = torch.zeros(BATCH, n, dtype=torch.bool)
    go = torch.randn(BATCH, n, d, generator=g)
    return x, mask, go


def enc_step_fwd(stack: EncoderStack, x: Tensor, mask: Tensor, go: Tensor):
    with torch.no_grad():
        return stack(x, mask)


def enc_step_fwdbwd(stack: EncoderStack, x: Tensor, mask: Tensor, go: Tensor):
    out = stack(x, mask)
    return torch.autograd.grad(out, [x, *stack.parameters()], go)


def encoder_child_main(specs_json: str, n: int) -> None:
    """Fresh process: peak extra memory (bytes) of one fwd and one fwd+bwd step, as JSON."""
    specs = json.loads(specs_json)
    torch.manual_seed(0)
    stack = EncoderStack(specs).eval()
    inputs = encoder_inputs(n, stack.cfg.d_model)
    # Warm-up (code pages, thread pools, one-off buffers): the forward at full size (cheap), the
    # backward at a small N (a full-size one would double the child's cost; the first full-size
    # fwd+bwd then reads <= ~0.3 % above the steady state, checked at N = 512).
    enc_step_fwd(stack, *inputs)
    enc_step_fwdbwd(stack, *encoder_inputs(min(n, WARMUP_N), stack.cfg.d_model))
    fwd = op_bench._peak_extra(enc_step_fwd, stack, inputs)
    fb = op_bench._peak_extra(enc_step_fwdbwd, stack, inputs)
    print(json.dumps({"fwd_bytes": fwd, "fwdbwd_bytes": fb}))


def measure_encoder_memory(specs: list[dict], n: int) -> dict:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--_child", json.dumps(specs), str(n)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if res.returncode != 0:
        raise RuntimeError(f"memory child failed ({n=}): {res.stderr[-2000:]}")
    return json.loads(res.stdout.strip().splitlines()[-1])


def run_encoder(configs: dict[str, list[dict]], ns: Sequence[int], reps: int, *,
                memory_ns: Sequence[int] | None = None, full_warmup: bool = True, log=print) -> list[dict]:
    """Time every configuration at every N; peak memory (fresh subprocesses) at ``memory_ns``
    (default: every N; rows elsewhere get ``"mem": None``).  ``full_warmup=False`` (quick mode)
    warms up at N = WARMUP_N instead of full size: faster, but the first timed call of each
    configuration then runs ~10 % slow."""
    memory_ns = set(ns if memory_ns is None else memory_ns)
    stacks = build_stacks(configs)
    d = next(iter(stacks.values())).cfg.d_model
    rows = []
    for n in ns:
        inputs = encoder_inputs(n, d)
        warm = inputs if full_warmup else encoder_inputs(min(n, WARMUP_N), d)
        for stack in stacks.values():  # one fwd+bwd warm-up per stack (covers the forward)
            enc_step_fwdbwd(stack, *warm)
        del warm
        with CpuShare() as share:
            fwd = op_bench.time_interleaved(enc_step_fwd, stacks, inputs, reps, warmup=0, min_seconds=ENCODER_MIN_SECONDS)
            fb = op_bench.time_interleaved(enc_step_fwdbwd, stacks, inputs, reps, warmup=0,
                                           min_seconds=ENCODER_MIN_SECONDS)
        del inputs
        for name, specs in configs.items():
            rows.append({"N": n, "config": name, "fwd": fwd[name], "fwdbwd": fb[name],
                         "cpu_share": round(share.value, 3),
                         "mem": measure_encoder_memory(specs, n) if n in memory_ns else None})
        log(f"  encoder N={n}: " + ", ".join(
            f"{c} fwd {fwd[c]['median_ms']:.0f} / fwd+bwd {fb[c]['median_ms']:.0f} ms" for c in configs)
            + f"  (CPU share {share.value:.2f}, load {_load()})")
    return rows


class CpuShare:
    """CPU time this process got during a block / (wall time x torch threads).

    Close to 1 when the timed steps ran alone on ``torch.get_num_threads()`` cores; clearly lower
    when other processes took cores away (no subprocesses may run inside the block).
    """

    value: float = math.nan

    @staticmethod
    def _cpu() -> float:
        r = resource.getrusage(resource.RUSAGE_SELF)
        return r.ru_utime + r.ru_stime

    def __enter__(self) -> CpuShare:
        self._t0, self._c0 = time.perf_counter(), self._cpu()
        return self

    def __exit__(self, *exc) -> None:
        wall = time.perf_counter() - self._t0
        self.value = (self._cpu() - self._c0) / max(wall * torch.get_num_threads(), 1e-9)


# ----------------------------------------------------------------------------------------------- driver


def _load() -> str:
    return "/".join(f"{x:.2f}" for x in os.getloadavg())


def encoder_configs(windows_json: Path | None) -> tuple[dict[str, list[dict]], list[str]]:
    configs = {"full": eff.full_spec(), "paper": eff.paper_spec()}
    notes: list[str] = []
    if windows_json is None:
        notes.append("own windows: no windows.json given, skipped")
    else:
        own = eff.load_windows_json(windows_json)
        if own is None:
            notes.append(f"own windows: {windows_json} absent (select_windows not run), skipped")
        else:
            configs["own"] = own
            try:
                shown = windows_json.resolve().relative_to(ROOT)
            except ValueError:
                shown = windows_json
            notes.append(f"own windows from {shown}")
    return configs, notes


def run_benchmark(*, ns: Sequence[int] = DEFAULT_NS, op_windows: Sequence[int] = DEFAULT_OP_WINDOWS,
                  op_reps: int = 7, encoder_reps: int = 5, windows_json: Path | None = None,
                  quick: bool = False, log=print) -> dict:
    """Run both parts; returns the result dict that benchmarks/efficiency_report.py turns into outputs."""
    if quick:
        ns, op_windows = QUICK["ns"], QUICK["op_windows"]
        op_reps, encoder_reps = QUICK["op_reps"], QUICK["encoder_reps"]
    t0 = time.time()
    load0 = list(os.getloadavg())
    cfg = model_config(SIZE)
    log(f"torch {torch.__version__}, torch.get_num_threads() = {torch.get_num_threads()} (default), "
        f"{os.cpu_count()} CPUs, load avg {_load()}; B={BATCH}, d={cfg.d_model}, H={cfg.n_heads}, "
        f"FFN {cfg.ffn_dim}, {cfg.encoder_layers} layers, fp32; N={list(ns)}, op w={list(op_windows)}, "
        f"reps op {op_reps} / encoder {encoder_reps}{' (quick)' if quick else ''}")
    configs, notes = encoder_configs(windows_json)
    for note in notes:
        log(f"  {note}")

    log("attention op ...")
    op_rows = op_bench.run(list(ns), list(op_windows), op_reps)
    load_mid = list(os.getloadavg())
    log(f"  op done after {time.time() - t0:.0f} s (load {_load()})")
    log("whole encoder ...")
    # quick: encoder memory at the largest N only (each child costs a full fwd + fwd+bwd).
    memory_ns = [max(ns)] if quick else list(ns)
    enc_rows = run_encoder(configs, ns, encoder_reps, memory_ns=memory_ns, full_warmup=not quick, log=log)
    meta = {
        "torch": torch.__version__, "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
        "cpu": platform.processor() or platform.machine(), "batch": BATCH, "d_model": cfg.d_model,
        "heads": cfg.n_heads, "ffn_dim": cfg.ffn_dim, "layers": cfg.encoder_layers, "dtype": "float32",
        "device": "cpu", "quick": quick, "ns": list(ns), "op_windows": list(op_windows),
        "op_reps": op_reps, "encoder_reps": encoder_reps, "encoder_memory_ns": memory_ns, "loadavg_start": load0, "loadavg_mid": load_mid,
        "loadavg_end": list(os.getloadavg()), "seconds": round(time.time() - t0, 1),
        "method_notes": METHOD_NOTES,
    }
    log(f"done in {meta['seconds']:.0f} s, load avg {_load()}")
    return {"meta": meta, "op": op_rows, "encoder": {"configs": configs, "notes": notes, "rows": enc_rows}}


def settings(args: argparse.Namespace, params_path: Path = ROOT / "params.yaml") -> EfficiencyParams:
    """The ``efficiency`` section of ``params_path`` (``load_params(...).efficiency``; its defaults
    when the section is absent), with every option given on the command line taking precedence."""
    p = load_params(params_path).efficiency
    given = {"pair": args.pair, "lengths": args.ns, "op_windows": args.op_windows, "op_reps": args.op_reps,
             "encoder_reps": args.encoder_reps, "quick": args.quick}
    return dataclasses.replace(p, **{k: v for k, v in given.items() if v is not None})


def main(argv=None) -> dict | None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 epilog="Options left out take their value from the 'efficiency' section of "
                                        "params.yaml (lib.params.EfficiencyParams; its defaults when absent).")
    ap.add_argument("--quick", action=argparse.BooleanOptionalAction, default=None,
                    help="N in {166, 512}, op w = 13, 3 op / 1 encoder reps (~1 min) (efficiency.quick)")
    ap.add_argument("--ns", type=int, nargs="+", default=None, help="sequence lengths N (efficiency.lengths)")
    ap.add_argument("--op-windows", type=int, nargs="+", default=None, help="(efficiency.op_windows)")
    ap.add_argument("--op-reps", type=int, default=None, help="(efficiency.op_reps)")
    ap.add_argument("--encoder-reps", type=int, default=None, help="(efficiency.encoder_reps)")
    ap.add_argument("--pair", default=None,
                    help="own windows: data/windows/<pair>/windows.json (efficiency.pair)")
    ap.add_argument("--windows-json", type=Path, default=None, help="own windows file (overrides --pair)")
    ap.add_argument("--metrics", type=Path, default=None, help="flat metrics JSON (e.g. metrics/efficiency.json)")
    ap.add_argument("--md", type=Path, default=None, help="Markdown table (e.g. metrics/efficiency.md)")
    ap.add_argument("--plot", type=Path, default=None, help="PNG (e.g. plots/efficiency/time_vs_N.png)")
    ap.add_argument("--raw-json", type=Path, default=None, help="every sample, for later analysis")
    ap.add_argument("--_child", nargs=2, metavar=("SPECS_JSON", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args._child:
        encoder_child_main(args._child[0], int(args._child[1]))
        return None
    try:
        cfg = settings(args)
    except ParamError as e:
        sys.exit(f"error: {e}")
    windows_json = args.windows_json or ROOT / "data" / "windows" / cfg.pair / "windows.json"
    result = run_benchmark(ns=cfg.lengths, op_windows=cfg.op_windows, op_reps=cfg.op_reps,
                           encoder_reps=cfg.encoder_reps, windows_json=windows_json, quick=cfg.quick,
                           log=lambda s: print(s, flush=True))
    print()
    print(eff.markdown_report(result))
    for p in eff.write_outputs(result, metrics=args.metrics, md=args.md, plot=args.plot, raw=args.raw_json):
        print(f"wrote {p}")
    return result


if __name__ == "__main__":
    main()

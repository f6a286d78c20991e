"""Training throughput and decoding speed of the S2T Transformer on this machine, and the training
step time of our model against an equal-size model built from ``torch.nn.Transformer`` modules, and
the pipeline's default precision (``amp: auto``: bf16 autocast where the CPU has it) against fp32.

    python benchmarks/train_throughput.py [--size demo] [--reps 5] [--rounds 3] [--threads N] [--copies K]

`--threads 1 --copies 2` runs two copies side by side, one thread each, and prints both: how the
pipeline trains every default run but one on 2 cores (the per-pair and per-seed stages, two at a
time, `parallel.jobs: auto`); the default (torch's threads, one copy) is how that one, the shared
ASR model, trains, alone on every core.

Prints, side by side in one run (interleaved rounds, medians): ms per training step (forward + backward + Adam) on the same
batch for ours and for the nn.Transformer reference, their ratio (target <= 1.1), training
throughput in input frames per second, and decoding speed (sentences per second, beam 5 and greedy)
on tst-COMMON of the prepared en-de demo data with the trained ST model when it exists
(runs/baseline/en-de/seed1/model.pt), else on random features with a random model (max length reached).
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from lib.model.s2t_transformer import Conv1dSubsampler, S2TTransformer, model_config  # noqa: E402
from lib.precision import autocast, resolve_amp  # noqa: E402
from lib.train.objectives import label_smoothed_nll_loss  # noqa: E402


class TorchReference(nn.Module):
    """Same sizes from torch.nn modules: our conv subsampler, nn.TransformerEncoder/Decoder (pre-LN)."""

    def __init__(self, cfg) -> None:
        super().__init__()
        self.subsample = Conv1dSubsampler(cfg.n_mels, cfg.conv_channels, cfg.d_model, cfg.conv_kernel)
        enc = nn.TransformerEncoderLayer(cfg.d_model, cfg.n_heads, cfg.ffn_dim, cfg.dropout, batch_first=True,
                                         norm_first=True)
        dec = nn.TransformerDecoderLayer(cfg.d_model, cfg.n_heads, cfg.ffn_dim, cfg.dropout, batch_first=True,
                                         norm_first=True)
        self.encoder = nn.TransformerEncoder(enc, cfg.encoder_layers, norm=nn.LayerNorm(cfg.d_model),
                                             enable_nested_tensor=False)
        self.decoder = nn.TransformerDecoder(dec, cfg.decoder_layers, norm=nn.LayerNorm(cfg.d_model))
        self.embed = nn.Embedding(cfg.vocab_size, cfg.d_model, padding_idx=1)
        self.out = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.scale = math.sqrt(cfg.d_model)

    def forward(self, feats, lengths, prev_tokens):
        x, out_len = self.subsample(feats, lengths)
        pad = torch.arange(x.size(1))[None] >= out_len[:, None]
        mem = self.encoder(x * self.scale, src_key_padding_mask=pad)
        causal = nn.Transformer.generate_square_subsequent_mask(prev_tokens.size(1))
        y = self.decoder(self.embed(prev_tokens) * self.scale, mem, tgt_mask=causal, tgt_is_causal=True,
                         memory_key_padding_mask=pad)
        return self.out(y)


def step_time(model: nn.Module, batch, reps: int, amp: str = "none") -> float:
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, fused=True)  # the pipeline's (lib.train.loop.make_optimizer)
    feats, lengths, prev, target = batch
    times = []
    for i in range(reps + 2):
        t0 = time.perf_counter()
        with autocast(torch.device("cpu"), amp):
            logits = model(feats, lengths, prev)
        loss, _ = label_smoothed_nll_loss(logits.float(), target, 0.1, 1)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if i >= 2:  # warm-up
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def side_by_side(copies: int) -> None:
    """Run this benchmark ``copies`` times at once (same arguments, ``--copies 1``), each in its own
    process, and print every copy's output: the copies run the same rounds in the same order, so
    they train (and decode) in the same precision at the same time, as two training stages under
    `make repro` do."""
    import subprocess

    argv, skip = [], False
    for a in sys.argv[1:]:  # every argument but --copies K / --copies=K
        if skip:
            skip = False
        elif a == "--copies":
            skip = True
        elif not a.startswith("--copies="):
            argv.append(a)
    procs = [subprocess.Popen([sys.executable, __file__, *argv, "--copies", "1"], cwd=ROOT, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for _ in range(copies)]
    outs = [p.communicate()[0] for p in procs]
    for i, (p, out) in enumerate(zip(procs, outs)):
        print(f"== copy {i + 1} of {copies}, side by side" + (f" (exit {p.returncode})" if p.returncode else ""))
        print(out.rstrip())
    if any(p.returncode for p in procs):
        raise SystemExit(1)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", default="demo")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; medians over rounds")
    ap.add_argument("--batch", type=int, default=20)
    ap.add_argument("--frames", type=int, default=300)
    ap.add_argument("--tokens", type=int, default=15)
    ap.add_argument("--threads", type=int, help="torch threads per copy (default: torch's, every core)")
    ap.add_argument("--copies", type=int, default=1, help="identical copies run side by side, each in its process")
    args = ap.parse_args()
    if args.threads is not None:
        if args.threads < 1:
            ap.error(f"--threads: expected an integer >= 1, got {args.threads}")
        torch.set_num_threads(args.threads)
    if args.copies < 1:
        ap.error(f"--copies: expected an integer >= 1, got {args.copies}")
    if args.copies > 1:
        side_by_side(args.copies)
        return
    torch.manual_seed(0)
    cfg = model_config(args.size, vocab_size=200)
    feats = torch.randn(args.batch, args.frames, cfg.n_mels)
    lengths = torch.full((args.batch,), args.frames)
    prev = torch.randint(4, cfg.vocab_size, (args.batch, args.tokens))
    target = torch.randint(4, cfg.vocab_size, (args.batch, args.tokens))
    ours, ref = S2TTransformer(cfg).train(), TorchReference(cfg).train()
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; size {args.size}: d={cfg.d_model}, "
          f"{cfg.encoder_layers}+{cfg.decoder_layers} layers; batch {args.batch} x {args.frames} frames x "
          f"{args.tokens} tokens; params ours {sum(p.numel() for p in ours.parameters()):,}, "
          f"nn.Transformer {sum(p.numel() for p in ref.parameters()):,}")
    batch = (feats, lengths, prev, target)
    default = resolve_amp("auto", torch.device("cpu"))
    # Rounds interleaved (fp32, reference, default precision, fp32, ...), the median over rounds of each
    # round's median step: this host's speed drifts by 10-20 % over minutes, which a block of fp32 steps
    # followed by a block of bf16 steps would read as a precision effect.
    rounds: dict[str, list[float]] = {"ours": [], "ref": [], "default": []}
    for _ in range(args.rounds):
        rounds["ours"].append(step_time(ours, batch, args.reps))
        rounds["ref"].append(step_time(ref, batch, args.reps))
        if default != "none":
            rounds["default"].append(step_time(ours, batch, args.reps, default))
    t_ours, t_ref = statistics.median(rounds["ours"]), statistics.median(rounds["ref"])
    frames = args.batch * args.frames
    print(f"{'model':<16} {'ms/step':>9} {'frames/s':>10}")
    print(f"{'ours':<16} {t_ours * 1e3:>9.1f} {frames / t_ours:>10.0f}")
    print(f"{'nn.Transformer':<16} {t_ref * 1e3:>9.1f} {frames / t_ref:>10.0f}")
    print(f"ratio ours / nn.Transformer: {t_ours / t_ref:.2f} (target <= 1.1)")
    # The pipeline's default precision (amp: auto) against fp32, same model and batch.
    if default != "none":
        t_default = statistics.median(rounds["default"])
        print(f"{'ours fp32':<16} {t_ours * 1e3:>9.1f} {frames / t_ours:>10.0f}")
        print(f"{'ours ' + default:<16} {t_default * 1e3:>9.1f} {frames / t_default:>10.0f}")
        print(f"speed-up of amp: auto ({default}) over fp32 per training step: {t_ours / t_default:.2f}x "
              "(target >= 1.6)")
    else:
        print("amp: auto resolves to fp32 on this CPU (no AVX-512 BF16 / AMX): no bf16 comparison")

    from lib.data.dataset import SpeechDataset
    from lib.decode.beam_search import BeamSearchConfig, translate_dataset
    from lib.model.checkpoint import load_model

    model_path = ROOT / "runs/baseline/en-de/seed1/model.pt"
    prepared = ROOT / "data/prepared/en-de"
    if model_path.is_file() and (prepared / "tst-COMMON.tsv").is_file():
        model, _ = load_model(model_path)
        ds = SpeechDataset(prepared, "tst-COMMON", "st")
        times: dict[tuple[str, int], list[float]] = {}
        amps = list(dict.fromkeys(["none", default]))
        for amp in amps:  # warm-up: oneDNN builds its kernels for these shapes on first use
            translate_dataset(model.eval(), ds, 20000, BeamSearchConfig(beam=5, max_len_b=100), "cpu",
                              progress=False, amp=amp)
        for _ in range(args.rounds):  # interleaved rounds, as for training
            for amp in amps:
                for beam in (5, 1):
                    t0 = time.perf_counter()
                    translate_dataset(model.eval(), ds, 20000, BeamSearchConfig(beam=beam, max_len_b=100), "cpu",
                                      progress=False, amp=amp)
                    times.setdefault((amp, beam), []).append(time.perf_counter() - t0)
        speeds = {}
        for (amp, beam), ts in times.items():
            dt = statistics.median(ts)
            speeds[amp, beam] = len(ds) / dt
            print(f"decoding {model_path.relative_to(ROOT)} on {len(ds)} tst-COMMON sentences, beam {beam}, "
                  f"{'fp32' if amp == 'none' else amp}: {dt:.2f} s = {len(ds) / dt:.1f} sentences/s "
                  f"(median of {len(ts)} rounds: {', '.join(f'{t:.2f}' for t in ts)} s)")
        if default != "none":
            print(f"decoding speed-up of {default} over fp32, beam 5: {speeds[default, 5] / speeds['none', 5]:.2f}x "
                  "(target >= 1.3)")
    else:
        print("decoding: no trained model at runs/baseline/en-de/seed1/model.pt (run `dvc repro train_baseline` first)")


if __name__ == "__main__":
    main()

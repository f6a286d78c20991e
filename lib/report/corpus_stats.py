"""Corpus statistics of one prepared language pair, as numbers and PNG figures.

The paper quotes the encoder sequence length N after the 4x convolutional subsampling (MuST-C
En-De: mean 166, max 1052); we report the same quantity for whatever corpus was prepared, so a
reader can tell how far the demo corpus is from the paper's regime.
"""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # no display on CI or servers
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import sentencepiece as spm  # noqa: E402

from lib.data.manifest import read_manifest  # noqa: E402
from lib.io import InputError  # noqa: E402

FRAME_SHIFT_S = 0.01


def subsampled_length(n_frames: int, n_layers: int = 2) -> int:
    """Length after the S2T Conv1d subsampler (stride 2 per layer, fairseq's length formula)."""
    for _ in range(n_layers):
        n_frames = (n_frames - 1) // 2 + 1
    return n_frames


def _describe(values: np.ndarray) -> dict[str, float]:
    return {"mean": round(float(values.mean()), 2), "max": int(values.max()), "min": int(values.min()),
            "p95": round(float(np.percentile(values, 95)), 2)}


def corpus_stats(prepared_dir: Path, splits: list[str]) -> tuple[dict, dict[str, dict[str, np.ndarray]]]:
    """Per split: segment count, hours, frames, encoder length N, target token length."""
    model = prepared_dir / "spm_st.model"
    if not model.is_file():  # SentencePiece's own error is a RuntimeError with no remedy
        raise FileNotFoundError(f"{model}: missing; it is written by the prepare@{prepared_dir.name} stage")
    try:
        sp = spm.SentencePieceProcessor(model_file=str(model))
    except (OSError, RuntimeError) as e:  # a damaged file: SentencePiece's message names no remedy
        raise InputError(f"{model}: cannot load SentencePiece model ({e}); it is written by the "
                         f"prepare@{prepared_dir.name} stage: `dvc repro` writes it again") from None
    stats: dict = {}
    arrays: dict[str, dict[str, np.ndarray]] = {}
    for split in splits:
        rows = read_manifest(prepared_dir / f"{split}.tsv")
        if not rows:
            continue
        frames = np.array([int(r["n_frames"]) for r in rows])
        n_enc = np.array([subsampled_length(int(f)) for f in frames])
        tgt_tokens = np.array([len(ids) for ids in sp.encode([r["tgt_text"] for r in rows])])
        arrays[split] = {"seconds": frames * FRAME_SHIFT_S, "encoder_length": n_enc, "target_tokens": tgt_tokens}
        stats[split] = {
            "segments": len(rows),
            "hours": round(float(frames.sum() * FRAME_SHIFT_S / 3600), 4),
            "speakers": len({r["speaker"] for r in rows}),
            "encoder_length": _describe(n_enc),
            "target_tokens": _describe(tgt_tokens),
        }
    return stats, arrays


def plot_histograms(arrays: dict[str, dict[str, np.ndarray]], out_dir: Path, title: str) -> list[Path]:
    """Three PNGs: segment duration, encoder length N after subsampling, target length."""
    out_dir.mkdir(parents=True, exist_ok=True)
    specs = [("seconds", "segment duration (s)", "durations.png"),
             ("encoder_length", "encoder length N (frames after 4x subsampling)", "encoder_length.png"),
             ("target_tokens", "target length (SentencePiece tokens)", "target_length.png")]
    written = []
    for key, xlabel, name in specs:
        fig, ax = plt.subplots(figsize=(6, 3.5), dpi=100)
        values = np.concatenate([a[key] for a in arrays.values()])
        bins = np.histogram_bin_edges(values, bins=min(40, max(5, len(np.unique(values)))))
        for split, a in arrays.items():
            ax.hist(a[key], bins=bins, histtype="step", linewidth=1.5, density=True,
                    label=f"{split} (mean {a[key].mean():.1f}, max {a[key].max():.0f})")
        if key == "encoder_length":
            ax.text(0.98, 0.5, "MuST-C En-De (paper):\nmean 166, max 1052", transform=ax.transAxes,
                    ha="right", va="center", fontsize=8, color="0.35")
        ax.set_xlabel(xlabel)
        ax.set_ylabel("density")
        ax.set_title(title)
        ax.legend(fontsize=8)
        fig.tight_layout()
        tmp = out_dir / f".{name}.tmp.png"
        fig.savefig(tmp, metadata={"Software": None})  # no version stamp: stable bytes
        plt.close(fig)
        tmp.replace(out_dir / name)
        written.append(out_dir / name)
    return written

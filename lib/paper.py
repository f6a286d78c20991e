"""The paper's published numbers, in one place (Alastruey et al., 2022, "On the Locality of
Attention in Direct Speech Translation"). Everything the pipeline compares itself with, and the
report's prose about the paper, comes from here; nothing else in the repository types them in.
"""
from __future__ import annotations

__all__ = ["EN_DE_WINDOWS", "FULL_LAYERS", "MAIN_DIAGONAL", "TABLE2", "WINDOW_TABLES", "table2_prose"]

# (layer, μ, σ, w, CL mean, CL std) as printed in the paper: Table 1 (En-De), 3 (En-Es), 4 (En-It).
WINDOW_TABLES: dict[str, list[tuple[int, float, float, int, float, float]]] = {
    "en-de": [
        (1, 3.41, 13.15, 17, 0.35, 0.07), (2, 1.18, 3.45, 5, 0.32, 0.04), (3, 0.51, 1.56, 3, 0.30, 0.04),
        (4, 2.25, 1.30, 5, 0.23, 0.04), (5, 4.03, 0.28, 5, 0.17, 0.03), (6, 7.03, 1.03, 9, 0.23, 0.04),
        (7, 11.37, 1.13, 13, 0.18, 0.04), (8, 7.94, 1.16, 11, 0.18, 0.04), (9, 12.56, 1.85, 15, 0.19, 0.05),
        (10, 16.47, 2.40, 19, 0.13, 0.05), (11, 13.28, 1.90, 17, 0.13, 0.04), (12, 16.28, 3.86, 21, 0.16, 0.05),
    ],
    "en-es": [
        (1, 4.68, 14.77, 21, 0.39, 0.08), (2, 3.21, 6.17, 11, 0.29, 0.04), (3, 0.99, 3.6, 5, 0.28, 0.04),
        (4, 2.58, 1.96, 5, 0.2, 0.02), (5, 4.52, 2.38, 7, 0.24, 0.04), (6, 15.88, 2.92, 19, 0.21, 0.06),
        (7, 11.32, 1.91, 15, 0.16, 0.03), (8, 9.52, 2.5, 13, 0.22, 0.05), (9, 14.96, 1.78, 17, 0.07, 0.05),
        (10, 15.94, 3.0, 19, 0.19, 0.05), (11, 13.83, 3.66, 19, 0.21, 0.05), (12, 20.38, 3.42, 25, 0.1, 0.05),
    ],
    "en-it": [
        (1, 6.16, 17.57, 25, 0.34, 0.09), (2, 2.56, 7.47, 11, 0.29, 0.05), (3, 2.44, 2.84, 7, 0.27, 0.05),
        (4, 4.08, 0.65, 5, 0.19, 0.03), (5, 14.05, 2.08, 17, 0.15, 0.03), (6, 10.82, 1.31, 13, 0.18, 0.04),
        (7, 7.37, 4.54, 13, 0.23, 0.05), (8, 8.62, 2.18, 11, 0.22, 0.04), (9, 12.49, 1.65, 15, 0.09, 0.03),
        (10, 16.06, 3.80, 21, 0.17, 0.04), (11, 18.15, 3.20, 23, 0.11, 0.05), (12, 17.34, 4.83, 23, 0.15, 0.05),
    ],
}

#: Table 2: MuST-C tst-COMMON BLEU of the baseline and of the local-attention model (mean of 5 seeds).
TABLE2: dict[str, dict[str, float]] = {"en-de": {"baseline": 22.53, "local": 22.49},
                                       "en-es": {"baseline": 27.49, "local": 27.46},
                                       "en-it": {"baseline": 22.98, "local": 22.97}}

#: Layers 1..FULL_LAYERS keep full attention in the local model (Sec. 4).
FULL_LAYERS = 3

#: The En-De windows of layers 4-12 (Table 1's w column), the local model's encoder.
EN_DE_WINDOWS: tuple[int, ...] = tuple(row[3] for row in WINDOW_TABLES["en-de"][FULL_LAYERS:])

#: Footnote 3: the main diagonal holds "around 65% of the total contributions in each layer".
MAIN_DIAGONAL = 0.65


def table2_prose() -> str:
    """Table 2 in words: "22.53/27.49/22.98 baseline, 22.49/27.46/22.97 local" (en-de/en-es/en-it)."""
    pairs = list(TABLE2)
    base = "/".join(f"{TABLE2[p]['baseline']:.2f}" for p in pairs)
    local = "/".join(f"{TABLE2[p]['local']:.2f}" for p in pairs)
    return f"{base} baseline, {local} local ({'/'.join(pairs)})"

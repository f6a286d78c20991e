"""A hand-made set of the small pipeline outputs the `report` stage reads (two pairs, three seeds), for
the whole-report tests of tests/report/test_controls_report.py. Deterministic: the same bytes every time,
so that the report built from it can be compared with a committed copy.

Regenerate the committed copies (tests/report/fixtures/) only on purpose, when the report's text is
meant to change: ``python tests/report/report_fixture.py``.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parent / "fixtures"
PAIRS = ["en-de", "en-it"]
SEEDS = [1, 2, 3]
REFS = [f"das ist satz nummer {i} von vielen" for i in range(24)]
ALG1 = [1, 1, 3, 5, 3, 15, 17, 3, 13]  # layers 4-12


def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def _hyps(k: int) -> str:
    """Hypotheses with every k-th sentence wrong (k = 0: all right)."""
    return "".join(("falsch" if k and i % k == 0 else r) + "\n" for i, r in enumerate(REFS))


def write_run(root: Path, folder: str, pair: str, seed: int, bleu: float, wrong_every: int, **extra) -> None:
    """metrics/<folder>/<pair>/seed<k>.json and data/decoded/<folder>/<pair>/seed<k>/."""
    _write(root / "metrics" / folder / pair / f"seed{seed}.json", json.dumps({"bleu": bleu, "chrf": bleu + 20, **extra}))
    decoded = root / "data" / "decoded" / folder / pair / f"seed{seed}"
    _write(decoded / "hyps.tst-COMMON.txt", _hyps(wrong_every))
    _write(decoded / "refs.tst-COMMON.txt", "".join(r + "\n" for r in REFS))


def make_root(root: Path, params_file: Path = REPO / "params.yaml") -> Path:
    """The default pipeline's report inputs (no controls, no variants) under ``root``, and its params.yaml
    (``params_file`` with this fixture's pairs and seeds)."""
    for pi, pair in enumerate(PAIRS):
        for seed in SEEDS:
            write_run(root, "baseline", pair, seed, 20.0 + seed + pi, 0)
            write_run(root, "local", pair, seed, 19.5 + seed + pi + 0.25 * (seed % 2), 5 + seed)
        for system, wer in (("asr", 30.0 + pi), ("asr_local", 31.5 + pi)):
            _write(root / "metrics" / system / f"{pair}.json", json.dumps({"wer": wer}))
        for model, acc in (("asr", 60.0), ("st", 50.0 + pi)):
            summary = {"position_share": 0.61, "c_ii_mean": 0.72 - 0.01 * pi, "band2_mean": 3.5, "local_heads": 30,
                       "falloff_mean": 1.8, "acc_full": acc, "acc_w1": acc - 10, "acc_alg1": acc - 3,
                       "alg1_gap_recovered": 0.7}
            _write(root / "metrics" / "health" / pair / f"{model}.json",
                   json.dumps({"summary": summary, "algorithm1_windows": " ".join(map(str, ALG1))}))
        _write(root / "data" / "windows" / pair / "table1.md", f"| layer | w |\n|---|---|\n| 4 | 1 ({pair}) |\n")
    for folder in ("metrics/variants", "data/decoded/variants"):
        _write(root / folder / "README.md", "kept\n")
    params = yaml.safe_load(Path(params_file).read_text(encoding="utf-8"))
    params.update(pairs=PAIRS, seeds=SEEDS)
    _write(root / "params.yaml", yaml.safe_dump(params, sort_keys=False))
    return root


def build(root: Path) -> tuple[str, dict]:
    """The report of ``root`` with the code of this checkout (``root/params.yaml``)."""
    from lib.params import load_params
    from lib.report.document import build_report

    return build_report(load_params(root / "params.yaml"), root)


if __name__ == "__main__":
    import tempfile

    sys.path.insert(0, str(REPO))
    with tempfile.TemporaryDirectory() as tmp:
        md, flat = build(make_root(Path(tmp)))
    _write(FIXTURES / "report_no_controls.md", md)
    _write(FIXTURES / "summary_no_controls.json", json.dumps(flat, indent=1, sort_keys=False) + "\n")
    print(f"wrote {FIXTURES}/report_no_controls.md and summary_no_controls.json")

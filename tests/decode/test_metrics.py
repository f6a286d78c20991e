"""Metrics against sacreBLEU's CLI (hard-coded numbers + a live CLI run) and hand-computed WER."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lib.decode.metrics import bleu, bleu_signature, chrf, edit_distance, normalize_for_wer, paired_bootstrap, wer

DATA = Path(__file__).parent / "data"
REFS = DATA / "refs.txt"

# `sacrebleu tests/decode/data/refs.txt -i tests/decode/data/<hyps>.txt -m bleu chrf -b` (sacreBLEU 2.6.0)
CLI_SCORES = {"hyps_a": (57.6, 76.2), "hyps_b": (22.5, 55.1), "hyps_c": (63.7, 79.7)}
# `SACREBLEU_SEED=12345 sacrebleu refs.txt -i hyps_a.txt hyps_c.txt -m bleu --paired-bs -f json`
CLI_PAIRED_A_C = {
    "a": {"score": 57.60060595087268, "mean": 57.233208271609136, "ci": 8.584314521509484},
    "c": {"score": 63.654653306629434, "mean": 63.481121599208784, "ci": 9.761323786584043, "p": 0.1258741258741259},
}


def lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def run_cli(*args: str, seed: str | None = None) -> str:
    env = dict(os.environ)
    if seed is not None:
        env["SACREBLEU_SEED"] = seed
    proc = subprocess.run([sys.executable, "-m", "sacrebleu", *args], capture_output=True, text=True,
                          encoding="utf-8", env=env, check=True)
    return proc.stdout


@pytest.mark.parametrize("name", sorted(CLI_SCORES))
def test_bleu_chrf_match_hardcoded_cli(name: str) -> None:
    hyps, refs = lines(DATA / f"{name}.txt"), lines(REFS)
    exp_bleu, exp_chrf = CLI_SCORES[name]
    assert round(bleu(hyps, refs), 1) == exp_bleu
    assert round(chrf(hyps, refs), 1) == exp_chrf


def test_bleu_chrf_match_live_cli() -> None:
    names = sorted(CLI_SCORES)
    for name in names:
        out = json.loads(run_cli(str(REFS), "-i", str(DATA / f"{name}.txt"), "-m", "bleu", "chrf", "-b", "-w", "6"))
        hyps, refs = lines(DATA / f"{name}.txt"), lines(REFS)
        assert bleu(hyps, refs) == pytest.approx(out[0], abs=1e-5)
        assert chrf(hyps, refs) == pytest.approx(out[1], abs=1e-5)


def test_bleu_signature_matches_cli() -> None:
    out = json.loads(run_cli(str(REFS), "-i", str(DATA / "hyps_a.txt"), "-m", "bleu"))
    assert bleu_signature() == out["signature"]
    assert "tok:13a" in bleu_signature() and "nrefs:1" in bleu_signature()


def test_perfect_and_length_mismatch() -> None:
    refs = lines(REFS)
    assert bleu(refs, refs) == pytest.approx(100.0)
    assert chrf(refs, refs) == pytest.approx(100.0)
    assert wer(refs, refs) == 0.0
    with pytest.raises(ValueError):
        bleu(refs[:-1], refs)
    with pytest.raises(ValueError):
        wer(refs[:-1], refs)


# ---------------------------------------------------------------------------- paired bootstrap


def test_paired_bootstrap_matches_hardcoded_cli() -> None:
    a, c, refs = lines(DATA / "hyps_a.txt"), lines(DATA / "hyps_c.txt"), lines(REFS)
    res = paired_bootstrap(a, c, refs)
    for key in ("score", "mean", "ci"):
        assert res["a"][key] == pytest.approx(CLI_PAIRED_A_C["a"][key], abs=1e-6)
        assert res["b"][key] == pytest.approx(CLI_PAIRED_A_C["c"][key], abs=1e-6)
    assert res["p_value"] == pytest.approx(CLI_PAIRED_A_C["c"]["p"], abs=1e-9)
    assert res["n_samples"] == 1000 and res["seed"] == 12345
    assert "bs:1000" in res["signature"] and "seed:12345" in res["signature"]


@pytest.mark.parametrize("other,seed,n", [("hyps_b", 12345, 1000), ("hyps_c", 7, 200)])
def test_paired_bootstrap_matches_live_cli(other: str, seed: int, n: int) -> None:
    a, b, refs = lines(DATA / "hyps_a.txt"), lines(DATA / f"{other}.txt"), lines(REFS)
    out = json.loads(run_cli(str(REFS), "-i", str(DATA / "hyps_a.txt"), str(DATA / f"{other}.txt"), "-m", "bleu",
                             "--paired-bs", "--paired-bs-n", str(n), "-f", "json", seed=str(seed)))
    res = paired_bootstrap(a, b, refs, n_samples=n, seed=seed)
    cli_a, cli_b = out[0]["BLEU"], out[1]["BLEU"]
    for key in ("score", "mean", "ci"):
        assert res["a"][key] == pytest.approx(cli_a[key], abs=1e-6)
        assert res["b"][key] == pytest.approx(cli_b[key], abs=1e-6)
    assert res["p_value"] == pytest.approx(cli_b["p_value"], abs=1e-9)


def test_paired_bootstrap_seed_is_local() -> None:
    a, c, refs = lines(DATA / "hyps_a.txt"), lines(DATA / "hyps_c.txt"), lines(REFS)
    before = os.environ.get("SACREBLEU_SEED")
    r1 = paired_bootstrap(a, c, refs, n_samples=100, seed=1)
    r2 = paired_bootstrap(a, c, refs, n_samples=100, seed=1)
    r3 = paired_bootstrap(a, c, refs, n_samples=100, seed=2)
    assert os.environ.get("SACREBLEU_SEED") == before
    assert r1 == r2
    assert r1["a"]["mean"] != r3["a"]["mean"]
    assert r1["a"]["score"] == r3["a"]["score"]


# ---------------------------------------------------------------------------- WER


def test_normalize_for_wer() -> None:
    assert normalize_for_wer("Hello, World!") == ["hello", "world"]
    # Unicode punctuation (German quotes, dashes, inverted marks) is deleted, not turned into spaces.
    assert normalize_for_wer("„Warum?“ — ¿Qué?  don't") == ["warum", "qué", "dont"]
    assert normalize_for_wer("  ...  ") == []
    # Symbols (category S) and digits stay.
    assert normalize_for_wer("7,5 € + 3") == ["75", "€", "+", "3"]


def test_edit_distance() -> None:
    assert edit_distance([], []) == 0
    assert edit_distance(list("abc"), []) == 3
    assert edit_distance([], list("ab")) == 2
    assert edit_distance(list("kitten"), list("sitting")) == 3
    assert edit_distance(list("sitting"), list("kitten")) == 3
    assert edit_distance("a b c d".split(), "a c d e".split()) == 2


def test_wer_hand_computed() -> None:
    ref = "the cat sat on the mat"  # 6 words
    assert wer(["the cat sat on the mat"], [ref]) == 0.0
    assert wer(["the dog sat on the mat"], [ref]) == pytest.approx(100 * 1 / 6)  # 1 substitution
    assert wer(["the cat sat on mat"], [ref]) == pytest.approx(100 * 1 / 6)  # 1 deletion
    assert wer(["the big cat sat on the mat today"], [ref]) == pytest.approx(100 * 2 / 6)  # 2 insertions
    assert wer(["cat sat in the hat"], [ref]) == pytest.approx(100 * 3 / 6)  # del + 2 sub
    assert wer([""], [ref]) == pytest.approx(100.0)  # all deleted
    assert wer(["a b c d e f g h i j k l"], [ref]) == pytest.approx(200.0)  # can exceed 100
    # Case and punctuation are ignored.
    assert wer(["The CAT, sat on the mat!!"], [ref]) == 0.0
    assert wer(["„The“ cat — sat on the mat."], [ref]) == 0.0


def test_wer_is_corpus_level() -> None:
    hyps = ["a b", "x y z w"]
    refs = ["a c", "x y z"]  # 1 sub (2 words) + 1 ins (3 words) -> 2 / 5
    assert wer(hyps, refs) == pytest.approx(40.0)
    # not the mean of sentence WERs (50 % and 33.3 %)
    assert wer(hyps, refs) != pytest.approx((50.0 + 100 / 3) / 2)
    # an empty reference contributes its hypothesis words as insertions
    assert wer(["a b", "extra"], ["a b", ""]) == pytest.approx(50.0)
    with pytest.raises(ValueError):
        wer(["x"], ["!!"])


def test_wer_on_fixture_files() -> None:
    # line 1: 0 errors / 2 words; line 2: "it's" -> "its", 1 insertion / 4 words;
    # line 3: 2 deletions ("den", "wohl") + 1 insertion ("Ende"), "Über" == "über" / 9 words
    hyps, refs = lines(DATA / "wer_hyps.txt"), lines(DATA / "wer_refs.txt")
    assert wer(hyps, refs) == pytest.approx(100 * 4 / 15)

"""params.yaml loading: the repo's file is valid; bad values stop with the key's name."""
from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from lib.params import ParamError, load_params

REPO = Path(__file__).resolve().parent.parent


def _write(tmp_path: Path, mutate) -> Path:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    mutate(params)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params))
    return path


def test_repo_params_load() -> None:
    p = load_params(REPO / "params.yaml")
    assert p.pairs == ["en-de", "en-es", "en-it"]
    assert p.prepare.n_mels == 80 and p.prepare.max_frames_train == 3000
    assert p.corpus.splits["train"] >= 1


@pytest.mark.parametrize("mutate, key", [
    (lambda p: p["corpus"].__setitem__("seed", "abc"), "corpus.seed"),
    (lambda p: p["corpus"]["splits"].__setitem__("train", 1.5), "corpus.splits.train"),
    (lambda p: p["corpus"]["splits"].__setitem__("dev", 0), "corpus.splits.dev"),
    (lambda p: p["prepare"].__setitem__("n_mels", True), "prepare.n_mels"),
    (lambda p: p["prepare"].__setitem__("min_frame", 5), "prepare.min_frame"),
    (lambda p: p["prepare"].pop("st_vocab_size"), "prepare.st_vocab_size"),
    (lambda p: p.__setitem__("pairs", ["de-en"]), "pairs[0]"),
    (lambda p: p["corpus"].__setitem__("pause_seconds", [1.0, 0.5]), "corpus.pause_seconds"),
    (lambda p: p["data"].__setitem__("mustc_root", 3), "data.mustc_root"),
])
def test_bad_values_name_the_key(tmp_path: Path, mutate, key: str) -> None:
    with pytest.raises(ParamError, match=key.replace("[", r"\[").replace("]", r"\]")):
        load_params(_write(tmp_path, mutate))


def test_numeric_strings_are_floats(tmp_path: Path) -> None:
    p = load_params(_write(tmp_path, lambda p: p["corpus"].__setitem__("noise_level", "1e-3")))
    assert p.corpus.noise_level == pytest.approx(1e-3)


def test_not_yaml(tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    path.write_text("pairs: [en-de\n")
    with pytest.raises(ParamError, match="not valid YAML"):
        load_params(path)

"""scripts/params_profile.py: switching params.yaml to a profile keeps the user's own, edits included, and
puts it back in one command."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "scripts/params_profile.py"


def _run(root: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], cwd=root, capture_output=True, text=True)


def test_switch_keeps_the_users_params_and_restore_puts_them_back(tmp_path: Path) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles/paper.yaml").write_text("model:\n  size: s\n")
    mine = "model:\n  size: tiny  # an uncommitted edit of mine\n"
    (tmp_path / "params.yaml").write_text(mine)
    proc = _run(tmp_path, "paper")
    assert proc.returncode == 0 and "params.yaml is now profiles/paper.yaml" in proc.stdout, proc.stderr
    assert (tmp_path / "params.yaml").read_text() == "model:\n  size: s\n"
    assert (tmp_path / "params.before-profile.yaml").read_text() == mine
    (tmp_path / "params.yaml").write_text("model:\n  size: s\ndata:\n  mustc_root: /x\n")  # dvc exp run -S ...
    proc = _run(tmp_path, "paper")  # a second switch would overwrite the kept file: refused
    assert proc.returncode == 1 and "--restore` first" in proc.stderr
    assert (tmp_path / "params.before-profile.yaml").read_text() == mine
    proc = _run(tmp_path, "--restore")
    assert proc.returncode == 0 and (tmp_path / "params.yaml").read_text() == mine
    assert not (tmp_path / "params.before-profile.yaml").exists()
    proc = _run(tmp_path, "--restore")
    assert proc.returncode == 1 and "no params.before-profile.yaml to restore" in proc.stderr
    proc = _run(tmp_path, "papr")
    assert proc.returncode == 1 and "no profile 'papr' in profiles/ (have: paper)" in proc.stderr
    proc = _run(tmp_path, "paper", "--restore")
    assert proc.returncode == 2 and "give a profile (paper) or --restore, not both" in proc.stderr
    assert (tmp_path / "params.yaml").read_text() == mine
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml", "profiles"]  # no temporary left


def _mustc(root: Path, pairs=("en-de", "en-es"), splits=("train", "dev", "tst-COMMON")) -> Path:
    for pair in pairs:
        for split in splits:
            _split(root / pair / "data" / split, pair)
    return root


def _split(folder: Path, pair: str) -> None:
    """A split's folders and text files, empty: the switch looks at them, nothing reads them."""
    (folder / "txt").mkdir(parents=True)
    (folder / "wav").mkdir()
    for lang in ("yaml", *pair.split("-")):
        (folder / "txt" / f"{folder.name}.{lang}").touch()


PROFILE = ("pairs: [en-de, en-es]\ndata:\n  # where MuST-C is\n  mustc_root: data/mustc-demo   # the demo\n"
           "  prepared_dir: data/prepared\nprepare:\n  splits: [train, dev, tst-COMMON]\n")


def test_mustc_root_is_checked_before_the_switch_and_set_with_the_comments_kept(tmp_path: Path) -> None:
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles/paper.yaml").write_text(PROFILE)
    mine = "data:\n  mustc_root: data/mustc-demo\n"
    (tmp_path / "params.yaml").write_text(mine)
    corpus = _mustc(tmp_path / "MUSTC_v1.0")
    # the pair's own folder: refused with what to set, nothing switched
    proc = _run(tmp_path, "paper", "--mustc-root", str(corpus / "en-de"))
    assert proc.returncode == 1, proc.stdout
    assert f"--mustc-root {corpus / 'en-de'}: " in proc.stderr and "set data.mustc_root to the folder above it" in proc.stderr
    assert (tmp_path / "params.yaml").read_text() == mine and not (tmp_path / "params.before-profile.yaml").exists()
    # a split missing: named
    shutil.rmtree(corpus / "en-es/data/dev")
    proc = _run(tmp_path, "paper", "--mustc-root", str(corpus))
    assert proc.returncode == 1 and "en-es/data/dev: split folder 'dev' not found" in proc.stderr, proc.stderr
    (corpus / "en-es/data/dev/txt").mkdir(parents=True)
    # a split without its talks or one of its text files: named before the switch
    proc = _run(tmp_path, "paper", "--mustc-root", str(corpus))
    assert proc.returncode == 1 and "en-es/data/dev/wav: the talks' folder of split 'dev' is missing" in proc.stderr, proc.stderr
    shutil.rmtree(corpus / "en-es/data/dev")
    _split(corpus / "en-es/data/dev", "en-es")
    (corpus / "en-es/data/dev/txt/dev.es").unlink()
    proc = _run(tmp_path, "paper", "--mustc-root", str(corpus))
    assert proc.returncode == 1 and "en-es/data/dev/txt/dev.es: missing;" in proc.stderr and "dev.en, dev.yaml" in proc.stderr, proc.stderr
    assert (tmp_path / "params.yaml").read_text() == mine and not (tmp_path / "params.before-profile.yaml").exists()
    (corpus / "en-es/data/dev/txt/dev.es").touch()
    proc = _run(tmp_path, "paper", "--mustc-root", str(corpus))
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "params.yaml").read_text()
    assert text == PROFILE.replace("mustc_root: data/mustc-demo   # the demo", f'mustc_root: "{corpus}"   # the demo')
    assert (tmp_path / "params.before-profile.yaml").read_text() == mine
    assert _run(tmp_path, "--restore").returncode == 0 and (tmp_path / "params.yaml").read_text() == mine


def test_an_empty_mustc_root_is_refused_before_anything_is_read(tmp_path: Path) -> None:
    """"" would resolve to the repository itself, whose lib/data and tests/data looked like pairs."""
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles/paper.yaml").write_text(PROFILE)
    mine = "data:\n  mustc_root: data/mustc-demo\n"
    (tmp_path / "params.yaml").write_text(mine)
    proc = _run(tmp_path, "paper", "--mustc-root", " ")
    assert proc.returncode == 2 and "--mustc-root: empty; give the folder that holds en-de/" in proc.stderr, proc.stderr
    assert (tmp_path / "params.yaml").read_text() == mine and not (tmp_path / "params.before-profile.yaml").exists()

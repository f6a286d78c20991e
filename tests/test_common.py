"""stages/_common.py: SIGTERM is handled like Ctrl-C, so the atomic writers clean up, and the stage
exits non-zero with one line (no traceback)."""
from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# A stage in miniature: run_stage(main), main writing through atomic_dir when the signal comes.
_STAGE = f"""
import sys, time
sys.path.insert(0, {str(REPO / 'stages')!r})
from _common import run_stage
from lib.io import atomic_dir

def main() -> None:
    with atomic_dir(sys.argv[1]) as tmp:
        (tmp / "part.txt").write_text("half")
        print(tmp, flush=True)
        time.sleep(30)

run_stage(main)
"""


@pytest.mark.parametrize("sig, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_signal_cleans_up_and_exits_with_one_line(tmp_path: Path, sig: signal.Signals, code: int) -> None:
    out = tmp_path / "out"
    # SIGINT at its default in the child, whatever this process inherited: a shell starts background
    # jobs (`.ci/run &`) with SIGINT ignored, and Python then keeps it ignored instead of raising
    # KeyboardInterrupt
    proc = subprocess.Popen([sys.executable, "-c", _STAGE, str(out)], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        tmp = Path(proc.stdout.readline().strip())
        assert tmp.is_dir() and tmp.parent == tmp_path
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == code
    assert not tmp.exists() and not out.exists()
    assert list(tmp_path.iterdir()) == []
    lines = err.strip().splitlines()
    assert len(lines) == 1 and sig.name in lines[0] and "Traceback" not in err, err


def test_every_stage_script_runs_through_run_stage() -> None:
    for script in sorted((REPO / "stages").glob("[!_]*.py")):
        text = script.read_text(encoding="utf-8")
        assert "run_stage(main)" in text and "\n    main()\n" not in text, f"{script.name}: not run via run_stage"


_READS = f"""
import sys
sys.path.insert(0, {str(REPO / 'stages')!r})
from _common import run_stage
from lib.io import read_json
from lib.model.checkpoint import read_model_state

def main() -> None:
    if sys.argv[1].endswith(".json"):
        read_json(sys.argv[1], "train_baseline@en-de-1", keys=("bleu",))
    else:
        read_model_state(sys.argv[1], producer="train_baseline@en-de-1")

run_stage(main)
"""


@pytest.mark.parametrize("name, content, says", [
    ("seed1.json", '{"bleu": 85.5, "ch', "not valid JSON"),
    ("seed1.json", '{"chrf": 60.1}', "no 'bleu'"),
    ("model.pt", None, "cannot load checkpoint"),
])
def test_a_truncated_or_malformed_input_is_one_line_naming_it_and_the_stage_to_rerun(
        tmp_path: Path, name: str, content: str | None, says: str) -> None:
    import torch

    path = tmp_path / name
    if content is None:  # a model file cut in half, as a disk fault leaves it
        torch.save({"model": {"w": torch.zeros(1000)}, "model_config": {}}, path)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
    else:
        path.write_text(content)
    proc = subprocess.run([sys.executable, "-c", _READS, str(path)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {path}: ") and says in lines[0], lines
    assert "train_baseline@en-de-1" in lines[0] and "-f" not in lines[0]  # a forced repro would rerun everything upstream


def test_a_param_error_while_the_stage_runs_is_one_line() -> None:
    """A setting the data cannot meet (raised once the run sees its data, e.g. a train set too small
    for one update): exit 1 with the message's one line, no traceback."""
    stage = f"""
import sys
sys.path.insert(0, {str(REPO / 'stages')!r})
from _common import run_stage
from lib.params import ParamError

def main() -> None:
    raise ParamError("train set too small for one update (3 segments): lower update_freq")

run_stage(main)
"""
    proc = subprocess.run([sys.executable, "-c", stage], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == ["error: train set too small for one update (3 segments): lower update_freq"]


def _stage_error_lines(tmp_path: Path, reads: str) -> list[str]:
    """Run ``reads`` as a stage's main under ``run_stage`` (``sys.argv[1]`` = ``tmp_path``); it must fail with
    exit 1 and no traceback: the lines of its stderr."""
    stage = f"""
import sys
from pathlib import Path
sys.path.insert(0, {str(REPO / 'stages')!r})
from _common import run_stage

def main() -> None:
    {reads}

run_stage(main)
"""
    proc = subprocess.run([sys.executable, "-c", stage, str(tmp_path)], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    return proc.stderr.strip().splitlines()


@pytest.mark.parametrize("reads, says", [
    # the corpus_stats stage run by hand before prepare: SentencePiece's own error was a RuntimeError
    ("from lib.report.corpus_stats import corpus_stats; corpus_stats(Path(sys.argv[1]) / 'en-de', ['train'])",
     "en-de/spm_st.model: missing; it is written by the prepare@en-de stage"),
    # a training stage run by hand before prepare
    ("from lib.data.dataset import SpeechDataset; SpeechDataset(Path(sys.argv[1]) / 'en-de', 'train', 'st')",
     "en-de/train.tsv: no such manifest (run the prepare stage first)"),
])
def test_a_missing_input_is_one_line_naming_it(tmp_path: Path, reads: str, says: str) -> None:
    lines = _stage_error_lines(tmp_path, reads)
    assert len(lines) == 1 and lines[0].startswith(f"error: {tmp_path}/") and lines[0].endswith(says), lines


def _bad_manifest(folder: Path) -> None:
    from lib.data.manifest import MANIFEST_COLUMNS

    row = ["ted_1_0", "train.fbank.npy:0:12", "twelve", "a dog", "ein hund", "spk.1"]
    (folder / "train.tsv").write_text("\t".join(MANIFEST_COLUMNS) + "\n" + "\t".join(row) + "\n", encoding="utf-8")


def _cut_store(folder: Path) -> None:
    import numpy as np

    np.save(folder / "train.fbank.npy", np.zeros((50, 80), np.float32))
    path = folder / "train.fbank.npy"
    path.write_bytes(path.read_bytes()[:3000])


def _placeholder_model(folder: Path) -> None:
    import torch

    torch.save({"unused": "asr.mode is per_pair: every pair trains its own ASR model (train_asr)"}, folder / "model.pt")


@pytest.mark.parametrize("damage, reads, says", [
    (_bad_manifest, "from lib.data.manifest import read_manifest; read_manifest(Path(sys.argv[1]) / 'train.tsv')",
     "train.tsv:2: n_frames 'twelve' is not a count of frames"),
    (_cut_store, "from lib.data.store import read_features; read_features(Path(sys.argv[1]), 'train.fbank.npy:0:1')",
     "train.fbank.npy: not a readable feature store (mmap length is greater than file size)"),
    (lambda folder: (folder / "spm_st.model").write_bytes(b"\x0a\x05 not a model"),
     "from lib.report.corpus_stats import corpus_stats; corpus_stats(Path(sys.argv[1]), ['train'])",
     "spm_st.model: cannot load SentencePiece model"),
    (_placeholder_model,
     "from lib.model.checkpoint import load_model; load_model(Path(sys.argv[1]) / 'model.pt', producer='train_asr')",
     "model.pt: not a model checkpoint (asr.mode is per_pair"),
])
def test_a_damaged_prepared_file_or_model_is_one_line_naming_it(tmp_path: Path, damage, reads: str, says: str) -> None:
    """What a stage reads from prepare (manifest, feature store, SentencePiece model) and from a training stage
    (model.pt), damaged: one line naming the file, exit 1, as a truncated JSON; these were tracebacks (numpy's
    and SentencePiece's errors name no remedy, the manifest's and the model file's were plain ValueErrors)."""
    damage(tmp_path)
    lines = _stage_error_lines(tmp_path, reads)
    assert len(lines) == 1 and lines[0].startswith(f"error: {tmp_path}/") and says in lines[0], lines

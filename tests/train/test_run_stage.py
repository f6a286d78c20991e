"""lib/train/run.py end to end on the tiny data: ASR pretraining, then ST initialised from it."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import sacrebleu
import torch

from lib.decode.beam_search import BeamSearchConfig
from lib.decode.metrics import bleu, chrf, wer
from lib.model.s2t_transformer import S2TTransformer, ModelConfig
from lib.train import checkpoint as ckpt
from lib.layout import RunPaths
from lib.params import TrainConfig
from lib.train.run import RunSpec, file_digest, run, score

TRAIN = dict(lr=2e-3, warmup_updates=2, max_updates=4, max_frames=200, update_freq=1, eval_every=2, save_every=2,
             average_last=2, best_metric="loss")


def _paths(task: str, root: Path) -> RunPaths:
    return RunPaths(root, "asr", "en-de") if task == "asr" else RunPaths(root, "baseline", "en-de", 1)


def _spec(task: str, prepared: Path, root: Path, init_encoder: Path | None = None) -> RunSpec:
    return RunSpec(task=task, pair="en-de", prepared_dir=prepared, paths=_paths(task, root),
                   train=TrainConfig(**TRAIN), model_size="tiny",
                   init_encoder=init_encoder, decode=BeamSearchConfig(beam=2, max_len_b=8),
                   dev_decode=BeamSearchConfig(beam=1, max_len_b=8), decode_batch_frames=2000, max_dev_decode=2)


def _asr_then_st(prepared: Path, root: Path) -> tuple[dict, dict]:
    asr = run(_spec("asr", prepared, root), progress=False)
    st = run(_spec("st", prepared, root, init_encoder=_paths("asr", root).model), progress=False)
    return asr, st


@pytest.mark.slow
def test_asr_then_st_end_to_end_and_reproducible(prepared: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    loaded: list[bool] = []
    from lib.model import checkpoint as model_file

    real_load = model_file.load_encoder

    def spy(model: S2TTransformer, state: dict):  # noqa: ANN202
        report = real_load(model, state)
        asr_model = ckpt.load(_paths("asr", one).model)["model"]
        loaded.append(all(torch.equal(v, asr_model[f"encoder.{k}"]) for k, v in model.encoder.state_dict().items()))
        return report

    monkeypatch.setattr(model_file, "load_encoder", spy)
    asr, st = _asr_then_st(prepared, one)

    # ASR outputs
    assert set(asr) >= {"wer", "dev_best", "updates", "sentences", "params"} and "bleu" not in asr
    assert asr["updates"] == 4 and asr["sentences"] == 3 and asr["wer"] >= 0
    # ST outputs
    assert set(st) >= {"bleu", "chrf", "bleu_signature", "dev_best", "updates"} and "wer" not in st
    assert 0 <= st["bleu"] <= 100 and 0 <= st["chrf"] <= 100 and "nrefs:1" in st["bleu_signature"]
    for task, metrics in (("asr", asr), ("st", st)):
        out = _paths(task, one)
        assert json.loads(out.metrics.read_text()) == metrics
        hyps = out.hyps().read_text(encoding="utf-8")
        assert hyps.endswith("\n") and len(hyps.splitlines()) == 3
        refs = out.refs().read_text(encoding="utf-8")
        assert len(refs.splitlines()) == 3
        # the saved scores are those of the saved hypotheses against the saved references (in that order:
        # WER, BLEU and chrF are not symmetric)
        h, r = hyps.splitlines(), refs.splitlines()
        expected = {"wer": round(wer(h, r), 2)} if task == "asr" else {"bleu": round(bleu(h, r), 2),
                                                                       "chrf": round(chrf(h, r), 2)}
        assert {k: metrics[k] for k in expected} == expected
        timing = json.loads(out.timing.read_text())
        assert set(timing) == {"train_seconds", "decode_seconds"}
        model = ckpt.load(out.model)
        assert model["task"] == task and model["checkpoint"] == "avg_last_k" and model["pair"] == "en-de"
        assert model["model_config"]["d_model"] == 16  # the tiny config
        assert model["model"].keys() == S2TTransformer(ModelConfig.from_dict(model["model_config"])).state_dict().keys()
        avg = ckpt.load(out.checkpoints / "avg_last_k.pt")
        assert avg["updates"] == [2, 4]
        assert all(torch.equal(model["model"][k], avg["model"][k]) for k in avg["model"])
        # dvclive: one row per update in the train metrics, dev metrics at each evaluation; the
        # curves output (plots/train/<run>) is a copy of the live folder's
        tsvs = {p.relative_to(out.curves).as_posix(): p for p in out.curves.rglob("*.tsv")}
        for rel, p in tsvs.items():
            assert (out.live / "plots" / "metrics" / rel).read_bytes() == p.read_bytes()
        assert "train/loss.tsv" in tsvs and "dev/loss.tsv" in tsvs, sorted(tsvs)
        assert ("dev/wer.tsv" if task == "asr" else "dev/bleu.tsv") in tsvs
        with open(tsvs["train/loss.tsv"], encoding="utf-8") as f:
            rows = list(csv.DictReader(f, delimiter="\t"))
        assert [int(r["step"]) for r in rows] == [1, 2, 3, 4]
        with open(tsvs["dev/loss.tsv"], encoding="utf-8") as f:
            assert [int(r["step"]) for r in csv.DictReader(f, delimiter="\t")] == [2, 4]

    # the ST encoder was initialised from the ASR model.pt (recorded by the spy), and that file
    # is part of the ST run's config
    assert len(loaded) == 1 and loaded[0]
    assert ckpt.load(_paths("asr", one).checkpoints / "last.pt")["config"]["init_encoder"] is None
    st_cfg = ckpt.load(_paths("st", one).checkpoints / "last.pt")["config"]
    assert st_cfg["init_encoder"] == file_digest(_paths("asr", one).model)

    # a second identical run from scratch, in a fresh folder: identical metrics files
    _asr_then_st(prepared, two)
    for task in ("asr", "st"):
        a_run, b_run = _paths(task, one), _paths(task, two)
        assert a_run.metrics.read_bytes() == b_run.metrics.read_bytes()
        assert a_run.hyps().read_bytes() == b_run.hyps().read_bytes()
        a, b = ckpt.load(a_run.model)["model"], ckpt.load(b_run.model)["model"]
        assert all(torch.equal(a[k], b[k]) for k in a)


def test_score_reads_hypotheses_then_references() -> None:
    """run.py's score(task, hyps, refs) on a pair where the order matters: a hypothesis one word longer than
    its reference. WER is 1 insertion over 6 reference words (the other way round, 1 / 7), and BLEU / chrF
    are sacreBLEU's with the references as references (swapped, BLEU gets a brevity penalty)."""
    hyps, refs = ["the cat sat on the mat today"], ["the cat sat on the mat"]
    assert score("asr", hyps, refs) == {"wer": round(100 / 6, 2)} == {"wer": 16.67}
    got = score("st", hyps, refs)
    want = {"bleu": round(sacrebleu.corpus_bleu(hyps, [refs]).score, 2),
            "chrf": round(sacrebleu.corpus_chrf(hyps, [refs]).score, 2)}
    swapped = {"bleu": round(sacrebleu.corpus_bleu(refs, [hyps]).score, 2),
               "chrf": round(sacrebleu.corpus_chrf(refs, [hyps]).score, 2)}
    assert got == want and want["bleu"] != swapped["bleu"] and want["chrf"] != swapped["chrf"]


class _Interrupt(Exception):
    pass


def _tsv_values(path: Path) -> list[tuple[str, str]]:
    with open(path, encoding="utf-8") as f:
        return [(r["step"], r[path.stem]) for r in csv.DictReader(f, delimiter="\t")]  # timestamps differ


@pytest.mark.slow
def test_interrupted_stage_resumes_without_duplicate_dvclive_rows(prepared: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A run stopped during update 4 (last.pt of update 2, dvclive rows 1-3 already written) and
    restarted resumes (loading last.pt once), drops the dvclive rows after its checkpoint, and ends
    exactly like an uninterrupted run: same metrics file, same dvclive values, one row per step."""
    ref = run(_spec("asr", prepared, tmp_path / "ref"), progress=False)

    import lib.train.loop as loop

    real_lr = loop.learning_rate

    def lr(update: int, *args, **kwargs) -> float:
        if update == 3:  # the lr of update 4 is computed from 3 completed updates
            raise _Interrupt
        return real_lr(update, *args, **kwargs)

    monkeypatch.setattr(loop, "learning_rate", lr)
    with pytest.raises(_Interrupt):
        run(_spec("asr", prepared, tmp_path / "cut"), progress=False)
    monkeypatch.undo()
    cut, ref_run = _paths("asr", tmp_path / "cut"), _paths("asr", tmp_path / "ref")
    assert ckpt.load(cut.checkpoints / "last.pt")["run_state"]["update"] == 2
    assert [s for s, _ in _tsv_values(cut.live / "plots/metrics/train/loss.tsv")] == ["1", "2", "3"]
    assert not cut.curves.exists()  # the curves output appears when the run ends

    real_load, last_loads = ckpt.load, []

    def load(path, *args, **kwargs):  # noqa: ANN001, ANN202
        if Path(path).name == "last.pt":
            last_loads.append(Path(path))
        return real_load(path, *args, **kwargs)

    monkeypatch.setattr(ckpt, "load", load)
    again = run(_spec("asr", prepared, tmp_path / "cut"), progress=False)
    monkeypatch.undo()
    assert last_loads == [cut.checkpoints / "last.pt"]  # one resume decision for dvclive and training
    assert again == ref
    assert cut.metrics.read_bytes() == ref_run.metrics.read_bytes()
    tsvs = sorted(p.relative_to(ref_run.curves) for p in ref_run.curves.rglob("*.tsv"))
    assert tsvs == sorted(p.relative_to(cut.curves) for p in cut.curves.rglob("*.tsv"))
    for rel in tsvs:
        assert _tsv_values(cut.curves / rel) == _tsv_values(ref_run.curves / rel), rel


@pytest.mark.slow
def test_the_thread_count_is_part_of_the_run(prepared: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``RunSpec.threads`` (lib/parallel.py: cores // parallel.jobs) is set for the run, recorded in its
    metrics and its config: a finished run is not resumed with another thread count (its last bits differ)."""
    import dataclasses

    before = torch.get_num_threads()
    try:
        spec = dataclasses.replace(_spec("asr", prepared, tmp_path), threads=1)
        metrics = run(spec, progress=False)
        assert metrics["threads"] == 1 and torch.get_num_threads() == 1
        assert ckpt.load(spec.paths.checkpoints / "last.pt")["config"]["threads"] == 1
        capsys.readouterr()
        again = run(spec, progress=False)  # same threads: resumes at its last update, same metrics
        assert again == metrics and "resumed from" in "".join(capsys.readouterr())
        curves = {p.relative_to(spec.paths.live): p.read_text() for p in spec.paths.live.rglob("*.tsv")}
        other = run(dataclasses.replace(spec, threads=2), progress=False)
        assert other["threads"] == 2 and list(spec.paths.checkpoints.glob("stale-*/last.pt"))
        assert "threads" in "".join(capsys.readouterr())  # the key that differs is named
        back = run(spec, progress=False)  # threads 1 again: its state, curves included, comes back
        assert back == metrics and "brought back" in "".join(capsys.readouterr())
        assert {p.relative_to(spec.paths.live): p.read_text() for p in spec.paths.live.rglob("*.tsv")} == curves != {}
    finally:
        torch.set_num_threads(before)


@pytest.mark.parametrize("state, match", [
    ({"unused": "asr.mode is per_pair"}, r"not a model to start the encoder from \(asr\.mode is per_pair\)"),
    ("wrong-shape", r"does not fit this run's model: encoder state dict does not match"),
])
def test_an_init_model_that_cannot_start_the_encoder_is_named_before_training(prepared: Path, tmp_path: Path,
                                                                               state, match: str) -> None:
    """The ASR model an ST run starts from is a placeholder, or a model of another size: an InputError naming
    the file (one line from the stage) when the run is set up, before any update; nothing of the run written."""
    from lib.io import InputError
    from lib.model import checkpoint as model_file
    from lib.model.s2t_transformer import model_config

    init = tmp_path / "asr_model.pt"
    if state == "wrong-shape":
        cfg = model_config("tiny", vocab_size=40, encoder_layers=1)  # the run's tiny model has more layers
        model_file.save_model(init, S2TTransformer(cfg), cfg)
    else:
        model_file.save(init, state)
    with pytest.raises(InputError, match=rf"asr_model\.pt: {match}"):
        run(_spec("st", prepared, tmp_path, init_encoder=init), progress=False)
    assert not _paths("st", tmp_path).model.exists() and not _paths("st", tmp_path).metrics.exists()

"""lib/train/run.py end to end on the tiny data: ASR pretraining, then ST initialised from it."""
from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest
import torch

from lib.decode.beam_search import BeamSearchConfig
from lib.model.s2t_transformer import S2TTransformer, ModelConfig
from lib.train import checkpoint as ckpt
from lib.train.loop import TrainConfig
from lib.train.run import RunSpec, file_digest, run

TRAIN = dict(lr=2e-3, warmup_updates=2, max_updates=4, max_frames=200, update_freq=1, eval_every=2, save_every=2,
             average_last=2, best_metric="loss")


def _spec(task: str, prepared: Path, root: Path, init_encoder: Path | None = None) -> RunSpec:
    return RunSpec(task=task, pair="en-de", prepared_dir=prepared, out_dir=root / task,
                   metrics_path=root / "metrics" / f"{task}.json", train=TrainConfig(**TRAIN), model_size="tiny",
                   init_encoder=init_encoder, decode=BeamSearchConfig(beam=2, max_len_b=8),
                   dev_decode=BeamSearchConfig(beam=1, max_len_b=8), decode_batch_frames=2000, max_dev_decode=2)


def _asr_then_st(prepared: Path, root: Path) -> tuple[dict, dict]:
    asr = run(_spec("asr", prepared, root), progress=False)
    st = run(_spec("st", prepared, root, init_encoder=root / "asr" / "model.pt"), progress=False)
    return asr, st


@pytest.mark.slow
def test_asr_then_st_end_to_end_and_reproducible(prepared: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    loaded: list[bool] = []
    real_load = S2TTransformer.load_encoder_from

    def spy(self: S2TTransformer, state: dict):  # noqa: ANN202
        report = real_load(self, state)
        asr_model = ckpt.load(one / "asr" / "model.pt")["model"]
        loaded.append(all(torch.equal(v, asr_model[f"encoder.{k}"]) for k, v in self.encoder.state_dict().items()))
        return report

    monkeypatch.setattr(S2TTransformer, "load_encoder_from", spy)
    asr, st = _asr_then_st(prepared, one)

    # ASR outputs
    assert set(asr) >= {"wer", "dev_best", "updates", "sentences", "params"} and "bleu" not in asr
    assert asr["updates"] == 4 and asr["sentences"] == 3 and asr["wer"] >= 0
    # ST outputs
    assert set(st) >= {"bleu", "chrf", "bleu_signature", "dev_best", "updates"} and "wer" not in st
    assert 0 <= st["bleu"] <= 100 and 0 <= st["chrf"] <= 100 and "nrefs:1" in st["bleu_signature"]
    for task, metrics in (("asr", asr), ("st", st)):
        out = one / task
        assert json.loads((one / "metrics" / f"{task}.json").read_text()) == metrics
        hyps = (out / "hyps.tst-COMMON.txt").read_text(encoding="utf-8")
        assert hyps.endswith("\n") and len(hyps.splitlines()) == 3
        timing = json.loads((out / "timing.json").read_text())
        assert set(timing) == {"train_seconds", "decode_seconds"}
        model = ckpt.load(out / "model.pt")
        assert model["task"] == task and model["checkpoint"] == "avg_last_k" and model["pair"] == "en-de"
        assert model["model_config"]["d_model"] == 16  # the tiny config
        assert model["model"].keys() == S2TTransformer(ModelConfig.from_dict(model["model_config"])).state_dict().keys()
        avg = ckpt.load(out / "checkpoints" / "avg_last_k.pt")
        assert avg["updates"] == [2, 4]
        assert all(torch.equal(model["model"][k], avg["model"][k]) for k in avg["model"])
        # dvclive: one row per update in the train metrics, dev metrics at each evaluation
        tsvs = {p.relative_to(out / "live" / "plots" / "metrics").as_posix(): p
                for p in (out / "live" / "plots" / "metrics").rglob("*.tsv")}
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
    assert ckpt.load(one / "asr" / "checkpoints" / "last.pt")["config"]["init_encoder"] is None
    st_cfg = ckpt.load(one / "st" / "checkpoints" / "last.pt")["config"]
    assert st_cfg["init_encoder"] == file_digest(one / "asr" / "model.pt")

    # a second identical run from scratch, in a fresh folder: identical metrics files
    _asr_then_st(prepared, two)
    for task in ("asr", "st"):
        assert (one / "metrics" / f"{task}.json").read_bytes() == (two / "metrics" / f"{task}.json").read_bytes()
        assert (one / task / "hyps.tst-COMMON.txt").read_bytes() == (two / task / "hyps.tst-COMMON.txt").read_bytes()
        a, b = ckpt.load(one / task / "model.pt")["model"], ckpt.load(two / task / "model.pt")["model"]
        assert all(torch.equal(a[k], b[k]) for k in a)


class _Interrupt(Exception):
    pass


def _tsv_values(path: Path) -> list[tuple[str, str]]:
    with open(path, encoding="utf-8") as f:
        return [(r["step"], r[path.stem]) for r in csv.DictReader(f, delimiter="\t")]  # timestamps differ


@pytest.mark.slow
def test_interrupted_stage_resumes_without_duplicate_dvclive_rows(prepared: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """A run stopped during update 4 (last.pt of update 2, dvclive rows 1-3 already written) and
    restarted resumes, drops the dvclive rows after its checkpoint, and ends exactly like an
    uninterrupted run: same metrics file, same dvclive values, one row per step."""
    ref = run(_spec("asr", prepared, tmp_path / "ref"), progress=False)

    import lib.train.loop as loop

    real_lr = loop.inverse_sqrt_lr

    def lr(update: int, *args, **kwargs) -> float:
        if update == 3:  # the lr of update 4 is computed from 3 completed updates
            raise _Interrupt
        return real_lr(update, *args, **kwargs)

    monkeypatch.setattr(loop, "inverse_sqrt_lr", lr)
    with pytest.raises(_Interrupt):
        run(_spec("asr", prepared, tmp_path / "cut"), progress=False)
    monkeypatch.undo()
    cut = tmp_path / "cut" / "asr"
    assert ckpt.load(cut / "checkpoints" / "last.pt")["run_state"]["update"] == 2
    assert [s for s, _ in _tsv_values(cut / "live/plots/metrics/train/loss.tsv")] == ["1", "2", "3"]

    again = run(_spec("asr", prepared, tmp_path / "cut"), progress=False)
    assert again == ref
    assert (tmp_path / "cut/metrics/asr.json").read_bytes() == (tmp_path / "ref/metrics/asr.json").read_bytes()
    ref_live = tmp_path / "ref" / "asr" / "live" / "plots" / "metrics"
    tsvs = sorted(p.relative_to(ref_live) for p in ref_live.rglob("*.tsv"))
    assert tsvs == sorted(p.relative_to(cut / "live/plots/metrics") for p in (cut / "live/plots/metrics").rglob("*.tsv"))
    for rel in tsvs:
        assert _tsv_values(cut / "live/plots/metrics" / rel) == _tsv_values(ref_live / rel), rel

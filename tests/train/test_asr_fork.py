"""local.asr_pretraining: fork -- the ASR run keeps its state K updates before the end, and a second
run finishes that training with another encoder attention (lib/train/run.py, lib/train/loop.py)."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lib.decode.beam_search import BeamSearchConfig
from lib.layout import RunPaths
from lib.params import TrainConfig
from lib.train import checkpoint as ckpt
from lib.train.run import RunSpec, load_fork_state, run
from lib.train.experiments import asr_fork_at, asr_fork_spec_from_params, write_no_fork

TRAIN = dict(lr=2e-3, warmup_updates=2, max_updates=4, max_frames=200, update_freq=1, eval_every=2, save_every=2,
             average_last=2, best_metric="loss", ctc_weight=0.3)
FULL = [{"type": "full"}, {"type": "full"}]
LOCAL = [{"type": "full"}, {"type": "local", "window": 1}]


def _spec(prepared: Path, root: Path, system: str, **kw) -> RunSpec:
    train = TrainConfig(**{**TRAIN, **kw.pop("train", {})})
    return RunSpec(task="asr", pair="en-de", prepared_dir=prepared, paths=RunPaths(root, system, "en-de"),
                   train=train, model_size="tiny", decode=BeamSearchConfig(beam=2, max_len_b=8),
                   dev_decode=BeamSearchConfig(beam=1, max_len_b=8), decode_batch_frames=2000, max_dev_decode=2,
                   final_checkpoint="last", **kw)


def _weights(root: Path, system: str) -> dict[str, torch.Tensor]:
    return ckpt.load(RunPaths(root, system, "en-de").model)["model"]


@pytest.mark.slow
def test_fork_with_the_same_attention_finishes_the_run_bit_exactly(prepared: Path, tmp_path: Path) -> None:
    """The fork state holds everything the training depends on: continued with the same attention it
    ends in the very model the run itself ended in; with local attention it ends elsewhere. Keeping
    the fork does not change the run."""
    plain = run(_spec(prepared, tmp_path / "plain", "asr"), progress=False)
    forked = run(_spec(prepared, tmp_path, "asr", fork_at=2), progress=False)
    assert plain["wer"] == forked["wer"]
    base = _weights(tmp_path, "asr")
    assert all(torch.equal(base[k], v) for k, v in _weights(tmp_path / "plain", "asr").items())
    fork_state = load_fork_state(RunPaths(tmp_path, "asr", "en-de").fork_state)
    assert fork_state["run_state"]["update"] == 2 and "optimizer" in fork_state

    start = RunPaths(tmp_path, "asr", "en-de").fork_state
    same = run(_spec(prepared, tmp_path / "same", "asr_local", encoder_attention=FULL, start_from=start),
               progress=False)
    assert same["updates"] == TRAIN["max_updates"]
    for k, v in _weights(tmp_path / "same", "asr_local").items():
        assert torch.equal(base[k], v), k
    run(_spec(prepared, tmp_path / "local", "asr_local", encoder_attention=LOCAL, start_from=start), progress=False)
    local = ckpt.load(RunPaths(tmp_path / "local", "asr_local", "en-de").model)
    assert local["model_config"]["encoder_attention"] == LOCAL
    assert any(not torch.equal(base[k], v) for k, v in local["model"].items())
    # its own curves start after the fork: updates 3-4 only
    loss = (RunPaths(tmp_path / "local", "asr_local", "en-de").curves / "train/loss.tsv").read_text().splitlines()
    assert [int(r.split("\t")[0]) for r in loss[1:]] == [3, 4]


@pytest.mark.slow
def test_fork_refuses_a_state_of_other_settings(prepared: Path, tmp_path: Path) -> None:
    run(_spec(prepared, tmp_path, "asr", fork_at=2), progress=False)
    start = RunPaths(tmp_path, "asr", "en-de").fork_state
    with pytest.raises(ValueError, match=r"fork.pt: made by a run with other settings \(train differ"):
        run(_spec(prepared, tmp_path / "other", "asr_local", encoder_attention=LOCAL, start_from=start,
                  train={"lr": 1e-3}), progress=False)
    assert not RunPaths(tmp_path / "other", "asr_local", "en-de").model.exists()


@pytest.mark.slow
def test_a_fork_state_older_than_a_training_key_matches_its_default(prepared: Path, tmp_path: Path) -> None:
    """A fork state written before a training key existed (here: without ``pad_frames_to``) is
    the same training as a run that leaves the key at its default, and not one that sets it."""
    run(_spec(prepared, tmp_path, "asr", fork_at=2), progress=False)
    start = RunPaths(tmp_path, "asr", "en-de").fork_state
    state = ckpt.load(start)
    reference = run(_spec(prepared, tmp_path / "reference", "asr_local", encoder_attention=LOCAL, start_from=start),
                    progress=False)  # from the fork state as written
    del state["config"]["train"]["pad_frames_to"]
    ckpt.save(start, state)
    with pytest.raises(ValueError, match=r"other settings \(train differ"):
        run(_spec(prepared, tmp_path / "padded", "asr_local", encoder_attention=LOCAL, start_from=start,
                  train={"pad_frames_to": 64}), progress=False)
    metrics = run(_spec(prepared, tmp_path / "local", "asr_local", encoder_attention=LOCAL, start_from=start),
                  progress=False)
    # the same training as from the fork state as written: the same weights and WER
    a = ckpt.load(RunPaths(tmp_path / "local", "asr_local", "en-de").model)["model"]
    b = ckpt.load(RunPaths(tmp_path / "reference", "asr_local", "en-de").model)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a) and metrics["wer"] == reference["wer"]


@pytest.mark.slow
def test_a_run_from_scratch_never_resumes_a_forks_checkpoint(prepared: Path, tmp_path: Path,
                                                             capsys: pytest.CaptureFixture) -> None:
    """`local` after `fork` writes to the same run folder with the same hyperparameters, model and
    data: it must train from scratch, not resume the forked run's last.pt."""
    run(_spec(prepared, tmp_path, "asr", fork_at=2), progress=False)
    start = RunPaths(tmp_path, "asr", "en-de").fork_state
    run(_spec(prepared, tmp_path, "asr_local", encoder_attention=LOCAL, start_from=start), progress=False)
    capsys.readouterr()
    run(_spec(prepared, tmp_path, "asr_local", encoder_attention=LOCAL), progress=False)
    assert "NOT resuming" in capsys.readouterr().out  # (tqdm.write)
    run(_spec(prepared, tmp_path / "scratch", "asr_local", encoder_attention=LOCAL), progress=False)
    scratch = _weights(tmp_path / "scratch", "asr_local")
    assert all(torch.equal(scratch[k], v) for k, v in _weights(tmp_path, "asr_local").items())


def test_missing_or_placeholder_fork_state_is_a_clear_error(tmp_path: Path) -> None:
    paths = RunPaths(tmp_path, "asr", "en-de")
    with pytest.raises(ValueError, match="runs/asr/en-de/fork.pt: missing"):
        load_fork_state(paths.fork_state)
    paths.run_dir.mkdir(parents=True)
    write_no_fork(paths)
    with pytest.raises(ValueError, match="fork.pt: not a fork state .*asr.fork_updates is 0"):
        load_fork_state(paths.fork_state)


@pytest.mark.slow
def test_a_run_past_its_fork_update_without_the_fork_state_trains_again(prepared: Path, tmp_path: Path,
                                                                        capsys: pytest.CaptureFixture) -> None:
    """E.g. the shared ASR model trained before `fork` was chosen: resuming its finished last.pt
    would leave no fork state, so it trains again (to the same model) and keeps one."""
    first = run(_spec(prepared, tmp_path, "asr"), progress=False)
    again = run(_spec(prepared, tmp_path, "asr", fork_at=2), progress=False)
    assert "without its fork state" in capsys.readouterr().err
    assert first["wer"] == again["wer"]
    assert load_fork_state(RunPaths(tmp_path, "asr", "en-de").fork_state)["run_state"]["update"] == 2


def _params(mode: str, pretraining: str = "fork"):
    return SimpleNamespace(
        model=SimpleNamespace(size="tiny", overrides={}),
        local=SimpleNamespace(windows=[], asr_pretraining=pretraining),
        asr=SimpleNamespace(mode=mode, shared_pair="en-de", fork_updates=800 if pretraining == "fork" else 0),
        decode=SimpleNamespace(beam=2, len_penalty=1.0, max_len_a=0.0, max_len_b=10, batch_frames=1000,
                               final_checkpoint="avg_last_k", dev_sentences=2),
        train_asr=dataclasses.replace(TrainConfig(**TRAIN), max_updates=2400), train_st=None,
        data=SimpleNamespace(prepared_dir="data/prepared"), parallel=SimpleNamespace(jobs="auto"),
    )


@pytest.mark.parametrize("mode", ["shared", "per_pair"])
def test_fork_spec_continues_the_pairs_asr_training(tmp_path: Path, mode: str) -> None:
    p = _params(mode)
    assert asr_fork_at(p) == 1600 and asr_fork_at(_params(mode, "shared")) is None
    spec = asr_fork_spec_from_params(p, tmp_path, "en-it", LOCAL)
    assert spec.task == "asr" and spec.paths.run_dir == tmp_path / "runs/asr_local/en-it"
    assert spec.start_from == tmp_path / "runs/asr/en-it/fork.pt" and spec.init_encoder is None
    # the data the forked run was trained on: the shared model's (en-de) or the pair's own
    assert spec.prepared_dir == tmp_path / "data/prepared" / ("en-de" if mode == "shared" else "en-it")
    assert spec.train == p.train_asr and spec.encoder_attention == LOCAL


def _shared_fork_params(root: Path):
    return SimpleNamespace(
        pairs=["en-de", "en-es"],
        model=SimpleNamespace(size="tiny", overrides={}),
        local=SimpleNamespace(windows=[], asr_pretraining="fork", fork="shared"),
        analysis=SimpleNamespace(full_layers=1),
        asr=SimpleNamespace(mode="shared", shared_pair="en-de", fork_updates=2),
        decode=SimpleNamespace(beam=2, len_penalty=1.0, max_len_a=0.0, max_len_b=8, batch_frames=2000,
                               final_checkpoint="last", dev_sentences=2),
        train_asr=TrainConfig(**TRAIN), train_st=None,
        data=SimpleNamespace(prepared_dir="data/prepared"), parallel=SimpleNamespace(jobs="auto"),
    )


@pytest.mark.slow
def test_one_shared_fork_with_the_widest_windows_serves_every_pair(prepared: Path, tmp_path: Path) -> None:
    """local.fork: shared -- the shared ASR training is forked once, with per layer the widest window of
    the pairs' windows, and every pair's asr_local is that model, scored on the pair's own test set."""
    from lib.train.experiments import (adopt_shared_asr, shared_fork_attention, shared_fork_spec_from_params,
                                       spec_from_params, uses_shared_fork)

    p = _shared_fork_params(tmp_path)
    assert uses_shared_fork(p)
    for pair in p.pairs:  # the tiny corpus stands in for both pairs' data
        (tmp_path / "data/prepared").mkdir(parents=True, exist_ok=True)
        (tmp_path / "data/prepared" / pair).symlink_to(prepared)
    asr = spec_from_params(p, tmp_path, "asr_shared", None)
    asr.fork_at = 2
    run(asr, progress=False)
    with pytest.raises(ValueError, match="windows/en-de/windows.json: missing"):
        shared_fork_attention(p, tmp_path)
    for pair, window in (("en-de", 1), ("en-es", 3)):
        path = tmp_path / "data/windows" / pair / "windows.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"encoder_attention": [{"type": "full"}, {"type": "local", "window": window}]}))
    attention = shared_fork_attention(p, tmp_path)
    assert attention == [{"type": "full"}, {"type": "local", "window": 3}]

    spec = shared_fork_spec_from_params(p, tmp_path, attention)
    assert spec.paths.run_dir == tmp_path / "runs/asr_local_shared"
    assert spec.start_from == tmp_path / "runs/asr_shared/fork.pt" and spec.prepared_dir.name == "en-de"
    fork_metrics = run(spec, progress=False)
    assert fork_metrics["updates"] == TRAIN["max_updates"]
    fork = ckpt.load(spec.paths.model)
    assert fork["model_config"]["encoder_attention"] == attention
    base = ckpt.load(RunPaths(tmp_path, "asr_shared").model)["model"]
    assert any(not torch.equal(base[k], v) for k, v in fork["model"].items())
    spec.paths.metrics.write_text(json.dumps({**fork_metrics, "asr_pretraining": "fork", "fork": "shared",
                                              "forked_at": 2, "windows": [0, 3]}))
    for pair in p.pairs:
        m = adopt_shared_asr(p, tmp_path, pair, progress=False, source="asr_local_shared", system="asr_local")
        dst = RunPaths(tmp_path, "asr_local", pair)
        assert dst.model.read_bytes() == spec.paths.model.read_bytes()
        assert not dst.fork_state.exists()  # a fork keeps no fork state of its own
        assert m["fork"] == "shared" and m["forked_at"] == 2 and m["windows"] == [0, 3] and "wer" in m
        assert json.loads(dst.metrics.read_text()) == m
        assert len(dst.hyps().read_text().splitlines()) == len(dst.refs().read_text().splitlines()) > 0


def test_adopting_a_placeholder_fork_is_a_clear_error(tmp_path: Path) -> None:
    from lib.train.experiments import adopt_shared_asr, write_unused_shared_asr

    p = _shared_fork_params(tmp_path)
    with pytest.raises(FileNotFoundError, match="runs/asr_local_shared/model.pt: missing; .* train_asr_local_shared"):
        adopt_shared_asr(p, tmp_path, "en-es", source="asr_local_shared", system="asr_local")
    write_unused_shared_asr(tmp_path, "asr_local_shared", "local.fork is per_pair", {"local_fork": "unused"})
    assert not RunPaths(tmp_path, "asr_local_shared").fork_state.exists()
    # its curves folder holds a row-less curve (a folder git can keep, that `dvc plots show` reads)
    assert (RunPaths(tmp_path, "asr_local_shared").curves / "train/loss.tsv").read_text() == "step\tloss\n"
    with pytest.raises(ValueError, match=r"not a model \(local.fork is per_pair\).*dvc repro train_asr_local_shared"):
        adopt_shared_asr(p, tmp_path, "en-es", source="asr_local_shared", system="asr_local")


@pytest.mark.slow
def test_auto_padding_is_resolved_in_the_run_config_and_a_fork_continues_with_it(prepared: Path,
                                                                                  tmp_path: Path) -> None:
    """`pad_*: auto` with bf16 training on a CPU pads to lib.precision.BF16_PAD_TO; the run's config
    (resume fingerprint, fork state) holds the numbers, so a fork of the same params continues it."""
    auto = {"amp": "bf16", "pad_frames_to": "auto", "pad_tokens_to": "auto"}
    run(_spec(prepared, tmp_path, "asr", fork_at=2, train=auto), progress=False)
    fork_state = load_fork_state(RunPaths(tmp_path, "asr", "en-de").fork_state)
    assert (fork_state["config"]["train"]["pad_frames_to"], fork_state["config"]["train"]["pad_tokens_to"]) == (64, 8)
    assert fork_state["config"]["precision"] == "bf16"
    start = RunPaths(tmp_path, "asr", "en-de").fork_state
    out = run(_spec(prepared, tmp_path / "local", "asr_local", encoder_attention=LOCAL, start_from=start, train=auto),
              progress=False)
    assert out["updates"] == TRAIN["max_updates"] and out["precision"] == "bf16"
    fp32 = run(_spec(prepared, tmp_path / "fp32", "asr", train={**auto, "amp": "none"}), progress=False)
    assert fp32["precision"] == "none"
    last = ckpt.load(RunPaths(tmp_path / "fp32", "asr", "en-de").checkpoints / "last.pt")
    assert (last["config"]["train"]["pad_frames_to"], last["config"]["train"]["pad_tokens_to"]) == (1, 1)


@pytest.mark.slow
def test_a_control_forks_the_shared_asr_training_with_its_own_windows(prepared: Path, tmp_path: Path) -> None:
    """controls.asr_systems -- a control's ASR model follows local's fork rule with the control's windows:
    the shared ASR training finished from its fork state with, per layer, the widest of every pair's
    control windows; controls not listed start from local's ASR model."""
    from lib.model.spec import control_attention_spec, local_attention_spec
    from lib.train.experiments import (control_asr_model, control_fork_attention,
                                       control_fork_spec_from_params, shared_fork_attention, spec_from_params)

    p = _shared_fork_params(tmp_path)
    p.model.overrides = {"encoder_layers": 4}
    p.controls = SimpleNamespace(systems=["local_uniform", "local_shuffled"], asr_systems=["local_uniform"],
                                 shuffle_seed=1)
    for pair in p.pairs:
        (tmp_path / "data/prepared").mkdir(parents=True, exist_ok=True)
        (tmp_path / "data/prepared" / pair).symlink_to(prepared)
    windows = {"en-de": [1, 3, 9], "en-es": [1, 1, 1]}
    for pair, ws in windows.items():
        path = tmp_path / "data/windows" / pair / "windows.json"
        path.parent.mkdir(parents=True)
        path.write_text(json.dumps({"encoder_attention": local_attention_spec(4, 1, ws)}))
    uniform = control_fork_attention(p, tmp_path, "local_uniform")
    # en-de's mean 4.33 rounds to 5, en-es's to 1: the widest is 5 in every local layer
    assert uniform == local_attention_spec(4, 1, [5, 5, 5])
    assert uniform != shared_fork_attention(p, tmp_path)  # Algorithm 1's widest: 1 3 9
    shuffled = control_fork_attention(p, tmp_path, "local_shuffled")
    assert shuffled == control_attention_spec(local_attention_spec(4, 1, windows["en-de"]), "local_shuffled",
                                              shuffle_seed=1)

    asr = spec_from_params(p, tmp_path, "asr_shared", None)
    asr.fork_at = 2
    run(asr, progress=False)
    spec = control_fork_spec_from_params(p, tmp_path, "local_uniform", uniform)
    assert spec.paths.run_dir == tmp_path / "runs/variants/controls_asr/local_uniform"
    assert spec.start_from == tmp_path / "runs/asr_shared/fork.pt" and spec.prepared_dir.name == "en-de"
    metrics = run(spec, progress=False)
    assert metrics["updates"] == TRAIN["max_updates"]
    fork = ckpt.load(spec.paths.model)
    assert fork["model_config"]["encoder_attention"] == uniform
    base = ckpt.load(RunPaths(tmp_path, "asr_shared").model)["model"]
    assert any(not torch.equal(base[k], v) for k, v in fork["model"].items())
    assert control_asr_model(p, tmp_path, "local_uniform", "en-es") == spec.paths.model
    assert control_asr_model(p, tmp_path, "local_shuffled", "en-es") == RunPaths(tmp_path, "asr_local", "en-es").model

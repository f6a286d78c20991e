"""lib/train/checkpoint.py: atomic save / safe load round trip, averaging, errors naming the file."""
from __future__ import annotations

import collections
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lib.train import checkpoint as ckpt


class _Arbitrary:
    """Any class outside torch's weights_only allowlist."""

    def __reduce__(self):  # noqa: ANN204 - what a malicious pickle would do
        return (print, ("code ran while loading",))


def _state(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return collections.OrderedDict(
        w=torch.randn(3, 4, generator=g), b=torch.randn(4, generator=g).to(torch.bfloat16),
        steps=torch.tensor([seed, seed + 1], dtype=torch.long), mask=torch.tensor([True, seed % 2 == 0]))


def test_save_load_round_trip_with_weights_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    state = {"model": _state(1), "run_state": {"update": 7, "history": [{"dev/loss": 1.5}], "best": None},
             "rng": [{"torch": torch.get_rng_state()}], "fingerprint": "abc", "config": {"train": {"lr": 1e-3}}}
    path = tmp_path / "sub" / "last.pt"
    ckpt.save(path, state)
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]  # no temporary left behind
    back = ckpt.load(path)
    assert back["run_state"] == state["run_state"] and back["config"] == state["config"]
    assert back["fingerprint"] == "abc"
    assert torch.equal(back["rng"][0]["torch"], state["rng"][0]["torch"])
    for k, v in state["model"].items():
        assert back["model"][k].dtype == v.dtype and torch.equal(back["model"][k], v)
    # load really is weights_only: a pickled arbitrary object is refused, naming the file
    evil = tmp_path / "evil.pt"
    torch.save({"model": _state(1), "obj": _Arbitrary()}, evil)
    with pytest.raises(RuntimeError, match=r"evil\.pt: cannot load checkpoint .*Weights only load failed"):
        ckpt.load(evil)
    assert "code ran" not in capsys.readouterr().out


def test_average_state_dicts_is_the_mean(tmp_path: Path) -> None:
    a, b = _state(1), _state(2)
    ckpt.save(tmp_path / "a.pt", {"model": a, "update": 1})
    ckpt.save(tmp_path / "b.pt", {"model": b, "update": 2})
    avg = ckpt.average_state_dicts([tmp_path / "a.pt", tmp_path / "b.pt"])
    assert list(avg) == list(a)
    assert torch.allclose(avg["w"], (a["w"] + b["w"]) / 2, rtol=0, atol=1e-7)
    assert avg["b"].dtype == torch.bfloat16
    assert torch.equal(avg["b"], ((a["b"].double() + b["b"].double()) / 2).to(torch.bfloat16))
    assert torch.equal(avg["steps"], b["steps"]) and torch.equal(avg["mask"], b["mask"])  # non-float: last
    one = ckpt.average_state_dicts([tmp_path / "a.pt"])
    assert all(torch.equal(one[k], a[k]) for k in a)
    with pytest.raises(ValueError, match="no checkpoints"):
        ckpt.average_state_dicts([])


def test_averaging_renames_keys_of_earlier_code_and_refuses_other_models(tmp_path: Path) -> None:
    """A run resumed across a change of key names (head selection's logits, once ``<attn>.head_logits``,
    now ``<attn>.selector.head_logits``) averages its snapshots of both kinds over all of them; snapshots
    whose keys differ otherwise are refused, naming the file, instead of averaged over fewer."""
    new = "encoder.layers.0.self_attn.selector.head_logits"
    old = "encoder.layers.0.self_attn.head_logits"
    a, b = {new: torch.ones(2, 3), "w": torch.zeros(2)}, {old: 3 * torch.ones(2, 3), "w": torch.ones(2)}
    ckpt.save(tmp_path / "a.pt", {"model": a})
    ckpt.save(tmp_path / "b.pt", {"model": b})
    avg = ckpt.average_state_dicts([tmp_path / "b.pt", tmp_path / "a.pt"])
    assert set(avg) == {new, "w"} and torch.equal(avg[new], 2 * torch.ones(2, 3))
    ckpt.save(tmp_path / "c.pt", {"model": {"w": torch.ones(2)}})
    with pytest.raises(ValueError, match=r"c\.pt: its weights have other keys .*selector\.head_logits"):
        ckpt.average_state_dicts([tmp_path / "a.pt", tmp_path / "c.pt"])


def test_truncated_or_corrupt_or_missing_file_is_named(tmp_path: Path) -> None:
    good = tmp_path / "good.pt"
    ckpt.save(good, {"model": _state(3)})
    data = good.read_bytes()
    (tmp_path / "truncated.pt").write_bytes(data[: len(data) // 2])
    (tmp_path / "garbage.pt").write_bytes(b"this is not a checkpoint")
    for name in ("truncated.pt", "garbage.pt"):
        with pytest.raises(RuntimeError, match=rf"{tmp_path / name}: cannot load checkpoint"):
            ckpt.load(tmp_path / name)
    with pytest.raises(FileNotFoundError, match=r"missing\.pt: checkpoint not found"):
        ckpt.load(tmp_path / "missing.pt")
    with pytest.raises(RuntimeError, match=r"truncated\.pt"):
        ckpt.average_state_dicts([good, tmp_path / "truncated.pt"])


def test_fingerprint_and_config_diff() -> None:
    a = {"train": {"lr": 1e-3, "seed": 1}, "model": {"d": 16}, "task": "asr"}
    b = {"task": "asr", "model": {"d": 16}, "train": {"seed": 1, "lr": 1e-3}}
    assert ckpt.fingerprint(a) == ckpt.fingerprint(b)  # key order does not matter
    c = {"train": {"lr": 2e-3, "seed": 1}, "model": {"d": 16, "extra": 1}, "task": "asr"}
    assert ckpt.fingerprint(c) != ckpt.fingerprint(a)
    assert ckpt.config_diff(a, c) == ["model.extra: '<missing>' -> 1", "train.lr: 0.001 -> 0.002"]
    assert ckpt.config_diff(a, b) == []


def test_save_sweeps_a_killed_runs_temporaries_but_not_a_live_ones(tmp_path: Path) -> None:
    """A SIGKILLed save leaves ``.last.pt.tmp-<pid>`` (hundreds of MB at paper scale); the next save of
    last.pt removes it once that pid is gone, and never a temporary of a running process."""
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        stale = tmp_path / f".last.pt.tmp-{dead.pid}"
        stale.write_bytes(b"truncated")
        busy = tmp_path / f".last.pt.tmp-{live.pid}"
        busy.write_bytes(b"being written")
        ckpt.save(tmp_path / "last.pt", {"model": _state(4)})
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["last.pt", busy.name])
    finally:
        live.kill()
        live.wait()


def test_a_forks_average_leaves_out_the_snapshot_at_its_fork_update() -> None:
    """(start, upto]: the snapshot at the fork update itself is the run it forked from."""
    assert ckpt.averaged_updates(2, 8, 3, 8, start=4) == [6, 8]
    assert ckpt.averaged_updates(2, 8, 5, 8, start=4) == [6, 8]
    assert ckpt.averaged_updates(3, 8, 3, 8, start=6) == [8]


def test_canonical_tree_is_an_equal_tree_of_the_same_types_with_interned_strings() -> None:
    key = "".join(["be", "tas"])  # a string object of its own, as one read back from a file
    tree = {key: (0.9, 0.98), "groups": [{"params": [0, 1], "lr": 1e-3}], "t": torch.ones(2), 3: None}
    out = ckpt.canonical_tree(tree)
    assert type(out[key]) is tuple and out[key] == (0.9, 0.98) and type(out["groups"]) is list
    assert out["groups"] == tree["groups"] and out[3] is None and out["t"] is tree["t"]
    assert next(iter(out)) is sys.intern("betas")


def test_config_diff_tells_a_number_from_its_string() -> None:
    assert ckpt.config_diff({"a": 1, "b": {"c": 2.0}}, {"a": "1", "b": {"c": 2}}) == ["a: 1 -> '1'"]

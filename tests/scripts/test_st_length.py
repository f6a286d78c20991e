"""scripts/st_length.py: baseline and local runs of one length with dense dev evaluations, from a finished
draw's ASR models and windows, then local − baseline per evaluation step with its interval over seeds."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch
import yaml

from lib.stats import paired_interval, t_quantile
from tests.dvc_repo import REPO
from tests.scripts.test_asr_draws import in_process, setting  # noqa: F401 (the fixture)

sys.path.insert(0, str(REPO / "scripts"))

import asr_draws  # noqa: E402
import st_length  # noqa: E402


def test_last_tenth_gain_reads_the_evaluation_at_or_before_nine_tenths() -> None:
    steps, nll = [60, 120, 180, 240], [2.0, 1.5, 1.2, 1.19]
    assert st_length.last_tenth_gain(steps, nll, 240) == pytest.approx((1.2 - 1.19) / 1.2)  # 0.9 * 240 = 216 -> 180
    assert st_length.last_tenth_gain(steps, nll, 120) == pytest.approx((2.0 - 1.5) / 2.0)
    assert st_length.last_tenth_gain(steps, nll, 60) is None and st_length.last_tenth_gain(steps, nll, 300) is None


def test_power_law_projection_recovers_the_curve_and_its_flat_length() -> None:
    steps = list(range(60, 2161, 60))
    with_floor = [0.05 + 30.0 * t ** -1.2 for t in steps]
    floor, b, a = st_length.fit_power_law(steps, with_floor)
    assert floor == pytest.approx(0.05, abs=2e-4) and a == pytest.approx(1.2, rel=0.02)
    proj = st_length.projected_flat_length(steps, with_floor)
    assert proj["fit_from"] == 900  # from 0.4 of the last step on
    nll = lambda t: 0.05 + 30.0 * t ** -1.2  # noqa: E731
    gain = lambda n: (nll(0.9 * n) - nll(n)) / nll(0.9 * n)  # noqa: E731
    assert gain(proj["flat_at"]) < 0.01 <= gain(proj["flat_at"] - 60)  # the first such length, on the grid of 60
    assert proj["last_tenth_gain_at_end"] == pytest.approx(gain(2160), abs=2e-3)
    pure = [25.0 * t ** -0.7 for t in steps]  # no floor: every tenth gains 1 - 0.9^0.7 = 7.1 %
    proj = st_length.projected_flat_length(steps, pure)
    assert proj["floor"] == 0.0 and proj["flat_at"] is None and proj["a"] == pytest.approx(0.7, rel=1e-3)
    assert proj["last_tenth_gain_at_end"] == pytest.approx(1 - 0.9 ** 0.7, abs=1e-4)
    assert st_length.projected_flat_length(steps[:3], pure[:3]) is None
    # the trend: a line through the last fifth, per tenth of the run
    line = [1.0 - 1e-4 * t for t in steps]
    assert st_length.trend_gain(steps, line) == pytest.approx(1e-4 * 216 / (1.0 - 1e-4 * 1944))
    assert st_length.trend_gain(steps, [0.5] * len(steps)) == pytest.approx(0.0, abs=1e-12)
    assert st_length.trend_gain(steps[:2], line[:2]) is None
    # the check fits 0.2-0.5 of the run and predicts its end: exact on the law, off where the curve bends
    check = st_length.projection_check(steps, with_floor)
    assert (check["fit_from"], check["fit_to"], check["at"]) == (480, 1080, 2160)
    assert check["predicted"] == pytest.approx(check["measured"], abs=2e-4) == pytest.approx(nll(2160), abs=1e-4)
    bent = with_floor[:18] + [v + 0.01 * (t - 1080) / 1080 for t, v in zip(steps[18:], with_floor[18:])]
    check = st_length.projection_check(steps, bent)
    assert check["measured"] - check["predicted"] == pytest.approx(0.01, abs=5e-4)


@pytest.mark.slow
def test_curves_from_a_finished_draw(setting, tmp_path: Path) -> None:  # noqa: F811
    """Baseline and local runs from a finished draw: their dev curves, local − baseline per step with its interval
    over seeds paired by seed (checked against the per-seed NLL read back), and --extend-from / --systems."""
    params, prepared = setting
    raw = yaml.safe_load(params.read_text())
    raw["seeds"] = [1, 2]
    params.write_text(yaml.safe_dump(raw, sort_keys=False))
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        asr_draws.main(["--draws", "1", "--params", str(params), "--prepared", str(prepared), "--workdir",
                        str(tmp_path / "w"), "--out", str(tmp_path / "draws"), "--jobs", "1"], runner=in_process([]))
        source = tmp_path / "w" / "params" / "seed1"
        calls: list = []
        result = st_length.main(["--max-updates", "4", "--eval-every", "2", "--params", str(params), "--source",
                                 str(source), "--workdir", str(tmp_path / "len"), "--out", str(tmp_path / "out" / "len"),
                                 "--jobs", "1"], runner=in_process(calls))
    finally:
        torch.set_num_threads(old)
    assert sorted(c[0][0] for c in calls) == ["stages/train_baseline.py"] * 2 + ["stages/train_local.py"] * 2
    folder = tmp_path / "len" / "4"
    p = yaml.safe_load((folder / "params.yaml").read_text())
    assert p["train_st"]["max_updates"] == 4 and p["train_st"]["eval_every"] == 2
    # the local runs start from the draw's local ASR model and windows, copied
    assert (folder / "runs/asr_local/en-de/model.pt").read_bytes() == (source / "runs/asr_local/en-de/model.pt").read_bytes()
    rows = result["pairs"]["en-de"]["curve"]
    assert [r["step"] for r in rows] == [2, 4]
    nll = {s: [dict(asr_draws.read_curve(folder / f"plots/train/{s}/en-de/seed{k}/dev/nll.tsv", "nll"))[4] for k in (1, 2)]
           for s in ("baseline", "local")}
    d = rows[1]["nll"]["local_minus_baseline"]
    assert d["mean"] == pytest.approx(round(sum(nll["local"]) / 2 - sum(nll["baseline"]) / 2, 4), abs=1e-4)
    assert d["n"] == 2 and d["ci95_lo"] is not None
    # the interval is that of the per-seed differences, local seed k minus baseline seed k (t with 1 df)
    diffs = [nll["local"][k] - nll["baseline"][k] for k in range(2)]
    half = t_quantile(0.975, 1) * abs(diffs[0] - diffs[1]) / 2  # stdev of two values |a - b| / sqrt(2), / sqrt(2)
    assert d["ci95_lo"] == pytest.approx(round(sum(diffs) / 2 - half, 4), abs=2e-4)
    assert d["ci95_hi"] == pytest.approx(round(sum(diffs) / 2 + half, 4), abs=2e-4)
    assert d == paired_interval(nll["local"], nll["baseline"]).as_dict(4)
    assert d != paired_interval(nll["local"], nll["baseline"][::-1]).as_dict(4)  # seeds mispaired: another interval
    assert rows[1]["baseline_nll_last_tenth_gain"] is not None and rows[0]["baseline_nll_last_tenth_gain"] is None
    saved = json.loads((tmp_path / "out" / "len.json").read_text())
    assert saved["pairs"] == json.loads(json.dumps(result["pairs"]))
    md = (tmp_path / "out" / "len.md").read_text()
    assert "| 4 |" in md and "![local − baseline against ST updates](len.png)" in md
    assert (tmp_path / "out" / "len.png").stat().st_size > 1000

    # --extend-from 4: the 4-update runs continued to 8 end bit-identical to 8-update runs from scratch
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        common = ["--eval-every", "2", "--params", str(params), "--source", str(source), "--jobs", "1"]
        extended = st_length.main(["--max-updates", "8", "--extend-from", "4", "--workdir", str(tmp_path / "len"),
                                   "--out", str(tmp_path / "out" / "ext"), *common], runner=in_process([]))
        fresh = st_length.main(["--max-updates", "8", "--workdir", str(tmp_path / "fresh"),
                                "--out", str(tmp_path / "out" / "fresh"), *common], runner=in_process([]))
    finally:
        torch.set_num_threads(old)
    for system in ("baseline", "local"):
        for k in (1, 2):
            a = torch.load(tmp_path / f"len/8/runs/{system}/en-de/seed{k}/model.pt", weights_only=True)["model"]
            b = torch.load(tmp_path / f"fresh/8/runs/{system}/en-de/seed{k}/model.pt", weights_only=True)["model"]
            assert all(torch.equal(a[n], b[n]) for n in a), (system, k)
    assert extended["pairs"] == fresh["pairs"]
    assert "--extend-from 4" in (tmp_path / "out" / "ext.md").read_text()
    assert f"--out {tmp_path / 'out' / 'ext'}`" in (tmp_path / "out" / "ext.md").read_text()  # the command as run
    # --systems baseline: only the baselines train (here extended from 8 to 10); the tables lose local's columns
    calls = []
    torch.set_num_threads(1)
    try:
        alone = st_length.main(["--max-updates", "10", "--extend-from", "8", "--systems", "baseline", "--workdir",
                                str(tmp_path / "len"), "--out", str(tmp_path / "out" / "alone"), *common],
                               runner=in_process(calls))
    finally:
        torch.set_num_threads(old)
    assert sorted(c[0][0] for c in calls) == ["stages/train_baseline.py"] * 2
    row = alone["pairs"]["en-de"]["curve"][-1]
    assert row["step"] == 10 and set(row["nll"]) == {"baseline"} and set(alone["pairs"]["en-de"]["test_bleu"]) == {"baseline"}
    assert alone["pairs"]["en-de"]["curve"][1] == {k: {"baseline": v["baseline"]} if k in ("nll", "bleu") else v
                                                   for k, v in extended["pairs"]["en-de"]["curve"][1].items()}
    md = (tmp_path / "out" / "alone.md").read_text()
    assert "--systems baseline" in md and "local − baseline dev NLL" not in md and "| 10 |" in md
    with pytest.raises(SystemExit, match="the baseline is always needed"):
        st_length.main(["--max-updates", "12", "--systems", "local", "--workdir", str(tmp_path / "len"), *common],
                       runner=in_process([]))
    with pytest.raises(SystemExit, match="--extend-from 8: need an earlier, shorter call"):
        st_length.main(["--max-updates", "8", "--extend-from", "8", "--workdir", str(tmp_path / "len"), *common],
                       runner=in_process([]))
    with pytest.raises(SystemExit, match="en-fr: not in"):
        st_length.main(["--max-updates", "4", "--eval-every", "2", "--params", str(params), "--pairs", "en-fr",
                        "--workdir", str(tmp_path / "len3")], runner=in_process([]))
    with pytest.raises(SystemExit, match="at least 2 seeds"):
        st_length.main(["--max-updates", "4", "--eval-every", "2", "--params", str(params), "--seeds", "1",
                        "--workdir", str(tmp_path / "len3")], runner=in_process([]))
    with pytest.raises(SystemExit, match="missing"):
        st_length.main(["--max-updates", "4", "--eval-every", "2", "--params", str(params), "--source",
                        str(tmp_path / "nothing"), "--workdir", str(tmp_path / "len2")], runner=in_process([]))


def test_extend_stamps_the_copied_snapshots_and_leaves_set_aside_states_behind(tmp_path: Path) -> None:
    """--extend-from copies a finished run's state into the longer run's folder: its snapshots are the
    longer run's weights at those updates, so they carry the longer run's fingerprint (its average refuses
    snapshots of another config); a state set aside by a change of params is not the run's and stays."""
    from lib.layout import RunPaths
    from lib.train import checkpoint as ckpt

    src = RunPaths(tmp_path / "short", "baseline", "en-de", 1)
    config = {"train": {"max_updates": 4, "eval_every": 2}, "task": "st"}
    ckpt.save(src.checkpoints / "last.pt", {"fingerprint": ckpt.fingerprint(config), "config": config})
    for u in (2, 4):
        ckpt.save(ckpt.snapshot_path(src.checkpoints / "snapshots", u),
                  {"model": {"w": torch.full((2,), float(u))}, "update": u, "fingerprint": ckpt.fingerprint(config)})
    (src.checkpoints / "stale-0123abcd").mkdir()
    src.model.parent.mkdir(parents=True, exist_ok=True)
    src.model.write_bytes(b"model")
    assert st_length.extend(tmp_path / "short", tmp_path / "long", "baseline", "en-de", 1, 8, 2)
    dst = RunPaths(tmp_path / "long", "baseline", "en-de", 1)
    fp = ckpt.load(dst.checkpoints / "last.pt")["fingerprint"]
    assert fp != ckpt.fingerprint(config)
    snaps = sorted((dst.checkpoints / "snapshots").glob("update_*.pt"))
    assert [p.name for p in snaps] == ["update_0000002.pt", "update_0000004.pt"]
    assert all(ckpt.load(p)["fingerprint"] == fp for p in snaps)
    assert torch.equal(ckpt.average_state_dicts(snaps, fp)["w"], torch.full((2,), 3.0))
    assert not list(dst.checkpoints.glob("stale-*"))


def test_a_call_stopped_on_missing_inputs_leaves_no_scratch_folder(tmp_path: Path) -> None:
    """A call that stops because the source lacks the ASR models makes no draw folder: a folder left behind
    (params.yaml and its marker) would refuse the next call's other --eval-every as 'made with other params'."""
    work = tmp_path / "len"
    with pytest.raises(SystemExit, match="missing"):
        st_length.main(["--max-updates", "4", "--eval-every", "2", "--source", str(tmp_path / "nothing"),
                        "--workdir", str(work)], runner=in_process([]))
    with pytest.raises(SystemExit, match="need an earlier, shorter call"):
        st_length.main(["--max-updates", "4", "--eval-every", "2", "--extend-from", "2", "--workdir", str(work)],
                       runner=in_process([]))
    assert not (work / "4").exists()

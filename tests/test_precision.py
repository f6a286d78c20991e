"""Mixed-precision resolution (lib/precision.py)."""
from __future__ import annotations

import json

import pytest
import torch

from lib import precision
from lib.train import precision as train_precision


def test_auto_resolves_by_cpu_capability(monkeypatch):
    cpu = torch.device("cpu")
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)
    assert precision.resolve_amp("auto", cpu) == "bf16" and precision.resolve_amp("probe", cpu) == "bf16"  # decoding
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: False)
    assert precision.resolve_amp("auto", cpu) == "none" and precision.resolve_amp("probe", cpu) == "none"
    assert precision.resolve_amp("bf16", cpu) == "bf16" and precision.resolve_amp("none", cpu) == "none"


def test_auto_on_cuda_takes_bf16_only_where_the_card_computes_it_natively(monkeypatch):
    """A V100 / T4 / RTX 2080 Ti (compute capability 7.x) emulates bf16, slower than fp32, although
    torch.cuda.is_bf16_supported() says yes there: auto trains those in fp32."""
    cuda = torch.device("cuda", 1)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: including_emulation)
    monkeypatch.setattr(torch.version, "hip", None)
    asked = []
    for capability, expected in (((7, 0), "none"), ((7, 5), "none"), ((8, 0), "bf16"), ((9, 0), "bf16")):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None, c=capability: asked.append(d) or c)
        assert precision.resolve_amp("auto", cuda) == expected, capability
        assert precision.resolve_amp("none", cuda) == "none" and precision.resolve_amp("bf16", cuda) == "bf16"
    assert set(asked) == {cuda}  # the run's own card, not the current device


def test_bad_values_are_refused():
    with pytest.raises(ValueError, match="amp must be one of"):
        precision.resolve_amp("fp8", torch.device("cpu"))
    with pytest.raises(ValueError, match="fp16 needs a CUDA device"):
        precision.resolve_amp("fp16", torch.device("cpu"))


def test_autocast_context_matches_the_precision():
    x = torch.randn(4, 4)
    with precision.autocast(torch.device("cpu"), "bf16"):
        assert (x @ x).dtype == torch.bfloat16
    with precision.autocast(torch.device("cpu"), "none"):
        assert (x @ x).dtype == torch.float32
    with precision.autocast(torch.device("cpu"), "fp64"):  # no autocast: the fp64 model computes in fp64
        assert (x.double() @ x.double()).dtype == torch.float64 and (x @ x).dtype == torch.float32


def test_fp64_is_taken_as_given_and_never_measured(monkeypatch, tmp_path):
    monkeypatch.setenv("LOCALITY_ST_CACHE", str(tmp_path))
    calls = _fake_probe(monkeypatch, fp32=0.2, bf16=0.1)
    for device in ("cpu", "cuda"):
        assert precision.resolve_amp("fp64", torch.device(device)) == "fp64"
    assert train_precision.resolve_train_amp("fp64", torch.device("cpu"), {}, 100, probe_batches=_three) == "fp64"
    assert precision.resolve_padding("auto", "auto", "fp64", torch.device("cpu")) == (1, 1)
    assert calls == []


# --- amp: auto for training: measured once per machine, model and data, then cached -------------

def _three() -> list[int]:
    # stands for enough training batches to measure (the fake probe never looks at them)
    return list(range(train_precision.PROBE_MIN_BATCHES))


def _fake_probe(monkeypatch, fp32: float, bf16: float) -> list[int]:
    calls: list[int] = []

    def probe(model_config, batches, ctc_weight=0.0, bf16_batches=None):
        calls.append(1)
        return {"none": fp32, "bf16": bf16, "speedup": fp32 / bf16}

    monkeypatch.setattr(train_precision, "probe_step_times", probe)
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)
    return calls


def test_train_amp_auto_keeps_bf16_only_when_clearly_faster(monkeypatch, tmp_path):
    monkeypatch.setenv("LOCALITY_ST_CACHE", str(tmp_path))
    cpu = torch.device("cpu")
    cfg = {"d_model": 8}
    _fake_probe(monkeypatch, fp32=0.200, bf16=0.150)
    assert train_precision.resolve_train_amp("probe", cpu, cfg, 100, probe_batches=_three, data_id="a") == "bf16"
    _fake_probe(monkeypatch, fp32=0.200, bf16=0.190)  # 1.05x: within noise, not worth bf16's rounding
    assert train_precision.resolve_train_amp("probe", cpu, cfg, 200, probe_batches=_three, data_id="a") == "none"
    _fake_probe(monkeypatch, fp32=0.150, bf16=0.170)  # slower, as on a 2-core Xeon with AMX
    assert train_precision.resolve_train_amp("probe", cpu, cfg, 300, probe_batches=_three, data_id="a") == "none"


def test_train_amp_auto_on_a_toy_training_set_keeps_the_cpu_flag_answer_uncached(monkeypatch, tmp_path):
    monkeypatch.setenv("LOCALITY_ST_CACHE", str(tmp_path))
    calls = _fake_probe(monkeypatch, fp32=0.100, bf16=0.200)
    few = list(range(train_precision.PROBE_MIN_BATCHES - 1))
    assert train_precision.resolve_train_amp("probe", torch.device("cpu"), {"d_model": 8}, 100,
                                       probe_batches=lambda: few, data_id="a") == "bf16"
    assert calls == [] and not list((tmp_path / "precision").glob("train-*.json"))


def test_train_amp_auto_is_cached_per_model_data_and_batch(monkeypatch, tmp_path):
    monkeypatch.setenv("LOCALITY_ST_CACHE", str(tmp_path))
    cpu = torch.device("cpu")
    calls = _fake_probe(monkeypatch, fp32=0.200, bf16=0.100)
    args = dict(probe_batches=_three, data_id="a")
    assert train_precision.resolve_train_amp("probe", cpu, {"d_model": 8}, 100, **args) == "bf16"
    assert len(calls) == 1
    # a later run (another process: the cache is on disk) gets the same answer without measuring,
    # even if the machine would now measure otherwise
    calls = _fake_probe(monkeypatch, fp32=0.100, bf16=0.200)
    assert train_precision.resolve_train_amp("probe", cpu, {"d_model": 8}, 100, **args) == "bf16"
    assert calls == []
    assert len(list((tmp_path / "precision").glob("train-*.json"))) == 1
    # another model, batch size or data is measured on its own
    assert train_precision.resolve_train_amp("probe", cpu, {"d_model": 16}, 100, **args) == "none"
    assert train_precision.resolve_train_amp("probe", cpu, {"d_model": 8}, 200, **args) == "none"
    assert train_precision.resolve_train_amp("probe", cpu, {"d_model": 8}, 100, probe_batches=_three, data_id="b") == "none"
    assert len(calls) == 3
    # a corrupt cache file is measured again, not trusted
    for f in (tmp_path / "precision").glob("train-*.json"):
        f.write_text("{not json")
    assert train_precision.resolve_train_amp("probe", cpu, {"d_model": 8}, 100, **args) == "none"
    assert len(calls) == 4


def test_every_attention_variant_of_a_model_gets_its_baselines_precision(monkeypatch, tmp_path):
    """The probe keys on (and times) the baseline model: a local / smoothed / head-selection run of the
    same size, data and batch reads the baseline's cached answer, even where its own model would time
    otherwise; a full-attention model's config is left as it is (the caches of baselines hold)."""
    from lib.model.config import model_config

    monkeypatch.setenv("LOCALITY_ST_CACHE", str(tmp_path))
    cpu = torch.device("cpu")
    full = model_config("demo", vocab_size=20).to_dict()
    assert train_precision.baseline_model_config(full) == full
    local = model_config("demo", vocab_size=20, encoder_attention=[{"type": "full"}] * 3 + [
        {"type": "local", "window": w} for w in (1, 3, 5, 7, 9, 1, 3, 5, 7)]).to_dict()
    smooth = model_config("demo", vocab_size=20, cross_attention={"type": "smooth", "prior": "uniform"}).to_dict()
    assert train_precision.baseline_model_config(local) == full and train_precision.baseline_model_config(smooth) == full
    timed: list[dict] = []

    def probe(model_config, batches, ctc_weight=0.0, bf16_batches=None):
        timed.append(model_config)
        return {"none": 0.2, "bf16": 0.1, "speedup": 2.0}

    monkeypatch.setattr(train_precision, "probe_step_times", probe)
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)
    args = dict(probe_batches=_three, data_id="a")
    assert train_precision.resolve_train_amp("probe", cpu, full, 100, **args) == "bf16"
    _fake_probe(monkeypatch, fp32=0.100, bf16=0.200)  # the local model alone would pick fp32
    assert train_precision.resolve_train_amp("probe", cpu, local, 100, **args) == "bf16"
    assert train_precision.resolve_train_amp("probe", cpu, smooth, 100, **args) == "bf16"
    assert timed == [full]  # one probe, of the baseline model
    assert len(list((tmp_path / "precision").glob("train-*.json"))) == 1


def test_train_amp_explicit_or_without_native_bf16_is_never_measured(monkeypatch, tmp_path):
    monkeypatch.setenv("LOCALITY_ST_CACHE", str(tmp_path))
    cpu = torch.device("cpu")
    calls = _fake_probe(monkeypatch, fp32=0.2, bf16=0.1)
    assert train_precision.resolve_train_amp("none", cpu, {}, 100, probe_batches=_three) == "none"
    assert train_precision.resolve_train_amp("bf16", cpu, {}, 100, probe_batches=_three) == "bf16"
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: False)
    assert train_precision.resolve_train_amp("probe", cpu, {}, 100, probe_batches=_three) == "none"
    assert calls == [] and not (tmp_path / "precision").exists()



def test_train_amp_auto_with_too_few_batches_keeps_the_flag_answer_uncached(monkeypatch, tmp_path):
    monkeypatch.setenv("LOCALITY_ST_CACHE", str(tmp_path))
    calls = _fake_probe(monkeypatch, fp32=0.1, bf16=0.2)
    assert train_precision.resolve_train_amp("probe", torch.device("cpu"), {}, 100, probe_batches=lambda: [0, 1]) == "bf16"
    assert calls == [] and not list(tmp_path.glob("precision/*.json"))


def test_train_amp_auto_measures_a_near_threshold_probe_again_and_takes_the_median(monkeypatch, tmp_path):
    """One probe's median near BF16_MIN_SPEEDUP is not trusted: PROBE_REPEATS probes, their median decides."""
    monkeypatch.setenv("LOCALITY_ST_CACHE", str(tmp_path))
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: True)
    cpu = torch.device("cpu")

    def probes(speedups):
        it = iter(speedups)
        calls: list[float] = []

        def probe(model_config, batches, ctc_weight=0.0, bf16_batches=None):
            s = next(it)
            calls.append(s)
            return {"none": 0.2, "bf16": 0.2 / s, "speedup": s}
        monkeypatch.setattr(train_precision, "probe_step_times", probe)
        return calls

    # a mismeasured first probe (1.06x) outvoted by two clear ones
    calls = probes([1.06, 1.40, 1.45])
    assert train_precision.resolve_train_amp("probe", cpu, {"d_model": 8}, 100, probe_batches=_three, data_id="a") == "bf16"
    assert calls == [1.06, 1.40, 1.45]
    record = json.loads(next((tmp_path / "precision").glob("train-*.json")).read_text())
    assert record["probe_speedups"] == [1.06, 1.40, 1.45] and record["median_speedup"] == 1.40
    # and a lucky one (1.25x) outvoted by two slow ones
    calls = probes([1.25, 1.05, 1.10])
    assert train_precision.resolve_train_amp("probe", cpu, {"d_model": 8}, 200, probe_batches=_three, data_id="a") == "none"
    assert len(calls) == 3
    # a clear first probe, either way, is measured once
    for s, want in ((1.40, "bf16"), (0.90, "none")):
        calls = probes([s])
        assert train_precision.resolve_train_amp("probe", cpu, {"d_model": 8}, int(s * 1000), probe_batches=_three,
                                           data_id="a") == want
        assert calls == [s]


def test_cpu_identity_tells_cpu_generations_with_one_model_name_apart(tmp_path):
    """Two hosts that both call themselves "AMD EPYC" get different probe cache keys."""
    zen = tmp_path / "cpuinfo"
    block = "processor\t: {p}\nvendor_id\t: AuthenticAMD\ncpu family\t: {fam}\nmodel\t\t: {mod}\n" \
            "model name\t: AMD EPYC\nstepping\t: 1\nflags\t\t: fpu avx512_bf16\n\n"
    zen.write_text(block.format(p=0, fam=26, mod=2) + block.format(p=1, fam=25, mod=17))
    assert train_precision.cpu_identity(zen) == "AMD EPYC (family 26, model 2, stepping 1)"  # the first block only
    zen.write_text(block.format(p=0, fam=25, mod=17))
    assert train_precision.cpu_identity(zen) == "AMD EPYC (family 25, model 17, stepping 1)"
    bare = tmp_path / "bare"
    bare.write_text("model name\t: Some CPU\n")
    assert train_precision.cpu_identity(bare) == "Some CPU"
    assert train_precision.cpu_identity(tmp_path / "missing")  # no /proc/cpuinfo: the platform's name, never empty


def test_train_amp_auto_cache_key_holds_the_cpu_identity(monkeypatch, tmp_path):
    monkeypatch.setenv("LOCALITY_ST_CACHE", str(tmp_path))
    cpu = torch.device("cpu")
    calls = _fake_probe(monkeypatch, fp32=0.200, bf16=0.100)
    monkeypatch.setattr(train_precision, "cpu_identity", lambda: "AMD EPYC (family 25, model 17, stepping 1)")
    assert train_precision.resolve_train_amp("probe", cpu, {"d_model": 8}, 100, probe_batches=_three, data_id="a") == "bf16"
    # the same model name on another CPU generation measures again, into its own cache file
    calls = _fake_probe(monkeypatch, fp32=0.100, bf16=0.200)
    monkeypatch.setattr(train_precision, "cpu_identity", lambda: "AMD EPYC (family 26, model 2, stepping 1)")
    assert train_precision.resolve_train_amp("probe", cpu, {"d_model": 8}, 100, probe_batches=_three, data_id="a") == "none"
    assert len(calls) == 1
    files = sorted((tmp_path / "precision").glob("train-*.json"))
    assert len(files) == 2
    assert {json.loads(f.read_text())["ident"]["cpu"] for f in files} == {
        "AMD EPYC (family 25, model 17, stepping 1)", "AMD EPYC (family 26, model 2, stepping 1)"}


@pytest.mark.parametrize(("bf16", "amx", "choice"), [(True, False, "bf16"), (True, True, "none"), (False, False, "none")])
def test_train_amp_auto_follows_the_cpu_kind_and_never_measures(monkeypatch, tmp_path, bf16, amx, choice):
    """`auto` trains in bf16 on AVX-512 BF16 without AMX (the AMD EPYC), in fp32 on AMX (the Intel Xeon, where
    whole runs train slower in bf16) and without native bf16: the same answer on every run of a CPU kind."""
    monkeypatch.setenv("LOCALITY_ST_CACHE", str(tmp_path))
    monkeypatch.setattr(precision, "cpu_has_bf16", lambda: bf16)
    monkeypatch.setattr(precision, "cpu_has_amx", lambda: amx)

    def probe(*a, **k):  # noqa: ANN002, ANN003, ANN202
        raise AssertionError("auto must not time anything")
    monkeypatch.setattr(train_precision, "probe_step_times", probe)
    assert train_precision.resolve_train_amp("auto", torch.device("cpu"), {"d_model": 8}, 100, probe_batches=_three) == choice
    assert not (tmp_path / "precision").exists()

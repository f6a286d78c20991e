"""params.yaml loading: the repo's file is valid; bad values stop with the key's name."""
from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
import yaml

from lib.params import ParamError, load_params
import lib.params.multi  # noqa: F401 (the variants' sections are checked too)
import lib.params.smoothing  # noqa: F401

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
    # an output path must stay inside the repository (DVC tracks outs there; '/tmp/x' would be written
    # outside it, '..' would escape it)
    (lambda p: p["data"].__setitem__("prepared_dir", "/tmp/x"),
     "data.prepared_dir: must be a relative path inside the repository, got '/tmp/x'"),
    (lambda p: p["data"].__setitem__("prepared_dir", "../prepared"), "data.prepared_dir: .*'../prepared'"),
    (lambda p: p["data"].__setitem__("prepared_dir", "data/../../x"), "data.prepared_dir: .*'data/../../x'"),
    (lambda p: p["data"].__setitem__("prepared_dir", ""), "data.prepared_dir"),
    (lambda p: p["data"].__setitem__("prepared_dir", "."), "data.prepared_dir"),
    (lambda p: p["local"].__setitem__("asr_pretraining", "full"), "local.asr_pretraining"),
    (lambda p: (p["local"].__setitem__("asr_pretraining", "fork"), p["asr"].__setitem__("fork_updates", 0)),
     "local.asr_pretraining: fork needs asr.fork_updates"),
    (lambda p: p["asr"].__setitem__("fork_updates", -1), "asr.fork_updates"),
    (lambda p: p["asr"].__setitem__("fork_updates", p["train_asr"]["max_updates"]),
     "asr.fork_updates: .* must be less than train_asr.max_updates"),
    (lambda p: p["local"].__setitem__("windows", [4]), "local.windows"),
    (lambda p: p["corpus"].__setitem__("reverb_rt60", [0, 0.5]), "corpus.reverb_rt60: expected [lo, hi]"),
    (lambda p: p["corpus"].__setitem__("reverb_rt60", [0.8, 0.3]), r"corpus.reverb_rt60"),
    (lambda p: p["corpus"].__setitem__("reverb_rt60", [0.5]), r"corpus.reverb_rt60"),
    (lambda p: p["train_st"].__setitem__("lr_scheduler", "cosine"), "train_st.lr_scheduler must be one of"),
    (lambda p: p["local"].__setitem__("fork", "pooled"), "local.fork: expected one of"),
    (lambda p: (p["local"].update(fork="shared", asr_pretraining="fork"), p["asr"].update(mode="per_pair", fork_updates=400)),
     "local.fork: shared needs asr.mode: shared"),
    # top-level typos stop like typos inside a section (there is no bag of unknown sections)
    (lambda p: p.__setitem__("analysys", p.pop("analysis")), "analysys"),
    (lambda p: p.__setitem__("health_check", {}), "health_check"),
    (lambda p: p.pop("health"), "health: missing"),
    (lambda p: p["analysis"].__setitem__("st_sed", 1), "analysis.st_sed"),
    (lambda p: p["health"].__setitem__("band_windows", [2]), r"health.band_windows"),
    (lambda p: p.__setitem__("efficiency", {"op_windows": [4]}), "efficiency.op_windows"),
    (lambda p: p["model"]["overrides"].__setitem__("encoder_layers", "four"),
     r"model.overrides.encoder_layers: expected an integer"),
    (lambda p: p["model"]["overrides"].__setitem__("scale_embedding", "zzz"), r"model.overrides.scale_embedding: expected bool"),
    (lambda p: p["model"]["overrides"].__setitem__("d_model", -16), r"model.overrides.d_model: must be >= 1"),
    (lambda p: p["model"]["overrides"].__setitem__("dropout", 7), "model.overrides.dropout: must be in [0, 1"),
    (lambda p: p["model"]["overrides"].__setitem__("dropout", "1e-1"), "model.overrides.dropout: '1e-1' is a string to YAML"),
    (lambda p: p["model"]["overrides"].__setitem__("n_heads", 3), r"model.overrides: d_model=\d+ not divisible by n_heads=3"),
    (lambda p: p["train_st"].__setitem__("lr", "nan"), r"train_st.lr: expected a finite number, got 'nan'"),
    (lambda p: p["train_st"].__setitem__("clip_norm", float("inf")), r"train_st.clip_norm: expected a finite number"),
    (lambda p: p["train_st"].__setitem__("warmup_init_lr", -1), "train_st.warmup_init_lr must be in [0, lr"),
    (lambda p: p["train_asr"].__setitem__("weight_decay", -1), r"train_asr.weight_decay must be >= 0"),
    (lambda p: p["train_st"].__setitem__("max_target_tokens", -1), r"train_st.max_target_tokens must be >= 1"),
    (lambda p: p["decode"].__setitem__("max_len_a", -1), r"decode.max_len_a: must be >= 0"),
    (lambda p: p["data"].__setitem__("mustc_root", "~/MUSTC_v1.0"), "data.mustc_root: '~/MUSTC_v1.0': give the path without '~'"),
    (lambda p: p.__setitem__("pairs", []), "pairs: empty"),
    (lambda p: p.__setitem__("seeds", []), "seeds: empty"),
    (lambda p: p.__setitem__("seeds", [1, 2, 2]), "seeds: duplicates"),
    # the analysed baseline must be one of the trained seeds (`dvc exp run -S 'seeds=[2]'` removes seed 1's model)
    (lambda p: p.__setitem__("seeds", [2, 3]), "analysis.st_seed: 1 is not in seeds [2, 3]"),
    (lambda p: p["analysis"].__setitem__("st_seed", 7), "analysis.st_seed: 7 is not in seeds [1, 2, 3, 4, 5]"),
    (lambda p: p.__setitem__("pairs", ["en-de", "en-de"]), "pairs: duplicates"),
    # attention smoothing (docs/variants.md): every bad definition stops before training
    (lambda p: p["smoothing"].__setitem__("systems", ["recursive"]), "smoothing.systems[0]: unknown system 'recursive'"),
    (lambda p: p["smoothing"].__setitem__("asr_systems", ["rec"]), "smoothing.asr_systems[0]: 'rec' is not in"),
    (lambda p: p["smoothing"].update(pairs=["en-fr"], systems=["rec"]), "smoothing.pairs[0]: 'en-fr' is not in pairs"),
    (lambda p: p["smoothing"].update(seeds=[9], systems=["rec"]), "smoothing.seeds[0]: 9 is not in seeds"),
    (lambda p: p["smoothing"]["defs"]["rec"].__setitem__("layers", [1, 2]), r"smoothing.defs.rec.layers"),
    (lambda p: p["smoothing"]["defs"]["band"].__setitem__("k", 4), r"smoothing.defs.band.k"),
    (lambda p: p["smoothing"]["defs"]["rec"].__setitem__("gamma", 1.5), r"smoothing.defs.rec.gamma"),
    (lambda p: p["smoothing"]["defs"]["rec"].__setitem__("prior", "gauss"), r"smoothing.defs.rec.prior"),
    (lambda p: p["smoothing"]["defs"]["rec"].__setitem__("where", ["decoder"]), r"smoothing.defs.rec.where"),
    (lambda p: p["smoothing"]["defs"]["rec"].__setitem__("gama", 0.1), r"smoothing.defs.rec: unknown key"),
    (lambda p: p["smoothing"]["defs"].__setitem__("Rec-2", {"prior": "uniform"}), r"smoothing.defs.Rec-2"),
    (lambda p: p["smoothing"]["defs"]["rec_all"].__setitem__("layers", [2, 9]), r"smoothing.defs.rec_all"),
    (lambda p: p["smoothing"].__setitem__("system", []), r"smoothing.system"),
])
def test_bad_values_name_the_key(tmp_path: Path, mutate, key: str) -> None:
    with pytest.raises(ParamError, match=key.replace("[", r"\[").replace("]", r"\]")):
        load_params(_write(tmp_path, mutate))


def test_mustc_root_may_be_absolute(tmp_path: Path) -> None:
    """data.mustc_root is an input: a real MuST-C copy lives outside the repository."""
    p = load_params(_write(tmp_path, lambda p: p["data"].__setitem__("mustc_root", "/data/MUSTC_v1.0")))
    assert p.data.mustc_root == "/data/MUSTC_v1.0" and p.data.prepared_dir == "data/prepared"


def test_every_section_is_typed() -> None:
    """One dataclass per section, consumed as is by the library (no untyped mapping hand-offs)."""
    import dataclasses

    from lib.params import VARIANT_SECTIONS, AnalysisParams, HealthParams, Params, TrainConfig
    from lib.params.multi import MultiParams
    from lib.params.smoothing import SmoothingParams

    p = load_params(REPO / "params.yaml")
    yaml_keys = {f.name for f in dataclasses.fields(Params) if f.metadata.get("yaml", True)}
    assert yaml_keys | set(VARIANT_SECTIONS) >= set(yaml.safe_load((REPO / "params.yaml").read_text()))
    assert isinstance(p.analysis, AnalysisParams) and isinstance(p.health, HealthParams)
    assert isinstance(p.train_st, TrainConfig)
    assert isinstance(p.smoothing, SmoothingParams) and isinstance(p.multi, MultiParams)


#: A process that imports lib.params but no variant's params module, as the baseline's stages do.
_WITHOUT_VARIANTS = """
import sys
import lib.params as P
p = P.load_params(sys.argv[1])
print("variants imported:", "lib.params.smoothing" in sys.modules or "lib.params.multi" in sys.modules)
try:
    p.smoothing
except RuntimeError as e:
    print("refused:", e)
"""


def test_without_the_variants_module_their_sections_are_kept_as_read(tmp_path: Path) -> None:
    """A baseline stage imports no variant code: load_params keeps smoothing and multi as read (a bad value
    in them does not stop it), and reading them without the variant's module says what to import. A stage
    that imports lib.params.smoothing gets the same file refused, naming the key."""
    import subprocess
    import sys

    path = _write(tmp_path, lambda p: p["smoothing"].update(systems=["nope"]))
    out = subprocess.run([sys.executable, "-c", _WITHOUT_VARIANTS, str(path)], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    assert "variants imported: False" in out
    assert "refused: params section 'smoothing' is parsed by lib/params/smoothing.py" in out
    assert "import lib.params.smoothing" in out
    with pytest.raises(ParamError, match=r"params.yaml: smoothing.systems\[0\]: unknown system 'nope'"):
        load_params(path)
    # a variant section that is not a mapping, or an unknown top-level key, stops every stage
    with pytest.raises(ParamError, match=r"multi: expected a mapping"):
        load_params(_write(tmp_path, lambda p: p.__setitem__("multi", [1])))
    with pytest.raises(ParamError, match=r"unknown key\(s\) smoothin; known: .*multi, .*smoothing"):
        load_params(_write(tmp_path, lambda p: p.__setitem__("smoothin", {})))


def test_a_variant_section_replaced_is_checked_like_a_loaded_one() -> None:
    import dataclasses

    p = load_params(REPO / "params.yaml")
    q = p.with_variant("smoothing", dataclasses.replace(p.smoothing, systems=["rec"], seeds=[1]))
    assert p.smoothing.systems == [] and q.smoothing.systems == ["rec"] and q.smoothing.seeds == [1]
    with pytest.raises(ParamError, match=r"smoothing.seeds\[0\]: 99 is not in seeds"):
        p.with_variant("smoothing", dataclasses.replace(p.smoothing, systems=["rec"], seeds=[99]))
    # a copy with other seeds checks the section again, against its own seeds
    with pytest.raises(ParamError, match=r"smoothing.seeds\[0\]: 1 is not in seeds \[7\]"):
        dataclasses.replace(q, seeds=[7]).smoothing
    # the section's own checks too, as parsing runs them (an unknown system, an inner section's value)
    with pytest.raises(ParamError, match=r"smoothing.systems\[0\]: unknown system 'nope'"):
        p.with_variant("smoothing", dataclasses.replace(p.smoothing, systems=["nope"]))
    with pytest.raises(ParamError, match=r"multi.head_selection.candidates: must be >= 1"):
        p.with_variant("multi", dataclasses.replace(
            p.multi, head_selection=dataclasses.replace(p.multi.head_selection, candidates=0)))


@pytest.mark.parametrize("name", ["smoothing", "multi"])
def test_an_empty_variant_section_is_refused_as_before(tmp_path: Path, name: str) -> None:
    """`smoothing:` with every key commented out is null: refused like any other section (DVC could not
    resolve ${smoothing.systems} in dvc.yaml either)."""
    with pytest.raises(ParamError, match=rf"{name}: expected a mapping, got NoneType None"):
        load_params(_write(tmp_path, lambda p: p.__setitem__(name, None)))


def test_numeric_strings_are_floats(tmp_path: Path) -> None:
    p = load_params(_write(tmp_path, lambda p: p["corpus"].__setitem__("noise_level", "1e-3")))
    assert p.corpus.noise_level == pytest.approx(1e-3)


def test_not_yaml(tmp_path: Path) -> None:
    path = tmp_path / "params.yaml"
    path.write_text("pairs: [en-de\n")
    with pytest.raises(ParamError, match="not valid YAML"):
        load_params(path)


def test_a_yaml_error_is_one_line_with_its_line_and_column(tmp_path: Path) -> None:
    """A stage prints a ParamError as one line: PyYAML's five-line message (with its 'in "<file>"' lines) is
    folded into one that leads with where the problem is and where its context began."""
    path = tmp_path / "params.yaml"
    path.write_text("pairs: [en-de, en-es\nseeds: [1, 2]\n")
    with pytest.raises(ParamError) as e:
        load_params(path)
    assert str(e.value) == (f"{path}: not valid YAML: line 2, column 6: expected ',' or ']', but got ':' "
                            "(while parsing a flow sequence at line 1, column 8)")
    path.write_text("pairs: [en-de]\n\tseeds: [1]\n")
    with pytest.raises(ParamError, match=r"^[^\n]*: not valid YAML: line 2, column 1: found character '\\t' that "
                                         r"cannot start any token[^\n]*$"):
        load_params(path)


def test_an_unknown_top_level_key_is_named_as_written(tmp_path: Path) -> None:
    """'unknown key(s) foo', not ': unknown key(s) .foo' (the top level has no key path to prefix)."""
    path = _write(tmp_path, lambda p: p.__setitem__("foo", 1))
    with pytest.raises(ParamError, match=rf"^{re.escape(str(path))}: unknown key\(s\) foo; known: analysis, "):
        load_params(path)


def test_paper_profile_has_the_papers_hyperparameters() -> None:
    """Appendix B-C of the paper (fairseq s2t_transformer_s MuST-C recipe)."""
    p = load_params(REPO / "profiles" / "paper.yaml")
    assert p.model.size == "s" and p.model.overrides == {}
    assert (p.prepare.asr_vocab_size, p.prepare.st_vocab_size) == (5000, 8000)
    for section, lr in ((p.train_asr, 1e-3), (p.train_st, 2e-3)):
        assert section.lr == lr
        assert section.max_frames == 40000 and section.update_freq == 8
        assert section.warmup_updates == 10000 and section.max_updates == 50000
        assert section.clip_norm == 10.0 and section.label_smoothing == 0.1
        assert section.ctc_weight == 0.0
    assert p.decode.beam == 5
    # the demo's deviations stay out of the paper profile
    assert p.asr.mode == "per_pair" and not p.train_st.init_decoder
    # one recipe for GPUs: bf16 where the card has it (fairseq's recipe trains in fp32: `amp: none`)
    assert p.train_st.amp == p.train_asr.amp == "auto"


def test_shared_asr_pair_must_be_a_configured_pair(tmp_path) -> None:
    def mutate(p):
        p["asr"] = {"mode": "shared", "shared_pair": "en-fr"}
    with pytest.raises(ParamError, match=r"asr\.shared_pair"):
        load_params(_write(tmp_path, mutate))
    def bad_mode(p):
        p["asr"]["mode"] = "joint"
    with pytest.raises(ParamError, match=r"asr\.mode"):
        load_params(_write(tmp_path, bad_mode))


def test_profile_and_params_have_the_same_keys() -> None:
    """The paper profile must not drift from params.yaml's structure."""
    def keys(d, prefix=""):
        out = set()
        for k, v in d.items():
            out.add(prefix + k)
            if isinstance(v, dict) and k not in ("splits", "overrides"):
                out |= keys(v, prefix + k + ".")
        return out
    a = yaml.safe_load((REPO / "params.yaml").read_text())
    b = yaml.safe_load((REPO / "profiles" / "paper.yaml").read_text())
    assert keys(a) == keys(b)


def test_unused_smoothing_section_does_not_constrain_pairs_and_seeds(tmp_path: Path) -> None:
    """With no smoothing system listed, `-S seeds=[1]` or `-S pairs=[en-it]` must still load."""
    p = load_params(_write(tmp_path, lambda d: d.update(seeds=[1], pairs=["en-it"], asr={"mode": "per_pair",
                                                                                          "shared_pair": "en-de",
                                                                                          "fork_updates": 800},
                                                        local={**d["local"], "fork": "per_pair"})))
    assert p.seeds == [1] and p.smoothing.seeds == [1, 2, 3, 4, 5] and p.smoothing.systems == []


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out |= _flatten(v, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = v
    return out


def test_multi_max_updates_follows_the_bilingual_length(tmp_path: Path) -> None:
    """multi.max_updates null (the default) = 3 x train_st.max_updates, recomputed when train_st changes
    (train_multi depends on the whole train_st section); a number overrides it."""
    p = load_params(REPO / "params.yaml")
    assert p.multi.max_updates is None and p.multi.head_selection.anneal_updates is None
    assert p.multi.run_updates(p.train_st.max_updates) == 3 * p.train_st.max_updates
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["train_st"]["max_updates"] = 100
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    q = load_params(path)
    assert q.multi.run_updates(q.train_st.max_updates) == 300
    raw["multi"]["max_updates"] = 77
    path.write_text(yaml.safe_dump(raw))
    assert load_params(path).multi.run_updates(100) == 77
    raw["multi"]["max_updates"] = 0
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ParamError, match=r"multi\.max_updates"):
        load_params(path)
    stage = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["train_multi"]
    assert "train_st" in stage["params"] and "multi.max_updates" in stage["params"]


@pytest.mark.parametrize("key, value, needle", [
    ("train_st.variant_lr", 0.01, r"train_st\.variant_lr"),
    ("train_st.data_workers", -1, r"train_st\.data_workers must be an integer >= 0 or 'auto'"),
    ("train_asr.data_workers", "many", r"train_asr\.data_workers must be an integer >= 0 or 'auto'"),
    ("smoothing.variant_lr", 0.0, r"smoothing\.variant_lr"),
    ("multi.head_selection.variant_lr", -1.0, r"multi\.head_selection\.variant_lr"),
    ("multi.head_selection.estimator", "straight", r"multi\.head_selection\.estimator"),
    ("multi.head_selection.noise_end", 2.0, r"multi\.head_selection\.noise_start / noise_end"),
    ("multi.head_selection.subset_init_lead", 0.0, r"multi\.head_selection\.subset_init_lead: must be > 0"),
    # the default estimator is gumbel: the KL regularises only the paper estimator's Bernoulli selection
    ("multi.head_selection.kl_weight", 0.01, r"multi\.head_selection\.kl_weight: 0\.01 needs estimator: paper"),
    ("multi.head_selection.kl_weight", "elbo", r"multi\.head_selection\.kl_weight: 'elbo' needs estimator: paper"),
])
def test_variant_lr_and_estimator_keys_are_checked(tmp_path: Path, key: str, value, needle: str) -> None:
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    node = raw
    *parents, last = key.split(".")
    for k in parents:
        node = node[k]
    node[last] = value
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ParamError, match=needle):
        load_params(path)


def test_the_kl_with_the_paper_estimator_loads(tmp_path: Path) -> None:
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["multi"]["head_selection"].update(estimator="paper", kl_weight="elbo")
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw))
    assert load_params(tmp_path / "params.yaml").multi.head_selection.kl_weight == "elbo"


def test_smoothing_stages_rerun_when_variant_lr_changes() -> None:
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    for name in ("train_smoothing", "train_asr_smoothing"):
        assert "smoothing.variant_lr" in stages[name]["params"]


@pytest.mark.parametrize("system, change, needle", [
    ("group", {"candidates": 6}, "multi.head_selection.candidates: the group strategy needs H' = 6 to be a multiple"),
    ("subset", {"candidates": 3}, "multi.head_selection.candidates"),
    ("subset", {"tau_start": 1.0, "tau_end": 2.0}, "multi.head_selection.tau_end: the schedule anneals downwards"),
])
def test_head_selection_that_train_multi_would_refuse_stops_at_load(tmp_path: Path, system: str, change: dict,
                                                                     needle: str) -> None:
    """The definition is checked against the model's H and the pairs when params.yaml loads, by the check
    that builds the layers; a system list without head selection leaves it unchecked."""
    def mutate(p: dict) -> None:
        p["multi"]["systems"] = [system]
        p["multi"]["head_selection"].update(change)

    with pytest.raises(ParamError, match=needle.replace("'", ".")):
        load_params(_write(tmp_path, mutate))

    def unused(p: dict) -> None:
        p["multi"]["systems"] = ["baseline"]
        p["multi"]["head_selection"].update(change)

    load_params(_write(tmp_path, unused))


def test_a_pair_without_a_demo_corpus_stops_at_load(tmp_path: Path) -> None:
    """On the demo corpus a pair the grammar cannot write stops at load time, naming the key, not at
    that pair's corpus stage after the others ran; on a MuST-C copy any en-xx pair loads."""
    with pytest.raises(ParamError, match=r"pairs\[1\]: 'en-fr' has no demo corpus.*data\.mustc_root"):
        load_params(_write(tmp_path, lambda p: p.__setitem__("pairs", ["en-de", "en-fr"])))

    def on_a_copy(p):
        p["pairs"] = ["en-de", "en-fr"]
        p["data"]["mustc_root"] = "/data/MUSTC_v1.0"
    assert load_params(_write(tmp_path, on_a_copy)).pairs == ["en-de", "en-fr"]


def test_the_splits_params_require_are_the_ones_the_runs_read() -> None:
    from lib.layout import TEST_SPLIT
    from lib.params import PrepareParams
    from lib.train.run import RunSpec

    fields = {f.name: f.default for f in dataclasses.fields(RunSpec)}
    assert PrepareParams.pipeline_splits == (fields["dev_split"], fields["test_split"]) == ("dev", TEST_SPLIT)


def test_an_extra_split_such_as_tst_he_loads_and_may_be_analysed(tmp_path: Path) -> None:
    def mutate(p: dict) -> None:
        p["prepare"]["splits"] = ["train", "dev", "tst-COMMON", "tst-HE"]
        p["analysis"]["split"] = "tst-HE"
    assert load_params(_write(tmp_path, mutate)).analysis.split == "tst-HE"


def test_demo_pairs_are_the_grammars_and_the_corpus_stages_root() -> None:
    from lib.corpus.grammar import LANGUAGES
    from lib.params.base import DEMO_MUSTC_ROOT, DEMO_PAIRS

    assert DEMO_PAIRS == tuple(f"en-{lang}" for lang in LANGUAGES)
    corpus = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]["corpus"]
    assert corpus["cmd"].split()[-1] == DEMO_MUSTC_ROOT
    assert corpus["outs"] == [f"{DEMO_MUSTC_ROOT}/${{item.pair}}"]
    assert load_params(REPO / "params.yaml").data.mustc_root == DEMO_MUSTC_ROOT


@pytest.mark.parametrize("mutate, key", [
    # each value just past the edge of the range its message states (the values above are far from it)
    (lambda p: p["train_st"].update(update_freq=3, processes=2),
     "train_st.update_freq (3) is the whole update's batches, split among train_st.processes (2): it must divide"),
    (lambda p: p["train_st"].__setitem__("label_smoothing", 1.0),
     "train_st: lr and clip_norm must be > 0, label_smoothing in [0, 1)"),
    (lambda p: p["train_asr"].__setitem__("adam_betas", [0.9, 1.0]),
     "train_asr.adam_betas must be two numbers in [0, 1)"),
    (lambda p: p["train_asr"].__setitem__("ctc_decay_from", p["train_asr"]["max_updates"]),
     "train_asr.ctc_decay_from must be 0 (off) or, with ctc_weight > 0, in (0, max_updates = "),
    (lambda p: p["train_st"].__setitem__("warmup_init_lr", 2 * p["train_st"]["lr"]),
     "train_st.warmup_init_lr must be in [0, lr = "),
    (lambda p: p["train_st"].__setitem__("max_frames_train", 0), "train_st.max_frames_train must be >= 1, got 0"),
    (lambda p: p["train_st"].__setitem__("pad_frames_to", "none"),
     "train_st.pad_frames_to must be an integer >= 1 or 'auto'"),
    (lambda p: p["train_st"].__setitem__("lr", True), "train_st.lr: expected a number, got True"),
    (lambda p: p["corpus"].__setitem__("noise_level", 0.1), "corpus.noise_level: expected 0 <= value < 0.1, got 0.1"),
    (lambda p: p["prepare"].__setitem__("splits", ["train", "dev", "dev"]), "prepare.splits: duplicates"),
    (lambda p: p["prepare"].__setitem__("splits", ["train", "dev", "test"]), "prepare.splits: must include 'tst-COMMON'"),
    (lambda p: p["prepare"].__setitem__("splits", ["train", "tst-COMMON"]), "prepare.splits: must include 'dev'"),
    (lambda p: p["analysis"].__setitem__("split", "tst-HE"), "analysis.split: 'tst-HE' is not in prepare.splits"),
    (lambda p: p["analysis"].__setitem__("window_split", "test"), "analysis.window_split: 'test' is not in prepare.splits"),
    (lambda p: p["health"].__setitem__("band_split", "valid"), "health.band_split: 'valid' is not in prepare.splits"),
    (lambda p: p["analysis"].__setitem__("figure_sample", p["analysis"]["samples"]),
     "analysis.figure_sample: must be < samples"),
    (lambda p: p["analysis"].__setitem__("threshold", 0.0), "analysis.threshold: expected 0 < t < 1"),
    (lambda p: p["analysis"].__setitem__("ddof", 2), "analysis.ddof: expected 0 (population std) or 1 (sample std)"),
    (lambda p: p["parallel"].__setitem__("jobs", 0), "parallel.jobs: expected an integer >= 1 or 'auto', got 0"),
    (lambda p: p["model"]["overrides"].__setitem__("dropout", 1.0),
     "model.overrides.dropout: must be in [0, 1), got 1.0"),
    (lambda p: p["health"].__setitem__("head_threshold", 0.0), "health.head_threshold: must be > 0, got 0.0"),
    (lambda p: p["data"].__setitem__("prepared_dir", "~/prepared"),
     "data.prepared_dir: must be a relative path inside the repository, got '~/prepared'"),
    (lambda p: p.__setitem__("pairs", ["en-de"]) or p["multi"].__setitem__("systems", ["baseline"]),
     "multi.systems: a multilingual model needs at least two pairs, got pairs ['en-de']"),
    (lambda p: p["multi"].update(systems=["baseline"], asr_init="en-fr"), "multi.asr_init: 'en-fr' is not in pairs"),
    (lambda p: p["multi"].__setitem__("vocab_size", 7), "multi.vocab_size: must be >= 8, got 7"),
    (lambda p: p["multi"]["head_selection"].__setitem__("anneal_updates", 0),
     "multi.head_selection.anneal_updates: must be >= 1 or null"),
    (lambda p: p["multi"]["head_selection"].__setitem__("apply_to", []),
     "multi.head_selection.apply_to: expected a non-empty subset"),
])
def test_a_value_just_outside_its_stated_range_names_the_key(tmp_path: Path, mutate, key: str) -> None:
    with pytest.raises(ParamError, match=re.escape(key)):
        load_params(_write(tmp_path, mutate))


@pytest.mark.parametrize("section, key, value", [
    # the inclusive edges of the same ranges load, and load as written
    ("train_st", "label_smoothing", 0.0), ("train_st", "warmup_init_lr", 1.5e-3), ("train_st", "max_frames_train", 1),
    ("train_st", "specaug_time_p", 1.0), ("corpus", "noise_level", 0.0), ("analysis", "figure_sample", 99),
    ("analysis", "ddof", 1), ("decode", "final_checkpoint", "last"), ("decode", "final_checkpoint", "best"),
    ("parallel", "jobs", 1), ("multi", "vocab_size", 8),
])
def test_a_value_at_the_edge_of_its_stated_range_loads(tmp_path: Path, section: str, key: str, value) -> None:
    def mutate(p: dict) -> None:
        p[section][key] = value
        if key == "figure_sample":
            p["analysis"]["samples"] = 100
        if key == "warmup_init_lr":  # equal to the lr
            p["train_st"]["lr"] = value

    assert getattr(getattr(load_params(_write(tmp_path, mutate)), section), key) == value

"""Where every pipeline output lives: the one place the code spells the layout.

dvc.yaml spells the same paths for DVC (it cannot import Python); ``tests/test_dvc_graph.py``
checks that the two agree stage by stage. Paths are relative to the repository root.

Systems (one name each, in paths, metrics keys and the report):

    asr_shared  the one English ASR model of ``asr.mode: shared``        runs/asr_shared
    asr         the ASR model that initialises a pair's ST encoder       runs/asr/<pair>
    baseline    the ST model with full attention (the paper's baseline)  runs/baseline/<pair>/seed<k>
    asr_local   the ASR model the local-attention system starts from     runs/asr_local/<pair>
    asr_local_shared  the one ASR fork of ``local.fork: shared`` (the    runs/asr_local_shared
                widest windows of all pairs), copied to every asr_local/<pair>
    local       the ST model with local attention in layers k+1..L       runs/local/<pair>/seed<k>

Attention variants (opt-in experiments; ``<variant>`` = a name from the variant's params ``defs``),
all under ``variants/`` so that one folder per output kind holds them (the report depends on
metrics/variants and data/decoded/variants, which hold a committed README so they always exist):

    smoothing_asr  ASR pretrained with a smoothing definition   runs/variants/smoothing_asr/<variant>/<pair>
    smoothing      ST with attention smoothing (Maekaku et al.)        runs/variants/smoothing/<variant>/<pair>/seed<k>
    multi          one multilingual ST model over all pairs        runs/variants/multi/<variant>/seed<k>
                   (Gong et al.; <variant> = baseline | subset | group | baseline_h8); its decoded test sets
                   are per pair: data/decoded/variants/multi/<variant>/seed<k>/hyps.<pair>.tst-COMMON.txt
    controls_asr   a control's own fork of the shared ASR training     runs/variants/controls_asr/<variant>
                   (controls.asr_systems; one for every pair, like asr_local_shared)
    controls       ST with a control of Algorithm 1's windows          runs/variants/controls/<variant>/<pair>/seed<k>
                   (<variant> = local_uniform | local_shuffled; lib/model/spec.py), from its controls_asr
                   model, or from runs/asr_local/<pair> when it has none

The inference band test of every window configuration on the ST baseline of one seed (stage band_test,
opt-in): metrics/variants/band_test/<pair>/seed<k>.json and its figure plots/variants/band_test/<pair>/seed<k>.png.

The joint target vocabulary of the multilingual model (stage prepare_multi): data/prepared_multi/.

Per training run (``<run>`` = the path after ``runs/`` above):

    runs/<run>/model.pt                       final model (DVC output, cached)
    runs/<run>/timing.json                    wall times of the invocation that trained it (a cached
                                              output: an uncached plain output would keep DVC from
                                              saving the stage to its run-cache)
    runs/asr{_shared,/<pair>}/fork.pt          ASR runs: training state taken asr.fork_updates before    
                                              the end (local.asr_pretraining: fork), else a placeholder
    runs/<run>/checkpoints/, runs/<run>/live/ resume state and live dvclive logs: NOT DVC outputs
                                              (so DVC neither caches nor deletes them; a killed
                                              stage resumes from them, and the run-cache applies)
    data/decoded/<run>/hyps.tst-COMMON.txt    test hypotheses and references: small outputs that
    data/decoded/<run>/refs.tst-COMMON.txt    the report reads (it never depends on runs/)
    metrics/<run>.json                        test metrics (``metrics/asr_shared.json`` for the shared model)
    plots/train/<run>/                        training curves (dvclive tsv, copied at the end of the run)
"""
from __future__ import annotations

from pathlib import Path

__all__ = ["ASR_SYSTEMS", "SHARED_SYSTEMS", "ST_SYSTEMS", "SYSTEMS", "VARIANT_ASR_SYSTEMS", "VARIANT_ST_SYSTEMS", "VARIANT_METRICS",
           "VARIANT_DECODED", "VARIANT_PLOTS", "SMOOTHING_PLOTS", "PREPARED_MULTI", "multi_plots", "variant_figure", "TEST_SPLIT", "RunPaths", "analysis_dir", "analysis_metrics",
           "analysis_plots", "health_data", "health_metrics", "health_plot", "run_name", "run_paths",
           "windows_dir", "windows_json", "windows_metrics", "corpus_metrics", "corpus_plots", "REPORT", "SUMMARY",
           "EFFICIENCY_MD", "band_test_metrics", "band_test_plot"]

ASR_SYSTEMS = ("asr_shared", "asr", "asr_local", "asr_local_shared")
ST_SYSTEMS = ("baseline", "local")
VARIANT_ASR_SYSTEMS = ("smoothing_asr", "controls_asr")
VARIANT_ST_SYSTEMS = ("smoothing", "multi", "controls")
SYSTEMS = ASR_SYSTEMS + ST_SYSTEMS + VARIANT_ASR_SYSTEMS + VARIANT_ST_SYSTEMS
SHARED_SYSTEMS = ("asr_shared", "asr_local_shared")  # one model for every pair: no <pair> in the path
TEST_SPLIT = "tst-COMMON"

REPORT = Path("reports/report.md")
SUMMARY = Path("metrics/summary.json")
EFFICIENCY_MD = Path("metrics/efficiency.md")  # written by benchmarks/encoder_efficiency.py


def run_name(system: str, pair: str | None = None, seed: int | None = None, variant: str | None = None) -> str:
    """``asr_shared`` | ``asr_local_shared`` | ``<system>/<pair>`` (ASR) | ``<system>/<pair>/seed<k>`` (ST) |
    ``variants/<system>/<variant>/<pair>[/seed<k>]`` (attention variants); ValueError naming what is
    missing or unknown."""
    if system not in SYSTEMS:
        raise ValueError(f"unknown system {system!r}; known: {list(SYSTEMS)}")
    is_variant = system in VARIANT_ASR_SYSTEMS + VARIANT_ST_SYSTEMS
    if is_variant and not variant:
        raise ValueError(f"system {system!r} needs a variant name")
    if not is_variant and variant is not None:
        raise ValueError(f"system {system!r} takes no variant name, got {variant!r}")
    if system in SHARED_SYSTEMS:
        return system
    if system == "controls_asr":  # one fork per control for every pair (local.fork: shared)
        if pair is not None or seed is not None:
            raise ValueError(f"system 'controls_asr' covers every pair: no pair or seed, got {pair!r}, {seed!r}")
        return f"variants/controls_asr/{variant}"
    if system == "multi":  # one model for all pairs
        if pair is not None:
            raise ValueError(f"system 'multi' covers every pair: no pair, got {pair!r}")
        if seed is None:
            raise ValueError("system 'multi' needs a seed")
        return f"variants/multi/{variant}/seed{seed}"
    if pair is None:
        raise ValueError(f"system {system!r} needs a pair")
    prefix = f"variants/{system}/{variant}" if is_variant else system
    if system in ASR_SYSTEMS + VARIANT_ASR_SYSTEMS:
        return f"{prefix}/{pair}"
    if seed is None:
        raise ValueError(f"system {system!r} needs a seed")
    return f"{prefix}/{pair}/seed{seed}"


class RunPaths:
    """Every path of one training run, under ``root`` (see the module docstring)."""

    def __init__(self, root: Path | str, system: str, pair: str | None = None, seed: int | None = None,
                 variant: str | None = None) -> None:
        self.root, self.system, self.pair, self.seed, self.variant = Path(root), system, pair, seed, variant
        self.name = run_name(system, pair, seed, variant)

    @property
    def run_dir(self) -> Path:
        return self.root / "runs" / self.name

    @property
    def model(self) -> Path:
        return self.run_dir / "model.pt"

    @property
    def timing(self) -> Path:
        return self.run_dir / "timing.json"

    @property
    def fork_state(self) -> Path:
        """ASR runs: the training state a ``local.asr_pretraining: fork`` run continues from (a
        placeholder naming the mode when no fork is taken)."""
        return self.run_dir / "fork.pt"

    @property
    def checkpoints(self) -> Path:
        return self.run_dir / "checkpoints"

    @property
    def live(self) -> Path:
        return self.run_dir / "live"

    @property
    def decoded(self) -> Path:
        return self.root / "data" / "decoded" / self.name

    def hyps(self, split: str = TEST_SPLIT, pair: str | None = None) -> Path:
        """``hyps.<split>.txt``; ``hyps.<pair>.<split>.txt`` for one pair of a multilingual run."""
        return self.decoded / (f"hyps.{pair}.{split}.txt" if pair else f"hyps.{split}.txt")

    def refs(self, split: str = TEST_SPLIT, pair: str | None = None) -> Path:
        return self.decoded / (f"refs.{pair}.{split}.txt" if pair else f"refs.{split}.txt")

    @property
    def metrics(self) -> Path:
        return self.root / "metrics" / f"{self.name}.json"

    @property
    def curves(self) -> Path:
        return self.root / "plots" / "train" / self.name


def run_paths(root: Path | str, system: str, pair: str | None = None, seed: int | None = None,
              variant: str | None = None) -> RunPaths:
    return RunPaths(root, system, pair, seed, variant)


VARIANT_METRICS = Path("metrics/variants")  # hold a committed README.md: always present for the report's deps
VARIANT_DECODED = Path("data/decoded/variants")
PREPARED_MULTI = Path("data/prepared_multi")  # joint vocabulary (spm_multi.model, tasks.json)
VARIANT_PLOTS = Path("plots/variants")
SMOOTHING_PLOTS = VARIANT_PLOTS / "smoothing"  # the report's smoothing figures (an output of `report`)


def variant_figure(root: Path | str, family: str, pair: str) -> Path:
    """The report's figure of one variant family (``smoothing``) on one pair."""
    return Path(root) / VARIANT_PLOTS / family / f"{pair}.png"  # family "smoothing": inside SMOOTHING_PLOTS


def windows_dir(root: Path | str, pair: str) -> Path:
    return Path(root) / "data" / "windows" / pair


def windows_json(root: Path | str, pair: str) -> Path:
    return windows_dir(root, pair) / "windows.json"


def windows_metrics(root: Path | str, pair: str) -> Path:
    return Path(root) / "metrics" / "windows" / f"{pair}.json"


def analysis_dir(root: Path | str, pair: str) -> Path:
    return Path(root) / "data" / "analysis" / pair


def analysis_metrics(root: Path | str, pair: str) -> Path:
    return Path(root) / "metrics" / "analysis" / f"{pair}.json"


def analysis_plots(root: Path | str, pair: str) -> Path:
    return Path(root) / "plots" / "analysis" / pair


def health_data(root: Path | str, pair: str, model: str) -> Path:
    return Path(root) / "data" / "health" / pair / f"{model}.json"


def health_metrics(root: Path | str, pair: str, model: str) -> Path:
    return Path(root) / "metrics" / "health" / pair / f"{model}.json"


def health_plot(root: Path | str, pair: str, model: str) -> Path:
    return Path(root) / "plots" / "health" / pair / f"{model}.png"


def corpus_metrics(root: Path | str, pair: str) -> Path:
    return Path(root) / "metrics" / "corpus" / f"{pair}.json"


def corpus_plots(root: Path | str, pair: str) -> Path:
    return Path(root) / "plots" / "corpus" / pair


def multi_plots(root: Path | str, variant: str, seed: int) -> Path:
    """Head-sharing heatmaps of one multilingual run (the paper's Fig. 3), written by train_multi."""
    return Path(root) / VARIANT_PLOTS / "multi" / variant / f"seed{seed}"


def band_test_metrics(root: Path | str, pair: str, seed: int) -> Path:
    """The inference band test of the ST baseline of one pair and seed (stage band_test)."""
    return Path(root) / VARIANT_METRICS / "band_test" / pair / f"seed{seed}.json"


def band_test_plot(root: Path | str, pair: str, seed: int) -> Path:
    """Its figure: token accuracy against the mean window width of layers k+1..L."""
    return Path(root) / VARIANT_PLOTS / "band_test" / pair / f"seed{seed}.png"

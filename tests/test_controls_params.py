"""params.yaml's `controls` group (opt-in controls for Algorithm 1): empty by default in every
profile, and a bad value stops with its key's name."""
from __future__ import annotations

from pathlib import Path

import pytest

from lib.params import ParamError, load_params

from tests.test_params import REPO, _write


@pytest.mark.parametrize("profile", ["params.yaml", "profiles/demo-fast.yaml", "profiles/paper.yaml"])
def test_controls_are_off_by_default(profile: str) -> None:
    c = load_params(REPO / profile).controls
    assert c.systems == [] and c.asr_systems == [] and c.band_seeds == [] and c.shuffle_seed == 1


def test_controls_may_be_listed(tmp_path: Path) -> None:
    p = load_params(_write(tmp_path, lambda p: p["controls"].update(systems=["local_shuffled", "local_uniform"],
                                                                    band_seeds=[2, 5], shuffle_seed=7)))
    assert p.controls.systems == ["local_shuffled", "local_uniform"] and p.controls.band_seeds == [2, 5]
    def fork_controls(p):  # noqa: ANN001, ANN202  (a control's own ASR fork needs local's fork rule)
        p["local"]["asr_pretraining"] = "fork"
        p["asr"]["fork_updates"] = 1200
        p["controls"].update(systems=["local_uniform"], asr_systems=["local_uniform"])
    p = load_params(_write(tmp_path, fork_controls))
    assert p.controls.asr_systems == ["local_uniform"]


@pytest.mark.parametrize("mutate, key", [
    (lambda p: p["controls"].__setitem__("systems", ["local_wide"]), r"controls.systems\[0\]: unknown control 'local_wide'"),
    (lambda p: p["controls"].__setitem__("systems", ["local_uniform", "local_uniform"]), "controls.systems: duplicates"),
    (lambda p: p["controls"].__setitem__("systems", "local_uniform"), "controls.systems: expected a list"),
    (lambda p: p["controls"].__setitem__("shuffle_seed", -1), "controls.shuffle_seed: must be >= 0"),
    (lambda p: p["controls"].__setitem__("shuffle_seed", 1.5), "controls.shuffle_seed: expected an integer"),
    (lambda p: p["controls"].__setitem__("band_seeds", [1, 1]), "controls.band_seeds: duplicates"),
    (lambda p: p["controls"].__setitem__("band_seeds", [9]), r"controls.band_seeds\[0\]: 9 is not in seeds"),
    (lambda p: p["controls"].__setitem__("band_seed", [1]), "controls.band_seed"),
    (lambda p: p["controls"].update(systems=["local_uniform"], asr_systems=["local_shuffled"]),
     r"controls.asr_systems\[0\]: 'local_shuffled' is not in controls.systems"),
    (lambda p: p["controls"].update(systems=["local_uniform"], asr_systems=["local_uniform", "local_uniform"]),
     "controls.asr_systems: duplicates"),
    # an own fork follows local's fork rule, which only local.fork: shared has as one shared fork
    (lambda p: (p["controls"].update(systems=["local_uniform"], asr_systems=["local_uniform"]),
                p["local"].update(asr_pretraining="shared")), "controls.asr_systems: .*local.asr_pretraining is shared"),
    (lambda p: (p["controls"].update(systems=["local_uniform"], asr_systems=["local_uniform"]),
                p["local"].update(fork="per_pair")), "controls.asr_systems: .*local.fork is per_pair"),
])
def test_bad_values_name_the_key(tmp_path: Path, mutate, key: str) -> None:
    with pytest.raises(ParamError, match=key):
        load_params(_write(tmp_path, mutate))

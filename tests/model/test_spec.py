"""Per-layer encoder attention specs (lib/model/spec.py): the widest of several specs."""
from __future__ import annotations

import pytest

from lib.model.spec import local_attention_spec, widest_spec


def test_widest_spec_takes_the_largest_window_per_layer_and_keeps_full_layers() -> None:
    de = local_attention_spec(5, 1, [1, 5, 3, 9])
    es = local_attention_spec(5, 1, [1, 7, 3, 7])
    it = local_attention_spec(5, 1, [3, 7, 1, 5])
    assert widest_spec([de, es, it]) == local_attention_spec(5, 1, [3, 7, 3, 9])
    assert widest_spec([de]) == de  # one spec: itself
    mixed = local_attention_spec(5, 2, [5, 3, 3])  # layer 2 full here: full wins
    assert widest_spec([de, mixed])[:2] == [{"type": "full"}, {"type": "full"}]
    assert widest_spec([de, mixed])[2:] == [{"type": "local", "window": w} for w in (5, 3, 9)]


@pytest.mark.parametrize("specs, match", [
    ([], "no specs"),
    ([local_attention_spec(3, 1, [1, 3]), local_attention_spec(4, 1, [1, 3, 5])], "different depths"),
    ([[{"type": "smooth", "prior": "uniform"}]], r"\[0\] \(layer 1\): only full or local"),
])
def test_widest_spec_refuses_what_does_not_combine(specs, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        widest_spec(specs, key="local.fork: shared")


@pytest.mark.parametrize("spec, match", [
    ({}, r"w\.json: encoder_attention: expected a list of layer specs, got dict"),
    ([{"type": "full"}, {"type": "foo"}], r"w\.json: encoder_attention\[1\] \(layer 2\): type must be 'full' or "
                                          r"'local', got 'foo'"),
    ([{"type": "full"}, {"type": "local", "window": 4}], r"encoder_attention\[1\] \(layer 2\): window must be a "
                                                         r"positive odd integer"),
])
def test_validate_spec_names_what_a_windows_file_holds_wrong(spec, match: str) -> None:
    """select_windows' per-layer specs are full or local layers: another type stops naming the file's key here
    (a stage prints it as one line), not in the attention registry once the model is being built."""
    from lib.model.spec import validate_spec

    with pytest.raises(ValueError, match=match):
        validate_spec(spec, 2, key="w.json: encoder_attention")
    assert validate_spec([{"type": "full"}, {"type": "local", "window": 3}], 2) == [{"type": "full"},
                                                                                   {"type": "local", "window": 3}]

"""The training curves' logger: dvclive's ``Live``, less a per-step re-read of every curve.

dvclive 3.49's ``Live.next_step`` ends in ``post_data_to_studio``, which parses every metric's TSV from
its first row to build a payload for DVC Studio, queues it, and only then (in a worker thread) drops it
when no Studio is configured. A step therefore costs time in proportion to the steps logged so far,
and a run in proportion to their square: with the loop's four curves, about 5.5 ms per 1,000 logged
updates, per step, on a 2-core AMD EPYC (``benchmarks/live_logging.py``: 32 ms at update 6,000, 284 ms
at update 50,000). The 6000-update demo ASR model spent about 1.5 min on it; a 50k-update paper run
would spend about 2 h, more than its training takes on an H100 in bf16 (docs/gpu.md).

:class:`TrainingLive` builds that payload only when Studio would receive it, by dvclive's own test
(``post_to_studio`` returns at once for an event in ``_studio_events_to_skip``, which ``Live`` fills
when ``get_dvc_studio_config`` finds no Studio). Everything written to disk is the same, file for file;
with Studio configured nothing changes. The test on the private attribute is pinned with dvclive
(requirements.txt) and checked by tests/train/test_live.py.
"""
from __future__ import annotations

from dvclive import Live


class TrainingLive(Live):
    """``dvclive.Live`` whose ``next_step`` costs the same at update 50,000 as at update 1 when no DVC
    Studio is configured (the pipeline's case: it reports through ``dvc plots``)."""

    def post_data_to_studio(self) -> None:
        if "data" in self._studio_events_to_skip:  # the payload would be dropped unsent
            return
        super().post_data_to_studio()

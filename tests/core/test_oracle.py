"""Oracle labels: every frame labelled with its episode's outcome, from a hand-made table."""

from __future__ import annotations

import pyarrow as pa
import pytest

from recap.core.oracle import episode_success, outcome_labels
from recap.errors import RecapError


def returns_table() -> pa.Table:
    # episode 4: success (last reward 0); episode 2: failure (-300); rows shuffled
    rows = [(4, 1, -1.0), (2, 0, -1.0), (4, 2, 0.0), (2, 1, -300.0), (4, 0, -1.0)]
    ep, fr, reward = zip(*rows)
    return pa.table({"episode_index": ep, "frame_index": fr, "reward": pa.array(reward)})


def test_episode_success_reads_the_last_reward():
    ids, success = episode_success(returns_table())
    assert ids.tolist() == [2, 4] and success.tolist() == [False, True]


def test_outcome_labels_replace_the_advantage_column_only():
    adv = pa.table({"episode_index": [2, 4, 4, 2, 4], "frame_index": [0, 0, 1, 1, 2],
                    "advantage_continuous": [0.5, -0.1, 0.2, 0.9, 0.0],
                    "advantage": [True, False, False, True, True]})  # fmt: skip
    out = outcome_labels(adv, returns_table())
    assert out.column("advantage").to_pylist() == [False, True, True, False, True]
    assert out.column_names == adv.column_names
    assert out.column("advantage_continuous").equals(adv.column("advantage_continuous"))
    stray = pa.table({"episode_index": [7], "frame_index": [0], "advantage": [True]})
    with pytest.raises(RecapError, match=r"^returns sidecar: no rows for episode 7 "):
        outcome_labels(stray, returns_table())

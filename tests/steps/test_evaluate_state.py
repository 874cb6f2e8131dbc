"""evaluate_policy reads the reaching task's state layout from the training data's state names,
so an evaluation cannot run the policy on states laid out differently from its training data."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from recap.data.loader import FrameDataset
from recap.envs.reach import write_demo_datasets
from recap.errors import RecapError
from recap.steps.evaluate_policy import reach_state_targets


@pytest.fixture(scope="module")
def roots(tmp_path_factory):
    base = tmp_path_factory.mktemp("state")
    for targets in (False, True):
        write_demo_datasets(base / str(targets), sft_episodes=1, rollout_episodes=1,
                            eval_episodes=1, state_targets=targets)  # fmt: skip
    return base


def data_of(*roots):
    return SimpleNamespace(sources=[SimpleNamespace(frames=FrameDataset(r)) for r in roots])


def test_state_targets_follow_the_state_names_the_data_was_written_with(roots):
    assert (
        reach_state_targets(data_of(roots / "False" / "sft", roots / "False" / "rollout")) is False
    )
    assert reach_state_targets(data_of(roots / "True" / "sft", roots / "True" / "rollout")) is True
    assert reach_state_targets(data_of(roots / "True" / "sft"), True) is True


def test_a_contradicting_binding_or_mixed_datasets_are_one_line(roots):
    info = roots / "True" / "sft" / "meta" / "info.json"
    with pytest.raises(RecapError) as caught:
        reach_state_targets(data_of(roots / "True" / "sft"), False)
    assert str(caught.value) == (
        f"{info}: features.state.names ['x', 'y', 'pad_2', 'pad_3', 'red_dx', "
        "'red_dy', 'blue_dx', 'blue_dy']: the data was written with --state-targets; "
        "evaluate_policy.state_targets = False contradicts it (remove the binding)"
    )
    plain = roots / "False" / "rollout" / "meta" / "info.json"
    with pytest.raises(RecapError) as caught:
        reach_state_targets(data_of(roots / "True" / "sft", roots / "False" / "rollout"))
    assert str(caught.value) == (
        f"{info}: state names with targets, {plain}: without; train on datasets of one kind"
    )


def test_other_state_names_need_an_explicit_binding(roots, tmp_path):
    import shutil

    root = tmp_path / "other"
    shutil.copytree(roots / "False" / "sft", root)
    info = json.loads((root / "meta" / "info.json").read_text())
    info["features"]["state"]["names"] = [f"s{i}" for i in range(8)]  # sft: LIBERO's keys
    (root / "meta" / "info.json").write_text(json.dumps(info))
    with pytest.raises(RecapError) as caught:
        reach_state_targets(data_of(root))
    assert str(caught.value) == (
        f"{root / 'meta' / 'info.json'}: features.state.names ['s0', 's1', 's2', "
        "'s3', 's4', 's5', 's6', 's7'] are not the reaching task's; set "
        "evaluate_policy.state_targets"
    )
    assert reach_state_targets(data_of(root), True) is True

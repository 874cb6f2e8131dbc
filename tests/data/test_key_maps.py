"""Per-dataset key maps from gin (#39): cameras in slot order or by role, state and action keys,
the one-line refusals (too many cameras, too wide, unknown key), the map printed once, and the
value and policy data feeding the processor the chosen cameras."""

from __future__ import annotations

import logging
from pathlib import Path

import gin
import pytest

from recap.core.normalize import ReturnRange
from recap.data import lerobot
from recap.data.datasets import ValueDataset
from recap.data.lerobot import KeyMap, spec_key_map
from recap.data.policy_data import PolicyDataset
from recap.data.specs import parse_dataset_specs
from recap.data.transforms import load_tokenizer, write_word_tokenizer
from recap.errors import DatasetError, RecapError
from recap.steps.compute_returns import ReturnsConfig, compute_returns
from tests.aloha import CHOSEN, TASKS, write_aloha

HIGH, LOW, LEFT, RIGHT = (f"observation.images.{c}" for c in
                          ("cam_high", "cam_low", "cam_left_wrist", "cam_right_wrist"))  # fmt: skip
FEATURES = (f"{HIGH}, {LOW}, {LEFT}, {RIGHT}, observation.state, action, is_success, done, "
            "timestamp, frame_index, episode_index, index, task_index")  # fmt: skip


@pytest.fixture(autouse=True)
def _fresh():
    gin.clear_config()
    lerobot._SHOWN.clear()
    yield
    gin.clear_config()


@pytest.fixture(scope="module")
def aloha(tmp_path_factory) -> Path:
    root = write_aloha(tmp_path_factory.mktemp("aloha") / "aloha")
    compute_returns(
        ReturnsConfig(datasets=[{"name": "aloha", "root": str(root), "type": "sft"}], tag="")
    )
    return root


def spec(root: Path, **entry):
    return parse_dataset_specs([{"name": "aloha", "root": str(root), **entry}], "",
                               "policy_data.datasets")[0]  # fmt: skip


def test_cameras_in_slot_order_or_by_role(aloha):
    assert spec(aloha, cameras=CHOSEN).cameras == tuple(CHOSEN)
    by_role = spec(aloha, cameras={"base": HIGH, "right_wrist": RIGHT})
    assert by_role.cameras == (HIGH, "", RIGHT)
    assert by_role.binding == "policy_data.datasets[0]"
    assert spec(aloha, cameras=[HIGH, None, RIGHT]).cameras == (HIGH, "", RIGHT)
    with pytest.raises(RecapError) as err:
        spec(aloha, cameras={"top": HIGH})
    assert str(err.value) == ("policy_data.datasets[0]: cameras roles ['top'] unknown; the roles "
                              "are ['base', 'left_wrist', 'right_wrist']")  # fmt: skip
    with pytest.raises(RecapError) as err:
        spec(aloha, cameras=HIGH)
    assert str(err.value) == (f"policy_data.datasets[0]: cameras '{HIGH}' is not a list of camera "
                              "keys in slot order (base, left_wrist, right_wrist) or a dict by "
                              "role")  # fmt: skip


def test_four_cameras_detected_are_refused_naming_the_binding(aloha):
    with pytest.raises(DatasetError) as err:
        spec_key_map(spec(aloha))
    assert str(err.value) == (
        f"{aloha}/meta/info.json: 4 cameras ({HIGH}, {LOW}, {LEFT}, {RIGHT}) for the model's 3 "
        'slots (base, left_wrist, right_wrist); pick 3 with "cameras" in '
        f'policy_data.datasets[0], e.g. "cameras": ["{HIGH}", "{LEFT}", "{RIGHT}"]'
    )


def test_bound_keys_are_used_and_printed_once(aloha, caplog):
    entry = spec(aloha, cameras=CHOSEN, action_key="action")
    with caplog.at_level(logging.INFO, logger="recap.data.lerobot"):
        first = spec_key_map(entry, max_dim=32)
        assert spec_key_map(entry) == first
    assert first == KeyMap((HIGH, LEFT, RIGHT), "observation.state", "action")
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        f"dataset aloha: cameras base={HIGH}, left_wrist={LEFT}, right_wrist={RIGHT} (bound); "
        f"unused cameras: {LOW}; state observation.state [14] (detected); action action [14] "
        "(bound)"
    ]


def test_unknown_key_lists_the_dataset_keys(aloha):
    with pytest.raises(DatasetError) as err:
        spec_key_map(spec(aloha, cameras=CHOSEN, state_key="observation.joints"))
    assert str(err.value) == (f"{aloha}/meta/info.json: state_key 'observation.joints' "
                              "(policy_data.datasets[0]) is not a feature of this dataset; its "
                              f"keys: {FEATURES}")  # fmt: skip
    with pytest.raises(DatasetError) as err:
        spec_key_map(spec(aloha, cameras=[HIGH, "observation.images.top"]))
    assert str(err.value).startswith(f"{aloha}/meta/info.json: cameras 'observation.images.top' "
                                     "(policy_data.datasets[0]) is not a feature")  # fmt: skip
    with pytest.raises(DatasetError) as err:
        spec_key_map(spec(aloha, cameras=[HIGH, "observation.state"]))
    assert str(err.value) == (f"{aloha}/meta/info.json: cameras 'observation.state' "
                              "(policy_data.datasets[0]) is a float32 feature, not a camera; its "
                              f"cameras: {HIGH}, {LOW}, {LEFT}, {RIGHT}")  # fmt: skip


def test_state_wider_than_32_is_refused_naming_the_dimension(tmp_path):
    root = write_aloha(tmp_path / "wide", episodes=2, frames=4, dim=40, cameras=("cam_high",))
    with pytest.raises(DatasetError) as err:
        spec_key_map(spec(root), max_dim=32)
    assert str(err.value) == (
        f"{root}/meta/info.json: state 'observation.state' has 40 dims; the "
        'model takes at most 32 (padded, never cut); bind "state_key" in '
        "policy_data.datasets[0] to a feature of at most 32 dims"
    )


def test_policy_data_feeds_the_chosen_cameras_by_role(aloha, tmp_path):
    tok = load_tokenizer(write_word_tokenizer(tmp_path / "tok", list(TASKS)))
    specs = [spec(aloha, cameras={"base": HIGH, "right_wrist": RIGHT})]
    data = PolicyDataset(specs, "", tok, image_size=16, action_horizon=3, conditioning="none",
                         state_in_prompt=False, max_length=16)  # fmt: skip
    assert data.processor.cameras == (HIGH, "", RIGHT)
    batch = data.__getitems__([0, 5])
    assert batch["image_masks"].tolist() == [[True, False, True]] * 2
    assert batch["frames"][:, 1].sum().item() == 0
    assert batch["actions"].shape == (2, 3, 32)
    value = ValueDataset([spec(aloha, cameras=CHOSEN)], "", ReturnRange(-50.0, 0.0), tok, 16)
    assert value.processor.cameras == tuple(CHOSEN)
    assert value.__getitems__([1])["image_masks"].tolist() == [[True, True, True]]
    with pytest.raises(DatasetError, match='4 cameras .* pick 3 with "cameras"'):
        PolicyDataset([spec(aloha)], "", tok, image_size=16, action_horizon=3,
                      conditioning="none")  # fmt: skip

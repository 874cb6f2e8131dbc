"""Normalization statistics around the π0.5 weights: openpi's ``assets/<id>/norm_stats.json`` and
LeRobot's normalizer file read from a checkpoint, chosen over the data's (``norm_stats``
checkpoint / data / auto, one report line), and written back beside a run's exported weights."""

from __future__ import annotations

import json

import gin
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from recap.data.conditioning import QuantileStats
from recap.data.policy_data import PolicyDataConfig, run_stats
from recap.errors import RecapError
from recap.models.checkpoints import find_norm_stats, read_norm_stats, write_norm_stats
from recap.steps.train import save_processor  # writes the statistics beside the weights

ASSET = "physical-intelligence/libero"
# openpi norm_stats.json of a checkpoint: state [8], actions padded to [9] (cut to the data's 7)
CKPT_STATE = {"mean": [0.5] * 8, "std": [2.0] * 8, "q01": [-3.0] * 8, "q99": [5.0] * 8}
CKPT_ACTIONS = {"mean": [0.0] * 9, "std": [1.0] * 9, "q01": [-2.0] * 9,
                "q99": [float(i) for i in range(1, 10)]}  # fmt: skip


def openpi_checkpoint(directory, asset=ASSET, state=CKPT_STATE, actions=CKPT_ACTIONS):
    path = directory / "assets" / asset / "norm_stats.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"norm_stats": {"state": state, "actions": actions}}))
    return path


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from recap.envs.reach import write_demo_datasets, write_demo_tokenizer

    root = tmp_path_factory.mktemp("norm") / "demo_data"
    write_demo_datasets(root, seed=0, sft_episodes=2, rollout_episodes=1, eval_episodes=1)
    write_demo_tokenizer(root)
    return root


@pytest.fixture(autouse=True)
def clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def build(data, **kwargs):
    args = dict(datasets=[{"name": "sft", "root": "sft", "type": "sft"}], data_root=str(data),
                tokenizer_path=str(data / "tokenizer"), image_size=32, action_horizon=3,
                conditioning="none", state_in_prompt=False, max_length=16)  # fmt: skip
    return PolicyDataConfig(**{**args, **kwargs}).build()


def first_line(err) -> str:
    """The error's own line (gin appends the configurable it was raised in)."""
    return str(err.value).split("\n")[0]


def test_read_and_find_openpi_and_lerobot_stats(tmp_path):
    path = openpi_checkpoint(tmp_path / "ckpt")
    assert find_norm_stats(tmp_path / "ckpt", ASSET) == path
    assert find_norm_stats(tmp_path / "ckpt") == path  # the only asset
    assert find_norm_stats(tmp_path / "ckpt", "trossen") is None
    stats = read_norm_stats(path)
    assert stats["state"].q01.tolist() == [-3.0] * 8 and stats["action"].q99[-1] == 9.0
    assert stats["state"].mean.tolist() == [0.5] * 8 and len(stats["action"]) == 9
    openpi_checkpoint(tmp_path / "ckpt", asset="trossen")
    with pytest.raises(RecapError) as err:
        find_norm_stats(tmp_path / "ckpt")
    assert str(err.value) == (
        f"{tmp_path / 'ckpt'}: normalization statistics of several assets "
        "['physical-intelligence/libero', 'trossen']; pick one with policy_data.asset_id"
    )
    lerobot = tmp_path / "lerobot"
    lerobot.mkdir()
    flat = {"observation.state.q01": torch.full((8,), -1.0), "observation.state.q99": torch.ones(8),
            "action.q01": torch.zeros(7), "action.q99": torch.full((7,), 2.0),
            "action.mean": torch.ones(7)}  # fmt: skip
    save_file(flat, str(lerobot / "policy_preprocessor_step_3_normalizer_processor.safetensors"))
    found = find_norm_stats(lerobot)
    assert found.name == "policy_preprocessor_step_3_normalizer_processor.safetensors"
    stats = read_norm_stats(found)
    assert stats["action"].q99.tolist() == [2.0] * 7 and stats["action"].mean.tolist() == [1.0] * 7
    assert stats["state"].mean is None and stats["state"].q01.tolist() == [-1.0] * 8
    bad = openpi_checkpoint(tmp_path / "bad", state={"mean": [0.0], "std": [1.0]})
    with pytest.raises(RecapError) as err:
        read_norm_stats(bad)
    assert str(err.value) == (
        f"{bad}: no q01/q99 for 'state' (have ['mean', 'std']); π0.5 needs quantile statistics, "
        'use policy_data.norm_stats = "data"'
    )


def test_checkpoint_stats_win_over_the_data_and_the_run_exports_them(data, tmp_path, capsys):
    ckpt = tmp_path / "pi05_base"
    openpi_checkpoint(ckpt)
    ds = build(data, checkpoint=str(ckpt), asset_id=ASSET)  # norm_stats "auto"
    assert ds.export_asset == ASSET and not (tmp_path / "run").exists()  # the builder writes none
    save_processor(ds, None, tmp_path / "run")  # what ``train`` does after fitting
    (line,) = [x for x in capsys.readouterr().out.splitlines() if x.startswith("policy_data:")]
    assert line == (
        f"policy_data: normalization statistics from {ckpt / 'assets' / ASSET / 'norm_stats.json'}"
        " (state 8 dims, actions 7 dims)"
    )
    assert ds.stats["state"].q01.tolist() == [-3.0] * 8
    assert ds.stats["action"].q99.tolist() == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]  # cut to 7
    item = ds.__getitems__([0])
    raw = ds.sources[0].frames.__getitems__(np.array([int(ds.row_of[0])]))["action"][0].double()
    q99 = torch.arange(1.0, 8.0, dtype=torch.float64)
    expected = ((raw - -2.0) / (q99 + 2.0 + 1e-6) * 2 - 1).float()
    torch.testing.assert_close(item["actions"][0, :, :7], expected, rtol=0, atol=0)
    exported = tmp_path / "run" / "assets" / ASSET / "norm_stats.json"
    written = json.loads(exported.read_text())["norm_stats"]
    assert written["state"] == CKPT_STATE
    assert written["actions"] == {k: v[:7] for k, v in CKPT_ACTIONS.items()}
    stats, path = run_stats(tmp_path / "run")
    assert path == exported and stats["action"].q99.tolist() == ds.stats["action"].q99.tolist()
    # the data's own statistics when asked, or when the checkpoint carries none
    data_ds = build(data, checkpoint=str(ckpt), asset_id=ASSET, norm_stats="data",
                    export_stats=False)  # fmt: skip
    assert [x for x in capsys.readouterr().out.splitlines() if x.startswith("policy_data:")] == [
        "policy_data: normalization statistics from the training data (sft) (state 8 dims, "
        "actions 7 dims)"
    ]
    assert data_ds.stats["state"].q01.tolist() != [-3.0] * 8
    assert data_ds.export_asset is None
    auto = build(data, checkpoint=str(tmp_path / "empty"), export_stats=False)
    assert auto.stats["state"].q01.tolist() == data_ds.stats["state"].q01.tolist()
    assert json.loads(exported.read_text())["norm_stats"]["state"] == CKPT_STATE  # not rewritten


def test_data_stats_export_in_openpi_layout_and_errors_are_one_line(data, tmp_path):
    ds = build(data)
    save_processor(ds, None, tmp_path / "run")
    written = json.loads((tmp_path / "run/assets/recap/norm_stats.json").read_text())
    assert sorted(written["norm_stats"]) == ["actions", "state"]
    assert sorted(written["norm_stats"]["state"]) == ["mean", "q01", "q99", "std"]
    assert len(written["norm_stats"]["actions"]["q99"]) == 7  # unpadded: the model pads to 32
    assert written["norm_stats"]["state"]["q99"] == ds.stats["state"].q99.tolist()
    eval_ds = build(data, split="eval", eval_datasets=[{"name": "eval", "root": "eval"}])
    assert eval_ds.stats["action"].q01.tolist() == ds.stats["action"].q01.tolist()
    with pytest.raises(RecapError) as err:
        build(data, norm_stats="checkpoint")
    assert first_line(err) == (
        'policy_data.norm_stats = "checkpoint" but policy_data.checkpoint is None; bind it (the '
        "pi05_policy.checkpoint directory)"
    )
    with pytest.raises(RecapError) as err:
        build(data, norm_stats="checkpoint", checkpoint=str(tmp_path))
    assert first_line(err) == (
        f"{tmp_path}: no assets/*/norm_stats.json or LeRobot normalizer file; use "
        'policy_data.norm_stats = "data" or "auto"'
    )
    short = tmp_path / "short"
    path = openpi_checkpoint(short, state={k: v[:6] for k, v in CKPT_STATE.items()})
    with pytest.raises(RecapError) as err:
        build(data, checkpoint=str(short))
    assert first_line(err) == (
        f'{path}: state statistics have 6 dims, the data 8; use policy_data.norm_stats = "data"'
    )
    with pytest.raises(RecapError, match=r"^policy_data.norm_stats: 'ckpt' is not one of"):
        build(data, norm_stats="ckpt")


def test_write_norm_stats_is_atomic_and_round_trips(tmp_path):
    action = QuantileStats(np.zeros(3), np.ones(3), np.full(3, 0.5), np.full(3, 0.1))
    stats = {"state": QuantileStats(np.array([-1.5, 0.0]), np.array([1.0, 2.5])), "action": action}
    path = write_norm_stats(tmp_path, "a/b", stats)
    assert path == tmp_path / "assets" / "a" / "b" / "norm_stats.json"
    assert [p.name for p in path.parent.iterdir()] == ["norm_stats.json"]  # no temporary left
    content = json.loads(path.read_text())["norm_stats"]
    assert content["state"] == {"q01": [-1.5, 0.0], "q99": [1.0, 2.5]}  # no mean/std: left out
    assert content["actions"]["mean"] == [0.5] * 3 and content["actions"]["std"] == [0.1] * 3
    back = read_norm_stats(path)
    assert back["state"].q01.tolist() == [-1.5, 0.0] and back["action"].std.tolist() == [0.1] * 3

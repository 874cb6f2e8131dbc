"""The look-ahead as a duration (#39): ``compute_advantages.lookahead_s`` converted at each
dataset's fps, frames still accepted, and a mixture of rates with a look-ahead per dataset."""

from __future__ import annotations

import io
import json
import shutil

import gin
import numpy as np
import pyarrow as pa
import pytest
import torch

from recap.cli import parse_gin
from recap.configurable import configured
from recap.core import columns as C
from recap.core.advantages import add_advantages, labeling_of
from recap.core.normalize import ReturnRange
from recap.data.lerobot import frames_of
from recap.data.sidecars import read_advantages
from recap.data.specs import parse_dataset_specs
from recap.envs.reach import write_demo_datasets, write_demo_tokenizer
from recap.errors import RecapError
from recap.models.value import value_model
from recap.steps.compute_advantages import AdvantagesConfig, compute_advantages
from recap.steps.compute_returns import ReturnsConfig, compute_returns
from tests.aloha import write_aloha
from tests.helpers import one_rank_here


def frames(name: str, lengths: list[int], rng) -> pa.Table:
    episode = np.concatenate([np.full(n, i) for i, n in enumerate(lengths)])
    frame = np.concatenate([np.arange(n) for n in lengths])
    n = episode.size
    return pa.table({C.DATASET_NAME: [name] * n, C.EPISODE_INDEX: episode, C.FRAME_INDEX: frame,
                     C.REWARD: np.full(n, -1.0), "value": rng.uniform(-1, 0, n)})  # fmt: skip


def test_a_lookahead_per_dataset_is_each_datasets_own_n_step_advantage():
    rng = np.random.default_rng(0)
    both = pa.concat_tables([frames("fast", [20, 30], rng), frames("slow", [6, 8], rng)])
    span = ReturnRange(-30.0, 0.0)
    mixed = add_advantages(both, return_range=span, lookahead={"fast": 10, "slow": 2})
    fast = np.array(mixed.column(C.DATASET_NAME).to_pylist()) == "fast"
    for n, rows in ((10, fast), (2, ~fast)):
        alone = add_advantages(both, return_range=span, lookahead=n)
        for column in (C.ADVANTAGE_CONTINUOUS, C.VALUE_NEXT, "num_valid_rewards"):
            got, want = mixed.column(column).to_numpy(), alone.column(column).to_numpy()
            np.testing.assert_array_equal(got[rows], want[rows])
    assert mixed.column("num_valid_rewards").to_numpy()[fast].max() == 10
    assert mixed.column("num_valid_rewards").to_numpy()[~fast].max() == 2
    assert labeling_of(mixed)["lookahead"] == {"fast": 10, "slow": 2}
    with pytest.raises(RecapError) as err:
        add_advantages(both, return_range=span, lookahead={"fast": 10})
    assert err.value.message == "lookahead: no value for datasets ['slow']; give one per dataset"


def test_seconds_become_frames_at_each_rate(tmp_path):
    write_aloha(tmp_path / "ten", episodes=2, frames=3, fps=10, cameras=("cam_high",))
    write_aloha(tmp_path / "fifty", episodes=2, frames=3, fps=50, cameras=("cam_high",))
    specs = parse_dataset_specs([{"name": "ten", "root": "ten"}, {"name": "fifty",
                                 "root": "fifty"}], tmp_path)  # fmt: skip
    assert frames_of(0.5, specs, "x") == {"ten": 5, "fifty": 25}
    assert frames_of(1.0, specs[:1], "x") == 10  # one rate: one N
    assert frames_of(0.01, specs, "x") == 1  # at least one frame each, so one N
    with pytest.raises(RecapError) as err:
        frames_of(0, specs, "compute_advantages.lookahead_s")
    assert (
        err.value.message == "compute_advantages.lookahead_s: 0 must be a duration in seconds > 0"
    )


def test_step3_with_lookahead_s_on_datasets_of_two_rates(tmp_path):
    root = tmp_path / "data"
    write_demo_datasets(root, sft_episodes=3, rollout_episodes=2, eval_episodes=3)
    write_demo_tokenizer(root)
    shutil.copytree(root / "eval", root / "eval20")  # the same frames, recorded at 20 fps
    info = json.loads((root / "eval20/meta/info.json").read_text())
    (root / "eval20/meta/info.json").write_text(json.dumps({**info, "fps": 20}))
    entries = [{"name": "sft", "root": "sft", "type": "sft"},
               {"name": "eval20", "root": "eval20", "type": "rollout"}]  # fmt: skip
    gin.clear_config()
    compute_returns(ReturnsConfig(datasets=entries, data_root=str(root)))
    parse_gin(["demo/value.gin"], [])
    torch.manual_seed(0)
    configured(value_model)().save_pretrained(root / "pretrained")
    gin.clear_config()
    out = io.StringIO()
    with one_rank_here(out):
        gin.bind_parameter("Tracker.enabled", False)
        compute_advantages(AdvantagesConfig(datasets=entries, data_root=str(root), tag="sec",
                           model_path=str(root / "pretrained"),
                           tokenizer_path=str(root / "tokenizer"), max_length=16, batch_size=16,
                           lookahead_s=0.5, output_dir=str(tmp_path / "pics")))  # fmt: skip
    gin.clear_config()
    assert "look-ahead 0.5 s = {'sft': 5, 'eval20': 10} frames" in out.getvalue()
    for name, n in (("sft", 5), ("eval20", 10)):
        table, record = read_advantages(root / name, "sec")
        assert record["lookahead"] == {"sft": 5, "eval20": 10}
        assert table.column("num_valid_rewards").to_numpy().max() == n

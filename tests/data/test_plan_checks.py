"""The plan reads every dataset's info.json and checks it against each step and the checkpoint
(#39): a 4-camera set without a camera binding and a 14-dim set against 8-dim checkpoint
statistics are refused at plan time with one line, --dry_run included, and no step launched."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import gin
import numpy as np
import pytest

from recap.data import lerobot
from recap.data.norm_stats import write_norm_stats
from recap.processing.normalize import QuantileStats
from recap.workflow import pipeline
from tests.aloha import CHOSEN, write_aloha

STAGES = 'pipeline.stages = ["returns", "value", "advantages", "policy"]'


@pytest.fixture(autouse=True)
def _fresh(monkeypatch):
    gin.clear_config()
    lerobot._SHOWN.clear()

    def launched(*args, **kwargs):
        raise AssertionError(f"a step was launched: {args}")

    monkeypatch.setattr(subprocess, "run", launched)
    monkeypatch.setattr(subprocess, "Popen", launched)
    yield
    gin.clear_config()


@pytest.fixture(scope="module")
def aloha(tmp_path_factory) -> Path:
    return write_aloha(tmp_path_factory.mktemp("plan") / "aloha", episodes=2, frames=4)


def args(entry: dict, *extra: str, dry: bool = True) -> list[str]:
    text = json.dumps(entry)
    params = [STAGES, f"all:ALOHA = {text}", "all:compute_returns.datasets = [%ALOHA]",
              "all:value_data.datasets = [%ALOHA]", "all:value_data.eval_datasets = [%ALOHA]",
              "all:compute_advantages.datasets = [%ALOHA]", "all:policy_data.datasets = [%ALOHA]",
              *extra]  # fmt: skip
    out = ["--gin_file", "demo/scratch.gin", *[a for p in params for a in ("--gin_param", p)]]
    return [*out, "--dry_run"] if dry else out


@pytest.mark.parametrize("dry", [True, False])
def test_four_cameras_without_a_binding_refused_at_plan_time(aloha, capsys, dry):
    entry = {"name": "aloha", "root": str(aloha), "type": "sft"}
    assert pipeline.main(args(entry, dry=dry)) == 2
    out, err = capsys.readouterr()
    cams = ", ".join(f"observation.images.{c}" for c in
                     ("cam_high", "cam_low", "cam_left_wrist", "cam_right_wrist"))  # fmt: skip
    pick = ", ".join(f'"{c}"' for c in CHOSEN)
    assert err == (f"error: {aloha}/meta/info.json: 4 cameras ({cams}) for the model's 3 slots "
                   "(base, left_wrist, right_wrist); pick 3 with \"cameras\" in "
                   f"value_data.datasets[0], e.g. \"cameras\": [{pick}]\n")  # fmt: skip
    # no plan printed (nothing run); the frame-counted horizons in seconds at the data's rate
    assert out.splitlines() == [
        "advantages: compute_advantages.lookahead 10 frames = 0.2 s at 50 fps (aloha)",
        "policy: policy_data.action_horizon 5 frames = 0.1 s at 50 fps (aloha)",
    ]


def test_fourteen_dims_against_eight_dim_checkpoint_statistics(aloha, tmp_path, capsys):
    eight = QuantileStats(-np.ones(8), np.ones(8), np.zeros(8), np.ones(8))
    found = write_norm_stats(tmp_path / "ckpt", "aloha", {"state": eight, "action": eight})
    entry = {"name": "aloha", "root": str(aloha), "type": "sft", "cameras": CHOSEN}
    bind = f'policy:policy_data.checkpoint = "{tmp_path / "ckpt"}"'
    assert pipeline.main(args(entry, bind)) == 2
    _, err = capsys.readouterr()
    assert err == (f"error: {found}: the statistics have state 8 and action 8 dims, the data "
                   "(aloha) state 14 and action 14; use policy_data.norm_stats = \"data\" or a "
                   "checkpoint of this robot\n")  # fmt: skip
    # with the data's own statistics the same plan passes and prints the steps
    assert pipeline.main(args(entry, bind, 'policy:policy_data.norm_stats = "data"')) == 0
    out, _ = capsys.readouterr()
    steps = [line.split()[0] for line in out.splitlines() if ":" not in line.split()[0]]
    assert steps == ["returns", "value", "advantages", "policy"]
    # a checkpoint an earlier step or iteration writes is not there yet: left to its step
    later = f'policy:policy_data.checkpoint = "{tmp_path / "later"}"'
    assert pipeline.main(args(entry, later, 'policy:policy_data.norm_stats = "checkpoint"')) == 0
    out, _ = capsys.readouterr()
    assert (f"policy: policy_data.checkpoint {tmp_path / 'later'} not there yet; its statistics "
            "are checked when the step reads them") in out.splitlines()  # fmt: skip


def test_several_mismatches_are_one_line_each(aloha, tmp_path, capsys, caplog):
    wide = write_aloha(tmp_path / "wide", episodes=2, frames=4, dim=40, cameras=("cam_high",))
    entry = {"name": "aloha", "root": str(aloha), "type": "sft", "state_key": "joints"}
    extra = f'policy:policy_data.eval_datasets = [{{"name": "wide", "root": "{wide}"}}]'
    assert pipeline.main(args(entry, extra)) == 2
    _, err = capsys.readouterr()
    assert err == ("error: plan: 2 mismatches between the datasets and the configuration (one "
                   "line each above); nothing was run\n")  # fmt: skip
    lines = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert [line.split(": ")[1][:40] for line in lines] == [
        "state_key 'joints' (value_data.datasets[",
        "state 'observation.state' has 40 dims; t",
    ]

"""recap-init (#39): an experiment file for one's own LeRobot datasets, written from their
info.json, that plans with --dry_run once the model directories are bound."""

from __future__ import annotations

from pathlib import Path

import gin
import pytest

from recap.commands.init import main
from recap.data import lerobot
from recap.workflow import pipeline
from tests.aloha import write_aloha

MODELS = ['all:SIGLIP = "/m/siglip"', 'all:GEMMA = "/m/gemma"', 'all:TOKENIZER = "/m/tok.model"',
          'all:PI05_BASE = "/m/pi05"']  # fmt: skip


@pytest.fixture(autouse=True)
def _fresh():
    gin.clear_config()
    lerobot._SHOWN.clear()
    yield
    gin.clear_config()


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("init")
    write_aloha(root / "aloha", episodes=2, frames=4)
    write_aloha(root / "aloha_eval", episodes=2, frames=4)
    return root


def test_init_writes_an_experiment_that_plans(data, tmp_path, capsys):
    out = tmp_path / "my_experiment.gin"
    argv = [
        str(data / "aloha"),
        str(data / "aloha_eval"),
        "--eval",
        "aloha_eval",
        "--out",
        str(out),
    ]
    assert main(argv) == 0
    assert capsys.readouterr().out == (
        f"wrote {out}; plan it: recap-pipeline --gin_file {out} --dry_run\n"
    )
    text = out.read_text()
    for line in [
        f'pipeline.steps = {{\n    "returns": ["experiments/libero_returns.gin", "{out}"],',
        "SIGLIP = %gin.REQUIRED",
        "#   LeRobot v3.0, 50 fps, 2 episodes, 8 frames, robot_type 'aloha'",
        '#   tasks (2): "fold the towel"; "hand over the cube"',
        "#   camera observation.images.cam_low (video 32x32x3)",
        "#   slots: base=observation.images.cam_high, left_wrist=observation.images.cam_left_wrist,"
        " right_wrist=observation.images.cam_right_wrist (unused: observation.images.cam_low)",
        "#   state observation.state [14], action action [14] (at most 32 each)",
        '    "cameras": ["observation.images.cam_high", "observation.images.cam_left_wrist", '
        '"observation.images.cam_right_wrist"],',
        "DATASETS = [%ALOHA]",
        "EVAL_DATASETS = [%ALOHA_EVAL]",
        "compute_advantages.lookahead_s = 1\n",
        "policy_data.action_horizon = 50     # the policy's action chunk, as the model's",
        'policy_data.asset_id = "my_experiment"',
    ]:
        assert line in text, line
    # without the model directories the plan names the first one missing
    assert pipeline.main(["--gin_file", str(out), "--dry_run"]) == 2
    assert capsys.readouterr().err == (
        "error: pipeline step value: value_data.tokenizer_path is required (macro GEMMA is "
        "%gin.REQUIRED); bind it, e.g. --gin_param 'value:GEMMA = ...'; also unbound: SIGLIP\n"
    )
    params = [a for p in MODELS for a in ("--gin_param", p)]
    assert pipeline.main(["--gin_file", str(out), "--dry_run", *params]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines if " run " in line] == [
        "returns", "value", "advantages", "policy", "baseline"]  # fmt: skip
    assert "advantages: compute_advantages.lookahead_s 1 s = 50 frames at 50 fps (aloha)" in lines


def test_init_refusals(data, tmp_path, capsys):
    out = tmp_path / "x.gin"
    out.write_text("keep me")
    assert main([str(data / "aloha"), "--out", str(out)]) == 2
    assert capsys.readouterr().err == f"error: {out}: exists; pass --force to overwrite it or " \
        "choose another --out\n"  # fmt: skip
    assert out.read_text() == "keep me"
    assert main([str(data / "aloha"), "--eval", "other", "--out", str(tmp_path / "y.gin")]) == 2
    assert capsys.readouterr().err == "error: --eval: ['other'] not among the datasets ['aloha']\n"
    assert main([str(tmp_path / "none"), "--out", str(tmp_path / "y.gin")]) == 2
    err = capsys.readouterr().err
    assert err == (
        f"error: {tmp_path}/none/meta/info.json: file not found; point the dataset "
        "root at a LeRobot dataset folder (the one holding meta/ and data/)\n"
    )
    assert not (tmp_path / "y.gin").exists()

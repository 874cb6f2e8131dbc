"""One's own robot from configuration only (#39): an ALOHA-style LeRobot v3.0 dataset the test
writes (4 cameras of which 3 are chosen by binding, 14-dim state and action, 50 fps, two tasks,
video), its experiment file written by ``recap-init``, and Steps 1-4 at tiny sizes
(``rehearsal/tiny.gin``) on 2 DeepSpeed CPU ranks on ``recap.standins``' models, with gin
bindings only; the chosen keys are in the runs' logged config. The BC baseline is left out
(``pipeline.stages``): it reads the same keys through the same data path as the policy."""

from __future__ import annotations

import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from recap.commands.init import main as init
from tests.aloha import write_aloha
from tests.helpers import launch_env, tree_hashes


@pytest.fixture(scope="module")
def aloha_run(tmp_path_factory, fresh_standins):
    tmp = tmp_path_factory.mktemp("aloha_run")
    standins = fresh_standins(tmp / "standins")
    data = tmp / "data"
    write_aloha(data / "aloha", episodes=6, frames=12)
    write_aloha(data / "aloha_eval", episodes=2, frames=12)
    before = {p: tree_hashes(p) for p in (data / "aloha", data / "aloha_eval")}
    experiment = tmp / "aloha.gin"
    models = [
        "--siglip",
        str(standins.siglip),
        "--gemma",
        str(standins.gemma3),
        "--tokenizer",
        str(standins.tokenizer),
        "--pi05-base",
        str(standins.pi05_base),
    ]
    assert init([str(data / "aloha"), str(data / "aloha_eval"), "--eval", "aloha_eval",
                 "--out", str(experiment), "--ranks", "2", *models]) == 0  # fmt: skip
    runs = tmp / "runs"
    params = ['all:include "rehearsal/tiny.gin"', f'pipeline.run_root = "{runs}"',
              'pipeline.stages = ["returns", "value", "advantages", "policy"]']  # fmt: skip
    argv = [sys.executable, "-m", "recap.commands.pipeline", "--gin_file", str(experiment)]
    argv += [a for p in params for a in ("--gin_param", p)]
    done = subprocess.run(argv, cwd=tmp, env=launch_env(tmp), capture_output=True, text=True,
                          timeout=1500)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return tmp, data, runs, done.stdout, before


def test_steps_1_to_4_run_from_gin_bindings_only(aloha_run):
    tmp, data, runs, stdout, _ = aloha_run
    for stage in ("value", "policy"):
        (run,) = (runs / stage).iterdir()
        assert (run / "model.safetensors").is_file(), stage
    assert "] baseline (" not in stdout and not (runs / "baseline").exists()
    assert (data / "aloha" / "meta" / "returns.parquet").is_file()
    # Step 3 labelled every frame of the training set, with 1 s = 50 frames of look-ahead
    (sidecar,) = (data / "aloha" / "meta").glob("advantages_adv_*.parquet")
    assert pq.ParquetFile(sidecar).metadata.num_rows == 72
    assert "compute_advantages.lookahead_s 1 s = 50 frames at 50 fps (aloha)" in stdout
    # the chosen cameras and slot roles were printed, and are in the runs' logged config
    assert ("dataset aloha: cameras base=observation.images.cam_high, left_wrist=observation."
            "images.cam_left_wrist, right_wrist=observation.images.cam_right_wrist (bound); "
            "unused cameras: observation.images.cam_low") in stdout  # fmt: skip
    logged = [t for t in (p.read_text() for p in tmp.rglob("config.gin")) if t]
    assert len(logged) == 3  # value, advantages, policy (Step 1 logs no config)
    assert all("'observation.images.cam_right_wrist'" in t for t in logged)
    # the policy's statistics are this data's, filed under the experiment's asset id
    (stats,) = (runs / "policy").glob("*/assets/aloha/norm_stats.json")
    assert '"q01"' in stats.read_text()


def test_the_input_datasets_are_not_modified(aloha_run):
    """Only recap's sidecars (meta/returns_*, advantages_*, mixture_config.yaml) are added."""
    _, _, _, _, before = aloha_run
    sidecars = ("meta/returns", "meta/advantages_", "meta/mixture_config")
    for dataset, hashes in before.items():
        assert tree_hashes(dataset, sidecars) == hashes, dataset
        assert sorted(p.name for p in (dataset / "meta").glob("returns*")) == [
            "returns.json", "returns.parquet"]  # fmt: skip

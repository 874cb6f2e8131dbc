"""Bad input: one clear line on stderr, exit status 2."""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import gin
import pytest

from recap.cli import run_step
from recap.steps.train import train
from tests.engine.conftest import COMMON, run, run_env

REPO = Path(__file__).resolve().parents[2]
TOY = str(REPO / "gin" / "demo" / "toy.gin")


@pytest.fixture
def clean(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(key, raising=False)
    gin.clear_config()
    yield
    gin.clear_config()


def run_in_process(capsys, *params: str) -> str:
    argv = ["--gin_file", TOY, *[a for p in params for a in ("--gin_param", p)]]
    with pytest.raises(SystemExit) as exit_info:
        run_step(train, argv)
    assert exit_info.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    return lines[0]


def run_script(tmp_path: Path, *params: str) -> str:
    cmd = [sys.executable, str(REPO / "scripts" / "train.py"), "--gin_file", TOY]
    cmd += [a for p in params for a in ("--gin_param", p)]
    done = subprocess.run(cmd, cwd=tmp_path, env=run_env(tmp_path), capture_output=True, text=True)
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: ")
    return last


def test_unknown_gin_binding(tmp_path):
    line = run_script(tmp_path, "train.no_such_option = 1")
    assert "no_such_option" in line


def test_global_batch_not_divisible(clean, capsys, tmp_path):
    line = run_in_process(
        capsys, "deepspeed_config.global_batch_size = 10", f'train.run_dir = "{tmp_path}"'
    )
    assert "global_batch_size=10" in line and "multiple of 4" in line


def test_checkpoint_from_another_world_size_then_its_conversion_resumes(clean, capsys, two_rank):
    run_dir = two_rank["tmp"] / "world_change"
    shutil.copytree(two_rank["run_dir"] / "checkpoints", run_dir / "checkpoints")
    line = run_in_process(capsys, f'train.run_dir = "{run_dir}"')
    assert "world size 2" in line and "this run has 1" in line
    convert = shlex.split(re.search(r"'(python -m deepspeed[^']+)'", line).group(1))
    tmp = two_rank["tmp"]
    subprocess.run(
        [sys.executable, *convert[1:]], cwd=tmp, env=run_env(tmp), check=True, capture_output=True
    )
    params = [*COMMON, "train.max_steps = 10", f'train.run_dir = "{run_dir}"']
    cmd = [sys.executable, str(REPO / "scripts" / "train.py"), "--gin_file", TOY]
    done = run([*cmd, *[a for p in params for a in ("--gin_param", p)]], tmp)
    assert "world=1 start_step=8" in done.stdout
    state = json.loads((run_dir / "checkpoints" / "step_10" / "recap_state.json").read_text())
    assert state["world_size"] == 1 and state["step"] == 10


def test_missing_model_path(tmp_path):
    line = run_script(
        tmp_path,
        'toy_model.backbone_path = "/nonexistent/model"',
        f'train.run_dir = "{tmp_path / "run"}"',
    )
    assert "/nonexistent/model" in line and "backbone_path" in line

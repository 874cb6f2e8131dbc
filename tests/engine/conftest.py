"""Shared end-to-end runs of the toy model (each launch costs ~10-20 s, so they are shared).

- ``two_rank``: ``deepspeed --num_gpus 2`` (CPU accelerator, ZeRO-3), 8 steps with checkpoints at
  4 and 8; then the run is cut back to its step-4 checkpoint (as if killed after it) and the same
  command is started again, which resumes.
- ``sweep``: ``scripts/sweep.py`` with two single-process points that differ in lr; point 000 has
  the two-rank run's exact configuration (1 rank x 2 accumulation steps vs 2 ranks x 1).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from recap.ports import free_port
from tests.helpers import REPO, deepspeed_local, launch_env

PY = sys.executable
STEPS = 8
COMMON = [
    f"train.max_steps = {STEPS}",
    "train.log_every = 1",
    "train.eval_every = 4",
    "train.save_every = 4",
    "train_data/toy_data.num_examples = 128",
]


run_env = launch_env


def run(cmd: list[str], cwd: Path, timeout: int = 300) -> subprocess.CompletedProcess:
    done = subprocess.run(
        cmd, cwd=cwd, env=run_env(cwd), capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def read_metrics(path: Path) -> dict[tuple[int, str], dict]:
    """{(step, "train"|"eval"): record} from metrics.jsonl (last record wins)."""
    out = {}
    for line in path.read_text().splitlines():
        record = json.loads(line)
        out[(record["step"], "eval" if "eval/loss" in record else "train")] = record
    return out


def train_cmd(run_dir: Path, port: int) -> list[str]:
    params = [*COMMON, f'train.run_dir = "{run_dir}"']
    return [
        *deepspeed_local(2, port),
        str(REPO / "scripts/train.py"),
        "--gin_file",
        str(REPO / "gin/demo/toy.gin"),
        *[arg for p in params for arg in ("--gin_param", p)],
    ]


@pytest.fixture(scope="session")
def two_rank(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("two_rank")
    run_dir = tmp / "run"
    cmd = train_cmd(run_dir, free_port())
    first = run(cmd, tmp)
    full = read_metrics(run_dir / "metrics.jsonl")
    # as if killed right after the step-4 checkpoint: later files gone
    shutil.rmtree(run_dir / "checkpoints" / f"step_{STEPS}")
    (run_dir / "checkpoints" / "latest").write_text("step_4")
    (run_dir / "metrics.jsonl").unlink()
    (run_dir / "model.safetensors").unlink()
    second = run(cmd, tmp)
    resumed = read_metrics(run_dir / "metrics.jsonl")
    return {
        "tmp": tmp,
        "run_dir": run_dir,
        "full": full,
        "resumed": resumed,
        "logs": (first.stdout + first.stderr, second.stdout + second.stderr),
    }


@pytest.fixture(scope="session")
def sweep(two_rank) -> dict:
    tmp = two_rank["tmp"]
    spec = tmp / "sweep.yaml"
    spec.write_text(
        json.dumps(
            {
                "name": "test_sweep",
                "gin_files": [str(REPO / "gin/demo/toy.gin")],
                "gin_params": COMMON,
                "launcher": "python",
                "run_root": str(tmp / "sweeps"),
                "grid": {"deepspeed_config.lr": [1e-3, 2e-3]},
            }
        )
    )
    done = run([PY, str(REPO / "scripts/sweep.py"), str(spec)], tmp, timeout=400)
    root = tmp / "sweeps" / "test_sweep"
    return {"tmp": tmp, "spec": spec, "stdout": done.stdout, "runs": [root / "000", root / "001"]}

"""A non-editable install works without the checkout: the wheel built from this checkout ships
every gin file and the console scripts, and, installed into a fresh venv, runs from any directory.

The fresh venv reuses .venv's installed dependencies (torch, deepspeed, ...) through a path line
in a ``.pth`` file, which puts .venv's site-packages on ``sys.path`` without running the ``.pth``
files there (so not the editable-install hook that maps ``recap`` to this checkout). Offline: the
wheel is built with .venv's setuptools (no build isolation) and installed without dependencies.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from recap.workflow.stages import BY_NAME
from tests.helpers import REPO, copy_fixture, launch_env

GIN_SUFFIXES = (".gin", ".yaml", ".yml")
PROJECT_FILES = (".py", ".toml", ".cfg", ".md", ".in", ".txt")
CONSOLE_SCRIPTS = {
    "recap-pipeline": "recap.commands.pipeline:main",
    "recap-train": "recap.commands.train:main",
    "recap-returns": "recap.commands.compute_returns:main",
    "recap-advantages": "recap.commands.compute_advantages:main",
    "recap-relabel": "recap.commands.relabel:main",
    "recap-evaluate": "recap.commands.evaluate_policy:main",
    "recap-doctor": "recap.commands.doctor:main",
    "recap-plan-memory": "recap.commands.plan_memory:main",
    "recap-sweep": "recap.commands.sweep:main",
    "recap-demo-data": "recap.commands.make_demo_data:main",
    "recap-import": "recap.commands.import_rlinf:main",
    "recap-serve": "recap.commands.serve:main",
    "recap-collect": "recap.commands.collect:main",
}


def check(cmd: list, cwd: Path, env: dict | None = None, timeout: int = 120):
    done = subprocess.run(
        [str(c) for c in cmd], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, f"{cmd} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def build_wheel(tmp: Path) -> Path:
    """The wheel of this checkout. Built from a copy of its top-level files and ``recap/`` so the
    build leaves nothing (build/, egg-info) in the shared checkout and no stale build/ leaks in."""
    src = tmp / "src"
    src.mkdir()
    for path in REPO.iterdir():  # setup.py, pyproject.toml, README.md (setup.py reads it), ...
        if path.is_file() and (path.suffix in PROJECT_FILES or path.name.startswith("LICENSE")):
            shutil.copy2(path, src / path.name)
    shutil.copytree(
        REPO / "recap", src / "recap", ignore=shutil.ignore_patterns("__pycache__", "*.pyc")
    )
    dist = tmp / "dist"
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    pip_wheel = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation"]
    check([*pip_wheel, "--no-index", "-w", dist, "."], cwd=src, env=env)
    (wheel,) = dist.glob("recap-*.whl")
    return wheel


def purelib(python: Path) -> Path:
    """The site-packages directory of the interpreter ``python``."""
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    return Path(check([python, "-c", code], cwd=python.parent).stdout.strip())


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("install")
    wheel = build_wheel(tmp)
    venv = tmp / "venv"
    check([sys.executable, "-m", "venv", "--without-pip", venv], cwd=tmp)
    python = venv / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", python, "install", "-q", "--no-deps"]
    env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}
    check([*pip, "--no-index", wheel], cwd=tmp, env=env)
    # after the install (so pip saw an empty venv): .venv's dependencies, as plain path lines
    ours = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (purelib(python) / "_recap_test_deps.pth").write_text("".join(f"{p}\n" for p in sorted(ours)))
    run_env = launch_env(tmp)
    for key in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV"):
        run_env.pop(key, None)
    run_env["PATH"] = f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"
    run_env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    work = tmp / "work"  # outside the checkout
    work.mkdir()
    return {"tmp": tmp, "wheel": wheel, "venv": venv, "env": run_env, "work": work}


def test_wheel_ships_every_gin_file_and_the_console_scripts(installed):
    with zipfile.ZipFile(installed["wheel"]) as wheel:
        names = set(wheel.namelist())
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        entries = wheel.read(entry_points).decode()
    gin_dir = REPO / "recap" / "gin"
    packaged = sorted(
        f"recap/gin/{p.relative_to(gin_dir).as_posix()}"
        for p in gin_dir.rglob("*")
        if p.is_file() and p.suffix in GIN_SUFFIXES
    )
    assert len(packaged) > 20 and "recap/gin/demo/pipeline.gin" in packaged
    assert [n for n in packaged if n not in names] == []
    commands = {
        f"recap/commands/{v.split(':')[0].split('.')[-1]}.py" for v in CONSOLE_SCRIPTS.values()
    }
    assert commands <= names
    lines = {line.replace(" ", "") for line in entries.splitlines()}
    assert {f"{k}={v}" for k, v in CONSOLE_SCRIPTS.items()} <= lines
    assert all((installed["venv"] / "bin" / name).is_file() for name in CONSOLE_SCRIPTS)


def test_installed_recap_is_the_wheel_not_the_checkout(installed):
    code = "import recap, recap.cli; print(recap.__file__); print(recap.cli.GIN_DIR)"
    python = installed["venv"] / "bin" / "python"
    out = check([python, "-c", code], cwd=installed["work"], env=installed["env"]).stdout
    module, gin_dir = (Path(line) for line in out.split())
    assert module.is_relative_to(installed["venv"]) and gin_dir.is_relative_to(installed["venv"])
    assert not module.resolve().is_relative_to(REPO)
    assert (gin_dir / "demo" / "pipeline.gin").is_file()


def test_pipeline_dry_run_from_outside_the_checkout(installed):
    exe = installed["venv"] / "bin" / "recap-pipeline"
    done = check(
        [exe, "--gin_file", "demo/pipeline.gin", "--dry_run"],
        cwd=installed["work"],
        env=installed["env"],
    )
    lines = done.stdout.strip().splitlines()
    demo = ["returns", "value", "advantages", "sft", "finetune", "finetune_bc",
            "evaluate_finetune_bc", "evaluate_finetune"]  # fmt: skip
    assert [line.split()[0] for line in lines] == demo
    for line, stage in zip(lines, [BY_NAME[name] for name in demo], strict=True):
        launch = "--module" if stage.distributed else "-m"
        assert f" {launch} {stage.module} --gin_file " in line, line
    assert str(REPO) not in done.stdout and "scripts/" not in done.stdout


def test_returns_step_on_a_lerobot_dataset(installed):
    data = installed["tmp"] / "data"
    root = copy_fixture("rlinf_like_v21_video", data)
    exe = installed["venv"] / "bin" / "recap-returns"
    params = [
        f'compute_returns.data_root = "{data}"',
        'compute_returns.datasets = [{"name": "rlinf", "root": "rlinf_like_v21_video"}]',
    ]
    done = check(
        [exe, "--gin_file", "returns.gin", *[a for p in params for a in ("--gin_param", p)]],
        cwd=installed["work"],
        env=installed["env"],
    )
    sidecar = root / "meta" / "returns.parquet"
    assert sidecar.is_file(), done.stdout + done.stderr
    assert pq.ParquetFile(sidecar).metadata.num_rows == 71

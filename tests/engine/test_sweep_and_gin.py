"""Sweep files and the engine's gin files."""

from __future__ import annotations

from pathlib import Path

import gin
import pytest

import recap
import recap.steps.train  # noqa: F401  (registers the configurables)
from recap.cli import GIN_DIR, parse_gin, resolve_gin_file
from recap.commands import sweep
from recap.errors import RecapError


@pytest.fixture(autouse=True)
def clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


@pytest.mark.parametrize("name", ["engine.gin", "demo/toy.gin"])
def test_gin_files_parse(name):
    parse_gin([name], [])


def test_gin_names_resolve_in_the_package(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # any working directory
    assert GIN_DIR == Path(recap.__file__).resolve().parent / "gin"
    assert resolve_gin_file("demo/toy.gin") == str(GIN_DIR / "demo" / "toy.gin")
    with pytest.raises(RecapError, match="gin file not found") as err:
        resolve_gin_file("no/such.gin")
    assert str(GIN_DIR) in str(err.value) and "\n" not in str(err.value)


def test_grid_is_a_cartesian_product_in_file_order():
    assert sweep.points({"a": [1, 2], "b": ["x", "y"]}) == [
        {"a": 1, "b": "x"},
        {"a": 1, "b": "y"},
        {"a": 2, "b": "x"},
        {"a": 2, "b": "y"},
    ]


def test_point_params_name_the_run_and_tag_the_sweep():
    spec = {"name": "s", "gin_files": ["demo/toy.gin"], "gin_params": ["train.max_steps = 2"]}
    params = sweep.point_params(spec, 1, {"deepspeed_config.lr": 0.002}, [])
    assert params == [
        "train.max_steps = 2",
        "deepspeed_config.lr = 0.002",
        'train.run_dir = "runs/sweeps/s/001"',
        'Tracker.sweep_name = "s"',
        'Tracker.run_name = "s/001 lr=0.002"',
    ]


def test_dry_run_prints_one_launch_per_point(capsys):
    assert sweep.main(["sweeps/toy_lr.yaml", "--dry_run"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2 and all(" -m recap.commands.train " in line for line in lines)
    assert all("scripts/" not in line for line in lines)
    assert "deepspeed_config.lr = 0.0003" in lines[0] and "deepspeed_config.lr = 0.001" in lines[1]


def test_launches_name_the_train_module():
    spec = {"name": "s", "gin_files": ["demo/toy.gin"]}
    argv = sweep.command({**spec, "launcher": "deepspeed --num_gpus 2"}, ["a = 1"])
    module = argv.index("--module")
    assert argv[:3] == ["deepspeed", "--num_gpus", "2"] and "--master_port" in argv[:module]
    assert argv[module : module + 4] == [
        "--module",
        "recap.commands.train",
        "--gin_file",
        "demo/toy.gin",
    ]
    argv = sweep.command({**spec, "launcher": "python -u"}, [])
    assert argv[1:4] == ["-u", "-m", "recap.commands.train"]


def test_bad_sweeps_exit_2(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: x\ngin_files: [demo/toy.gin]\ngrid: {train.nope: [1]}\n")
    assert sweep.main([str(bad), "--dry_run"]) == 2
    assert "nope" in capsys.readouterr().err
    bad.write_text("name: x\ngin_files: [demo/toy.gin]\ngrids: {}\n")
    with pytest.raises(RecapError, match="unknown field"):
        sweep.load_sweep(str(bad))

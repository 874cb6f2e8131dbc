"""Several nodes: the pipeline's multi-node options reach every ``deepspeed`` command, and the
toy training on two simulated nodes (two DeepSpeed per-node launchers on this machine, one rank
each, so the second node's rank is global rank 1 with local rank 0) does every rank-0-only action
once and reproduces the single-node 2-rank run (``two_rank`` in conftest.py). The real steps
(value, Step 3, policy) on two simulated nodes: ``tests/test_rehearsal.py``."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest

from recap.errors import RecapError
from tests.engine.conftest import COMMON, STEPS, read_metrics
from tests.helpers import REPO, launch_two_nodes
from tests.test_pipeline import LIBERO_PARAMS, libero_argv

DISTRIBUTED = ("value", "advantages", "policy", "baseline")


def libero_dry_run(tmp_path: Path, capsys, *params: str) -> tuple[int, str, str]:
    from recap.workflow.pipeline import main

    code = main(libero_argv(tmp_path / "runs", [*LIBERO_PARAMS, *params]))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_a_hostfile_reaches_every_distributed_stage(tmp_path, capsys):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("node1 slots=8\nnode2 slots=8\n")
    code, out, err = libero_dry_run(
        tmp_path,
        capsys,
        f'pipeline.hostfile = "{hostfile}"',
        "pipeline.num_nodes = 2",
        'pipeline.master_addr = "node1"',
        'pipeline.multinode_launcher = "openmpi"',
    )
    assert code == 0, err
    lines = {line.split()[0]: line for line in out.splitlines()}
    assert list(lines) == ["returns", *DISTRIBUTED]
    flags = f"--hostfile {hostfile} --num_nodes 2 --master_addr node1 --launcher openmpi"
    for stage in DISTRIBUTED:
        assert "deepspeed --num_gpus 8 --master_port " in lines[stage]
        assert flags in lines[stage], lines[stage]
        assert lines[stage].index(flags) < lines[stage].index("--module recap.commands.")
    assert " -m recap.commands.compute_returns " in lines["returns"]
    assert "--hostfile" not in lines["returns"] and "deepspeed" not in lines["returns"]


def test_without_multinode_options_the_commands_are_unchanged(tmp_path, capsys):
    code, out, err = libero_dry_run(tmp_path, capsys)
    assert code == 0, err
    assert out.count("deepspeed --num_gpus 8 --master_port ") == len(DISTRIBUTED)
    for flag in ("--hostfile", "--num_nodes", "--master_addr", "--launcher"):
        assert flag not in out


@pytest.mark.parametrize(
    "param, message",
    [
        (
            'pipeline.multinode_launcher = "srun"',
            "error: pipeline.multinode_launcher: 'srun'; use one of ['pdsh', 'openmpi', "
            "'mvapich', 'slurm', 'impi'] (deepspeed --launcher)\n",
        ),
        (
            'pipeline.hostfile = "/nonexistent/hostfile"',
            "error: pipeline.hostfile: /nonexistent/hostfile is not a file; write one line per "
            "node, e.g. 'node1 slots=8'\n",
        ),
        ("pipeline.num_nodes = -1", "error: pipeline.num_nodes: -1; use >= 1 (0: every "),
    ],
)
def test_bad_multinode_option_is_one_line(tmp_path, capsys, param, message):
    code, out, err = libero_dry_run(tmp_path, capsys, param)
    assert code == 2
    assert out == ""
    assert err.startswith(message) and err.count("\n") == 1
    assert not (tmp_path / "runs").exists()


def test_multinode_options_need_the_deepspeed_launcher(tmp_path):
    from recap.workflow.pipeline import load_pipeline

    with pytest.raises(RecapError, match=r"launcher: 'python' runs one process; the multi-node"):
        load_pipeline(
            ["experiments/libero_pipeline.gin"],
            ['pipeline.launcher = "python"', "pipeline.ranks = 1", "pipeline.num_nodes = 2"],
        )


# ---- two simulated nodes ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def two_nodes(tmp_path_factory) -> dict:
    """The two_rank fixture's first training, as 2 nodes x 1 rank, both on this machine."""
    tmp = tmp_path_factory.mktemp("two_nodes")
    run_dir = tmp / "run"
    params = [*COMMON, f'train.run_dir = "{run_dir}"']
    args = ["--module", "recap.commands.train", "--gin_file", str(REPO / "gin/demo/toy.gin"),
            *[a for p in params for a in ("--gin_param", p)]]  # fmt: skip
    logs = launch_two_nodes(args, tmp, tmp / "train", timeout=300)
    return {"tmp": tmp, "run_dir": run_dir, "logs": logs}


def test_second_node_runs_global_rank_1_as_local_rank_0(two_nodes):
    node1 = two_nodes["logs"][1]
    assert "'node1': [1]" in node1  # DeepSpeed's global_rank_mapping for node 1
    assert "nnodes=2, num_local_procs=1, node_rank=1" in node1


def test_rank0_only_outputs_are_written_once(two_nodes, two_rank):
    run_dir = two_nodes["run_dir"]
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    keys = [(r["step"], "eval" if "eval/loss" in r else "train") for r in lines]
    assert len(keys) == len(set(keys)) == len(two_rank["full"])  # every record once
    assert sorted(keys) == sorted(two_rank["full"])
    assert (run_dir / "model.safetensors").stat().st_size > 0
    assert (run_dir / "checkpoints" / "latest").read_text().strip() == f"step_{STEPS}"
    # each global rank writes its own ZeRO-3 shard: the same files as the single-node run
    for step in (4, STEPS):
        mine = sorted(p.name for p in (run_dir / "checkpoints" / f"step_{step}").rglob("*"))
        theirs = (two_rank["run_dir"] / "checkpoints" / f"step_{step}").rglob("*")
        assert mine == sorted(p.name for p in theirs)
        assert any("rank_1" in name for name in mine)
    with sqlite3.connect(two_nodes["tmp"] / "mlflow.db") as db:
        ((runs,),) = db.execute("SELECT count(*) FROM runs").fetchall()
    assert runs == 1


def test_two_nodes_reproduce_the_single_node_losses(two_nodes, two_rank):
    mine = read_metrics(two_nodes["run_dir"] / "metrics.jsonl")
    full = two_rank["full"]
    for step in range(1, STEPS + 1):
        assert mine[(step, "train")]["train/loss"] == pytest.approx(
            full[(step, "train")]["train/loss"], rel=1e-6, abs=1e-9
        )
    for step in (4, STEPS):
        assert mine[(step, "eval")]["eval/loss"] == pytest.approx(
            full[(step, "eval")]["eval/loss"], rel=1e-6, abs=1e-9
        )

"""Shared test helpers: the LeRobot-written fixtures (tests/fixtures/lerobot), dataset hashes."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "lerobot"  # written by the real LeRobot library
FIXTURE_NAMES = ("libero_like_v30_images", "libero_like_v30_video", "rlinf_like_v21_video")


def fixture_dir(name: str) -> Path:
    path = FIXTURES / name
    assert path.is_dir(), f"LeRobot fixture {name} missing from {FIXTURES}"
    return path


def copy_fixture(name: str, dest: Path) -> Path:
    """A writable copy of a fixture dataset under ``dest``."""
    out = dest / name
    shutil.copytree(fixture_dir(name), out)
    for p in [out, *out.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    return out


def tree_hashes(root: Path, exclude_prefix: tuple[str, ...] = ()) -> dict[str, str]:
    """sha256 of every file under ``root`` (relative posix path -> digest)."""
    out = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root).as_posix()
        if p.is_file() and not rel.startswith(exclude_prefix):
            out[rel] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def launch_env(root: Path) -> dict[str, str]:
    """Environment of a training/inference subprocess (plain or under the deepspeed launcher):
    CPU accelerator, MLflow in ``root``, no inherited rank variables, one thread per process."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(
        DS_ACCELERATOR="cpu",
        MLFLOW_TRACKING_URI=f"sqlite:///{root / 'mlflow.db'}",
        PYTHONWARNINGS="ignore",
        OMP_NUM_THREADS="1",
        TOKENIZERS_PARALLELISM="false",
    )
    return env


def world_info(hosts: dict[str, list[int]]) -> str:
    """DeepSpeed's runner encoding of ``{host: [local device ids]}`` for ``launch --world_info``."""
    import base64
    import json

    return base64.urlsafe_b64encode(json.dumps(hosts).encode()).decode()


def node_launcher(hosts: dict[str, list[int]], port: int, node_rank: int = 0) -> list[str]:
    """DeepSpeed's per-node launcher (``deepspeed.launcher.launch``) as its runner starts it on
    host number ``node_rank`` of ``hosts``, master on loopback; append ``SCRIPT ARGS`` or
    ``--module MODULE ARGS``."""
    import sys

    return [sys.executable, "-u", "-m", "deepspeed.launcher.launch",
            f"--world_info={world_info(hosts)}", f"--node_rank={node_rank}",
            "--master_addr=127.0.0.1", f"--master_port={port}"]  # fmt: skip


def deepspeed_local(ranks: int, port: int) -> list[str]:
    """The command ``deepspeed --num_gpus RANKS --master_port PORT`` runs on one node: DeepSpeed's
    per-node launcher with the runner's world info (``node_launcher``). The same launcher and
    ranks as the ``deepspeed`` command, without the runner process in front, which imports
    DeepSpeed only to start it (~3 s a launch on 2 CPU cores); the runner itself is exercised by
    the pipeline's tests (tests/test_rehearsal.py)."""
    return node_launcher({"localhost": list(range(ranks))}, port)


def launch_two_nodes(args: list[str], cwd: Path, logs: Path, timeout: int = 600) -> list[str]:
    """``deepspeed ARGS`` (``--module MODULE ...`` or ``SCRIPT ...``) as two simulated nodes of
    one rank each: the per-node launcher DeepSpeed's runner starts on every host
    (``deepspeed.launcher.launch --node_rank N``), twice on this machine, master on loopback, so
    the second node's process is global rank 1 with local rank 0. Asserts both exit 0; returns
    the two nodes' logs (also in ``{logs}.node0.log`` / ``.node1.log``)."""
    import subprocess

    from recap.ports import free_port

    hosts, port = {"node0": [0], "node1": [0]}, free_port()
    paths = [logs.with_name(f"{logs.name}.node{node}.log") for node in (0, 1)]
    procs = []
    try:
        for node, path in enumerate(paths):
            cmd = [*node_launcher(hosts, port, node_rank=node), *args]
            with open(path, "w") as log:  # the child keeps its own descriptor
                procs.append(subprocess.Popen(cmd, cwd=cwd, env=launch_env(cwd), stdout=log,
                                              stderr=subprocess.STDOUT))  # fmt: skip
        codes = [proc.wait(timeout=timeout) for proc in procs]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    texts = [path.read_text() for path in paths]
    assert codes == [0, 0], f"two-node run failed {codes}:\n{texts[0][-3000:]}\n{texts[1][-3000:]}"
    return texts


@contextlib.contextmanager
def one_rank_here(stdout: io.StringIO | None = None) -> Iterator[None]:
    """Run a distributed step as one rank in this process, as a launched rank would: no
    launcher variables, the CPU accelerator, one torch thread (OMP_NUM_THREADS=1 of the
    launcher); gin cleared before and after, the process group torn down, stdout captured."""
    import gin
    import pytest
    import torch

    threads = torch.get_num_threads()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(stdout or io.StringIO()):
        for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
            mp.delenv(key, raising=False)
        mp.setenv("DS_ACCELERATOR", "cpu")
        torch.set_num_threads(1)
        gin.clear_config()
        try:
            yield
        finally:
            torch.set_num_threads(threads)
            gin.clear_config()
            if torch.distributed.is_initialized():
                torch.distributed.destroy_process_group()

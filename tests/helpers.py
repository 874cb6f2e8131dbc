"""Shared test helpers: the LeRobot-written fixtures (tests/fixtures/lerobot), dataset hashes."""

from __future__ import annotations

import hashlib
import os
import shutil
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

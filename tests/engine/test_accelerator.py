"""Device code stays in recap/engine/accelerator.py; TensorFlow is never imported."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

from recap.engine import accelerator

REPO = Path(__file__).resolve().parents[2]
CUDA_API = "torch." + "cuda"  # spelled apart so this file does not match itself
NPU_PATCH = "transfer_" + "to_npu"


def python_files(*dirs: str) -> list[Path]:
    return [p for d in dirs for p in sorted((REPO / d).rglob("*.py"))]


def test_cuda_api_only_in_accelerator_module():
    allowed = REPO / "recap" / "engine" / "accelerator.py"
    offenders = [p for p in python_files("recap") if p != allowed and CUDA_API in p.read_text()]
    assert offenders == []


def test_no_global_npu_patch_anywhere():
    files = python_files("recap", "scripts", "bench", "tests") + sorted((REPO / "gin").rglob("*"))
    offenders = [p for p in files if p.is_file() and NPU_PATCH in p.read_text()]
    assert offenders == []


def test_importing_recap_engine_never_imports_tensorflow(tmp_path):
    # A stand-in TensorFlow that transformers would detect as installed.
    (tmp_path / "tensorflow").mkdir()
    (tmp_path / "tensorflow" / "__init__.py").write_text("__version__ = '2.15.0'\n")
    meta = tmp_path / "tensorflow-2.15.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: tensorflow\nVersion: 2.15.0\n")
    code = (
        "import sys, recap, recap.engine, recap.engine.trainer, recap.steps.train\n"
        "from recap.models.toy import toy_model\n"
        "toy_model()\n"
        "assert 'tensorflow' not in sys.modules, 'tensorflow was imported'\n"
        "import tensorflow; assert tensorflow.__version__ == '2.15.0'\n"
    )
    env = {**os.environ, "PYTHONPATH": str(tmp_path), "PYTHONWARNINGS": "ignore"}
    for key in ("USE_TF", "TRANSFORMERS_NO_TF", "USE_TORCH"):
        env.pop(key, None)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]


def test_cpu_accelerator_selected_by_env():
    assert os.environ["DS_ACCELERATOR"] == accelerator.select_accelerator() == "cpu"
    assert accelerator.name() == "cpu"
    assert accelerator.comm_backend() == "gloo"
    assert accelerator.device() == torch.device("cpu")
    assert accelerator.supports_bf16() is False


def test_seed_everything_is_reproducible():
    accelerator.seed_everything(7)
    first = torch.rand(3)
    accelerator.seed_everything(7)
    assert torch.equal(first, torch.rand(3))


def test_to_device_moves_nested_tensors_and_keeps_the_rest():
    batch = {"a": torch.ones(2), "b": [torch.zeros(1), "text"], "c": 3}
    moved = accelerator.to_device(batch, torch.device("cpu"))
    assert torch.equal(moved["a"], batch["a"]) and moved["b"][1] == "text" and moved["c"] == 3


def test_memory_stats_and_synchronize_never_raise():
    accelerator.synchronize()
    assert all(v >= 0 for v in accelerator.memory_stats().values())


def test_cpu_ranks_share_the_cores(monkeypatch):
    import torch

    from recap.engine import accelerator

    monkeypatch.setenv("DS_ACCELERATOR", "cpu")
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.setattr(accelerator.os, "sched_getaffinity", lambda pid: set(range(8)))
    before = torch.get_num_threads()
    try:
        assert accelerator.share_cpu_cores(2) == 4 and torch.get_num_threads() == 4
        assert accelerator.share_cpu_cores(16) == 1
        assert accelerator.share_cpu_cores(1) is None  # one rank keeps torch's default
        monkeypatch.setenv("OMP_NUM_THREADS", "3")
        assert accelerator.share_cpu_cores(2) is None  # the user's setting wins
    finally:
        torch.set_num_threads(before)

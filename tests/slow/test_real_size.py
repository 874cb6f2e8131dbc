"""Real-size models on CPU with random weights (``make test-slow``; skipped by ``make test``).

Parameter counts against the published sizes, one bf16 value-model step and one bf16 π0.5 loss
+ 2-step sample at batch 1, and a 2-rank ZeRO-3 construction whose per-rank parameter memory is
about half of the model. Timings, counts and peak memory are printed (run with ``-s``).
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import gin
import pytest
import torch

from recap.ports import free_port

REPO = Path(__file__).resolve().parents[2]
DEEPSPEED = str(Path(sys.executable).with_name("deepspeed"))
VALUE_GIN = ["value.gin", "models/value_real.gin"]
PI05_GIN = ["experiments/libero_pi05.gin"]
TOLERANCE = 0.01  # counts within 1% of the published sizes
PROMPT = 20

pytestmark = pytest.mark.slow


class PeakRSS:
    """Peak resident memory (GiB) of this process while the block runs, sampled every 20 ms."""

    def __init__(self):
        self.peak = 0.0
        self._stop = threading.Event()

    def _rss(self) -> float:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**30

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, self._rss())

    def __enter__(self) -> PeakRSS:
        self.peak = self._rss()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self._rss())


@contextlib.contextmanager
def timed(label: str, times: dict[str, float]):
    start = time.perf_counter()
    yield
    times[label] = round(time.perf_counter() - start, 1)


def report(name: str, **fields) -> None:
    print(f"\n[slow] {name}: " + json.dumps(fields), flush=True)


def gin_model_fn(files: list[str], params: list[str] = ()):
    """The gin config's ``train.model_fn`` (a zero-argument builder)."""
    import recap.models.pi05  # noqa: F401  (registers pi05_policy)
    import recap.steps.train  # noqa: F401  (registers value_model)
    from recap.cli import parse_gin

    gin.clear_config()
    parse_gin(files, list(params))
    return gin.query_parameter("train.model_fn").scoped_configurable_fn


def meta_model(files: list[str], params: list[str] = ()) -> torch.nn.Module:
    from recap.engine.memory import build_on_meta

    return build_on_meta(gin_model_fn(files, params))


def numel(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def assert_near(count: int, published: float, what: str) -> None:
    assert abs(count - published) <= TOLERANCE * published, f"{what}: {count:,} vs {published:,}"


@contextlib.contextmanager
def default_dtype(dtype: torch.dtype):
    """Build new modules directly in ``dtype`` (no float32 copy of the large parts)."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(old)


def camera_batch(size: int, vocab: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Batch 1: 3 camera slots at ``size`` px in [-1, 1] (bf16), a ``PROMPT``-token prompt."""
    return {
        "images": (torch.rand(1, 3, 3, size, size, generator=generator) * 2 - 1).bfloat16(),
        "image_masks": torch.ones(1, 3, dtype=torch.bool),
        "input_ids": torch.randint(0, vocab, (1, PROMPT), generator=generator),
        "attention_mask": torch.ones(1, PROMPT, dtype=torch.bool),
    }


@pytest.fixture(autouse=True)
def free_memory():
    yield
    gin.clear_config()
    gc.collect()


def test_parameter_counts_match_the_published_sizes():
    from transformers import AutoModel

    value = meta_model(VALUE_GIN)
    full = meta_model(VALUE_GIN, ["value_model.truncate_backbone = False"])
    with torch.device("meta"):
        gemma3 = AutoModel.from_config(full.config.text_config())
    pi05 = meta_model(PI05_GIN)
    counts = {
        "value_truncated": numel(value),
        "value_full": numel(full),
        "siglip_so400m_vision": numel(value.vision_tower),
        "gemma3_270m": numel(gemma3),
        "pi05": numel(pi05),
        "pi05_gemma_2b": numel(pi05.paligemma_with_expert.language_model),
        "pi05_gemma_300m_expert": numel(pi05.paligemma_with_expert.gemma_expert),
    }
    report("parameter counts", **counts)
    for key, published in [("value_truncated", 604.5e6), ("value_full", 682.5e6),
                           ("siglip_so400m_vision", 412e6), ("gemma3_270m", 268e6),
                           ("pi05", 3.35e9)]:  # fmt: skip
        assert_near(counts[key], published, key)


def test_value_model_bf16_forward_backward_batch1():
    from recap.models.value import build_value_model

    times: dict[str, float] = {}
    config = meta_model(VALUE_GIN).config
    with PeakRSS() as rss:
        with timed("build_s", times):
            model = build_value_model(config, dtype=torch.bfloat16).train()
        batch = camera_batch(224, 262144, torch.Generator().manual_seed(0))
        batch["target"] = torch.tensor([-0.3023])
        with timed("forward_s", times):
            loss, metrics = model(batch)
        with timed("backward_s", times):
            loss.mean().backward()
    grads = [p.grad for p in model.parameters() if p.requires_grad]
    report("value model bf16 batch 1", params=numel(model), loss=float(loss.detach().mean()),
           peak_rss_gib=round(rss.peak, 2), **times)  # fmt: skip
    assert (
        torch.isfinite(loss).all() and 4.0 < float(loss.detach().mean()) < 8.0
    )  # ~ ln 201 at init
    assert all(g is not None and torch.isfinite(g.float()).all() for g in grads)
    assert model.vision_tower.embeddings.patch_embedding.weight.grad.abs().sum() > 0
    del model, loss, metrics, grads


def test_pi05_bf16_loss_and_two_step_sample_batch1():
    from recap.models.pi05 import build_pi05

    times: dict[str, float] = {}
    config = meta_model(PI05_GIN).config
    with PeakRSS() as rss:
        with timed("build_s", times), default_dtype(torch.bfloat16):
            model = build_pi05(config, dtype=torch.bfloat16).eval()
        generator = torch.Generator().manual_seed(0)
        batch = camera_batch(224, 257152, generator)
        batch["actions"] = torch.randn(1, config.action_horizon, config.action_dim)
        with timed("loss_s", times), torch.no_grad():
            loss, _ = model(batch)
        with timed("sample_2_steps_s", times):
            actions = model.sample_actions(batch, num_steps=2)
    report("pi05 bf16 batch 1", params=numel(model), loss=float(loss.detach().mean()),
           peak_rss_gib=round(rss.peak, 2), **times)  # fmt: skip
    assert torch.isfinite(loss).all()
    assert actions.shape == (1, config.action_horizon, config.action_dim)
    assert torch.isfinite(actions).all()
    del model, loss, actions


def test_zero3_two_ranks_partition_the_value_model_at_construction():
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env.update(DS_ACCELERATOR="cpu", PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    cmd = [DEEPSPEED, "--num_gpus", "2", "--master_port", str(free_port()),
           str(REPO / "tests/slow/zero3_build.py")]  # fmt: skip
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    records = [json.loads(line.split("ZERO3 ", 1)[1])
               for line in done.stdout.splitlines() if "ZERO3 {" in line]  # fmt: skip
    report("zero3 2 ranks", wall_s=round(time.perf_counter() - start, 1), ranks=records)
    assert sorted(r["rank"] for r in records) == [0, 1]
    for r in records:
        assert r["partitioned_numel"] > 0.97 * r["full"]  # all but projector, expert, head
        assert 0.45 <= r["local"] / r["full"] <= 0.6, r
        assert_near(r["full"], 604.5e6, "value model under ZeRO-3")

"""A tiny exported π0.5 policy (openpi layout + norm stats + tokenizer) and a server on it."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

from recap.data.conditioning import QuantileStats
from recap.data.transforms import write_word_tokenizer
from recap.models.checkpoints import write_norm_stats
from tests.models.test_pi05 import tiny_model

TASK = "pick up the bowl"
WORDS = [f"Task: {TASK}, State: ;\nAction: Advantage: positive negative put it"]
STATE_Q01, STATE_Q99 = [-1.0, 0.0, 2.0], [1.0, 4.0, 3.0]
ACTION_Q01, ACTION_Q99 = [-1.0, -2.0, 0.0, 0.5, -0.5], [1.0, 2.0, 3.0, 1.5, 0.5]


def write_policy(directory: Path, seed: int = 0) -> Path:
    """save_pi05 of the tiny test model (image 28 px, horizon 4, action dim 6), its statistics
    (state 3 dims, actions 5) under assets/robot/, a word tokenizer beside them."""
    tiny_model(seed).save_pretrained(directory)
    stats = {
        "state": QuantileStats(np.array(STATE_Q01), np.array(STATE_Q99)),
        "action": QuantileStats(np.array(ACTION_Q01), np.array(ACTION_Q99)),
    }
    write_norm_stats(directory, "robot", stats)
    write_word_tokenizer(directory, WORDS)
    return directory


def observation(seed: int = 0, **extra) -> dict:
    """An openpi LIBERO-style observation: 32x40 base and wrist images, state [3], prompt."""
    rng = np.random.default_rng(seed)
    return {
        "observation/image": rng.integers(0, 256, (32, 40, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(0, 256, (28, 28, 3), dtype=np.uint8),
        "observation/state": rng.uniform(-1.0, 3.0, 3).astype(np.float32),
        "prompt": TASK,
        **extra,
    }


@pytest.fixture(scope="session")
def policy_dir(tmp_path_factory) -> Path:
    return write_policy(tmp_path_factory.mktemp("policy"))


@pytest.fixture(scope="session")
def served(policy_dir):
    from recap.serve.load import load_served

    return load_served(policy_dir, beta=1.5, device="cpu")


@pytest.fixture(scope="module")
def server(served):
    from recap.serve.server import BackgroundServer, ServerConfig

    with BackgroundServer(served, ServerConfig(port=0, batch_wait_ms=2.0)) as running:
        yield running


def wait_until(condition, limit: float = 60.0) -> bool:
    """Poll ``condition()`` every 20 ms until it holds (True) or ``limit`` seconds pass (False)."""
    deadline = time.monotonic() + limit
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True

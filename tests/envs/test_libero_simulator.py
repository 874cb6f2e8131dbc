"""LIBERO's real simulator through recap's adapter, where it is installed with its scene assets.

It never runs on this project's machines or CI: the ``hf-libero`` wheel ships the BDDL and
initial-state files but not the scene assets, which LIBERO fetches from the Hub on first use. A
machine that has them (``pip install hf-libero``, the assets in place and ``~/.libero/config.yaml``
or ``$LIBERO_CONFIG_PATH`` pointing at them) runs task 0 of libero_10 for a few steps:

    pytest tests/envs/test_libero_simulator.py -rs

Elsewhere the test is skipped with one line saying what is missing. The adapter's conventions
against a stand-in with LIBERO's observation dict are tests/envs/test_libero.py's.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from recap.envs.libero import CAMERAS, LiberoEnv, load_libero
from recap.errors import RecapError


def libero_or_skip():
    """LIBERO's modules, or a skip naming what is missing (the module, its config, the assets)."""
    try:
        lib = load_libero()
    except RecapError as exc:
        pytest.skip(f"no LIBERO simulator here: {exc}")
    assets = Path(lib.get_libero_path("assets"))
    if not assets.is_dir() or not any(assets.iterdir()):
        pytest.skip(f"no LIBERO simulator here: LIBERO's scene assets are not at {assets} (its "
                    "config.yaml 'assets'); put them there")  # fmt: skip
    return lib


def test_a_few_steps_of_libero_10_task_0():
    lib = libero_or_skip()
    env = LiberoEnv("libero_10", 0, resolution=64, num_steps_wait=2, max_steps=3, backend=lib)
    try:
        obs = env.reset(0)
        assert set(obs["images"]) == set(CAMERAS)
        assert all(im.shape == (64, 64, 3) and im.dtype == np.uint8
                   for im in obs["images"].values())  # fmt: skip
        assert obs["state"].shape == (8,) and np.isfinite(obs["state"]).all()
        assert obs["task"] == env.task and env.task
        dones = []
        for _ in range(3):  # the gripper closes, nothing moves: no success, done at the limit
            obs, success, done = env.step(np.array([0, 0, 0, 0, 0, 0, -1], np.float32))
            dones.append(done)
            assert not success and np.isfinite(obs["state"]).all()
        assert dones == [False, False, True]
    finally:
        env.close()


def test_missing_assets_skip_with_one_line_naming_where(tmp_path, monkeypatch):
    """With LIBERO installed but its assets absent, the skip says where they belong."""
    import types

    import tests.envs.test_libero_simulator as here

    paths = {"assets": str(tmp_path / "assets")}
    fake = types.SimpleNamespace(get_libero_path=paths.__getitem__)
    monkeypatch.setattr(here, "load_libero", lambda: fake)
    with pytest.raises(pytest.skip.Exception) as skipped:
        libero_or_skip()
    assert str(skipped.value) == (
        f"no LIBERO simulator here: LIBERO's scene assets are not at {tmp_path / 'assets'} (its "
        "config.yaml 'assets'); put them there"
    )
    (tmp_path / "assets").mkdir()
    (tmp_path / "assets" / "scenes").mkdir()
    assert libero_or_skip() is fake

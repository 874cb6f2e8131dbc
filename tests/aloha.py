"""An ALOHA-style LeRobot v3.0 dataset written by the tests: four cameras (``cam_high``,
``cam_low``, ``cam_left_wrist``, ``cam_right_wrist``), 14-dim state/action, 50 fps, two tasks."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from recap.data.lerobot_writer import Episode, WriterConfig, write_lerobot_dataset

CAMERAS = ("cam_high", "cam_low", "cam_left_wrist", "cam_right_wrist")
TASKS = ("fold the towel", "hand over the cube")
DIM, FPS = 14, 50
CHOSEN = ["observation.images.cam_high", "observation.images.cam_left_wrist",
          "observation.images.cam_right_wrist"]  # fmt: skip


def write_aloha(
    root: Path,
    episodes: int = 4,
    frames: int = 12,
    image_dtype: str = "video",
    dim: int = DIM,
    fps: int = FPS,
    cameras: tuple[str, ...] = CAMERAS,
) -> Path:
    """Write the dataset at ``root`` (deterministic; episodes alternate tasks and outcomes)."""
    rng = np.random.default_rng(0)

    def episode(i: int) -> Episode:
        images = {c: rng.integers(0, 255, (frames, 32, 32, 3), dtype=np.uint8) for c in cameras}
        state = rng.normal(size=(frames, dim)).astype(np.float32)
        action = rng.normal(size=(frames, dim)).astype(np.float32)
        return Episode(images, state, action, TASKS[i % 2], success=i % 2 == 0)

    config = WriterConfig(version="v3.0", image_dtype=image_dtype, fps=fps, robot_type="aloha")
    write_lerobot_dataset(root, (episode(i) for i in range(episodes)), config)
    return root

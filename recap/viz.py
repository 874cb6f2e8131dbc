"""Pictures a person would rather look at than numbers (matplotlib, the ``viz`` extra).

Each function returns a matplotlib Figure; the engine logs it to MLflow as a PNG. matplotlib is
imported lazily with the Agg backend, so nothing here needs a display.
"""

from __future__ import annotations

import numpy as np
import torch


def _pyplot():
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt

    return plt


def value_curves(dataset, outputs: dict[str, torch.Tensor], max_episodes: int = 6):
    """Predicted vs target value along the first frames' episodes of each eval dataset.

    ``dataset.episode_keys()`` gives (dataset index, episode, frame) per item, in the order of
    ``outputs["predicted_value"]`` / ``outputs["target_value"]``.
    """
    plt = _pyplot()
    source, episode, frame = dataset.episode_keys()
    pred = outputs["predicted_value"].float().numpy()
    target = outputs["target_value"].float().numpy()
    keys = np.unique(np.stack([source, episode], axis=1), axis=0)[:max_episodes]
    cols = min(3, len(keys)) or 1
    rows = max(1, -(-len(keys) // cols))
    fig, axes = plt.subplots(rows, cols, figsize=(4 * cols, 2.6 * rows), squeeze=False)
    for ax, (s, e) in zip(axes.flat, keys.tolist()):
        sel = np.flatnonzero((source == s) & (episode == e))
        sel = sel[np.argsort(frame[sel])]
        ax.plot(frame[sel], target[sel], label="target", color="black")
        ax.plot(frame[sel], pred[sel], label="predicted", color="tab:orange")
        name = dataset.sources[s].spec.name
        ax.set_title(f"{name} episode {e}", fontsize=9)
        ax.set_ylim(-1.05, 0.05)
    for ax in axes.flat[len(keys) :]:
        ax.axis("off")
    axes.flat[0].legend(fontsize=8)
    fig.supxlabel("frame")
    fig.supylabel("normalized value")
    fig.tight_layout()
    return fig

"""Pictures a person would rather look at than numbers (matplotlib, the ``viz`` extra).

Each function returns a matplotlib Figure; the engine logs it to MLflow as a PNG. matplotlib is
imported lazily with the Agg backend, so nothing here needs a display.
"""

from __future__ import annotations

from itertools import zip_longest

import numpy as np
import pyarrow as pa
import torch

from recap.core import columns as C

THUMBNAILS = 5


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


# ---- Step 3: advantages ---------------------------------------------------------------------

MAX_LABELED_THRESHOLDS = 6


def advantage_histogram(
    advantages: dict[str, np.ndarray], thresholds: dict[str, float], bins: int = 60
):
    """Distribution of the continuous advantage (stacked per dataset) with the threshold(s).

    ``advantages``: dataset name -> float[n]; ``thresholds``: group key -> threshold (one line
    each; many per-task thresholds are drawn thin and unlabeled)."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 3.8))
    edges = np.histogram_bin_edges(np.concatenate(list(advantages.values())), bins=bins)
    ax.hist(list(advantages.values()), bins=edges, stacked=True, label=list(advantages))
    many = len(thresholds) > MAX_LABELED_THRESHOLDS
    for i, (key, value) in enumerate(thresholds.items()):
        label = None if many else f"threshold ({key}): {value:.4g}"
        style = {"lw": 0.6, "alpha": 0.5} if many else {"lw": 1.4, "ls": ("-", "--", ":")[i % 3]}
        ax.axvline(value, color="black", label=label, **style)
    if many:
        ax.plot([], [], color="black", lw=0.6, label=f"{len(thresholds)} per-group thresholds")
    ax.set_xlabel("advantage A_t (normalized)")
    ax.set_ylabel("frames")
    ax.set_title("advantage distribution; frames at or right of the threshold are positive")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def positive_rate_per_episode(
    rates: np.ndarray, success: np.ndarray, positive_quantile: float | None = None
):
    """Fraction of positive frames of every episode, sorted, coloured by the episode's outcome.

    ``rates``: float[E] in [0, 1]; ``success``: bool[E]."""
    from matplotlib.patches import Patch

    plt = _pyplot()
    order = np.argsort(rates, kind="stable")
    colors = np.where(np.asarray(success)[order], "tab:green", "tab:red")
    fig, ax = plt.subplots(figsize=(7.5, 3.4))
    x = np.arange(order.size)
    ax.bar(x, np.asarray(rates)[order], width=1.0, color=colors)
    ax.scatter(x, np.full(order.size, -0.035), c=colors, marker="|", s=40)  # outcome strip
    handles = [Patch(color="tab:green", label="successful"), Patch(color="tab:red", label="failed")]
    if positive_quantile is not None:
        line = ax.axhline(positive_quantile, color="black", ls="--", lw=1.0)
        line.set_label(f"positive quantile {positive_quantile:g}")
        handles.append(line)
    ax.set_xlim(-0.5, order.size - 0.5)
    ax.set_ylim(-0.07, 1.02)
    ax.set_xlabel("episode (sorted by positive rate)")
    ax.set_ylabel("positive frames")
    ax.legend(handles=handles, fontsize=8, loc="upper left")
    fig.tight_layout()
    return fig


def episode_curves(episodes: list[dict]):
    """Value and advantage along a few episodes, positive frames shaded, key frames below.

    Each entry: ``title``; ``frame`` int[T]; ``value``, ``advantage`` float[T]; ``label``
    bool[T]; ``threshold`` float; ``thumbnails`` [(frame, uint8[H, W, 3])] from the base camera.
    """
    plt = _pyplot()
    fig, axes = plt.subplots(len(episodes), 1, figsize=(8, 3.4 * len(episodes)), squeeze=False)
    for ax, ep in zip(axes[:, 0], episodes):
        frame = np.asarray(ep["frame"])
        ax.plot(frame, ep["value"], color="tab:blue", label="value V(o_t)")
        ax.plot(frame, ep["advantage"], color="tab:orange", label="advantage A_t")
        ax.axhline(ep["threshold"], color="tab:orange", ls="--", lw=0.8, label="threshold")
        ax.fill_between(frame, 0, 1, where=np.asarray(ep["label"]), step="mid", alpha=0.15,
                        color="tab:green", transform=ax.get_xaxis_transform(),
                        label="positive")  # fmt: skip
        ax.set_xlim(frame[0] - 0.5, frame[-1] + 0.5)
        ax.set_title(ep["title"], fontsize=9)
        _thumbnails(ax, ep["thumbnails"], frame[-1] - frame[0] + 1)
    axes[0, 0].legend(fontsize=7, ncol=4, loc="upper right")
    axes[-1, 0].set_xlabel("frame")
    fig.subplots_adjust(hspace=0.95, bottom=0.16 / len(episodes) + 0.06, top=0.95)
    return fig


def _thumbnails(ax, thumbnails: list, span: float) -> None:
    """Small images under the x axis of ``ax``, centred on their frames."""
    width = span / max(len(thumbnails) + 1, 4)
    for frame, image in thumbnails:
        box = [frame - width / 2, -0.78, width, 0.5]
        inset = ax.inset_axes(box, transform=ax.get_xaxis_transform())
        inset.imshow(image)
        inset.set_axis_off()


def advantage_figures(parts: dict, outcomes: dict, traces: list[dict], record: dict) -> dict:
    """Step 3's figures by name: advantage histogram, positive rate per episode, episode curves.

    ``parts``: dataset name -> advantages sidecar; ``outcomes``: name -> (episode ids int64[E]
    sorted, success bool[E]); ``traces``: ``advantage_episodes``; ``record``: labeling record."""
    rates, success = [], []
    for name, part in parts.items():
        ids, ok = outcomes[name]
        code = np.searchsorted(ids, part.column(C.EPISODE_INDEX).to_numpy())
        label = part.column(C.ADVANTAGE).to_numpy(zero_copy_only=False)
        rates.append(np.bincount(code, label, ids.size) / np.bincount(code, None, ids.size))
        success.append(ok)
    advantages = {n: p.column(C.ADVANTAGE_CONTINUOUS).to_numpy() for n, p in parts.items()}
    figures = {
        "advantage_histogram": advantage_histogram(advantages, record["thresholds"]),
        "positive_rate_per_episode": positive_rate_per_episode(
            np.concatenate(rates), np.concatenate(success), record["positive_quantile"]
        ),
    }
    if traces:
        figures["episode_curves"] = episode_curves(traces)
    return figures


def advantage_episodes(data, parts: dict, outcomes: dict, returns: list, record: dict, count: int):
    """``episode_curves`` entries for ``count`` episodes of Step 3's output, successes and
    failures in turn (rollout datasets first), key frames from each dataset's base camera.

    ``data``: the ``ValueDataset`` inferred; ``parts``: dataset name -> advantages sidecar;
    ``outcomes``: name -> (episode ids, success); ``returns``: the returns sidecars (prompts);
    ``record``: the labeling record (thresholds)."""
    order = sorted(range(len(data.sources)), key=lambda i: data.sources[i].spec.type == C.SFT)
    pools: dict[bool, list] = {True: [], False: []}
    for i in order:
        ids, ok = outcomes[data.sources[i].spec.name]
        for episode, success in zip(ids.tolist(), ok.tolist(), strict=True):
            pools[success].append((i, episode, success))
    chosen = [x for pair in zip_longest(pools[True], pools[False]) for x in pair if x][:count]
    return [_trace(data.sources[i], parts, returns[i], record, e, ok) for i, e, ok in chosen]


def _trace(source, parts: dict, returns: pa.Table, record: dict, episode: int, ok: bool):
    name = source.spec.name
    part = parts[name]
    rows = np.flatnonzero(part.column(C.EPISODE_INDEX).to_numpy() == episode)
    names = (C.FRAME_INDEX, C.VALUE_CURRENT, C.ADVANTAGE_CONTINUOUS, C.ADVANTAGE)
    column = {k: part.column(k).to_numpy(zero_copy_only=False)[rows] for k in names}
    frame = column[C.FRAME_INDEX]
    first = int(np.argmax(returns.column(C.EPISODE_INDEX).to_numpy() == episode))
    prompt = returns.column(C.PROMPT)[first].as_py()
    thresholds = record["thresholds"]
    threshold = thresholds.get("all", thresholds.get(name, thresholds.get(prompt, np.nan)))
    picks = np.unique(np.linspace(frame[0], frame[-1], THUMBNAILS).round().astype(np.int64))
    keys = source.frames.columns
    at = np.flatnonzero((keys[C.EPISODE_INDEX] == episode) & np.isin(keys[C.FRAME_INDEX], picks))
    at = at[np.argsort(keys[C.FRAME_INDEX][at])]
    images = source.frames.dataset.frames(source.frames.key_map.cameras[0], at)
    label = column[C.ADVANTAGE]
    return {
        "title": f"{name} episode {episode} ({'success' if ok else 'failure'}): "
        f"{int(label.sum())}/{label.size} frames positive",
        "frame": frame, "value": column[C.VALUE_CURRENT], "label": label,
        "advantage": column[C.ADVANTAGE_CONTINUOUS], "threshold": threshold,
        "thumbnails": list(zip(keys[C.FRAME_INDEX][at].tolist(), images)),
    }  # fmt: skip


def close(figure) -> None:
    """Release a figure (pyplot keeps every figure alive until it is closed)."""
    _pyplot().close(figure)

"""Advantage prompts, label dropout modes, label lookup, π0.5 prompt text, quantile stats."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest
import torch

from recap.data import conditioning as cond
from recap.data.lerobot import LocalDataset
from recap.errors import RecapError
from tests.helpers import copy_fixture, fixture_dir

N = 10_000
LABELS = np.arange(N) % 10 < 3  # 30% positive


def draws(mode: str, seed: int = 0, prob: float | None = None) -> torch.Tensor:
    return cond.draw_conditional(LABELS, mode, prob, torch.Generator().manual_seed(seed))


def test_advantage_prompts():
    assert (
        cond.advantage_prompt("pick up the bowl", True) == "pick up the bowl\nAdvantage: positive"
    )
    assert (
        cond.advantage_prompt("pick up the bowl", False) == "pick up the bowl\nAdvantage: negative"
    )
    assert cond.advantage_prompt("pick up the bowl", None) == "pick up the bowl"


def test_paper_mode_drops_30_percent_of_all_frames():
    conditional = draws(cond.PAPER)
    assert int((~conditional).sum()) == 2951  # seed 0; ~ Binomial(10000, 0.3): 3000 +- 46
    assert abs(float((~conditional[LABELS]).float().mean()) - 0.3) < 0.03  # positives alike
    assert abs(float((~conditional[~LABELS]).float().mean()) - 0.3) < 0.03  # negatives alike
    assert torch.equal(conditional, draws(cond.PAPER))  # deterministic for a seed
    assert not torch.equal(conditional, draws(cond.PAPER, seed=1))


def test_positive_only_mode():
    conditional = draws(cond.POSITIVE_ONLY)
    assert not conditional[~LABELS].any()  # negatives always get the plain prompt
    assert int(conditional.sum()) == 2686  # seed 0: 314 of 3000 positives dropped (~10%)
    assert int(draws(cond.POSITIVE_ONLY, prob=0.0).sum()) == 3000


def test_condition_tasks_texts():
    tasks = ["open the drawer"] * 4
    labels = np.array([True, False, True, False])
    texts, conditional = cond.condition_tasks(tasks, labels, cond.PAPER, prob=0.0)
    assert conditional.all() and texts[1] == "open the drawer\nAdvantage: negative"
    texts, conditional = cond.condition_tasks(tasks, labels, cond.POSITIVE_ONLY, prob=0.0)
    assert texts == ["open the drawer\nAdvantage: positive", "open the drawer"] * 2
    assert conditional.tolist() == [True, False, True, False]
    texts, _ = cond.condition_tasks(tasks, labels, cond.PAPER, prob=1.0)
    assert texts == tasks
    with pytest.raises(RecapError, match="mode 'rlinf'"):
        cond.draw_conditional(labels, "rlinf")


def test_pi05_prompt_with_discretized_state():
    state = np.array([-1.0, 0.0, 1.0, 0.5, -3.0, 3.0])
    assert cond.discretize_state(state).tolist() == [0, 128, 255, 192, -1, 255]  # openpi's bins
    prompt = cond.pi05_prompt("Pick_up the bowl\nAdvantage: positive", state[:3])
    assert prompt == ("Task: Pick up the bowl Advantage: positive, State: 0 128 255;\nAction: ",)
    lerobot = cond.pi05_prompt("Pick_up the bowl\nAdvantage: positive", state[:3], "lerobot")
    assert lerobot == prompt  # with state both systems write the same text
    assert cond.pi05_prompt(" open_it\n") == ("open it", "\n")
    assert cond.pi05_prompt(" open_it\n", None, "lerobot") == ("Task: open it;\nAction: ",)
    with pytest.raises(RecapError, match=r"^policy_data.prompt_style: 'rlinf' is not one of "
                       r"\['openpi', 'lerobot'\]$"):  # fmt: skip
        cond.pi05_prompt("a", None, "rlinf")


def test_conditioned_prompts_and_padding():
    states = np.array([[-1.0, 1.0], [0.0, 0.0]])
    texts = [cond.conditioned_prompt(t, lab, s) for t, lab, s in zip(["a_b", "c"], [True, False],
                                                                    states)]  # fmt: skip
    assert texts == [
        ("Task: a b Advantage: positive, State: 0 255;\nAction: ",),
        ("Task: c Advantage: negative, State: 128 128;\nAction: ",),
    ]
    assert cond.conditioned_prompt("c", None, states[1]) == ("Task: c, State: 128 128;\nAction: ",)
    assert (cond.conditioned_prompt("c", True, None, "lerobot"),
            cond.conditioned_prompt("c", None, None, "lerobot")) == (
        ("Task: c Advantage: positive;\nAction: ",), ("Task: c;\nAction: ",))  # fmt: skip
    padded, mask = cond.pad_last(torch.ones(2, 3, 7), 32)
    assert padded.shape == (2, 3, 32) and int(mask.sum()) == 7 and float(padded[..., 7:].sum()) == 0
    with pytest.raises(RecapError, match="33 dims"):
        cond.pad_last(np.ones(33), 32)


def advantages_table(episodes, frames, labels) -> pa.Table:
    return pa.table(
        {
            "episode_index": pa.array(episodes, pa.int64()),
            "frame_index": pa.array(frames, pa.int64()),
            "advantage": pa.array(labels, pa.bool_()),
        }
    )


def test_lookup_labels_joins_on_episode_and_frame():
    table = advantages_table([1, 0, 0, 1, 2], [0, 1, 0, 1, 0], [True, False, True, False, True])
    labels = cond.lookup_labels(np.array([0, 0, 1, 1]), np.array([0, 1, 0, 1]), table, "adv.pq")
    assert labels.tolist() == [True, False, True, False]  # episode 2 is an extra row: allowed
    with pytest.raises(
        RecapError,
        match=r"^adv.pq: no advantage label for \(episode_index=1, "
        r"frame_index=2\) \(1 of 3 frames unlabeled\)",
    ):
        cond.lookup_labels(np.array([0, 1, 1]), np.array([0, 1, 2]), table, "adv.pq")
    duplicated = advantages_table([0, 0], [3, 3], [True, True])
    with pytest.raises(RecapError, match="duplicate row for .episode_index=0, frame_index=3"):
        cond.lookup_labels(np.array([0]), np.array([3]), duplicated, "adv.pq")


def test_dataset_labels_names_the_missing_tag(tmp_path):
    (tmp_path / "meta").mkdir()
    with pytest.raises(RecapError, match=r"advantages_v1\.parquet.*tag 'v1' not found"):
        cond.dataset_labels(tmp_path, "v1", np.array([0]), np.array([0]))


def test_quantile_normalization_is_openpi_unclipped_and_round_trips():
    stats = cond.QuantileStats(q01=np.array([0.0, -2.0]), q99=np.array([1.0, 2.0]))
    x = np.array([[0.5, 0.0], [2.0, -4.0], [-1.0, 6.0]])  # rows 2-3 outside [q01, q99]
    y = cond.normalize_quantile(x, stats)
    # (x - q01) / (q99 - q01 + 1e-6) * 2 - 1, not clipped: 2 -> 3, -4 -> -2, -1 -> -3, 6 -> 3
    expected = [[0.0, 0.0], [3.0, -2.0], [-3.0, 3.0]]
    np.testing.assert_allclose(y, expected, atol=1e-5)
    assert y[1, 0] == (2.0 - 0.0) / (1.0 + 1e-6) * 2.0 - 1.0  # openpi's formula, bit for bit
    padded = np.concatenate([y, np.full((3, 1), 0.7)], axis=1)  # a padded third dim, dropped
    back = cond.unnormalize_quantile(padded, stats)
    assert back.shape == (3, 2)
    np.testing.assert_allclose(back, x, atol=1e-9)  # outside values come back too
    back_t = cond.unnormalize_quantile(torch.tensor(padded), stats)
    torch.testing.assert_close(back_t, torch.tensor(x), atol=1e-9, rtol=0)
    assert torch.allclose(cond.normalize_quantile(torch.tensor(x), stats), torch.tensor(y))
    bins = cond.discretize_state(y[:, 0])  # below -1 -> bin -1, above 1 -> 255 (openpi)
    assert bins.tolist() == [127, 255, -1]  # the 1e-6 puts the midpoint at -1e-6: bin 127


def test_quantile_stats_from_stats_json_or_columns(tmp_path):
    with LocalDataset(fixture_dir("libero_like_v30_images")) as ds:
        written = json.loads((ds.root / "meta" / "stats.json").read_text())
        key = "observation.state"
        stats = cond.quantile_stats(ds, [key])[key]
        assert np.allclose(stats.q01, written[key]["q01"])
    root = copy_fixture("libero_like_v30_images", tmp_path)
    (root / "meta" / "stats.json").unlink()
    with LocalDataset(root) as ds:
        computed = cond.quantile_stats(ds, [key, "action"])
        values = np.stack(ds.read_columns([key]).column(key).to_numpy(zero_copy_only=False))
    assert np.allclose(computed[key].q01, np.quantile(values, 0.01, axis=0))
    assert computed["action"].q99.shape == (7,)

"""`make demo`'s pipeline (gin/demo/pipeline.gin, RLinf's recipe), planned only: the sft stage
feeds both fine-tunes, the labels force the demonstrations positive, both arms are evaluated on
the same 200 episodes, and the summary prints the paired difference with its interval."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recap.workflow.bindings import lines
from recap.workflow.pipeline import load_pipeline, plan, split_params
from recap.workflow.report import (
    PAIRED_SEED,
    paired,
    paired_line,
    summary_figure,
    summary_metrics,
    summary_table,
)

DEMO = ["returns", "value", "advantages", "sft", "finetune", "finetune_bc",
        "evaluate_finetune_bc", "evaluate_finetune"]  # fmt: skip
TUNED = {"sft", "finetune", "finetune_bc", "evaluate_finetune", "evaluate_finetune_bc"}


def planned(*params: str):
    own, scoped = split_params(list(params))
    config = load_pipeline(["demo/pipeline.gin"], own)
    return config, plan(config, scoped)


@pytest.fixture(scope="module")
def demo():
    return planned()


def test_the_demo_runs_rlinfs_recipe_in_this_order(demo):
    config, items = demo
    assert config.name == "demo" and config.stages == DEMO and config.ranks == 2
    assert config.evaluate is True


def test_the_sft_stage_feeds_both_fine_tunes_and_their_evaluations(demo):
    _, items = demo
    sft = items["sft"].run_dir
    assert str(sft) == f"runs/pipeline/sft/{items['sft'].short}"
    base = [f'pi05_policy.checkpoint = "{sft}"', f'policy_data.checkpoint = "{sft}"']
    tag = f'policy_data.advantages_tag = "adv_{items["advantages"].short}"'
    assert lines(items["finetune"].stage.inputs(items)) == [tag, *base]
    assert lines(items["finetune_bc"].stage.inputs(items)) == base
    assert lines(items["evaluate_finetune"].stage.inputs(items)) == [tag, *base]
    assert lines(items["evaluate_finetune_bc"].stage.inputs(items)) == base
    for name in ("finetune", "finetune_bc", "evaluate_finetune", "evaluate_finetune_bc"):
        assert all(b in items[name].params for b in base), name


def test_an_sft_binding_reruns_both_fine_tunes_only(demo):
    _, items = demo
    before = {name: item.fingerprint for name, item in items.items()}
    _, changed = planned("sft:train.max_steps = 7")
    assert {n for n in before if changed[n].fingerprint != before[n]} == TUNED
    _, dropout = planned("finetune:policy_data.dropout = 0.3")
    assert {n for n in before if dropout[n].fingerprint != before[n]} == {
        "finetune", "evaluate_finetune"}  # fmt: skip


def test_the_recipes_bindings(demo):
    _, items = demo
    assert "compute_advantages.force_sft_positive = True" in items["advantages"].params
    assert items["sft"].params[:2] == ['DEMO_DATA = "demo_state"',
                                       'DEMO_TOKENIZER = "demo_state/tokenizer"']  # fmt: skip
    evaluate = ["evaluate_policy.num_episodes = 200", "evaluate_policy.betas = [1.0, 2.0]",
                "evaluate_policy.batch_size = 200"]  # fmt: skip
    for name in ("evaluate_finetune", "evaluate_finetune_bc"):
        assert items[name].params[2:5] == evaluate
    assert items["evaluate_finetune"].files == ["demo/finetune_rlinf.gin"]
    assert items["evaluate_finetune_bc"].files == ["demo/finetune_bc.gin"]


def test_the_paired_line_is_formatted_from_its_numbers():
    row = {"arm": "finetune", "label": "RECAP", "baseline": "finetune_bc",
           "baseline_label": "BC", "beta": "1", "rate": 0.625, "baseline_rate": 0.49,
           "episodes": 200, "mean": 0.135, "low": 0.06, "high": 0.2104}  # fmt: skip
    assert paired_line(row) == (
        "RECAP (finetune, beta 1) 0.625 vs BC (finetune_bc) 0.490 on the same 200 held-out "
        "episodes: +0.135 [+0.060, +0.210] (paired 95% bootstrap interval over the episodes)"
    )


def report(items) -> dict[str, dict]:
    """The demo's stages finished with figures written by hand: 8 episodes, RECAP wins 6 (5 of
    them where BC wins too), BC 5 at beta 1."""
    recap_b1, recap_b2, bc = (
        [1, 1, 1, 1, 1, 1, 0, 0],
        [1, 1, 1, 0, 0, 0, 0, 0],
        [1, 1, 1, 1, 1, 0, 0, 0],
    )
    results = {
        "returns": {"frames": 1200},
        "value": {"train/loss": 1.2, "eval/value_spearman": 0.65,
                  "eval/value_spearman_untrained": 0.03},
        "advantages": {"frames": 1200, "positive_fraction": 0.5},
        "sft": {"train/loss": 0.02},
        "finetune": {"train/loss": 0.05},
        "finetune_bc": {"train/loss": 0.04},
        "evaluate_finetune_bc": {"success": {"beta_1": 0.625}, "num_episodes": 8,
                                 "outcomes": {"beta_1": bc}},
        "evaluate_finetune": {"success": {"beta_1": 0.75, "beta_2": 0.375}, "num_episodes": 8,
                              "outcomes": {"beta_1": recap_b1, "beta_2": recap_b2}},
    }  # fmt: skip
    return {name: {"status": "ran", "wall_s": 10.0 + i, "fingerprint": item.fingerprint,
                   "run_dir": str(item.run_dir) if item.run_dir else None,
                   "result": results[name]}
            for i, (name, item) in enumerate(items.items())}  # fmt: skip


def test_the_summary_prints_both_rates_with_the_paired_interval(demo):
    config, items = demo
    rows = paired(report(items))
    assert [(r["beta"], r["rate"], r["baseline_rate"], r["mean"], r["episodes"]) for r in rows] == [
        ("1", 0.75, 0.625, 0.125, 8), ("2", 0.375, 0.625, -0.25, 8)]  # fmt: skip
    assert all(r["low"] <= r["mean"] <= r["high"] for r in rows)
    assert (rows[0]["low"], rows[0]["high"]) == (0.0, 0.375)  # one episode of 8 differs: 1/8 steps
    lines = summary_table(config, report(items), "sqlite:///mlflow.db").splitlines()
    assert lines[0] == (
        "pipeline 'demo': value eval Spearman 0.650 (untrained 0.030), positive fraction 0.500, "
        "finetune loss 0.05, finetune_bc success (beta 1) 0.62, finetune success (beta 1) 0.75"
    )
    assert lines[-4:-1] == [paired_line(rows[0]), paired_line(rows[1]), PAIRED_SEED]
    assert PAIRED_SEED.startswith("one training seed: ")
    assert "python bench/recap_vs_bc.py --arms sft_rlinf" in PAIRED_SEED
    metrics = summary_metrics(report(items))
    assert metrics["paired/finetune-finetune_bc/beta_1"] == 0.125
    assert metrics["paired/finetune-finetune_bc/beta_1_high"] == 0.375
    assert metrics["success/finetune_bc/beta_1"] == 0.625


def test_the_summary_picture(tmp_path, demo):
    _, items = demo
    sidecar = tmp_path / "rollout" / "meta" / "advantages_adv_x.parquet"
    sidecar.parent.mkdir(parents=True)
    pq.write_table(pa.table({"episode_index": [0, 0, 1, 1, 2, 2],
                             "frame_index": [0, 1, 0, 1, 0, 1],
                             "value_current": [-0.5, -0.2, -0.9, -1.0, -0.1, 0.0],
                             "return": [-0.4, 0.0, -1.0, -1.0, -0.2, 0.0]}), sidecar)  # fmt: skip
    entries = report(items)
    entries["advantages"]["outputs"] = {str(sidecar): [0, 0]}
    png = summary_figure(entries, tmp_path / "out" / "pipeline.png")
    assert png == tmp_path / "out" / "pipeline.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert summary_figure({k: entries[k] for k in DEMO[:6]}, tmp_path / "none.png") is None
    assert not (tmp_path / "none.png").exists()

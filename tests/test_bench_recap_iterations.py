"""bench/recap_iterations.py's table, intervals and RESULT line on hand-made loop outcomes (no
training): points per setting, paired differences with the point before, the target's test."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "recap_iterations.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("recap_iterations", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def outcomes(rate: float, episodes: int, seed: int) -> list[int]:
    """``episodes`` outcomes with exactly round(rate * episodes) successes, spread evenly."""
    wins = round(rate * episodes)
    row = np.zeros(episodes, dtype=int)
    row[np.linspace(0, episodes - 1, wins).astype(int)] = 1 if wins else 0
    return np.roll(row, seed).tolist()


def results(rates: dict, seeds=(0, 1, 2), episodes=200) -> dict:
    """rates: setting -> [bc, iter 1, iter 2] (the same bc for every setting)."""
    out = {}
    for setting, (bc, first, second) in rates.items():
        for seed in seeds:
            out[(seed, setting)] = {
                "bc": outcomes(bc, episodes, seed), 1: outcomes(first, episodes, seed),
                2: outcomes(second, episodes, seed), "wall_s": 100.0,
                "collect_1": {"success": 0.25, "corrections": 10 if setting == "corrected" else 0},
                "collect_2": {"success": 0.5, "corrections": 4 if setting == "corrected" else 0},
            }  # fmt: skip
    return out


def args(seeds=(0, 1, 2), episodes=200, settings=("plain", "corrected")) -> SimpleNamespace:
    return SimpleNamespace(seeds=list(seeds), episodes=episodes, iterations=2,
                           collect_episodes=100, settings=list(settings))  # fmt: skip


def test_points_differences_and_a_met_target(bench):
    lines, figures = bench.summarize(
        results({"plain": (0.2, 0.25, 0.25), "corrected": (0.2, 0.5, 0.8)}), args()
    )
    assert [line.split(" | ")[0].strip() for line in lines[1:6]] == [
        "bc", "plain iter 1", "plain iter 2", "corrected iter 1", "corrected iter 2"]  # fmt: skip
    points = figures["points"]
    assert points["bc"]["mean"] == pytest.approx(0.2)
    assert points["corrected iter 1"]["vs_previous"]["mean"] == pytest.approx(0.3)
    assert points["corrected iter 2"]["vs_previous"]["mean"] == pytest.approx(0.3)
    assert points["plain iter 2"]["vs_previous"]["mean"] == pytest.approx(0.0)
    assert lines[4].startswith("corrected iter 1 |  0.500 |  0.500 |  0.500 | 0.500 | [")
    assert lines[4].endswith(" vs bc") and lines[5].endswith(" vs iter 1")
    assert "collect corrected iter 1: success 0.250 mean over seeds, corrected frames 30" in lines
    assert figures["wall_s"] == 600.0
    result = bench.result_line(figures, args(), 601.2)
    assert result.startswith("RESULT: seeds=3 episodes=200 collect=100 bc=0.200 plain_iter1=0.250 "
                             "plain_iter1_minus_previous=+0.050 plain_iter1_ci=[")  # fmt: skip
    assert "met_plain=no" in result and "met_corrected=yes" in result
    assert result.endswith(f'wall_s=601 target="{bench.TARGET}" met=yes')


def test_overlapping_intervals_or_too_few_seeds_do_not_meet_it(bench):
    rates = {"plain": (0.2, 0.5, 0.8)}
    _, figures = bench.summarize(results(rates, seeds=(0, 1)), args((0, 1), settings=["plain"]))
    assert not bench.meets(figures, "plain", args((0, 1), settings=["plain"]))  # 2 seeds
    _, figures = bench.summarize(results(rates, episodes=20), args(episodes=20, settings=["plain"]))
    assert not bench.meets(figures, "plain", args(episodes=20, settings=["plain"]))
    close = {"plain": (0.2, 0.22, 0.24)}  # steps of 2 points over 600 episodes overlap
    _, figures = bench.summarize(results(close), args(settings=["plain"]))
    assert not bench.meets(figures, "plain", args(settings=["plain"]))


def test_settings_must_share_the_baseline(bench):
    out = results({"plain": (0.2, 0.3, 0.4), "corrected": (0.3, 0.3, 0.4)})
    with pytest.raises(SystemExit, match="the corrected loop's baseline differs"):
        bench.summarize(out, args())


def test_the_loop_bindings_name_the_seed_setting_and_budget(bench):
    a = SimpleNamespace(episodes=200, iterations=2, collect_episodes=100, policy_init="finetune",
                        state_targets=True, value_steps=500, policy_steps=1000,
                        baseline_steps=3000, ranks=2, base_work=None)  # fmt: skip
    params = bench.loop_params(1, "corrected", a)
    assert params[:3] == [
        'pipeline.run_root = "runs/s1"',
        'pipeline.name = "iterations-s1-corrected"',
        "pipeline.evaluate = True",
    ]
    assert "iterate.expert = True" in params and "iterate.state_targets = True" in params
    assert "policy:train.seed = 1" in params and "baseline:train.max_steps = 3000" in params
    assert params[-2:] == ['policy:include "demo/state.gin"', 'baseline:include "demo/state.gin"']
    assert "iterate.expert = False" in bench.loop_params(1, "plain", a)
    a.ranks = 1
    assert bench.loop_params(0, "plain", a)[-2:] == ["pipeline.ranks = 1",
                                                     'pipeline.launcher = "python"']  # fmt: skip


def base_args(base: Path) -> SimpleNamespace:
    return SimpleNamespace(episodes=200, iterations=2, collect_episodes=200,
                           policy_init="retrain", state_targets=True, value_steps=500,
                           policy_steps=1000, baseline_steps=3000, ranks=2, base_work=base,
                           base_steps=3000, base_data="demo")  # fmt: skip


def test_the_expert_first_loop_starts_from_bcsft_in_rlinfs_recipe(bench, tmp_path):
    a = base_args(tmp_path)
    missing = r"bcsft_s1_3000: no model.safetensors; run bench/recap_vs_bc.py --work .* --arms "
    with pytest.raises(SystemExit, match=missing + "bcsft --seeds 1 first"):
        bench.loop_params(1, "plain", a)
    start = tmp_path / "runs" / "bcsft_s1_3000"
    start.mkdir(parents=True)
    (start / "model.safetensors").write_bytes(b"")
    params = bench.loop_params(1, "plain", a)
    assert params[-7:] == [
        "pipeline.steps = {'returns': ['demo/returns.gin'], 'value': ['demo/value.gin'], "
        "'advantages': ['demo/advantages.gin'], 'policy': ['demo/finetune.gin'], "
        "'baseline': ['demo/policy_bc.gin']}",
        'pipeline.stages = ["returns", "value", "advantages", "policy", "evaluate_policy"]',
        f'iterate.start_run = "{start}"',
        f'policy:BASE_POLICY = "{start}"',
        "policy:policy_data.dropout = 0.1",
        'policy:policy_data.label_position = "action"',
        "advantages:compute_advantages.force_sft_positive = True",
    ]
    assert 'iterate.policy_init = "retrain"' in params  # each iteration from bcsft: the paper's
    assert bench.base_run("sft_bc", 2, a) == tmp_path / "runs" / "sft_bc_s2_bcsft3000_ft1000"
    a.base_data = "sft"  # the paper's loop: the demonstrations and the policy's own episodes
    own = bench.loop_params(1, "plain", a)
    sft = '[{"name": "sft", "root": "sft", "type": "sft"}]'
    assert own[-10:-7] == [f"value:value_data.datasets = {sft}",
                           f"advantages:compute_advantages.datasets = {sft}",
                           f"policy:policy_data.datasets = {sft}"]  # fmt: skip
    assert own[-7:] == params[-7:]


def test_the_reference_runs_must_be_evaluated_on_the_loops_episodes(bench, tmp_path):
    import json

    a = base_args(tmp_path)
    run = tmp_path / "runs" / "sft_bc_s0_bcsft3000_ft1000"
    run.mkdir(parents=True)
    record = {"success": {"beta_1": 2 / 3}, "num_episodes": 3, "seed": 1000,
              "outcomes": {"beta_1": [1, 0, 1]}}  # fmt: skip
    (run / "closed_loop.json").write_text(json.dumps(record))
    assert bench.reference_outcomes("sft_bc", 0, a, {"num_episodes": 3, "seed": 1000}) == [1, 0, 1]
    other = (r"closed_loop.json: 3 episodes from layout seed 1000, the loop evaluates 3 from "
             r"2000; rerun that arm with --episodes 3$")  # fmt: skip
    with pytest.raises(SystemExit, match=other):
        bench.reference_outcomes("sft_bc", 0, a, {"num_episodes": 3, "seed": 2000})
    with pytest.raises(SystemExit, match=r"bcsft_s0_3000/closed_loop.json not found"):
        bench.reference_outcomes("bcsft", 0, a, {"num_episodes": 3, "seed": 1000})


def test_the_more_sft_control_is_a_row_and_each_iterations_difference_with_it(bench):
    out = results({"plain": (0.5, 0.6, 0.7), "corrected": (0.5, 0.65, 0.75)})
    for key in out:
        out[key]["control"] = outcomes(0.6, 200, key[0])
    lines, figures = bench.summarize(out, args())
    assert lines[6].startswith("more SFT         |  0.600 |  0.600 |  0.600 | 0.600 | [")
    assert lines[6].endswith(" vs bc")
    assert figures["points"]["more SFT"]["vs_bc"]["mean"] == pytest.approx(0.1)
    assert figures["points"]["plain iter 1"]["vs_control"]["mean"] == pytest.approx(0.0)
    assert figures["points"]["corrected iter 2"]["vs_control"]["mean"] == pytest.approx(0.15)
    assert lines[7].startswith("plain iter 1 vs more SFT: +0.000 [")
    assert lines[10].startswith("corrected iter 2 vs more SFT: +0.150 [")
    assert lines[11].startswith("collect plain iter 1: ")
    result = bench.result_line(figures, args(), 5.0)
    assert " bc=0.500 more_sft=0.600 plain_iter1=0.600 " in result
    assert " plain_iter1_ci=[" in result and " plain_iter1_minus_more_sft=+0.000 " in result
    assert " corrected_iter2_minus_more_sft=+0.150 met_corrected=yes " in result
    del out[(2, "plain")]["control"]  # a seed without the control: no control lines
    lines, _ = bench.summarize(out, args())
    assert not any("more SFT" in line for line in lines)

"""bench/recap_vs_bc.py's table and RESULT line on hand-made records (no training): the LoRA vs
full fine-tuning rows (issue #26) next to the validity figures, and each arm's training cost."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench" / "recap_vs_bc.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("recap_vs_bc", BENCH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# seeds 0 and 1, four paired episodes each, beta 1 only
OUTCOMES = {
    "bc": [[0, 0, 1, 0], [0, 1, 0, 0]],  # 0.25
    "recap": [[1, 0, 1, 0], [1, 1, 0, 0]],  # 0.5
    "ft": [[1, 0, 1, 0], [0, 1, 1, 0]],  # 0.5
    "lora": [[1, 1, 1, 0], [1, 1, 1, 1]],  # 0.875: lora - ft = +0.25 (seed 0), +0.5 (seed 1)
    "bcsft": [[1, 1, 1, 1], [1, 1, 1, 0]],  # 0.875
    "sft_bc": [[0, 1, 0, 1], [1, 0, 0, 0]],  # 0.375
    "sft_recap": [[1, 1, 1, 1], [1, 1, 0, 1]],  # 0.875: +0.5 over sft_bc
    "sft_oracle": [[1, 1, 1, 1], [1, 1, 1, 1]],  # 1.0: +0.625 over sft_bc
    "sft_recap_forced": [[1, 1, 0, 1], [1, 0, 0, 1]],  # 0.625: +0.25 over sft_bc
    "sft_rlinf": [[1, 1, 1, 1], [1, 0, 0, 1]],  # 0.75: +0.375 over sft_bc
}
TRAINABLE = {"bc": 295904, "recap": 295904, "ft": 295904, "lora": 126304}
TRAINABLE |= {arm: 295904 for arm in OUTCOMES if arm.startswith(("bcsft", "sft_"))}


def records(arms: list[str]) -> dict:
    out = {}
    for arm in arms:
        for seed in (0, 1):
            training = {"trainable_parameters": TRAINABLE[arm], "train_s": 10.0 * (seed + 1)}
            out[(arm, seed)] = {"outcomes": {"beta_1": OUTCOMES[arm][seed]}, "training": training}
    return out


def args(arms: list[str]) -> SimpleNamespace:
    return SimpleNamespace(seeds=[0, 1], arms=arms, betas=[1.0], episodes=4, steps=20,
                           finetune_steps=10)  # fmt: skip


def test_lora_minus_ft_rows_and_result_fields(bench):
    arms = ["bc", "recap", "ft", "lora"]
    lines, figures = bench.summarize(records(arms), args(arms))
    assert [line.split(" | ")[0].strip() for line in lines[1:6]] == [
        "bc b=1", "recap b=1", "ft b=1", "lora b=1", "lora-ft b=1"]  # fmt: skip
    row = lines[5].split(" | ")
    assert row[1:4] == ["+0.250", "+0.500", "+0.375"]  # per seed, then the mean
    diff = figures["lora_vs_ft"]["b=1"]
    assert diff["per_seed"] == [0.25, 0.5] and diff["mean"] == pytest.approx(0.375)
    assert diff["interval"][0] <= 0.375 <= diff["interval"][1]
    assert figures["arms"]["ft b=1"]["vs"]["mean"] == pytest.approx(0.25)
    assert figures["arms"]["lora b=1"]["vs"]["mean"] == pytest.approx(0.625)
    assert "training ft: 295,904 trainable parameters, 15 s mean over 2 seeds" in lines
    assert "training lora: 126,304 trainable parameters, 15 s mean over 2 seeds" in lines
    assert figures["training"]["lora"]["train_s"] == [10.0, 20.0]
    result = bench.result_line(figures, args(arms), 123.4)
    low, high = diff["interval"]
    assert result.startswith("RESULT: seeds=2 episodes=4 steps=20 bc=0.250 recap_b1=0.500 "
                             "recap_over_bc=2.00 recap_b1_minus_bc=+0.250 ci=[")  # fmt: skip
    assert (f"finetune_steps=10 ft_b1=0.500 lora_b1=0.875 lora_minus_ft=+0.375 "
            f"lora_ci=[{low:+.3f},{high:+.3f}] wall_s=123 target=") in result  # fmt: skip
    assert result.endswith(f'target="{bench.TARGET}" met=no')


def test_without_recap_or_one_fine_tune_the_result_line_leaves_their_fields_out(bench):
    arms = ["bc", "ft", "lora"]
    _, figures = bench.summarize(records(arms), args(arms))
    result = bench.result_line(figures, args(arms), 5.0)
    assert "recap_b1" not in result and "lora_minus_ft=+0.375" in result
    arms = ["bc", "ft"]
    lines, figures = bench.summarize(records(arms), args(arms))
    assert "lora_vs_ft" not in figures and not any(line.startswith("lora-ft") for line in lines)
    assert "lora_minus_ft" not in bench.result_line(figures, args(arms), 5.0)


def test_fine_tunes_start_from_the_bc_run_of_their_seed(bench):
    a = SimpleNamespace(steps=3000, finetune_steps=1000)
    assert bench.arm_run_dir("bc", 2, a) == "runs/bc_s2_3000"  # the validity bench's naming
    assert bench.arm_run_dir("lora", 2, a) == "runs/lora_s2_bc3000_ft1000"
    assert list(bench.ARMS).index("bc") < list(bench.ARMS).index("ft")


def test_the_expert_first_recipe_compares_each_fine_tune_with_its_own_baseline(bench):
    arms = ["bc", "bcsft", "sft_bc", "sft_recap", "sft_oracle"]
    lines, figures = bench.summarize(records(arms), args(arms))
    vs = {name: (entry["vs"]["baseline"], entry["vs"]["mean"])
          for name, entry in figures["arms"].items() if "vs" in entry}  # fmt: skip
    assert vs == {"bcsft b=1": ("bc", pytest.approx(0.625)),
                  "sft_bc b=1": ("bcsft", pytest.approx(-0.5)),
                  "sft_recap b=1": ("sft_bc", pytest.approx(0.5)),
                  "sft_oracle b=1": ("sft_bc", pytest.approx(0.625))}  # fmt: skip
    assert lines[4].startswith("sft_recap b=1    |  1.000 |  0.750 | 0.875 | [")
    assert lines[4].endswith(" vs sft_bc")
    result = bench.result_line(figures, args(arms), 7.0)
    assert result.startswith(
        "RESULT: seeds=2 episodes=4 steps=20 bc=0.250 finetune_steps=10 sft_base=0.875 "
        "sft_bc=0.375 sft_recap_b1=0.875 sft_recap_over_bc=2.33 sft_recap_b1_minus_bc=+0.500 "
        "sft_ci=["
    )
    assert "sft_oracle_b1_minus_bc=+0.625" in result
    # two seeds x four episodes cannot meet the target whatever the margin
    assert result.endswith(f'met_scratch=no met_sft=no wall_s=7 target="{bench.TARGET}" met=no')


def test_asking_for_a_fine_tune_runs_its_base_and_baseline_first(bench):
    wanted = bench.arms_with_dependencies(["sft_oracle"])
    assert wanted == ["bc", "bcsft", "sft_bc", "sft_oracle"]
    assert bench.arms_with_dependencies(["lora"]) == ["bc", "lora"]


def test_the_dropout_probe_is_the_oracle_arm_with_rlinfs_dropout(bench):
    files, params = bench.ARMS["sft_oracle_d01"]
    assert files == bench.ARMS["sft_oracle"][0] == ["demo/finetune.gin"]
    assert params == ['policy_data.advantages_tag = "oracle"', "policy_data.dropout = 0.1"]
    assert bench.BASELINE["sft_oracle_d01"] == "sft_bc" and "sft_oracle_d01" in bench.CONDITIONED
    assert bench.arms_with_dependencies(["sft_oracle_d01"]) == [
        "bc", "bcsft", "sft_bc", "sft_oracle_d01"]  # fmt: skip


def test_rlinf_labels_forced_positive_are_their_own_fields_with_their_own_verdict(bench):
    arms = ["bc", "bcsft", "sft_bc", "sft_recap_forced"]
    lines, figures = bench.summarize(records(arms), args(arms))
    assert lines[0].startswith("arm                  | seed 0 | seed 1 | mean")  # 20 wide
    assert lines[2].startswith("bcsft b=1            |  1.000 |  0.750 | 0.875 | [")
    assert lines[4].startswith("sft_recap_forced b=1 |  0.750 |  0.500 | 0.625 | [")
    assert figures["arms"]["sft_recap_forced b=1"]["vs"]["baseline"] == "sft_bc"
    assert figures["arms"]["sft_recap_forced b=1"]["vs"]["mean"] == pytest.approx(0.25)
    result = bench.result_line(figures, args(arms), 3.0)
    low, high = figures["arms"]["sft_recap_forced b=1"]["vs"]["interval"]
    assert (
        f"sft_bc=0.375 sft_forced_b1=0.625 sft_forced_b1_minus_bc=+0.250 "
        f"sft_forced_ci=[{low:+.3f},{high:+.3f}] met_sft_forced=no wall_s=3 "
    ) in result
    assert bench.arms_with_dependencies(["sft_recap_forced"]) == [
        "bc", "bcsft", "sft_bc", "sft_recap_forced"]  # fmt: skip


def test_the_target_needs_15_points_an_interval_above_0_3_seeds_and_200_episodes(bench):
    size = SimpleNamespace(seeds=[0, 1, 2], episodes=200)
    assert bench.meets_target({"mean": 0.15, "interval": [0.01, 0.3]}, size)
    assert not bench.meets_target({"mean": 0.149, "interval": [0.01, 0.3]}, size)
    assert not bench.meets_target({"mean": 0.2, "interval": [0.0, 0.4]}, size)
    assert not bench.meets_target({"mean": 0.2, "interval": [0.1, 0.3]},
                                  SimpleNamespace(seeds=[0, 1], episodes=200))  # fmt: skip
    assert not bench.meets_target({"mean": 0.2, "interval": [0.1, 0.3]},
                                  SimpleNamespace(seeds=[0, 1, 2], episodes=199))  # fmt: skip


def test_rlinfs_full_recipe_has_its_own_fields_after_the_forced_labels(bench):
    arms = ["bc", "bcsft", "sft_bc", "sft_recap_forced", "sft_rlinf"]
    _, figures = bench.summarize(records(arms), args(arms))
    assert figures["arms"]["sft_rlinf b=1"]["vs"]["mean"] == pytest.approx(0.375)
    assert bench.ARMS["sft_rlinf"][1] == ['policy_data.advantages_tag = "demo_forced"',
                                          "policy_data.dropout = 0.1"]  # fmt: skip
    result = bench.result_line(figures, args(arms), 3.0)
    low, high = figures["arms"]["sft_rlinf b=1"]["vs"]["interval"]
    expected = (f"met_sft_forced=no sft_rlinf_b1=0.750 sft_rlinf_b1_minus_bc=+0.375 "
                f"sft_rlinf_ci=[{low:+.3f},{high:+.3f}] met_sft_rlinf=no wall_s=3 ")  # fmt: skip
    assert expected in result


def test_more_sft_is_plain_bc_on_the_demonstrations_compared_with_the_base(bench):
    files, params = bench.ARMS["sft_more"]
    assert files == ["demo/finetune.gin"]
    sft = '[{"name": "sft", "root": "sft", "type": "sft"}]'
    assert params == ['policy_data.conditioning = "none"', f"policy_data.datasets = {sft}"]
    assert bench.BASELINE["sft_more"] == "bcsft" and bench.BASELINE["sft_bc"] == "bcsft"
    assert bench.BASELINE["sft_rlinf"] == "sft_bc" and "sft_more" not in bench.CONDITIONED
    assert bench.FINETUNED["sft_more"] == "bcsft"
    assert bench.arms_with_dependencies(["sft_more"]) == ["bc", "bcsft", "sft_more"]

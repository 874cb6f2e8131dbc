"""``zero_stage = "auto"``: the planner's fastest configuration that fits, on the LIBERO π0.5's
real parameter counts and activations (literal figures), per hardware; the training run's
resolution of "auto" (and an explicit stage winning); the end-to-end toy run that logs it."""

from __future__ import annotations

import json

import pytest

from recap.engine import accelerator, memory
from recap.engine.deepspeed_config import EngineConfig, resolve_auto
from recap.engine.memory import Activations, ParamCounts
from recap.errors import RecapError
from recap.models.toy import toy_model
from tests.engine.conftest import PY, REPO, run

# experiments/libero_pi05.gin counted on the meta device (recap-plan-memory), and the README's
# measured activations per sample: 3.716 GiB plain, 0.938 checkpointed, SigLIP's share 0.690
PI05 = {
    "as configured": ParamCounts(3_353_433_872, 3_244_377_872, 526_647_296),
    "LoRA": ParamCounts(3_353_433_872, 449_426_192, 526_647_296),
    "LoRA + frozen vision": ParamCounts(3_353_433_872, 36_983_840, 526_647_296),
}
ACTS = Activations(3.716, 0.938, "README", 0.690, 0.690)


def chosen(hardware: str) -> list[memory.Choice]:
    ranks, device_gb = memory.HARDWARE[hardware]
    return memory.choose(PI05, ACTS, ranks, device_gb, global_batch=256, micro_cap=32)


def summary(choice: memory.Choice) -> tuple:
    return (choice.recipe, choice.stage, choice.offload_optimizer, choice.offload_param,
            choice.checkpointing, choice.micro, round(choice.total_gb, 1))  # fmt: skip


def test_the_choice_changes_with_the_hardware():
    # 8 x 64 GB: stage <= 2 without checkpointing fits, so that is the choice
    assert [summary(c) for c in chosen("910b")[:2]] == [
        ("as configured", 0, False, False, False, 8, 62.6),
        ("as configured", 1, False, False, False, 8, 50.5),
    ]
    assert [summary(c) for c in chosen("910b4")[:2]] == [
        ("as configured", 2, False, False, False, 4, 30.4),
        ("as configured", 2, False, False, True, 16, 30.5),
    ]
    assert [summary(c) for c in chosen("h100")[:2]] == [
        ("as configured", 2, False, False, False, 16, 75.0),
        ("as configured", 0, False, False, False, 8, 62.6),
    ]
    # one 24 GB card: only with the optimizer on the host
    assert [summary(c) for c in chosen("24gb")[:2]] == [
        ("as configured", 1, True, False, True, 8, 23.8),
        ("as configured", 2, True, False, True, 8, 23.8),
    ]
    assert all(c.stage == 3 for c in chosen("910b") if c.stage == 3)  # ZeRO-3 still ranked


def test_small_cards_offload_and_lora_comes_when_nothing_full_fits():
    # the configured (full) training first, however slow: parameters and optimizer on the host
    assert [summary(c) for c in memory.choose(PI05, ACTS, 1, 16.0, 256, 32)[:1]] == [
        ("as configured", 3, True, True, True, 8, 13.5)]  # fmt: skip
    # a LoRA + frozen vision config on the same card runs at ZeRO-0, checkpointed, micro 16
    lora = {"as configured": PI05["LoRA + frozen vision"]}
    assert summary(memory.choose(lora, ACTS.without_vision(), 1, 16.0, 256, 32)[0]) == (
        "as configured", 0, False, False, True, 16, 14.8)  # fmt: skip
    # a layer too large to gather on the card: no full configuration fits, LoRA does
    big = {"as configured": ParamCounts(8 * 2**30, 8 * 2**30, 5 * 2**30),
           "LoRA": ParamCounts(8 * 2**30, 2**28, 5 * 2**30)}  # fmt: skip
    assert summary(memory.choose(big, ACTS, 1, 24.0, 256, 32)[0]) == (
        "LoRA", 1, True, False, True, 2, 22.4)  # fmt: skip
    assert memory.choose(PI05, ACTS, 1, 6.0, 256, 32) == []
    assert memory.format_choice([], 1, 6.0) == [
        'zero_stage = "auto" on 1 x 6 GiB: no configuration fits; use more or larger devices'
    ]


def test_format_choice_prints_the_choice_bindings_and_runner_up():
    lines = memory.format_choice(chosen("910b"), 8, 64.0, "pi05_policy.gradient_checkpointing")
    assert lines == [
        'zero_stage = "auto" on 8 x 64 GiB: as configured, ZeRO-0, no offload, gradient '
        "checkpointing off, micro batch 8: 62.6 GiB of 64 per rank (model states 28.9 + "
        "activations 29.7 + reserve 4), relative throughput 0.80",
        "  bindings: --gin_param 'pi05_policy.gradient_checkpointing = False' --gin_param "
        "'deepspeed_config.zero_stage = 0' --gin_param 'deepspeed_config.micro_batch_size = 8' "
        "--gin_param 'deepspeed_config.offload_optimizer = False'",
        "  runner-up: as configured, ZeRO-1, no offload, gradient checkpointing off, micro batch "
        "8: 50.5 GiB of 64 per rank (model states 16.8 + activations 29.7 + reserve 4), "
        "relative throughput 0.78",
    ]


def test_stage_model_states_literal():
    counts = ParamCounts(2**30, 2**30, 0)  # 1 Gi parameters, all trained, 8 ranks
    table = {s: memory.stage_model_states(counts, 8, s) for s in (0, 1, 2)}
    assert {s: (m.params, m.grads, m.optimizer) for s, m in table.items()} == {
        0: (2.0, 6.0, 1.5), 1: (2.0, 2.0, 1.5), 2: (2.0, 0.25, 1.5)}  # fmt: skip
    assert memory.stage_model_states(counts, 8, 2, offload_optimizer=True).planned == 2.25
    with pytest.raises(RecapError, match="ZeRO-2 cannot offload parameters"):
        memory.stage_model_states(counts, 8, 2, offload_param=True)
    assert memory.micro_batches(256, 8, 32) == [1, 2, 4, 8, 16, 32]
    assert memory.micro_batches(256, 1, 12) == [1, 2, 4, 8]


def config(stage, **kw) -> dict:
    return EngineConfig(
        micro_batch_size=4, global_batch_size=8, precision="fp32", zero_stage=stage, **kw
    ).build(world_size=1, max_steps=1)


def test_zero_stage_is_checked_and_param_offload_means_zero3():
    with pytest.raises(RecapError) as err:
        config(4)
    assert str(err.value).splitlines()[0] == (
        'gin config: deepspeed_config.zero_stage=4; use 0, 1, 2, 3 or "auto"'
    )
    assert config("auto", offload_param="cpu")["zero_optimization"]["stage"] == 3
    assert config("auto")["zero_optimization"]["stage"] == "auto"


def test_resolve_auto_by_device_memory_and_an_explicit_stage_wins(monkeypatch):
    monkeypatch.setattr(accelerator, "total_memory_gib", lambda local=1: 64.0)
    resolved, line = resolve_auto(config("auto", activation_gb_per_sample=1.0), toy_model, 2)
    assert resolved["zero_optimization"]["stage"] == 0
    assert line.startswith('zero_stage "auto" on 2 rank(s): ZeRO-0 (ZeRO-0, no offload, gradient '
                           "checkpointing off, micro batch 4: 8.0 GiB of 64 per rank")  # fmt: skip
    # the optimizer offload asked for: the fastest stage that can offload it
    offload = config("auto", offload_optimizer=True, activation_gb_per_sample=1.0)
    resolved, _ = resolve_auto(offload, toy_model, 2)
    assert resolved["zero_optimization"]["stage"] == 1
    assert resolved["zero_optimization"]["offload_optimizer"]["device"] == "cpu"
    monkeypatch.setattr(accelerator, "total_memory_gib", lambda local=1: 6.0)  # 4 reserve + 4 x 1
    resolved, line = resolve_auto(config("auto", activation_gb_per_sample=1.0), toy_model, 2)
    assert resolved["zero_optimization"]["stage"] == 3
    assert line == 'zero_stage "auto" on 2 rank(s): ZeRO-3 (no stage fits 6.0 GiB at micro batch 4)'
    explicit = config(2)
    assert resolve_auto(explicit, toy_model, 2) == (explicit, None)


def test_a_resumed_auto_run_keeps_the_stage_its_checkpoint_was_saved_at(monkeypatch, tmp_path):
    import json

    from recap.engine.checkpointing import plan_resume

    monkeypatch.setattr(accelerator, "total_memory_gib", lambda local=1: 64.0)  # would pick 0
    resolved, line = resolve_auto(config("auto", activation_gb_per_sample=1.0), toy_model, 2,
                                  saved_stage=2)  # fmt: skip
    assert resolved["zero_optimization"]["stage"] == 2
    assert line == ('zero_stage "auto" on 2 rank(s): ZeRO-2, the stage of the checkpoint this '
                    "run resumes from")  # fmt: skip
    root = tmp_path / "checkpoints"
    (root / "step_4").mkdir(parents=True)
    (root / "latest").write_text("step_4")
    state = {"step": 4, "world_size": 2, "global_batch_size": 8, "zero_stage": 2}
    (root / "step_4" / "recap_state.json").write_text(json.dumps(state))
    assert plan_resume(tmp_path, 2, resolved).zero_stage == 2
    del state["zero_stage"]  # a checkpoint from before the stage was recorded
    (root / "step_4" / "recap_state.json").write_text(json.dumps(state))
    assert plan_resume(tmp_path, 2, resolved).zero_stage is None


def test_a_toy_run_with_auto_logs_the_stage_it_used(tmp_path):
    run_dir = tmp_path / "run"
    params = ["train.max_steps = 1", "train.eval_every = 0", "train.save_every = 0",
              "train_data/toy_data.num_examples = 16", 'deepspeed_config.zero_stage = "auto"',
              f'train.run_dir = "{run_dir}"']  # fmt: skip
    cmd = [PY, str(REPO / "scripts/train.py"), "--gin_file", str(REPO / "gin/demo/toy.gin"),
           *[arg for p in params for arg in ("--gin_param", p)]]  # fmt: skip
    done = run(cmd, tmp_path)
    assert 'zero_stage "auto" on 1 rank(s): ZeRO-0 (ZeRO-0, no offload' in done.stdout + done.stderr
    assert (run_dir / "model.safetensors").is_file()
    # ZeRO-0 logs the gradient norm too (recap's own: DeepSpeed keeps none there), and it is the
    # norm DeepSpeed computes at ZeRO-1 for the same step
    zero1 = tmp_path / "zero1"
    swapped = [p for p in params if "zero_stage" not in p and "run_dir" not in p]
    run([*cmd[:4], *[arg for p in [*swapped, "deepspeed_config.zero_stage = 1",
                                   f'train.run_dir = "{zero1}"'] for arg in ("--gin_param", p)]],
        tmp_path)  # fmt: skip
    firsts = [json.loads((d / "metrics.jsonl").read_text().splitlines()[0])
              for d in (run_dir, zero1)]  # fmt: skip
    norms = [first["train/grad_norm"] for first in firsts]
    assert norms[0] > 0 and norms[0] == pytest.approx(norms[1], rel=1e-5)
    assert all(first["time/step_ms"] > 0 for first in firsts)  # the step was timed


def test_two_ranks_with_different_memory_resolve_one_stage(tmp_path):
    # rank 0 alone would pick ZeRO-0 (64 GiB), rank 1 alone ZeRO-3 (6 GiB): both plan for 6
    from recap.ports import free_port
    from tests.helpers import deepspeed_local

    cmd = [*deepspeed_local(2, free_port()),
           str(REPO / "tests/engine/auto_ranks.py"), str(tmp_path)]  # fmt: skip
    run(cmd, tmp_path)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    line = 'zero_stage "auto" on 2 rank(s): ZeRO-3 (no stage fits 6.0 GiB at micro batch 4)'
    assert ranks == [{"stage": 3, "line": line, "largest": 1}] * 2

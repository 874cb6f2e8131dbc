"""The planner's recipes (full, optimizer offload, LoRA, LoRA + frozen vision, param offload)
with literal numbers, its LoRA counts against peft's, and ZeRO-3 parameter offload in the
DeepSpeed config."""

from __future__ import annotations

import pytest

from recap.engine import memory
from recap.engine.deepspeed_config import EngineConfig
from recap.engine.memory import Activations, ParamCounts
from recap.errors import RecapError

GI = 2**30
# 4 Gi parameters, LoRA trains 1/8 of them, LoRA + frozen vision 1/32; largest layer 1/4 Gi
COUNTS = {"full": ParamCounts(4 * GI, 4 * GI, GI // 4),
          "lora": ParamCounts(4 * GI, GI // 2, GI // 4),
          "lora_frozen_vision": ParamCounts(4 * GI, GI // 8, GI // 4)}  # fmt: skip
# 1 GiB per sample, 0.5 checkpointed; the vision tower 0.25 of either (not checkpointed)
ACTS = Activations(1.0, 0.5, "literal", 0.25, 0.25)


def test_parameter_offload_leaves_only_the_gathered_layers_on_the_device():
    s = memory.zero3_model_states(COUNTS["full"], ranks=8, offload_param=True)
    assert (s.params, s.grads, s.optimizer, s.gathered) == (0.0, 0.0, 0.0, 1.0)
    assert s.deepspeed == 1.0  # DeepSpeed: 4 x the largest layer with cpu_offload_params


def test_deepspeed_estimate_counts_frozen_parameters_as_weights_only():
    # 18 B/param x 4 Gi over 1 rank = 72 GiB if all trained; 1/8 trained: 72 x (2 + 16/8) / 18
    s = memory.zero3_model_states(COUNTS["lora"], ranks=1)
    assert (s.params, s.grads, s.optimizer, s.gathered) == (8.0, 1.0, 6.0, 1.0)
    assert s.deepspeed == 72 * 4 / 18 + 1.0 == 17.0


def test_recipes_on_one_24_gb_card():
    plans = memory.plan_recipes(COUNTS, ACTS, 1, 24.0, 32, checkpointing=True)
    table = {p.recipe.name: (p.states.planned, p.per_sample_gb, p.largest_micro, p.total_gb)
             for p in plans}  # fmt: skip
    assert table == {
        "full": (73.0, 0.5, 0, 77.5),  # 72 + 1 gathered; 4 reserve; micro 1
        "full + optimizer offload": (17.0, 0.5, 6, 24.0),  # 8 + 8 grads + 1
        "LoRA": (17.0, 0.5, 6, 24.0),
        "LoRA + frozen vision": (11.0, 0.25, 32, 23.0),  # frozen SigLIP keeps no activations
        "param offload": (1.0, 0.5, 32, 21.0),
    }
    lines = memory.format_recipes(plans, 1, "pi05_policy", memory.RECIPES[0])
    assert lines[3] == ("| full | 4,294,967,296 | 73.00 | 0.500 | 0 | 77.5 (micro 1) | "
                        "no: full + optimizer offload fits |")  # fmt: skip
    assert lines[-1] == (
        "configured recipe (full): DOES NOT FIT (77.5 GiB at micro 1); cheapest change that "
        "fits: full + optimizer offload (--gin_param 'deepspeed_config.offload_optimizer = "
        "True'): 24.0 GiB at micro 6"
    )
    lora = memory.format_recipes(plans, 1, "pi05_policy", memory.RECIPES[2])
    assert lora[-1] == (
        "configured recipe (LoRA): fits up to micro batch 6 (24.0 GiB per rank there)"
    )
    assert memory.RECIPES[3].bindings("value_model") == [
        "value_model.lora = @LoraOptions()",
        "value_model.freeze = ['vision']",
    ]


def test_recipes_on_eight_32_gb_cards_and_when_nothing_fits():
    plans = memory.plan_recipes(COUNTS, ACTS, 8, 32.0, 32, checkpointing=True)
    assert [(p.largest_micro, p.total_gb) for p in plans] == [
        (32, 30.0),
        (32, 23.0),
        (32, 23.0),
        (32, 14.25),
        (32, 21.0),
    ]
    tiny = memory.plan_recipes(COUNTS, ACTS, 1, 4.0, 32)
    assert not any(p.fits for p in tiny)
    assert memory.format_recipes(tiny, 1, "pi05_policy", memory.RECIPES[2])[-1] == (
        "configured recipe (LoRA): DOES NOT FIT (22.0 GiB at micro 1) and no recipe fits "
        "1 x 4 GiB; use more or larger devices"
    )


def test_recipe_lora_counts_are_peft_counts():
    import peft

    from recap.models.adapters import LoraOptions, adapt, recipe_steps
    from recap.models.pi05 import build_pi05
    from tests.models.test_pi05 import tiny_config

    options = LoraOptions(rank=4, alpha=4.0, expert_rank=8, expert_alpha=8.0)
    counts = memory.recipe_counts(lambda: build_pi05(tiny_config()), recipe_steps(options))
    model = adapt(build_pi05(tiny_config()), options)
    assert counts["lora"].trainable == peft.get_model_status(model).trainable_params == 44_774
    assert counts["full"].trainable == 101_510 and counts["lora_frozen_vision"].trainable == 17_190
    assert counts["lora"].total == counts["full"].total + 12_544  # the adapters themselves


def test_offload_param_in_the_deepspeed_config():
    zero = EngineConfig(offload_param="nvme", nvme_path="/nvme").build(world_size=1, max_steps=1)[
        "zero_optimization"
    ]
    assert zero["offload_param"] == {"device": "nvme", "pin_memory": False, "nvme_path": "/nvme"}
    cpu = EngineConfig(offload_param="cpu").build(world_size=1, max_steps=1)["zero_optimization"]
    assert cpu["offload_param"] == {"device": "cpu", "pin_memory": False}
    assert (
        "offload_param" not in EngineConfig().build(world_size=1, max_steps=1)["zero_optimization"]
    )
    cases = {
        ("gpu", 3, None): "gin config: deepspeed_config.offload_param='gpu'; use one of "
        "('none', 'cpu', 'nvme')",
        ("cpu", 2, None): "gin config: deepspeed_config.offload_param='cpu' needs zero_stage 3 "
        "(have 2); set deepspeed_config.zero_stage = 3",
        ("nvme", 3, None): "gin config: deepspeed_config.nvme_path is required with "
        "offload_param 'nvme'; bind a local NVMe directory",
    }
    for (device, stage, path), line in cases.items():
        with pytest.raises(RecapError) as err:
            EngineConfig(offload_param=device, zero_stage=stage, nvme_path=path).build(
                world_size=1, max_steps=1
            )
        assert str(err.value).splitlines()[0] == line  # gin appends its call context


@pytest.fixture(scope="module")
def nvme_line() -> str:
    """The one line ``offload_param = "nvme"`` stops at where DeepSpeed's async_io op cannot
    load (libaio missing, as on the 2-core CI machine); skipped where it can."""
    from recap.engine import accelerator
    from recap.engine.deepspeed_config import async_io_missing

    if async_io_missing() is None:
        pytest.skip("DeepSpeed's async_io op loads here (libaio found): NVMe offload can run")
    return (
        'deepspeed_config.offload_param = "nvme": DeepSpeed\'s async_io op cannot be built on '
        f"this machine ({accelerator.name()} accelerator; libaio's headers and library not "
        "found); install libaio on every node (apt-get install libaio-dev, or yum install "
        'libaio-devel), or offload to the host: deepspeed_config.offload_param = "cpu"'
    )


def test_nvme_offload_without_async_io_stops_the_pipeline_plan_in_one_line(
    nvme_line, tmp_path, capsys
):
    """Before any step launches (the plan, ``--dry_run`` too): DeepSpeed itself would raise
    inside ``zero.Init`` on every rank, after Steps 1-3 ran."""
    import gin

    from recap.workflow.pipeline import main

    params = [f'pipeline.run_root = "{tmp_path}"', 'policy:deepspeed_config.offload_param = "nvme"',
              f'policy:deepspeed_config.nvme_path = "{tmp_path}"']  # fmt: skip
    argv = ["--gin_file", "demo/scratch.gin", "--dry_run"]
    try:
        assert main(argv + [a for p in params for a in ("--gin_param", p)]) == 2
        assert capsys.readouterr().err == f"error: pipeline step policy: {nvme_line}\n"
        assert main(argv + [a for p in params[:1] for a in ("--gin_param", p)]) == 0  # no offload
    finally:
        gin.clear_config()  # the plan stopped with the step's bindings parsed


def test_nvme_offload_without_async_io_stops_train_before_building(nvme_line, tmp_path, capsys):
    import gin

    from recap.cli import run_command
    from recap.steps.train import train

    run_dir = tmp_path / "run"
    params = ["train.model_fn = @toy_model", "train.data_fn = @toy_data", "train.max_steps = 1",
              f'train.run_dir = "{run_dir}"', 'deepspeed_config.offload_param = "nvme"',
              f'deepspeed_config.nvme_path = "{tmp_path}"']  # fmt: skip
    gin.clear_config()
    try:
        code = run_command(train, ["--gin_file", "engine.gin",
                                   *[a for p in params for a in ("--gin_param", p)]])  # fmt: skip
    finally:
        gin.clear_config()
    assert code == 2 and capsys.readouterr().err == f"error: {nvme_line}\n"
    assert not run_dir.exists()  # nothing built, nothing written


def test_plan_memory_command_prints_the_recipes_of_the_lora_experiment(capsys):
    """``experiments/libero_pi05_lora.gin`` at the rehearsal's tiny sizes with the vision tower
    frozen: the configured plan counts peft's trainable parameters and drops SigLIP's share."""
    import gin

    from recap.commands.plan_memory import main

    argv = [
        "--gin_file", "experiments/libero_pi05_lora.gin", "--gin_file", "rehearsal/tiny.gin",
        "--gin_param", "pi05_policy.freeze = ['vision']", "--ranks", "1", "--device_gb", "24",
        "--activation_gb_per_sample", "0.5", "--vision_activation_gb_per_sample", "0.2",
    ]  # fmt: skip
    gin.clear_config()
    try:
        assert main(argv) == 0
    finally:
        gin.clear_config()
    out = capsys.readouterr().out.splitlines()
    assert (
        out[0] == "parameters: 140,864 total, 47,776 trainable, 93,088 frozen; largest layer 16,384"
    )
    assert "activations at micro batch 2 (checkpointed): 0.60 GiB" in out[3]  # (0.5 - 0.2) x 2
    rows = {line.split(" | ")[0][2:]: line.split(" | ")[1:4] for line in out if "| 0." in line}
    assert rows == {
        "full": ["90,112", "0.00", "0.500"],
        "full + optimizer offload": ["90,112", "0.00", "0.500"],
        "LoRA": ["71,616", "0.00", "0.500"],
        "LoRA + frozen vision": ["47,776", "0.00", "0.300"],
        "param offload": ["90,112", "0.00", "0.500"],
    }
    verdict = next(line for line in out if line.startswith("configured recipe"))
    assert verdict == (
        "configured recipe (LoRA + frozen vision): fits up to micro batch 2 (4.6 GiB per rank "
        "there)"
    )
    assert out[-3] == (
        'zero_stage = "auto" on 1 x 24 GiB: as configured, ZeRO-0, no offload, gradient '
        "checkpointing on, micro batch 2: 4.6 GiB of 24 per rank (model states 0.0 + "
        "activations 0.6 + reserve 4), relative throughput 0.38"
    )

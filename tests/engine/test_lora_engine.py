"""LoRA training of a tiny π0.5 on the engine (CPU accelerator), three shared launches
(``tests/engine/lora_train.py``, fixed flow-matching noise and time in the data):

- ``two``: ``deepspeed --num_gpus 2``, ZeRO-3 with parameters and optimizer offloaded to the
  host, 4 steps (micro 2, global 4), EMA 0.5, lr 1e-2;
- ``one``: the same in one process under ZeRO-2 (micro 2 x 2 accumulation steps), saving at 2 and 4;
- ``resumed``: ``one`` cut back to its step-2 checkpoint (as if killed) and started again.

Adam's eps is 1e-4 here: SigLIP's key biases get no true gradient (softmax ignores a constant
per query), and with eps 1e-8 Adam turns their rounding noise, which differs between ZeRO-2 on
one rank and ZeRO-3 on two, into full lr-sized steps.
"""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from recap.models import adapters
from recap.models.adapters import LoraOptions
from recap.ports import free_port
from tests.engine.conftest import PY, REPO, run
from tests.helpers import deepspeed_local

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

SCRIPT = str(REPO / "tests/engine/lora_train.py")
# the 2-rank run keeps parameters and optimizer on the host (ZeRO-3 offload_param, ZeRO-Infinity)
OFFLOAD = ('deepspeed_config.offload_param = "cpu"', "deepspeed_config.offload_optimizer = True")
LORA = {"rank": 4, "alpha": 8.0, "expert_rank": 2, "expert_alpha": 4.0}
# tiny config (tests/models/test_pi05.py): LoRA rank 4 on the decoder (layer 0 all seven
# projections: 928 in+out; layer 1 k/v only: 160) + rank 2 on the expert (2 x 512) = 6,400;
# fully trained: SigLIP 27,584, projector 2,112, action in/out 224 + 198, time MLP 2 x 1,056
TRAINABLE = 4 * (928 + 160) + 2 * 2 * 512 + 27_584 + 2_112 + 224 + 198 + 2 * 1_056
FULLY_TRAINED = ("action_in_proj.", "action_out_proj.", "time_mlp_in.", "time_mlp_out.",
                 "paligemma_with_expert.paligemma.model.vision_tower.",
                 "paligemma_with_expert.paligemma.model.multi_modal_projector.")  # fmt: skip


def params(run_dir, base, stage: int, extra: tuple[str, ...] = ()) -> list[str]:
    bindings = [
        "train.model_fn = @pi05_policy", "train.data_fn = @tiny_policy_data",
        "train.max_steps = 4", "train.log_every = 1", "train.save_every = 2",
        "train.keep_checkpoints = 0", f'train.run_dir = "{run_dir}"',
        f'pi05_policy.checkpoint = "{base}"', "pi05_policy.lora = @LoraOptions()",
        *[f"LoraOptions.{k} = {v!r}" for k, v in LORA.items()],
        "deepspeed_config.micro_batch_size = 2", "deepspeed_config.global_batch_size = 4",
        f"deepspeed_config.zero_stage = {stage}", 'deepspeed_config.precision = "fp32"',
        "deepspeed_config.lr = 1e-2", "deepspeed_config.head_lr = None",
        "deepspeed_config.head_patterns = []", "deepspeed_config.ema_decay = 0.5",
        "deepspeed_config.eps = 1e-4", *extra,
    ]  # fmt: skip
    return ["--gin_file", "engine.gin", *[a for p in bindings for a in ("--gin_param", p)]]


@pytest.fixture(scope="module")
def lora_runs(tmp_path_factory) -> dict:
    from recap.models.checkpoints import save_pi05
    from tests.models.test_pi05 import tiny_model

    tmp = tmp_path_factory.mktemp("lora")
    base = tmp / "base"
    save_pi05(tiny_model(), base)
    two, one = tmp / "two", tmp / "one"
    run([*deepspeed_local(2, free_port()), SCRIPT,
         *params(two, base, 3, OFFLOAD)], tmp, timeout=900)  # fmt: skip
    cmd = [PY, SCRIPT, *params(one, base, 2)]
    run(cmd, tmp, timeout=900)
    uninterrupted = load_file(str(one / "model.safetensors"))
    # as if killed right after the step-2 checkpoint
    shutil.rmtree(one / "checkpoints" / "step_4")
    (one / "checkpoints" / "latest").write_text("step_2")
    (one / "model.safetensors").unlink()
    shutil.rmtree(one / "adapter")
    run(cmd, tmp, timeout=900)
    return {"base": base, "two": two, "one": one, "uninterrupted": uninterrupted}


def test_only_adapters_and_named_modules_reach_the_optimizer(lora_runs):
    for name in ("two", "one"):
        report = json.loads((lora_runs[name] / "optimizer.json").read_text())
        assert report["optimizer_params"] == report["trainable"] == TRAINABLE == 38_630
        other = [n for n in report["trainable_names"]
                 if ".lora_" not in n and not n.startswith(FULLY_TRAINED)]  # fmt: skip
        assert other == []
        assert sum(".lora_A." in n for n in report["trainable_names"]) == 7 + 2 + 2 * 7


def test_two_rank_zero3_offloaded_equals_one_process_zero2_and_resume_is_exact(lora_runs):
    two = load_file(str(lora_runs["two"] / "model.safetensors"))
    one = load_file(str(lora_runs["one"] / "model.safetensors"))
    base = load_file(str(lora_runs["base"] / "model.safetensors"))
    assert set(two) == set(one)
    assert not any("lora_" in k or "base_layer" in k for k in one)  # merged, plain names
    for key in one:
        torch.testing.assert_close(one[key], lora_runs["uninterrupted"][key], rtol=0, atol=0)
    for key in one:
        torch.testing.assert_close(two[key], one[key], rtol=0, atol=1e-6)
    adapter = adapters.ADAPTER_DIR + "/" + adapters.ADAPTER_WEIGHTS
    two_adapter, one_adapter = (load_file(str(lora_runs[r] / adapter)) for r in ("two", "one"))
    assert set(two_adapter) == set(one_adapter)
    assert sum(".lora_B.weight" in k for k in one_adapter) == 7 + 2 + 2 * 7
    for key in one_adapter:
        torch.testing.assert_close(two_adapter[key], one_adapter[key], rtol=0, atol=1e-6)
    # frozen base weights are untouched; adapted and trained ones moved
    q0 = "paligemma_with_expert.paligemma.model.language_model.layers.0.self_attn.q_proj.weight"
    embed = "paligemma_with_expert.paligemma.model.language_model.embed_tokens.weight"
    assert torch.equal(one[embed], base["paligemma_with_expert.paligemma.lm_head.weight"])
    assert (one[q0] - base[q0]).abs().max() > 1e-4
    assert (one["action_in_proj.weight"] - base["action_in_proj.weight"]).abs().max() > 1e-4
    with safe_open(str(lora_runs["one"] / "model.safetensors"), framework="pt") as f:
        meta = f.metadata()
    assert (meta["recap_weights"], meta["recap_lora"], meta["recap_ema_updates"]) == (
        "ema",
        "merged",
        "4",
    )


def test_the_adapter_loads_through_peft_and_matches_the_merged_export(lora_runs):
    from peft import PeftModel

    from recap.engine.inference import load_exported
    from recap.models.checkpoints import load_pi05
    from recap.models.pi05 import pi05_policy
    from tests.models.test_pi05 import tiny_batch

    adapter = lora_runs["two"] / adapters.ADAPTER_DIR
    assert sorted(p.name for p in adapter.iterdir()) == [adapters.ADAPTER_CONFIG,
                                                          adapters.ADAPTER_WEIGHTS]  # fmt: skip
    peft_model = PeftModel.from_pretrained(load_pi05(lora_runs["base"]), adapter).eval()
    merged = pi05_policy(checkpoint=str(lora_runs["base"]), lora=LoraOptions(**LORA))
    load_exported(merged, lora_runs["two"] / "model.safetensors")  # unloads the adapters
    assert not adapters.is_adapted(merged)
    batch = tiny_batch()
    noise, time = torch.randn(3, 4, 6), torch.tensor([0.2, 0.5, 0.9])
    with torch.no_grad():
        want = merged.eval()(batch, noise, time)[0]
        got = peft_model(batch, noise, time)[0]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)

"""Loading an exported policy for serving: recap run + gin, openpi and LeRobot layouts, errors."""

from __future__ import annotations

import shutil

import gin
import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from recap.engine.checkpointing import save_exported
from recap.errors import RecapError
from recap.serve.load import load_served
from tests.models.test_pi05 import EXPERT, TEXT, VISION, tiny_model
from tests.serve.conftest import ACTION_Q01, ACTION_Q99, STATE_Q01, STATE_Q99, observation

GIN = """
pi05_policy.vision = {vision}
pi05_policy.text = {text}
pi05_policy.expert = {expert}
pi05_policy.action_dim = 6
pi05_policy.action_horizon = 4
pi05_policy.num_steps = 3
policy_data.tokenizer_path = "{tokenizer}"
policy_data.prompt_style = "lerobot"
policy_data.state_in_prompt = False
policy_data.max_length = 48
"""


@pytest.fixture
def clean_gin():
    yield
    gin.clear_config()


def no_state(seed: int) -> dict:
    obs = observation(seed, noise_seed=seed)
    del obs["observation/state"]  # not needed when the state is not in the prompt
    return obs


def test_a_recap_run_loads_with_its_gin_files(tmp_path, policy_dir, clean_gin):
    run = tmp_path / "run"
    save_exported(tiny_model(0).state_dict(), run / "model.safetensors", step=10)
    shutil.copytree(policy_dir / "assets", run / "assets")
    gin_file = tmp_path / "policy.gin"
    gin_file.write_text(GIN.format(vision=VISION, text=TEXT, expert=EXPERT, tokenizer=policy_dir))
    served = load_served(run, gin_files=(str(gin_file),), device="cpu")
    meta = served.metadata()
    assert (meta["prompt_style"], meta["state_in_prompt"], meta["max_tokens"]) == (
        "lerobot", False, 48)  # fmt: skip
    assert meta["tokenizer"] == str(policy_dir)
    same = load_served(policy_dir, prompt_style="lerobot", state_in_prompt=False, device="cpu")
    np.testing.assert_array_equal(
        served.infer(no_state(1))["actions"], same.infer(no_state(1))["actions"]
    )
    gin.clear_config()  # without the run's bindings
    with pytest.raises(RecapError) as exc:
        load_served(run, device="cpu")
    assert str(exc.value) == (
        f"--policy: {run} is a recap training run without processor.json; pass its gin files "
        "(--gin_file, the ones it was trained with) so the model's sizes and inputs are known"
    )


def test_the_lerobot_layout_and_normalizer_serve_the_same_actions(tmp_path, policy_dir, served):
    directory = tmp_path / "lerobot"
    tiny_model(0).save_pretrained(directory, layout="lerobot")
    moments = {"observation.state.q01": STATE_Q01, "observation.state.q99": STATE_Q99,
               "action.q01": ACTION_Q01, "action.q99": ACTION_Q99}  # fmt: skip
    tensors = {k: torch.tensor(v, dtype=torch.float32) for k, v in moments.items()}
    save_file(
        tensors, str(directory / "policy_preprocessor_step_3_normalizer_processor.safetensors")
    )
    # a recap policy in LeRobot's layout: its conditioning named (LeRobot's default is the
    # plain prompt), images at model size (LeRobot's resize has no antialiasing)
    lerobot = load_served(directory, tokenizer=str(policy_dir), device="cpu", beta=1.5,
                          conditioning="paper")  # fmt: skip
    assert lerobot.metadata()["norm_stats"].endswith("normalizer_processor.safetensors")
    obs = observation(3, noise_seed=3)
    obs["observation/image"] = obs["observation/image"][:28, :28]
    np.testing.assert_allclose(
        lerobot.infer(obs)["actions"],
        served.infer(obs)["actions"],
        rtol=0,
        atol=1e-5,  # the LeRobot statistics were stored as float32
    )


def test_one_line_errors(tmp_path, policy_dir):
    bare = tmp_path / "bare"
    shutil.copytree(policy_dir, bare, ignore=shutil.ignore_patterns("assets", "tokenizer*"))
    with pytest.raises(RecapError) as exc:
        load_served(bare, device="cpu")
    assert str(exc.value) == (
        f"--policy: {bare} has no assets/<asset_id>/norm_stats.json or LeRobot normalizer file; "
        "a policy runs with the statistics it was trained with"
    )
    shutil.copytree(policy_dir / "assets", bare / "assets")
    with pytest.raises(RecapError) as exc:
        load_served(bare, device="cpu")
    assert str(exc.value) == (
        f"--tokenizer: {bare} carries no tokenizer; pass --tokenizer PATH (PaliGemma's "
        "paligemma_tokenizer.model for π0.5)"
    )
    with pytest.raises(RecapError) as exc:
        load_served(tmp_path / "nothing", device="cpu")
    assert str(exc.value) == (
        f"--policy: {tmp_path / 'nothing' / 'model.safetensors'} not found; point it at an "
        "exported policy directory (recap run, openpi or LeRobot layout)"
    )
    with pytest.raises(RecapError) as exc:
        load_served(policy_dir, device="cpu", guidance="negative",
                    conditioning="positive_only_conditional")  # fmt: skip
    assert str(exc.value) == (
        "--guidance: 'negative' is refused for a policy trained with positive_only_conditional "
        "(it never saw the negative prompt); use 'positive' or 'no_guide'"
    )


def test_the_label_position_comes_from_the_run_and_shapes_the_guided_prompt(
    tmp_path, policy_dir, clean_gin
):
    """A run trained with ``policy_data.label_position = "action"`` is served with the label
    after the state, exactly as ``PolicyDataset.prompt`` built it for training."""
    from recap.data.conditioning import conditioned_prompt, normalize_quantile
    from recap.data.transforms import tokenize_prompts
    from tests.serve.conftest import TASK

    run = tmp_path / "run"
    save_exported(tiny_model(0).state_dict(), run / "model.safetensors", step=10)
    shutil.copytree(policy_dir / "assets", run / "assets")
    gin_file = tmp_path / "policy.gin"
    text = GIN.format(vision=VISION, text=TEXT, expert=EXPERT, tokenizer=policy_dir)
    text = text.replace('"lerobot"', '"openpi"').replace("= False", "= True")
    gin_file.write_text(text + 'policy_data.label_position = "action"\n')
    served = load_served(run, gin_files=(str(gin_file),), device="cpu")
    assert served.metadata()["label_position"] == "action"
    obs = observation(2, noise_seed=2)
    prompts = served.prepare(obs).prompts
    state = normalize_quantile(obs["observation/state"], served.processor.state_stats)
    tokenizer = served.processor.load_tokenizer()
    for name, label in (("positive", True), ("plain", None)):
        segments = conditioned_prompt(TASK, label, state, "openpi", "action")
        ids, mask = tokenize_prompts(tokenizer, [segments], 48)
        assert prompts[name] == ids[0, mask[0]].tolist()
    guided = tokenizer.decode(prompts["positive"][1:])
    assert guided.index("state") < guided.index("advantage") < guided.index("action")

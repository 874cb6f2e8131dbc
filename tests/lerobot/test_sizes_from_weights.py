"""A tiny π0.5 LeRobot 0.6.1 itself saved, read by recap from LeRobot's files alone: no
``recap_pi05.json``, no sizes passed; the sizes come from the weights' header
(``recap.models.pi05_sizes``) and the actions are LeRobot's.

LeRobot's ``PI05Config`` takes only the variant names ``gemma_2b`` / ``gemma_300m`` and builds the
SigLIP tower at so400m's sizes, so no configuration of LeRobot's makes a π0.5 of other sizes: as
in ``test_policy_both_ways``, this process re-points ``modeling_pi05.get_gemma_config`` and wraps
its PaliGemma constructor (LeRobot's files are not edited). The sizes here keep π0.5's head
convention (1 KV head, 16 SigLIP heads), which is what recap assumes where no tensor shows it.
"""

import pytest
import torch
from lerobot.configs.types import FeatureType, PolicyFeature
from lerobot.policies.pi05.configuration_pi05 import PI05Config
from lerobot.policies.pi05.modeling_pi05 import PI05Policy

from recap.models import checkpoints as ckpt
from tests.lerobot.test_policy_both_ways import (
    ACTION_DIM,
    CAMERAS,
    STEPS,
    H,
    S,
    lerobot_actions,
    observation,
    randomize,
    recap_actions,
    repoint_sizes,
    same_weights,
)

# unlike test_policy_both_ways' sizes (8 heads of 8, 2 vision heads) and the real ones
VISION = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 1,
          "num_attention_heads": 16, "patch_size": 7}  # fmt: skip
TEXT = {"hidden_size": 48, "intermediate_size": 80, "num_hidden_layers": 3,
        "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 12}  # fmt: skip
EXPERT = {"hidden_size": 24, "intermediate_size": 40, "num_hidden_layers": 3,
          "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 12}  # fmt: skip


@pytest.fixture
def other_sizes(monkeypatch):
    """LeRobot's variant names and SigLIP tower re-pointed to this file's sizes (this process);
    recap's variant table is left alone: it must read these sizes from the weights."""
    repoint_sizes(monkeypatch, VISION, TEXT, EXPERT)


def test_a_lerobot_saved_pi05_of_other_sizes_loads_from_its_own_files(other_sizes, tmp_path):
    config = PI05Config(
        input_features={c: PolicyFeature(FeatureType.VISUAL, (3, S, S)) for c in CAMERAS},
        output_features={"action": PolicyFeature(FeatureType.ACTION, (ACTION_DIM,))},
        chunk_size=H, n_action_steps=H, num_inference_steps=STEPS, image_resolution=(S, S),
        device="cpu",
    )  # fmt: skip
    policy = PI05Policy(config)
    randomize(policy, 7)
    policy.eval()
    directory = tmp_path / "lerobot"
    policy.save_pretrained(directory)  # LeRobot's own writer
    assert not (directory / ckpt.RECAP_CONFIG_FILE).exists()

    sizes = ckpt.read_config(directory)
    assert {k: sizes.vision[k] for k in VISION} == VISION
    assert (sizes.vision["image_size"], sizes.text["vocab_size"]) == (S, 257152)  # LeRobot's
    assert {k: sizes.text[k] for k in TEXT} == TEXT
    assert sizes.expert == EXPERT
    assert (sizes.action_dim, sizes.action_horizon, sizes.num_steps) == (32, H, STEPS)
    model = ckpt.load_pi05(directory).eval()  # no sizes passed
    assert same_weights(policy, model) == []
    images, tokens, mask, noise = observation(seed=3)
    with torch.no_grad():
        ours = recap_actions(model, images, tokens, mask, noise)
        theirs = lerobot_actions(policy, images, tokens, mask, noise)
    assert ours.shape == theirs.shape == (2, H, ACTION_DIM)
    assert (ours - theirs).abs().max().item() < 1e-5
    assert ours.abs().mean().item() > 0.1

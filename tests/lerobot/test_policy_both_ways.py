"""π0.5 both ways at tiny sizes: a recap-exported policy loads with LeRobot 0.6.1's ``PI05Policy``
from its directory (``recap-import export-lerobot-policy``) and a policy LeRobot saved loads in
recap (``load_pi05``); for the same observation, prompt tokens and noise both give the same
actions (fp32, 1e-5), and recap's LeRobot-style prompt is LeRobot's prompt text. The whole path
too: a checkpoint LeRobot wrote with its pre/post-processor files, run by ``load_policy`` +
``PolicyAdapter`` (evaluation) and ``load_served`` (serving) on a raw observation, gives LeRobot's
preprocessor -> ``predict_action_chunk`` -> postprocessor actions.

LeRobot 0.6.1 accepts only the variant names ``gemma_2b`` / ``gemma_300m`` and hard-codes the
SigLIP so400m tower (``projection_dim`` 2048) and the 257,152-token vocabulary; tiny sizes are
made in this test process only, by re-pointing ``modeling_pi05.get_gemma_config`` and wrapping its
PaliGemma constructor (recap's ``checkpoints.VARIANTS`` names the same tiny sizes), keeping the 8
attention heads and the vocabulary. LeRobot's own files are not edited.
"""

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from lerobot.configs.types import FeatureType, PolicyFeature
from lerobot.policies.pi05 import modeling_pi05
from lerobot.policies.pi05.configuration_pi05 import PI05Config
from lerobot.policies.pi05.modeling_pi05 import PI05Policy
from lerobot.policies.pi05.processor_pi05 import Pi05PrepareStateTokenizerProcessorStep
from lerobot.processor import TransitionKey
from lerobot.utils.constants import OBS_LANGUAGE_ATTENTION_MASK, OBS_LANGUAGE_TOKENS

from recap.commands.import_rlinf import main as recap_import
from recap.data.conditioning import QuantileStats, pi05_prompt
from recap.models import checkpoints as ckpt
from recap.models import pi05_files
from recap.models.pi05 import Pi05Config, build_pi05

VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 2, "image_size": 28, "patch_size": 14,
          "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6}  # fmt: skip
TEXT = dict(ckpt.PALIGEMMA_2B, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=8, num_key_value_heads=1, head_dim=8)  # fmt: skip
EXPERT = dict(ckpt.GEMMA_300M, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
              num_attention_heads=8, num_key_value_heads=1, head_dim=8)  # fmt: skip
CAMERAS = ["observation.images.base", "observation.images.wrist"]
H, STEPS, STATE_DIM, ACTION_DIM, S = 4, 3, 8, 7, 28


SIGLIP_SIZE_KEYS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                    "patch_size")  # fmt: skip


def repoint_sizes(monkeypatch, vision: dict, text: dict, expert: dict) -> None:
    """LeRobot's variant names (gemma_2b -> ``text``, gemma_300m -> ``expert``) and SigLIP tower
    (``vision``) re-pointed to other sizes in this process; LeRobot's files are not edited."""

    def gemma_config(variant):
        d = {"gemma_2b": text, "gemma_300m": expert}[variant]
        return modeling_pi05.GemmaConfig(
            width=d["hidden_size"], depth=d["num_hidden_layers"], mlp_dim=d["intermediate_size"],
            num_heads=d["num_attention_heads"], num_kv_heads=d["num_key_value_heads"],
            head_dim=d["head_dim"],
        )  # fmt: skip

    paligemma = modeling_pi05.PaliGemmaForConditionalGenerationWithPiGemma

    class SizedPaliGemma(paligemma):
        def __init__(self, config):
            for name in SIGLIP_SIZE_KEYS:
                setattr(config.vision_config, name, vision[name])
            config.vision_config.projection_dim = text["hidden_size"]
            super().__init__(config)

    monkeypatch.setattr(modeling_pi05, "get_gemma_config", gemma_config)
    monkeypatch.setattr(
        modeling_pi05, "PaliGemmaForConditionalGenerationWithPiGemma", SizedPaliGemma
    )


@pytest.fixture
def tiny_sizes(monkeypatch):
    """LeRobot's variant names and SigLIP tower re-pointed to the tiny sizes (this process), and
    recap's variant table too (recap reads these sizes by the variant names)."""
    repoint_sizes(monkeypatch, VISION, TEXT, EXPERT)
    monkeypatch.setattr(pi05_files, "VARIANTS", {"gemma_2b": TEXT, "gemma_300m": EXPERT})


def tiny_config() -> Pi05Config:
    return Pi05Config(vision=dict(VISION), text=dict(TEXT), expert=dict(EXPERT),
                      action_horizon=H, num_steps=STEPS)  # fmt: skip


def randomize(module: torch.nn.Module, seed: int) -> None:
    """Weights of std 0.2 everywhere, so every path moves the actions."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.normal_(0.0, 0.2)


def observation(batch: int = 2, seed: int = 1):
    """Camera images in [0, 1] at the policy's resolution, prompt tokens (row 1 padded), noise."""
    g = torch.Generator().manual_seed(seed)
    images = {cam: torch.rand(batch, 3, S, S, generator=g) for cam in CAMERAS}
    tokens = torch.randint(3, 257152, (batch, 9), generator=g)
    mask = torch.ones(batch, 9, dtype=torch.bool)
    mask[1, 6:] = False
    noise = torch.randn(batch, H, 32, generator=g)
    return images, tokens, mask, noise


def recap_actions(model, images, tokens, mask, noise, cameras=CAMERAS) -> torch.Tensor:
    """recap's sampled actions; a camera left out of ``cameras`` is masked (LeRobot: missing)."""
    stacked = torch.stack([images[c] * 2.0 - 1.0 for c in CAMERAS], 1)
    masks = torch.tensor([c in cameras for c in CAMERAS]).expand(len(tokens), -1)
    batch = {"images": stacked, "image_masks": masks, "input_ids": tokens, "attention_mask": mask}
    return model.sample_actions(batch, noise=noise, beta=1.0)[:, :, :ACTION_DIM]


def lerobot_actions(policy, images, tokens, mask, noise, cameras=CAMERAS) -> torch.Tensor:
    batch = {c: images[c] for c in cameras}
    batch |= {OBS_LANGUAGE_TOKENS: tokens, OBS_LANGUAGE_ATTENTION_MASK: mask}
    return policy.predict_action_chunk(batch, noise=noise)


def same_weights(policy, model) -> list[str]:
    """Keys whose LeRobot tensor differs from recap's (the LeRobot file's names)."""
    ours = ckpt.file_state(model, ckpt.LEROBOT)
    ours[ckpt.file_key(ckpt.EMBED_KEY, ckpt.LEROBOT)] = model.state_dict()[ckpt.EMBED_KEY]
    theirs = policy.state_dict()
    # the two vocabulary heads flow matching never reads (LeRobot unties paligemma's lm_head)
    skip = {ckpt.file_key(k, ckpt.LEROBOT) for k in (ckpt.LM_HEAD_KEY, ckpt.EXPERT_LM_HEAD_KEY)}
    return [k for k in theirs if k not in skip and not torch.equal(theirs[k], ours.get(k))]


def test_recap_export_runs_in_lerobot(tiny_sizes, tmp_path, capsys):
    model = build_pi05(tiny_config())
    randomize(model, 0)
    model.eval()
    ckpt.save_pi05(model, tmp_path / "recap")
    stats = {k: QuantileStats(np.full(n, -1.0), np.full(n, 1.0)) for k, n in
             (("state", STATE_DIM), ("action", ACTION_DIM))}  # fmt: skip
    ckpt.write_norm_stats(tmp_path / "recap", "tiny", stats)
    out = tmp_path / "lerobot"
    argv = ["export-lerobot-policy", str(tmp_path / "recap"), "--out", str(out),
            "--camera", CAMERAS[0], "--camera", CAMERAS[1], "--state-dim", str(STATE_DIM),
            "--action-dim", str(ACTION_DIM)]  # fmt: skip
    assert recap_import(argv) == 0
    assert capsys.readouterr().out == f"wrote {out}\n"
    config = json.loads((out / "config.json").read_text())
    assert config["input_features"] == {
        CAMERAS[0]: {"type": "VISUAL", "shape": [3, S, S]},
        CAMERAS[1]: {"type": "VISUAL", "shape": [3, S, S]},
        "observation.state": {"type": "STATE", "shape": [STATE_DIM]},
    }
    assert (out / "assets/tiny/norm_stats.json").is_file()

    policy = PI05Policy.from_pretrained(out)  # LeRobot's own loader, from the directory
    policy.eval()
    assert list(policy.config.image_features) == CAMERAS
    assert (policy.config.chunk_size, policy.config.num_inference_steps) == (H, STEPS)
    assert same_weights(policy, model) == []  # its loader swallows errors: check the tensors
    images, tokens, mask, noise = observation()
    for cameras in (CAMERAS, CAMERAS[:1]):  # both cameras; the wrist camera missing
        ours = recap_actions(model, images, tokens, mask, noise, cameras)
        theirs = lerobot_actions(policy, images, tokens, mask, noise, cameras)
        assert theirs.shape == ours.shape == (2, H, ACTION_DIM)
        assert (ours - theirs).abs().max().item() < 1e-5
        assert ours.abs().mean().item() > 0.1  # the actions are not trivially equal


def test_lerobot_saved_policy_runs_in_recap(tiny_sizes, tmp_path):
    config = PI05Config(
        input_features={c: PolicyFeature(FeatureType.VISUAL, (3, S, S)) for c in CAMERAS},
        output_features={"action": PolicyFeature(FeatureType.ACTION, (ACTION_DIM,))},
        chunk_size=H, n_action_steps=H, num_inference_steps=STEPS, image_resolution=(S, S),
        device="cpu",
    )  # fmt: skip
    policy = PI05Policy(config)
    randomize(policy, 1)
    policy.eval()
    policy.save_pretrained(tmp_path / "lerobot")  # LeRobot's own writer

    model = ckpt.load_pi05(tmp_path / "lerobot", config=tiny_config()).eval()
    assert ckpt.read_config(tmp_path / "lerobot").action_horizon == H  # its config.json
    assert same_weights(policy, model) == []
    images, tokens, mask, noise = observation(seed=2)
    for cameras in (CAMERAS, CAMERAS[:1]):
        ours = recap_actions(model, images, tokens, mask, noise, cameras)
        theirs = lerobot_actions(policy, images, tokens, mask, noise, cameras)
        assert (ours - theirs).abs().max().item() < 1e-5
        assert ours.abs().mean().item() > 0.1


def test_recap_lerobot_prompt_is_lerobots_prompt():
    step = Pi05PrepareStateTokenizerProcessorStep()
    state = torch.tensor([[-1.2, -1.0, -0.5, 0.0, 0.37, 0.999, 1.0, 3.0]])
    tasks = ["Put_the bowl\non the plate. "]
    transition = {TransitionKey.OBSERVATION: {"observation.state": state},
                  TransitionKey.COMPLEMENTARY_DATA: {"task": tasks}}  # fmt: skip
    (theirs,) = step(transition)[TransitionKey.COMPLEMENTARY_DATA]["task"]
    (ours,) = pi05_prompt(tasks[0], state[0].numpy(), style="lerobot")
    assert (
        theirs == "Task: Put the bowl on the plate., State: -1 0 64 128 175 255 255 255;\nAction: "
    )
    assert ours == theirs


# ---- a LeRobot checkpoint through the whole path: raw observation -> unnormalized actions ----

PALIGEMMA = "google/paligemma-3b-pt-224"  # the tokenizer LeRobot's π0.5 processor names
LEROBOT_STEPS = 3  # config.json's num_inference_steps; recap's default is 10
STATE_KEY = "observation.state"
# LeRobot stacks the cameras in its config's input_features order, here the wrist camera first
# (recap's own rule, base first, would swap them)
LEROBOT_CAMERAS = (CAMERAS[1], CAMERAS[0])


@pytest.fixture(scope="module")
def paligemma_standin(tmp_path_factory):
    """A Hugging Face tokenizer directory standing in for PaliGemma's (offline): recap's
    SentencePiece stand-in (pad 0, eos 1, bos 2), converted by transformers, adding BOS as
    PaliGemma's does."""
    from transformers import GemmaTokenizer

    from recap.standins import sentencepiece_model

    root = tmp_path_factory.mktemp("paligemma")
    (root / "src").mkdir()
    (root / "src/tokenizer.model").write_bytes(sentencepiece_model(0))
    tokenizer = GemmaTokenizer.from_pretrained(root / "src", local_files_only=True,
                                               add_bos_token=True)  # fmt: skip
    tokenizer.save_pretrained(root / "tokenizer")
    return root / "tokenizer"


@pytest.fixture
def paligemma_offline(monkeypatch, paligemma_standin):
    """LeRobot's ``TokenizerProcessorStep`` resolves PaliGemma's Hub name to the stand-in (its
    saved ``policy_preprocessor.json`` names PaliGemma, as a real checkpoint's does)."""
    from lerobot.processor import tokenizer_processor
    from transformers import AutoTokenizer

    class Offline:
        @staticmethod
        def from_pretrained(name, **kwargs):
            assert name == PALIGEMMA, name
            return AutoTokenizer.from_pretrained(paligemma_standin, local_files_only=True)

    monkeypatch.setattr(tokenizer_processor, "AutoTokenizer", Offline)
    return paligemma_standin


def quantile_stats(seed: int, dim: int) -> dict[str, torch.Tensor]:
    """Non-trivial q01 < q99 per dim (offsets and spans far from [-1, 1]), mean and std."""
    g = torch.Generator().manual_seed(seed)
    q01 = torch.rand(dim, generator=g) * 4 - 3
    q99 = q01 + 0.5 + torch.rand(dim, generator=g) * 3
    return {"q01": q01, "q99": q99, "mean": (q01 + q99) / 2, "std": (q99 - q01) / 4,
            "min": q01 - 1, "max": q99 + 1}  # fmt: skip


@pytest.fixture
def lerobot_checkpoint(tiny_sizes, paligemma_offline, tmp_path):
    """A tiny π0.5 written by LeRobot 0.6.1: ``PI05Policy.save_pretrained`` and the pre/post
    processors of ``make_pre_post_processors`` (quantile statistics) saved beside it, with
    ``num_inference_steps`` 3 and the wrist camera first. Only ``recap_pi05.json`` is added:
    the tiny sizes, which are no ``gemma_2b`` (its ``num_steps`` left at recap's default, 10)."""
    from lerobot.policies.factory import make_pre_post_processors

    features = {c: PolicyFeature(FeatureType.VISUAL, (3, S, S)) for c in LEROBOT_CAMERAS}
    features[STATE_KEY] = PolicyFeature(FeatureType.STATE, (STATE_DIM,))
    config = PI05Config(
        input_features=features,
        output_features={"action": PolicyFeature(FeatureType.ACTION, (ACTION_DIM,))},
        chunk_size=H, n_action_steps=H, num_inference_steps=LEROBOT_STEPS,
        image_resolution=(S, S), device="cpu",
    )  # fmt: skip
    policy = PI05Policy(config)
    randomize(policy, 3)
    policy.eval()
    stats = {STATE_KEY: quantile_stats(4, STATE_DIM), "action": quantile_stats(5, ACTION_DIM)}
    stats[STATE_KEY]["q01"][0], stats[STATE_KEY]["q99"][0] = -1.0, 3.0  # see the test
    pre, post = make_pre_post_processors(config, dataset_stats=stats)
    directory = tmp_path / "lerobot"
    policy.save_pretrained(directory)
    pre.save_pretrained(directory)
    post.save_pretrained(directory)
    sizes = dataclasses.asdict(tiny_config()) | {"num_steps": 10}
    (directory / ckpt.RECAP_CONFIG_FILE).write_text(json.dumps(sizes))
    return directory


def raw_observation(seed: int, states: np.ndarray, size: tuple[int, int] = (S, S)):
    """recap's observation (uint8 HWC cameras, raw state, task texts) and the same as LeRobot's
    raw batch (float CHW in [0, 1], as its dataset and env wrappers give them)."""
    rng = np.random.default_rng(seed)
    images = {c: rng.integers(0, 256, (len(states), *size, 3), dtype=np.uint8) for c in CAMERAS}
    tasks = ["pick_up the red cube\n", "open the drawer."][: len(states)]
    ours = {"images": images, "state": states, "task": tasks}
    theirs = {c: torch.from_numpy(v).permute(0, 3, 1, 2).float() / 255.0 for c, v in
              images.items()}  # fmt: skip
    theirs |= {STATE_KEY: torch.from_numpy(states).float(), "task": list(tasks)}
    return ours, theirs


def lerobot_pipeline(directory: Path, batch: dict, noise: torch.Tensor) -> np.ndarray:
    """LeRobot's own path from its directory: preprocessor -> ``predict_action_chunk`` (the
    given noise) -> postprocessor, float64[B, H, action dims]."""
    from lerobot.policies.factory import make_pre_post_processors

    policy = PI05Policy.from_pretrained(directory).eval()
    pre, post = make_pre_post_processors(policy.config, pretrained_path=str(directory))
    with torch.no_grad():
        actions = policy.predict_action_chunk(pre(batch), noise=noise)
    return post(actions).double().numpy()


def test_a_lerobot_checkpoint_serves_and_evaluates_as_lerobot_runs_it(
    lerobot_checkpoint, paligemma_offline
):
    from recap.loading import PolicyAdapter, load_policy
    from recap.processing.cameras import slot_order
    from recap.processing.normalize import LEROBOT_FORMULA, OPENPI_FORMULA
    from recap.serve.load import load_served
    from recap.serve.policy import ServeSpec

    tokenizer = str(paligemma_offline)
    model, processor = load_policy(lerobot_checkpoint, tokenizer=tokenizer)
    assert (processor.normalization, processor.num_steps) == ("lerobot", 3)
    assert (processor.conditioning, processor.resize) == ("none", "bilinear")  # plain prompt
    assert LEROBOT_FORMULA == "lerobot" and processor.prompt_style == "lerobot"
    assert processor.max_length == 200  # config.json's tokenizer_max_length
    assert processor.cameras == LEROBOT_CAMERAS != tuple(slot_order(LEROBOT_CAMERAS))
    # state dim 0 sits on a bin edge under LeRobot's formula (q01 -1, q99 3: 2 (1 + 1) / 4 - 1
    # = 0, bin 128); openpi's epsilon moves it below (bin 127): another prompt
    g = torch.Generator().manual_seed(6)
    states = torch.randn(2, STATE_DIM, generator=g).double().numpy() * 2
    states[0, 0] = 1.0
    (prompt,) = processor.prompt("t", None, processor.normalize_state(states[0]))
    assert prompt.startswith("Task: t, State: 128 ")
    ours_obs, theirs_obs = raw_observation(7, states)
    noise = torch.randn(2, H, 32, generator=torch.Generator().manual_seed(11))  # the adapter's

    def evaluated(processor) -> np.ndarray:  # closed-loop evaluation's chunk, seed 11
        return PolicyAdapter(model, processor, beta=1.0, seed=11).chunk(ours_obs)

    ours = evaluated(processor)
    theirs = lerobot_pipeline(lerobot_checkpoint, theirs_obs, noise)
    assert ours.shape == theirs.shape == (2, H, ACTION_DIM)
    assert np.abs(ours - theirs).max() < 1e-5
    assert np.abs(theirs).mean() > 0.1
    # openpi's formula on the same checkpoint: frame 0 gets another prompt
    openpi = evaluated(processor.replace(normalization=OPENPI_FORMULA))
    assert np.abs(openpi[0] - theirs[0]).max() > 1e-3  # state bin 127: other actions
    assert np.abs(openpi[1] - theirs[1]).max() < 1e-4  # same bins: only the epsilon
    # recap's own camera rule (base first) swaps LeRobot's slots
    assert np.abs(evaluated(processor.replace(cameras=())) - theirs).max() > 1e-3
    # the advantage label RECAP policies are served with is another prompt
    assert np.abs(evaluated(processor.replace(conditioning="paper")) - theirs).max() > 1e-3
    # cameras not at model size: LeRobot's bilinear resize; recap packs them as uint8
    # (pack_cameras), which rounds each pixel by up to 0.5 / 255
    ours_obs, theirs_obs = raw_observation(7, states, (40, 56))
    theirs = lerobot_pipeline(lerobot_checkpoint, theirs_obs, noise)
    assert np.abs(evaluated(processor) - theirs).max() < 1e-3
    assert np.abs(evaluated(processor.replace(resize="antialias")) - theirs).max() > 5e-3
    ours_obs, theirs_obs = raw_observation(7, states)

    spec = ServeSpec(image_keys=LEROBOT_CAMERAS, state_key=STATE_KEY)
    served = load_served(lerobot_checkpoint, tokenizer=tokenizer, device="cpu", spec=spec)
    assert (served.num_steps, served.processor.normalization, served.beta) == (3, "lerobot", 1.0)
    for row in range(2):
        request = {c: ours_obs["images"][c][row] for c in CAMERAS}
        request |= {STATE_KEY: states[row], "prompt": ours_obs["task"][row], "noise_seed": 5}
        reply = served.infer(request)["actions"]
        noise = torch.randn(H, 32, generator=torch.Generator().manual_seed(5))[None]
        single = {k: v[row : row + 1] for k, v in theirs_obs.items()}
        expected = lerobot_pipeline(lerobot_checkpoint, single, noise)[0]
        assert np.abs(reply - expected).max() < 1e-5

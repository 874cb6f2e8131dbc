"""Real-format stand-ins, at tiny sizes, of everything a user of the LIBERO experiment brings.

``write_standins(out)`` writes, deterministically for a seed and in a few seconds::

    out/data/libero10_task0_{sft,train,eval}   LeRobot v2.1 datasets in the layout of RLinf's
                                              RECAP-Libero10-Task0 data (openpi/RLinf names
                                              image, wrist_image (AV1 256x256), state [8],
                                              actions [7], is_success; robot panda, 10 fps)
    out/models/siglip                         transformers SiglipModel (vision + text towers)
    out/models/gemma3                         Gemma3ForCausalLM + its Gemma tokenizer files
    out/models/paligemma_tokenizer.model      PaliGemma-style SentencePiece file, vocab 512
    out/models/pi05_base                      openpi π0.5 PyTorch checkpoint (converter output:
                                              model.safetensors, config.json, assets/…)
    out/models/pi05_libero_checkpoint/1000    the same weights as an openpi training checkpoint
                                              (model.safetensors, optimizer.pt, metadata.pt,
                                              assets/…; no config.json)

so the shipped LIBERO configs run end to end in CI, and users can rehearse their own config
before pointing it at the real files: only the sizes differ. ``python -m recap.standins --out
DIR`` writes them and prints the gin bindings of their paths (``StandIns.bindings``); their
sizes are ``VALUE_SIZES`` / ``PI05_SIZES`` (gin: ``rehearsal/tiny.gin``).

Every model is built here from random weights (nothing comes from the hub), π0.5's adaptive norms
with a non-zero time modulation (``ADARMS_STD``), as a trained ``pi05_base`` has: at a fresh
model's zeros every action-expert layer is gated off, and a LoRA run (whose adapted towers keep
their norms frozen) would get no gradient into any adapter. The tokenizers are
SentencePiece BPE models trained in-process on LIBERO-style prompts, with byte fallback (any
text encodes, digits included) and Gemma's special ids (pad 0, eos 1, bos 2, unk 3, <mask> 4).
Each directory (and the tokenizer file) is written to a temporary sibling and renamed into
place. Parquet, JSON, safetensors and tokenizer files are byte-identical for a seed; torch's
``.pt`` files carry a random serialization id, as torch writes them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from recap.data.lerobot_writer import Episode, WriterConfig, atomic_directory
from recap.data.sidecars import write_atomic
from recap.errors import RecapError

TASK = "put both the alphabet soup and the tomato sauce in the basket"  # LIBERO-10 task 0
# Tokenizer training text only (instructions of the LIBERO-10 suite).
CORPUS_TASKS = (
    TASK,
    "put both the cream cheese box and the butter in the basket",
    "turn on the stove and put the moka pot on it",
    "put the black bowl in the bottom drawer of the cabinet and close it",
    "put the white mug on the left plate and put the yellow and white mug on the right plate",
    "pick up the book and place it in the back compartment of the caddy",
    "put the white mug on the plate and put the chocolate pudding to the right of the plate",
    "put both the alphabet soup and the cream cheese box in the basket",
    "put both moka pots on the stove",
    "put the yellow and white mug in the microwave and close it",
)
FPS = 10
IMAGE_HW = 256
STATE_DIM, ACTION_DIM = 8, 7
MIN_LEN, MAX_LEN = 8, 14
# name -> episode outcomes (fixed, so counts do not depend on the seed)
DATASETS = {
    "libero10_task0_sft": (True, True, True, True),
    "libero10_task0_train": (True, False, True, False, False, True),
    "libero10_task0_eval": (True, False, False, True),
}
NORM_STATS_DATASET = "libero10_task0_train"
WRITER = WriterConfig(version="v2.1", naming="libero", codec="libsvtav1", image_dtype="video",
                      fps=FPS, robot_type="panda")  # fmt: skip

VOCAB_SIZE = 512
SPECIAL_PIECES = ("<pad>", "<eos>", "<bos>", "<unk>")  # ids 0-3, as PaliGemma / Gemma
MASK_PIECE = "<mask>"  # id 4, as Gemma

SIGLIP_VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                 "num_attention_heads": 2, "image_size": 32, "patch_size": 8}  # fmt: skip
SIGLIP_TEXT = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
               "num_attention_heads": 2, "vocab_size": VOCAB_SIZE,
               "max_position_embeddings": 16, "pad_token_id": 0, "eos_token_id": 1,
               "bos_token_id": 2}  # fmt: skip
GEMMA3_TEXT = {
    "vocab_size": VOCAB_SIZE, "hidden_size": 32, "intermediate_size": 64,
    "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
    "max_position_embeddings": 256, "query_pre_attn_scalar": 16, "sliding_window": 512,
    "layer_types": ["sliding_attention", "full_attention"],
    "rope_parameters": {
        "full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
        "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0},
    },
    "pad_token_id": 0, "eos_token_id": 1, "bos_token_id": 2,
}  # fmt: skip
# ValueModelConfig fields for the stand-in SigLIP + Gemma3 (head_dim / kv heads = Gemma3's).
VALUE_SIZES = {"expert_width": 32, "expert_depth": 2, "expert_mlp": 64, "expert_head_dim": 16}
# Pi05Config fields of the stand-in π0.5 (the caller's pi05_policy.* overrides).
PI05_SIZES = {
    # 16 heads as π0.5's SigLIP (no tensor shows a head count: a checkpoint's sizes are read from
    # its weights with π0.5's heads, recap.models.pi05_sizes, so the stand-in keeps them)
    "vision": dict(SIGLIP_VISION, num_attention_heads=16),
    "text": {"vocab_size": VOCAB_SIZE, "hidden_size": 32, "intermediate_size": 64,
             "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
             "head_dim": 16, "max_position_embeddings": 256,
             "hidden_act": "gelu_pytorch_tanh"},
    "expert": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
               "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16},
    "action_horizon": 10,
    "action_dim": 32,
}  # fmt: skip
CHECKPOINT_STEP = 1000
# std of the π0.5 stand-in's adaptive-norm modulation (a fresh model's is zero; module docstring)
ADARMS_STD = 0.02
ASSET_ID = "physical-intelligence/libero"


@dataclasses.dataclass(frozen=True)
class StandIns:
    """Absolute paths of a stand-in tree (``StandIns.at(out)``; ``write_standins`` writes it)."""

    root: Path
    data: Path  # the directory holding the three datasets (gin DATA)
    sft: Path
    train: Path
    eval: Path
    siglip: Path
    gemma3: Path
    tokenizer: Path  # paligemma_tokenizer.model
    pi05_base: Path  # openpi converter output (config.json)
    pi05_checkpoint: Path  # openpi training checkpoint step directory (no config.json)

    @classmethod
    def at(cls, out: str | os.PathLike) -> StandIns:
        root = Path(out).expanduser().absolute()
        data, models = root / "data", root / "models"
        sft, train, eval_ = (data / name for name in DATASETS)
        step = models / "pi05_libero_checkpoint" / str(CHECKPOINT_STEP)
        return cls(root=root, data=data, sft=sft, train=train, eval=eval_,
                   siglip=models / "siglip", gemma3=models / "gemma3",
                   tokenizer=models / "paligemma_tokenizer.model",
                   pi05_base=models / "pi05_base", pi05_checkpoint=step)  # fmt: skip

    def bindings(self) -> list[str]:
        """The path bindings of the LIBERO pipeline (``all:`` applies them to every step)."""
        return [
            f'all:DATA = "{self.data}"',
            f'all:SIGLIP = "{self.siglip}"',
            f'all:GEMMA = "{self.gemma3}"',
            f'all:TOKENIZER = "{self.tokenizer}"',
            f'all:PI05_BASE = "{self.pi05_base}"',
        ]


# ---- datasets -------------------------------------------------------------------------------

BASKET = np.array([0.15, 0.10, 1.00])  # where successful episodes end (eef x, y, z in metres)
LOW, HIGH = np.array([-0.3, -0.3, 0.9]), np.array([0.3, 0.3, 1.3])
SQUARE = 24


def _episode(rng: np.random.Generator, success: bool) -> Episode:
    """A smooth end-effector path (to the basket on success, elsewhere otherwise) with LIBERO's
    state [eef xyz, axis-angle, gripper qpos x2] and actions [dxyz, drot, gripper -1/+1]."""
    length = int(rng.integers(MIN_LEN, MAX_LEN + 1))
    start = rng.uniform([-0.25, -0.25, 1.15], [0.25, 0.25, 1.25])
    goal = BASKET + rng.normal(0.0, 0.01, 3) if success else rng.uniform(LOW, HIGH)
    s = np.linspace(0.0, 1.0, length)
    s = s * s * (3 - 2 * s)  # smoothstep
    pos = start + (goal - start) * s[:, None] + rng.normal(0.0, 0.003, (length, 3))
    rot = np.array([np.pi, 0.0, 0.0]) + np.cumsum(rng.normal(0.0, 0.01, (length, 3)), axis=0)
    closed = s > (0.5 if success else 0.8)
    finger = np.where(closed, 0.012, 0.039) + rng.normal(0.0, 0.0005, length)
    state = np.concatenate([pos, rot, finger[:, None], -finger[:, None]], axis=1)
    pose = np.concatenate([pos, rot], axis=1)
    deltas = np.diff(pose, axis=0, append=pose[-1:])  # the last step holds still
    grip = np.where(closed, 1.0, -1.0)[:, None]  # LIBERO: -1 open, +1 close
    action = np.concatenate([np.clip(deltas * 10.0, -1.0, 1.0), grip], axis=1)
    images = {
        "image": _frames(pos[:, :2], finger, base=True, tint=rng.integers(0, 40, 3)),
        "wrist_image": _frames(pos[:, 1:], finger, base=False, tint=rng.integers(0, 40, 3)),
    }
    state, action = state.astype(np.float32), action.astype(np.float32)
    return Episode(images=images, state=state, action=action, task=TASK, success=success)


def _frames(xy: np.ndarray, finger: np.ndarray, base: bool, tint: np.ndarray) -> np.ndarray:
    """uint8[T, 256, 256, 3]: a smooth gradient (vertical for the base camera, horizontal for the
    wrist) tinted per episode, a square whose position follows the state (its size the gripper
    opening on the wrist camera) and, on the base camera, the basket's outline."""
    ramp = np.linspace(0, 160, IMAGE_HW)
    grad = ramp[:, None] if base else ramp[None, :]
    grad = np.broadcast_to(grad, (IMAGE_HW, IMAGE_HW))
    channels = (grad, 160 - grad, np.full_like(grad, 60.0)) if base else (
        np.full_like(grad, 90.0), grad, 160 - grad)  # fmt: skip
    background = np.stack(channels, axis=-1) + tint
    lo, hi = (LOW[:2], HIGH[:2]) if base else (LOW[1:], HIGH[1:])
    span = IMAGE_HW - SQUARE
    frames = np.repeat(background[None], len(xy), axis=0).astype(np.uint8)
    if base:
        x, y = ((BASKET[:2] - lo) / (hi - lo) * span).astype(int)
        outline = frames[:, y : y + SQUARE, x : x + SQUARE]  # a view: 2-pixel border
        outline[:, :2] = outline[:, -2:] = outline[:, :, :2] = outline[:, :, -2:] = 230
    colour = (220, 40, 40) if base else (240, 200, 30)
    for t, (u, v) in enumerate(np.clip((xy - lo) / (hi - lo), 0, 1) * span):
        size = SQUARE if base else int(8 + 16 * finger[t] / 0.04)
        x, y = int(u), int(v)
        frames[t, y : y + size, x : x + size] = colour
    return frames


def make_episodes(seed: int) -> dict[str, list[Episode]]:
    """The three datasets' episodes, in memory (deterministic for ``seed``)."""
    out = {}
    for k, (name, outcomes) in enumerate(DATASETS.items()):
        rng = np.random.default_rng([seed, k])
        out[name] = [_episode(rng, success) for success in outcomes]
    return out


def norm_stats(episodes: Sequence[Episode]) -> dict:
    """openpi ``norm_stats.json`` content (mean, std, q01, q99 of state and actions)."""

    def stats(x: np.ndarray) -> dict[str, list[float]]:
        x = x.astype(np.float64)
        values = {"mean": x.mean(0), "std": x.std(0), "q01": np.quantile(x, 0.01, axis=0),
                  "q99": np.quantile(x, 0.99, axis=0)}  # fmt: skip
        return {k: [float(np.float32(e)) for e in v] for k, v in values.items()}

    state = np.concatenate([ep.state for ep in episodes])
    actions = np.concatenate([ep.action for ep in episodes])
    return {"norm_stats": {"state": stats(state), "actions": stats(actions)}}


# ---- tokenizers -----------------------------------------------------------------------------


def _corpus(seed: int) -> Iterator[str]:
    """LIBERO-style prompts: π0.5's (task + state bins), the value model's, advantage texts."""
    rng = np.random.default_rng([seed, 99])
    for task in CORPUS_TASKS:
        for _ in range(20):
            bins = " ".join(str(b) for b in rng.integers(0, 256, STATE_DIM))
            yield f"Task: {task}, State: {bins};\nAction: "
            yield f"Task: {task};\nAction: "
            yield f"Task: {task}."
            yield f"{task}\nAdvantage: positive"
            yield f"{task}\nAdvantage: negative"


def sentencepiece_model(seed: int = 0) -> bytes:
    """A serialized SentencePiece BPE model in the PaliGemma / Gemma style: vocab exactly 512,
    pad 0, eos 1, bos 2, unk 3, ``<mask>`` 4, byte fallback, digits split, no normalization,
    no dummy prefix, whitespace kept."""
    import sentencepiece as spm

    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=_corpus(seed), model_writer=buffer, vocab_size=VOCAB_SIZE,
        model_type="bpe", byte_fallback=True, split_digits=True, character_coverage=1.0,
        pad_id=0, eos_id=1, bos_id=2, unk_id=3, pad_piece=SPECIAL_PIECES[0],
        eos_piece=SPECIAL_PIECES[1], bos_piece=SPECIAL_PIECES[2], unk_piece=SPECIAL_PIECES[3],
        control_symbols=[MASK_PIECE], normalization_rule_name="identity",
        add_dummy_prefix=False, remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True, hard_vocab_limit=True, num_threads=1, minloglevel=2,
    )  # fmt: skip
    return buffer.getvalue()


def _write_gemma_tokenizer(directory: Path, model: bytes) -> None:
    """``tokenizer.model`` + the Hugging Face files (``tokenizer.json``,
    ``tokenizer_config.json``) that ``AutoTokenizer`` reads offline, as a Gemma model ships."""
    from transformers import GemmaTokenizer

    (directory / "tokenizer.model").write_bytes(model)
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "tokenizer.model").write_bytes(model)
        tokenizer = GemmaTokenizer.from_pretrained(tmp, local_files_only=True)
    tokenizer.save_pretrained(str(directory))
    # transformers records where it loaded from (a temporary path); a shipped model has none.
    config_path = directory / "tokenizer_config.json"
    config = json.loads(config_path.read_text())
    for key in ("vocab_file", "is_local", "local_files_only"):
        config.pop(key, None)
    config_path.write_text(json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


# ---- models ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """Torch's global RNG seeded with ``seed`` inside, restored after (weights init from it)."""
    import torch

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def _write_siglip(path: Path, seed: int, overwrite: bool) -> None:
    from transformers import SiglipConfig, SiglipModel

    config = SiglipConfig(text_config=dict(SIGLIP_TEXT), vision_config=dict(SIGLIP_VISION))
    with _seeded(seed):
        model = SiglipModel(config).eval()
    with atomic_directory(path, overwrite) as tmp:
        model.save_pretrained(str(tmp))


def _write_gemma3(path: Path, seed: int, tokenizer_model: bytes, overwrite: bool) -> None:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    config = Gemma3TextConfig(**GEMMA3_TEXT)
    with _seeded(seed):
        model = Gemma3ForCausalLM(config).eval()
    with atomic_directory(path, overwrite) as tmp:
        model.save_pretrained(str(tmp))
        _write_gemma_tokenizer(tmp, tokenizer_model)


def openpi_module(policy, seed: int = 0):
    """An ``nn.Module`` shaped like openpi's ``PI0Pytorch(pi05=True)`` around ``policy``'s
    parameters: ``paligemma_with_expert.paligemma.{model, lm_head}`` with ``lm_head`` tied to the
    text embedding, ``paligemma_with_expert.gemma_expert.{model, lm_head}`` (the expert's unused
    [vocab, width] head, randomly initialized from ``seed``) and the four projections.
    ``safetensors.torch.save_model`` on it writes the file openpi writes."""
    import torch
    from torch import nn

    inner = policy.paligemma_with_expert
    paligemma, expert = nn.Module(), nn.Module()
    paligemma.model = inner.paligemma["model"]
    embed = paligemma.model["language_model"].embed_tokens
    vocab, width = embed.weight.shape
    paligemma.lm_head = nn.Linear(width, vocab, bias=False, device="meta")
    paligemma.lm_head.weight = embed.weight  # tied, as PaliGemmaForConditionalGeneration
    expert.model = inner.gemma_expert["model"]
    expert_width = policy.action_in_proj.out_features
    generator = torch.Generator().manual_seed(seed)
    head = nn.Linear(expert_width, vocab, bias=False)
    with torch.no_grad():
        bound = 1.0 / expert_width**0.5
        head.weight.copy_(torch.rand(vocab, expert_width, generator=generator) * 2 * bound - bound)
    expert.lm_head = head
    module = nn.Module()
    module.paligemma_with_expert = nn.Module()
    module.paligemma_with_expert.paligemma = paligemma
    module.paligemma_with_expert.gemma_expert = expert
    for name in ("action_in_proj", "action_out_proj", "time_mlp_in", "time_mlp_out"):
        setattr(module, name, getattr(policy, name))
    return module


def _write_pi05(standins: StandIns, seed: int, stats: dict, overwrite: bool) -> None:
    import torch
    from safetensors.torch import save_model

    from recap.models.pi05 import Pi05Config, build_pi05

    config = Pi05Config(**{k: (dict(v) if isinstance(v, dict) else v)
                           for k, v in PI05_SIZES.items()})  # fmt: skip
    with _seeded(seed):
        policy = build_pi05(config).eval()
        with torch.no_grad():  # a trained checkpoint's time modulation (module docstring)
            for name, param in policy.named_parameters():
                if name.endswith("norm.dense.weight"):  # every AdaRMSNorm of the expert
                    param.normal_(0.0, ADARMS_STD)
    module = openpi_module(policy, seed)
    stats_text = json.dumps(stats, indent=2)

    def common(directory: Path) -> None:
        save_model(module, str(directory / "model.safetensors"))
        assets = directory / "assets" / ASSET_ID
        assets.mkdir(parents=True)
        (assets / "norm_stats.json").write_text(stats_text)

    with atomic_directory(standins.pi05_base, overwrite) as tmp:
        common(tmp)
        converter = {"action_dim": config.action_dim, "action_horizon": config.action_horizon,
                     "paligemma_variant": "gemma_2b", "action_expert_variant": "gemma_300m",
                     "precision": "float32"}  # fmt: skip
        (tmp / "config.json").write_text(json.dumps(converter, indent=2))
    with atomic_directory(standins.pi05_checkpoint, overwrite) as tmp:
        common(tmp)
        optimizer = torch.optim.AdamW(module.parameters(), lr=5e-5, weight_decay=1e-10)
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save({"global_step": CHECKPOINT_STEP}, tmp / "metadata.pt")


# ---- entry points ---------------------------------------------------------------------------


def write_standins(out: str | os.PathLike, seed: int = 0, force: bool = False) -> StandIns:
    """Write the stand-in tree under ``out`` (see the module docstring); refuses a non-empty
    ``out`` unless ``force`` (then each stand-in directory is replaced, nothing else touched)."""
    from recap.data.lerobot_writer import write_lerobot_dataset

    standins = StandIns.at(out)
    root = standins.root
    if root.exists() and not root.is_dir():
        raise RecapError(f"{root}: exists and is not a directory; pass a directory for --out")
    if root.is_dir() and any(root.iterdir()) and not force:
        raise RecapError(f"{root}: directory not empty; pass an empty or new directory, or "
                         "force=True (--force) to overwrite the stand-ins in it")  # fmt: skip
    episodes = make_episodes(seed)
    for name, path in zip(DATASETS, (standins.sft, standins.train, standins.eval), strict=True):
        write_lerobot_dataset(path, episodes[name], WRITER, overwrite=force)
    tokenizer_model = sentencepiece_model(seed)
    write_atomic({standins.tokenizer: lambda tmp: tmp.write_bytes(tokenizer_model)})
    _write_siglip(standins.siglip, seed, force)
    _write_gemma3(standins.gemma3, seed + 1, tokenizer_model, force)
    _write_pi05(standins, seed + 2, norm_stats(episodes[NORM_STATS_DATASET]), force)
    return standins


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Write tiny real-format stand-ins of the LIBERO experiment's inputs."
    )
    parser.add_argument("--out", required=True, help="directory to write (new or empty)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--force", action="store_true", help="overwrite stand-ins in --out")
    args = parser.parse_args(argv)
    os.environ.setdefault("SVT_LOG", "1")  # SVT-AV1: errors only, not a banner per video
    try:
        standins = write_standins(args.out, args.seed, args.force)
    except RecapError as exc:
        print(f"error: {exc.message}", file=sys.stderr)
        return 2
    print(f"# stand-ins written to {standins.root}; pass each line as a --gin_param, plus")
    print("# 'all:include \"rehearsal/tiny.gin\"' for their tiny sizes")
    print("\n".join(standins.bindings()))
    return 0


if __name__ == "__main__":
    sys.exit(main())

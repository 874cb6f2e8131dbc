"""A policy is its weights plus its processor: ``load_policy(dir)`` returns both from the directory.

Layouts, each with the processor it carries or implies:

- **recap runs and exports** (a training run directory, ``save_pi05``, imports, LoRA merges):
  ``processor.json`` (``Pi05Processor``) and ``recap_pi05.json`` (the exact ``Pi05Config``) beside
  ``model.safetensors``; nothing else is read.
- **LeRobot** π0.5 directories (``config.json`` with ``type: pi05``, the normalizer files): the
  sizes from the weights' shapes (``recap.models.checkpoints.read_config``: its variant names say
  only the real ones), ``num_inference_steps``, ``tokenizer_max_length``, the image resolution
  and the camera slots (its VISUAL ``input_features``, in order) from ``config.json``, LeRobot's
  quantile formula,
  prompt style, plain prompt (conditioning ``none``) and bilinear resize, statistics from the
  normalizer.
- **openpi** directories and training checkpoints: ``assets/<asset_id>/norm_stats.json``, openpi's
  formula and prompt style, 10 sampling steps.
- **older recap runs** without ``processor.json``: the processor is rebuilt once from the run's
  gin bindings (``policy_data``; the caller parses the run's gin files), with one log line.

Foreign checkpoints carry no tokenizer setting: ``tokenizer`` (or a tokenizer inside the
directory) names it. ``overrides`` replace processor fields (e.g. ``conditioning``,
``prompt_style``) for checkpoints whose files do not say them.

``PolicyAdapter`` turns the pair into the batched chunk policy that closed-loop evaluation and
collection run: observations through ``Pi05Processor.obs_to_batch``, classifier-free guidance at
``beta``, the chunk unnormalized by the processor.
"""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path

import numpy as np
import torch

from recap import logs
from recap.configurable import configured
from recap.core.columns import EPISODE_SEED, EPISODE_STEP
from recap.errors import RecapError
from recap.processing.cameras import NUM_CAMERAS
from recap.processing.files import DTYPE_NAMES, own_tokenizer
from recap.processing.normalize import LEROBOT_FORMULA, OPENPI_FORMULA
from recap.processing.pi05 import GUIDANCE, Pi05Processor, check_guidance, read_policy_processor
from recap.processing.prompts import LEROBOT, NONE, OPENPI, PLAIN
from recap.processing.transforms import RESIZE_BILINEAR

log = logs.get(__name__)

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}
PROCESSOR_FIELDS = {f.name for f in dataclasses.fields(Pi05Processor)}


def is_recap_export(weights: Path) -> bool:
    """True for a ``model.safetensors`` the trainer exported (its metadata names tied keys)."""
    from safetensors import safe_open

    from recap.engine.inference import TIED_KEY

    with safe_open(str(weights), framework="pt") as handle:
        return TIED_KEY in (handle.metadata() or {})


def _check_overrides(overrides: dict) -> dict:
    unknown = sorted(set(overrides) - PROCESSOR_FIELDS)
    if unknown:
        raise RecapError(f"load_policy: {unknown[0]!r} is not a processor field; known: "
                         f"{', '.join(sorted(PROCESSOR_FIELDS))}")  # fmt: skip
    return {k: v for k, v in overrides.items() if v is not None}


def _lerobot_config(path: Path) -> dict | None:
    config = path / "config.json"
    if not config.is_file():
        return None
    try:
        raw = json.loads(config.read_text())
    except ValueError as exc:
        raise RecapError(f"{config}: not valid JSON ({exc})") from exc
    return raw if raw.get("type") == "pi05" else None


def lerobot_cameras(config: dict | None) -> tuple[str, ...]:
    """The VISUAL ``input_features`` of a LeRobot ``config.json``, in order (LeRobot's
    ``PI05Config.image_features``: the order its model stacks the cameras in)."""
    features = (config or {}).get("input_features") or {}
    return tuple(k for k, f in features.items()
                 if isinstance(f, dict) and f.get("type") == "VISUAL")  # fmt: skip


def foreign_processor(
    path: Path, model_config, tokenizer: str | os.PathLike | None, asset_id: str | None,
    overrides: dict,
) -> Pi05Processor:  # fmt: skip
    """The processor an openpi or LeRobot checkpoint implies (module docstring)."""
    from recap.processing.norm_stats import find_norm_stats, read_norm_stats

    found = find_norm_stats(path, asset_id)
    if found is None and asset_id is None:
        found = find_norm_stats(path, "recap")
    if found is None:
        raise RecapError(f"--policy: {path} has no assets/<asset_id>/norm_stats.json or LeRobot "
                         "normalizer file; a policy runs with the statistics it was trained "
                         "with")  # fmt: skip
    stats = read_norm_stats(found)
    tokenizer = tokenizer or own_tokenizer(path)
    if tokenizer is None:
        raise RecapError(f"--tokenizer: {path} carries no tokenizer; pass --tokenizer PATH "
                         "(PaliGemma's paligemma_tokenizer.model for π0.5)")  # fmt: skip
    lerobot = _lerobot_config(path)
    fields = {"normalization": OPENPI_FORMULA, "prompt_style": OPENPI}
    if lerobot is not None or str(found).endswith(".safetensors"):
        # LeRobot's PI05 pipeline: its quantile formula and prompt, the plain prompt it trains
        # on (no advantage label: one branch, beta 1) and resize_with_pad_torch (bilinear, no
        # antialiasing)
        fields = {"normalization": LEROBOT_FORMULA, "prompt_style": LEROBOT,
                  "conditioning": NONE, "resize": RESIZE_BILINEAR}  # fmt: skip
    cameras = lerobot_cameras(lerobot)
    if 0 < len(cameras) <= NUM_CAMERAS:  # LeRobot's slots: its image features, in order
        fields["cameras"] = cameras
    fields["num_steps"] = int(model_config.num_steps)
    if lerobot is not None and lerobot.get("tokenizer_max_length"):
        fields["max_length"] = int(lerobot["tokenizer_max_length"])
    if lerobot is not None and lerobot.get("num_inference_steps"):  # LeRobot's own setting
        fields["num_steps"] = int(lerobot["num_inference_steps"])
    fields |= overrides
    processor = Pi05Processor(
        tokenizer=str(tokenizer), action_horizon=model_config.action_horizon,
        state_stats=stats["state"], action_stats=stats["action"],
        action_dim=model_config.action_dim,
        image_size=int(model_config.vision.get("image_size", 224)),
        vocab_size=int(model_config.text["vocab_size"]), **fields,
    )  # fmt: skip
    log.info(f"{path}: no processor.json; {processor.normalization} normalization "
             f"({found.name}), {processor.prompt_style} prompts, {processor.num_steps} "
             "sampling steps")  # fmt: skip
    return processor


GIN_FIELDS = {"tokenizer": "tokenizer_path", "prompt_style": "prompt_style",
              "state_in_prompt": "state_in_prompt", "label_position": "label_position",
              "conditioning": "conditioning", "max_length": "max_length"}  # fmt: skip


def check_gin_run(path: Path) -> None:
    """An older recap run (trainer weights, no processor.json) needs its training bindings."""
    from recap.configurable import bound

    if bound("policy_data.tokenizer_path") is None:
        raise RecapError(f"--policy: {path} is a recap training run without processor.json; "
                         "pass its gin files (--gin_file, the ones it was trained with) so the "
                         "model's sizes and inputs are known")  # fmt: skip


def processor_from_gin(path: Path, model_config, overrides: dict) -> Pi05Processor:
    """An older recap run's processor, rebuilt once from the parsed gin bindings of its training
    (``policy_data``) with the statistics the run exported beside its weights (one log line):
    from the datasets when they are bound (the state names come with them), else from the
    bound prompt settings alone."""
    from recap.configurable import bound
    from recap.data.policy_data import PolicyDataConfig, describe_stats, run_stats

    stats, where = run_stats(path)
    if bound("policy_data.datasets") is not None:
        processor = configured(PolicyDataConfig)(export_stats=False).build().processor
        if stats is not None:
            processor = processor.replace(
                state_stats=stats["state"].first(processor.state_dim),
                action_stats=stats["action"].first(processor.robot_action_dim))  # fmt: skip
    elif stats is None:
        raise RecapError(f"--policy: {path} has no assets/<asset_id>/norm_stats.json; bind "
                         "policy_data.datasets (the run's gin files) so the statistics can be "
                         "computed")  # fmt: skip
    else:
        fields = {ours: bound(f"policy_data.{theirs}") for ours, theirs in GIN_FIELDS.items()}
        fields = {k: v for k, v in fields.items() if v is not None}
        processor = Pi05Processor(
            action_horizon=model_config.action_horizon, action_dim=model_config.action_dim,
            image_size=int(model_config.vision.get("image_size", 224)),
            state_stats=stats["state"], action_stats=stats["action"], **fields)  # fmt: skip
    shown = {"state": processor.state_stats, "action": processor.action_stats}
    source = str(where) if where is not None else "policy_data (the run exported none)"
    log.info(f"{path}: no processor.json; rebuilt from the run's gin bindings; "
             f"{describe_stats(shown, source)}")  # fmt: skip
    return processor.for_model(model_config).replace(**overrides)


def load_policy(
    directory: str | os.PathLike,
    *,
    tokenizer: str | os.PathLike | None = None,
    asset_id: str | None = None,
    dtype: str = "float32",
    sizes: dict | None = None,
    **overrides,
):
    """``(Pi05Policy in eval mode, Pi05Processor)`` of ``directory`` (see the module docstring);
    ``overrides`` replace processor fields (an unknown one is one line). ``sizes``:
    ``Pi05Config`` fields of an openpi / LeRobot directory that replace those its files give
    (sizes come from the weights' shapes, heads by π0.5's convention: ``read_config``); e.g.
    the gin-bound ``pi05_policy.*`` sizes of a checkpoint whose heads break it."""
    from recap.models.checkpoints import RECAP_CONFIG_FILE, load_pi05, read_config
    from recap.models.pi05 import build_pi05, pi05_policy, set_precision

    path = Path(directory)
    weights = path / "model.safetensors"
    if not weights.is_file():
        raise RecapError(f"--policy: {weights} not found; point it at an exported policy "
                         "directory (recap run, openpi or LeRobot layout)")  # fmt: skip
    if dtype not in DTYPES:
        raise RecapError(f"--dtype: {dtype!r} is not one of {list(DTYPES)}")
    overrides = _check_overrides(overrides)
    processor = read_policy_processor(path)
    if is_recap_export(weights):
        from recap.engine.inference import load_exported

        if (path / RECAP_CONFIG_FILE).is_file():
            model = build_pi05(read_config(path))
        elif processor is None:
            check_gin_run(path)
            # an older run: its sizes from the parsed gin bindings
            model = configured(pi05_policy)()
        else:
            raise RecapError(f"{path}: processor.json without {RECAP_CONFIG_FILE}; re-export "
                             "the run (its sizes are unknown)")  # fmt: skip
        load_exported(model, weights)
        model = set_precision(model, DTYPES[dtype])
        if processor is None:
            processor = processor_from_gin(path, model.config, overrides)
    else:
        model = load_pi05(path, dtype=DTYPES[dtype], **(sizes or {}))
        if processor is None:
            processor = foreign_processor(path, model.config, tokenizer, asset_id, overrides)
    if tokenizer is not None:
        overrides["tokenizer"] = str(tokenizer)
    if overrides:
        processor = processor.replace(**overrides)
    processor.check_model(model.config)
    return model.eval(), processor


def load_run(run_dir: str | os.PathLike | None = None, **overrides) -> tuple:
    """A trained Step 4 policy: ``(model, processor, run directory)`` from the directory alone
    (``load_policy``; an older run's processor rebuilt from the parsed gin bindings);
    ``run_dir`` defaults to the bound ``train.run_dir``."""
    from recap.configurable import bound

    run = Path(run_dir if run_dir is not None else bound("train.run_dir", ""))
    if not (run / "model.safetensors").is_file():
        raise RecapError(f"{run / 'model.safetensors'}: no exported policy; train it first "
                         "(scripts/train.py with the same gin files) or set "
                         "evaluate_policy.run_dir")  # fmt: skip
    model, processor = load_policy(run, **overrides)
    return model, processor, run


VALUE_CONFIG_FILE = "recap_value.json"  # a value run's exact ValueModelConfig (train writes it)


def value_weights(path: str | os.PathLike) -> Path:
    """The value model's weights: ``model.safetensors`` of a run or ``save_pretrained``
    directory, or the file itself; a one-line error when there are none."""
    from recap.models.value import WEIGHTS_FILE

    path = Path(path)
    found = path / WEIGHTS_FILE if path.is_dir() else path
    if found.is_file() and found.suffix == ".safetensors":
        return found
    raise RecapError(f"{path}: no value-model weights ({WEIGHTS_FILE}); train the value model "
                     "(scripts/train.py) and set compute_advantages.model_path to its run "
                     "directory")  # fmt: skip


def load_value(
    directory: str | os.PathLike, model_fn=None, *, tokenizer: str | os.PathLike | None = None
):
    """``(ValueModel in eval mode on the CPU, ValueProcessor)`` of ``directory``: a recap value
    run (``model.safetensors`` + ``recap_value.json`` + ``processor.json``), a
    ``ValueModel.save_pretrained`` directory (``config.json``; RLinf imports), or an older run
    whose architecture ``model_fn`` builds (its gin file). Without ``processor.json`` the
    processor is rebuilt once (one log line): the model's image size and bins, antialiased
    resize, and the return range of an older run's ``return_range.json`` (None otherwise)."""
    from recap.data.datasets import read_return_range
    from recap.engine.inference import load_exported
    from recap.models.value import (
        CONFIG_FILE,
        ValueModelConfig,
        build_value_model,
        load_value_model,
    )
    from recap.processing.value import ValueProcessor, read_value_processor

    weights = value_weights(directory)
    path = weights.parent
    if (path / CONFIG_FILE).is_file():
        model = load_value_model(path)
    else:
        if (path / VALUE_CONFIG_FILE).is_file():
            fields = json.loads((path / VALUE_CONFIG_FILE).read_text())
            model = build_value_model(ValueModelConfig(**fields))
        elif model_fn is not None:
            model = model_fn()
        else:
            raise RecapError(f"{weights}: exported weights without {VALUE_CONFIG_FILE} or "
                             f"{CONFIG_FILE}; set compute_advantages.model_fn = @value_model and "
                             "include the value model's gin file (its architecture)")  # fmt: skip
        load_exported(model, weights)
    processor = read_value_processor(path)
    if processor is None:
        recorded = read_return_range(path)
        processor = ValueProcessor(
            tokenizer=str(tokenizer or ""),
            return_range=(recorded[0].return_min, recorded[0].return_max) if recorded else None,
            image_size=int(model.config.vision.get("image_size", 224)),
        ).for_model(model.config)  # fmt: skip
        source = f"the range in {recorded[1]}" if recorded else "no return range"
        log.info(f"{path}: no processor.json; the value model's defaults, {source}")
    if tokenizer is not None:
        processor = processor.replace(tokenizer=str(tokenizer))
    return model.eval(), processor


class PolicyAdapter:
    """``policy(batched observations) -> float32[B, action dims]``: a π0.5 policy and its
    processor as the batched policy of the closed loops (``recap.envs.rollout``).

    Observations (``{"images": {camera: uint8[B, H, W, 3]}, "state": float[B, D], "task":
    [str]}``) become the model batch through ``Pi05Processor.obs_to_batch``; the chunk is sampled
    with v = v_plain + beta (v_guide - v_plain) (``guidance``: the processor's when None) from
    seeded noise (per episode and step under a closed loop: :meth:`noise`), so a run is
    reproducible, and unnormalized by the processor. ``__call__``
    returns the first action (replanning every step); ``chunk`` the whole chunk."""

    def __init__(
        self,
        model,
        processor,
        beta: float = 1.0,
        num_steps: int | None = None,
        seed: int = 0,
        guidance: str | None = None,
    ):
        if hasattr(processor, "processor"):  # a PolicyDataset: its processor, the model's steps
            processor = processor.processor.for_model(getattr(model, "config", None))
        self.model, self.processor = model.eval(), processor
        self.beta = processor.check_beta(beta)
        self.num_steps = num_steps or processor.num_steps
        self.guidance = check_guidance(guidance or processor.guidance, processor.conditioning)
        self.seed, self.generator = seed, torch.Generator().manual_seed(seed)

    @property
    def sample_guidance(self) -> str:
        return "no_guide" if self.processor.conditioning in PLAIN else self.guidance

    def batch(self, obs: dict) -> dict[str, torch.Tensor]:
        """The model batch of batched observations (no actions)."""
        return self.processor.obs_to_batch(obs, self.beta, self.sample_guidance)

    def chunk(self, obs: dict) -> np.ndarray:
        """float64[B, H, robot action dims]: the sampled action chunk, unnormalized."""
        batch = self.batch(obs)
        config = self.model.config
        shape = (batch["frames"].shape[0], config.action_horizon, config.action_dim)
        noise = self.noise(obs, shape)
        return self.processor.sample(self.model, batch, noise, self.beta, self.num_steps,
                                     self.guidance)  # fmt: skip

    def noise(self, obs: dict, shape: tuple[int, ...]) -> torch.Tensor:
        """The chunk's starting noise: each row's own draw, seeded by (``seed``, the episode's
        seed, its step) when a closed loop names them (``EPISODE_SEED`` / ``EPISODE_STEP``: an
        episode's actions then depend on nothing else in the batch, so batch size and sharding
        change no result); else the next draw of this adapter's stream (a server's requests)."""
        if EPISODE_SEED not in obs:
            return torch.randn(shape, generator=self.generator)
        rows = []
        for episode, step in zip(obs[EPISODE_SEED], obs[EPISODE_STEP], strict=True):
            key = np.random.SeedSequence([self.seed, int(episode), int(step)])
            generator = torch.Generator().manual_seed(int(key.generate_state(1, np.uint64)[0] >> 1))
            rows.append(torch.randn(shape[1:], generator=generator))
        return torch.stack(rows)

    def __call__(self, obs: dict) -> np.ndarray:
        return self.chunk(obs)[:, 0].astype(np.float32)


class ChunkAdapter(PolicyAdapter):
    """``policy(batched observations) -> float32[B, H, D]``: the unnormalized action chunk, so
    ``replan_steps`` of it are executed before the next call (collection, ``recap.envs``)."""

    def __call__(self, obs: dict) -> np.ndarray:
        return self.chunk(obs).astype(np.float32)


__all__ = ["GUIDANCE", "ChunkAdapter", "PolicyAdapter", "load_policy", "load_value"]

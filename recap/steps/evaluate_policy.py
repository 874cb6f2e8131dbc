"""Closed-loop evaluation of a trained Step 4 policy on the synthetic reaching task.

Reads the same gin files as the training run (``train.run_dir``, ``pi05_policy.*``,
``policy_data.*``): the exported ``model.safetensors`` is loaded into ``pi05_policy()`` without
DeepSpeed, and ``policy_data()`` supplies the training transforms (image size, prompts in the
run's style, tokenizer); the normalization statistics are the ones the run exported beside its
weights (``{run_dir}/assets/<asset_id>/norm_stats.json``, openpi's layout), else
``policy_data``'s, and one line says which. For each guidance strength beta, ``num_episodes``
seeded episodes of ``ReachEnv`` run in lockstep batches (``synthetic.evaluate_batch``); every
step the policy samples an action chunk with v = v_uncond + beta (v_cond - v_uncond) between the
prompt with the positive advantage text and the plain task, unnormalizes it (openpi's inverse
quantile map, on the first D dims) and executes its first action (replanning each step). A
behaviour-cloning policy (``conditioning = "none"``) has one prompt, so it is evaluated at beta 1
only. Success rates and the mean heading (``synthetic.heading``: cosine between each executed
action and the way to the named target; ~0 for a policy that has not learned the task, whatever
its success) are printed and written to ``{run_dir}/closed_loop.json``.

    python scripts/evaluate_policy.py --gin_file demo/policy.gin
    python scripts/evaluate_policy.py --gin_file demo/policy_bc.gin \
        --gin_param 'evaluate_policy.num_episodes = 100'
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import gin
import numpy as np
import torch

import recap.steps.train  # noqa: F401  (registers train, policy_data and pi05_policy with gin)
from recap import logs
from recap.data.conditioning import normalize_quantile, unnormalize_quantile
from recap.data.policy_data import PLAIN, PolicyDataset, describe_stats, policy_data, run_stats
from recap.data.sidecars import write_atomic
from recap.data.synthetic import (
    STATE_NAMES,
    TARGET_STATE_NAMES,
    ReachConfig,
    ReachEnv,
    episode_outcomes,
    seeded_layouts,
    stack_observations,
)
from recap.data.transforms import pack_cameras
from recap.engine.inference import load_exported
from recap.errors import RecapError
from recap.models.pi05 import Pi05Policy, pi05_policy

log = logs.get(__name__)
RESULTS_FILE = "closed_loop.json"


class PolicyAdapter:
    """``policy(batched observations) -> float32[B, action dims]`` for ``evaluate_batch``.

    Observations become the training batch (uint8 frames in camera slots, base camera first;
    prompts with the normalized state when the data puts it in the text); the sampled chunk is
    unnormalized with the training statistics and its first action returned. Noise comes from a
    seeded generator, so a run is reproducible.
    """

    def __init__(
        self,
        model: Pi05Policy,
        data: PolicyDataset,
        beta: float = 1.0,
        num_steps: int | None = None,
        seed: int = 0,
        guidance: str = "positive",
    ):
        self.model, self.data, self.beta, self.num_steps = model.eval(), data, beta, num_steps
        self.guidance = guidance
        self.generator = torch.Generator().manual_seed(seed)

    def batch(self, obs: dict) -> dict[str, torch.Tensor]:
        """The model batch of ``synthetic.stack_observations`` output (no actions)."""
        slots, masks = pack_cameras(obs["images"], self.data.image_size)  # base first, wrists
        state = normalize_quantile(np.asarray(obs["state"], np.float64), self.data.stats["state"])
        label = None if self.data.conditioning in PLAIN else True
        cond = [self.data.prompt(t, label, s) for t, s in zip(obs["task"], state)]
        plain = [self.data.prompt(t, None, s) for t, s in zip(obs["task"], state)]
        ids, mask = self.data.tokenize(cond)
        uncond_ids, uncond_mask = self.data.tokenize(plain)
        batch = {"frames": slots, "image_masks": masks, "input_ids": ids, "attention_mask": mask,
                 "uncond_input_ids": uncond_ids, "uncond_attention_mask": uncond_mask}  # fmt: skip
        if self.guidance == "negative":  # RLinf: the "Advantage: negative" prompt guides
            negative = [self.data.prompt(t, False, s) for t, s in zip(obs["task"], state)]
            batch["neg_input_ids"], batch["neg_attention_mask"] = self.data.tokenize(negative)
        return batch

    def chunk(self, obs: dict) -> np.ndarray:
        """float64[B, H, D]: the sampled action chunk, unnormalized."""
        batch = self.batch(obs)
        config = self.model.config
        shape = (batch["frames"].shape[0], config.action_horizon, config.action_dim)
        noise = torch.randn(shape, generator=self.generator)
        positive_only = self.data.conditioning == "positive_only_conditional"
        with torch.no_grad():
            chunk = self.model.sample_actions(batch, noise, self.beta, self.num_steps,
                                              guidance=self.guidance,
                                              positive_only=positive_only)  # fmt: skip
        return unnormalize_quantile(chunk.double().numpy(), self.data.stats["action"])

    def __call__(self, obs: dict) -> np.ndarray:
        return self.chunk(obs)[:, 0].astype(np.float32)


def load_policy(model_fn: Callable[[], Pi05Policy], run_dir: Path) -> Pi05Policy:
    """``model_fn()`` with the run's exported weights, in eval mode."""
    path = run_dir / "model.safetensors"
    if not path.is_file():
        raise RecapError(f"{path}: no exported policy; train it first (scripts/train.py with the "
                         "same gin files) or set evaluate_policy.run_dir")  # fmt: skip
    model = model_fn()
    load_exported(model, path)
    return model.eval()


def load_run(
    run_dir: str | Path | None = None,
    model_fn: Callable[[], Pi05Policy] = pi05_policy,
    data_fn: Callable[[], PolicyDataset] = policy_data,
) -> tuple[Pi05Policy, PolicyDataset, Path]:
    """A trained Step 4 policy under the parsed gin config: ``model_fn()`` with the run's
    exported weights, ``data_fn()`` with the statistics the run exported (else its own; one line
    says which); ``run_dir`` defaults to ``train.run_dir``."""
    run = Path(run_dir if run_dir is not None else gin.query_parameter("train.run_dir"))
    model, data = load_policy(model_fn, run), data_fn(export_stats=False)
    stats, path = run_stats(run)
    if stats is not None:
        data.stats = {name: stats[name].first(len(data.stats[name])) for name in data.stats}
    log.info(
        describe_stats(data.stats, str(path) if path else "policy_data (the run exported none)")
    )
    data.check_model(model)
    return model, data, run


@gin.configurable
def evaluate_policy(
    run_dir: str | None = None,
    model_fn: Callable[[], Pi05Policy] = pi05_policy,
    data_fn: Callable[[], PolicyDataset] = policy_data,
    betas: Sequence[float] = (1.0, 1.5, 2.5),
    num_episodes: int = 100,
    seed: int = 1000,
    batch_size: int = 50,
    num_steps: int | None = None,
    max_steps: int = 40,
    noise_seed: int = 0,
    guidance: str = "positive",
    state_targets: bool | None = None,
) -> dict[str, float]:
    """Success rate per beta (``{"beta_1.0": rate, ...}``) over ``num_episodes`` episodes whose
    layouts come from ``seed`` (held out from the demo data's seeds); ``run_dir`` defaults to
    ``train.run_dir``. ``guidance`` (RLinf's ``guidance_type``): ``"positive"``, ``"negative"``
    (the "Advantage: negative" prompt as the guided branch; refused for a policy trained with
    ``positive_only_conditional``) or ``"no_guide"`` (the plain prompt only).
    ``state_targets``: the task's ``ReachConfig.state_targets``; None (default) reads it from
    the training data's state names (``reach_state_targets``), as ``recap-demo-data`` wrote them
    with or without ``--state-targets``."""
    model, data, run = load_run(run_dir, model_fn, data_fn)
    if data.conditioning in PLAIN:
        betas = [1.0]  # one prompt: guidance has nothing to contrast
    results, outcomes, headings = {}, {}, {}
    state_targets = reach_state_targets(data, state_targets)
    config = ReachConfig(max_steps=max_steps, state_targets=state_targets)
    for beta in betas:
        start = time.perf_counter()
        adapter = PolicyAdapter(model, data, float(beta), num_steps, noise_seed, guidance)
        steps: list[float] = []
        with torch.no_grad():
            won = episode_outcomes(adapter, num_episodes, seed, batch_size, config, steps)
        key = f"beta_{float(beta):g}"
        results[key], outcomes[key] = float(won.mean()) if num_episodes else 0.0, won
        headings[key] = round(float(np.mean(steps)), 6) if steps else 0.0
        seconds = time.perf_counter() - start
        log.info(
            f"{run.name}: beta {float(beta):g}: success {results[key]:.3f} over "
            f"{num_episodes} episodes, heading {headings[key]:.3f} ({seconds:.0f} s)"
        )
    record = {"conditioning": data.conditioning, "num_episodes": num_episodes, "seed": seed,
              "guidance": guidance, "success": results, "heading": headings,
              "outcomes": {k: v.astype(int).tolist() for k, v in outcomes.items()}}  # fmt: skip
    if data.conditioning not in PLAIN:
        record["sensitivity"] = conditioning_sensitivity(model, data, seed, num_steps, noise_seed,
                                                         config=config)  # fmt: skip
        log.info(f"{run.name}: conditioning sensitivity {record['sensitivity']}")
    write_atomic({run / RESULTS_FILE: lambda p: p.write_text(json.dumps(record, indent=2) + "\n")})
    return results


def reach_state_targets(data: PolicyDataset, state_targets: bool | None = None) -> bool:
    """The reaching task's ``state_targets`` the policy was trained for, from the state names in
    each training dataset's ``meta/info.json`` (``synthetic.STATE_NAMES``: False,
    ``TARGET_STATE_NAMES``: True). An explicit ``state_targets`` that contradicts them, datasets
    that disagree, or names of neither kind without an explicit value: one line."""
    kinds = {STATE_NAMES: False, TARGET_STATE_NAMES: True}
    found: dict[bool, Path] = {}
    for source in data.sources:
        dataset, key = source.frames.dataset, source.frames.key_map.state
        names = tuple(dataset.features.get(key, {}).get("names") or ())
        where = Path(dataset.root) / "meta" / "info.json"
        if names not in kinds:
            if state_targets is None:
                raise RecapError(f"{where}: features.{key}.names {list(names)} are not the "
                                 "reaching task's; set evaluate_policy.state_targets")  # fmt: skip
            continue
        found.setdefault(kinds[names], where)
        if state_targets is not None and kinds[names] != state_targets:
            written = "with" if kinds[names] else "without"
            raise RecapError(f"{where}: features.{key}.names {list(names)}: the data was written "
                             f"{written} --state-targets; evaluate_policy.state_targets = "
                             f"{state_targets} contradicts it (remove the binding)")  # fmt: skip
    if len(found) > 1:
        raise RecapError(f"{found[True]}: state names with targets, {found[False]}: without; "
                         "train on datasets of one kind")  # fmt: skip
    return bool(state_targets) if state_targets is not None else next(iter(found), False)


def conditioning_sensitivity(
    model: Pi05Policy,
    data: PolicyDataset,
    seed: int = 1000,
    num_steps: int | None = None,
    noise_seed: int = 0,
    frames: int = 64,
    config: ReachConfig = ReachConfig(),
) -> dict[str, float]:
    """Does the policy read its label? On the first observation of ``frames`` held-out episodes
    (the evaluation's layouts), the mean L2 distance between action chunks (normalized space,
    the action's own dims)
    sampled with the same noise from the positive prompt and the plain one
    (``positive_vs_plain``), the negative one (``positive_vs_negative``; omitted for
    ``positive_only_conditional``, which never saw it), and, as the scale of "no effect", from
    the positive prompt with two different noises (``noise_reference``). A policy that ignores
    its label shows ~0 for the first two."""
    layouts = seeded_layouts(frames, seed, config)
    obs = stack_observations([ReachEnv(0, config).reset(layout) for layout in layouts])
    positive_only = data.conditioning == "positive_only_conditional"
    adapter = PolicyAdapter(model, data, 1.0, num_steps, noise_seed,
                            "positive" if positive_only else "negative")  # fmt: skip
    batch = adapter.batch(obs)
    config = model.config
    shape = (frames, config.action_horizon, config.action_dim)
    generator = torch.Generator().manual_seed(noise_seed)
    noise, other = torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)

    def sample(beta: float, kind: str, eps: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return model.sample_actions(batch, eps, beta, num_steps, guidance=kind,
                                        positive_only=positive_only)  # fmt: skip

    dims = len(data.stats["action"].q01)  # the robot's action dims, not the zero padding

    def distance(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b)[..., :dims].flatten(1).norm(dim=1).mean())

    positive = sample(1.0, "positive", noise)
    out = {"positive_vs_plain": distance(positive, sample(0.0, "positive", noise))}
    if not positive_only:
        out["positive_vs_negative"] = distance(positive, sample(1.0, "negative", noise))
    out["noise_reference"] = distance(positive, sample(1.0, "positive", other))
    return {k: round(v, 6) for k, v in out.items()}

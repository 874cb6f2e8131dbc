"""Closed-loop evaluation of a trained Step 4 policy on any environment (the demo's reaching task
by default).

The run directory alone says how the policy is fed (``recap.loading.load_policy``: the weights and
the ``processor.json`` its training wrote; an older run's processor is rebuilt from the parsed gin
bindings, with one log line). The environment is named by ``evaluate_policy.env`` and built by
``recap.envs.factory.env_factory`` (as ``recap-collect`` and ``recap-iterate`` build theirs):
``"reach"`` (``recap.envs.reach``, its state layout read from the training data), ``"metaworld"``,
``"libero"`` or ``"package.module:Factory"`` (any callable returning an ``recap.envs.Env``), with
the keyword arguments ``evaluate_policy.env_options``. For each guidance strength beta,
``num_episodes`` seeded episodes (episode k at ``env.reset(seed + k)``) run through the one closed
loop (``recap.envs.rollout.evaluate``, ``batch_size`` environments in lockstep); every step the
policy samples an action chunk with v = v_uncond + beta (v_cond - v_uncond) between the prompt with
the positive advantage text and the plain task, unnormalizes it (openpi's inverse quantile map, on
the first D dims) and executes its first ``replan_steps`` actions. A behaviour-cloning policy
(``conditioning = "none"``) has one prompt, so it is evaluated at beta 1 only. Success rates, the
mean heading (the environment's ``heading`` step metric: for the reach task the cosine between each
executed action and the way to the named target, ~0 for a policy that has not learned the task,
whatever its success; null for an environment without one) and the conditioning-sensitivity probe
(on the first observations of the evaluation's episodes) are printed and written to
``{run_dir}/closed_loop.json``.

    python scripts/evaluate_policy.py --gin_file demo/policy.gin
    python scripts/evaluate_policy.py --gin_file demo/policy_bc.gin \
        --gin_param 'evaluate_policy.num_episodes = 100'
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

import recap.steps.train  # noqa: F401  (declares train, policy_data and pi05_policy)
from recap import logs
from recap.configurable import configurable
from recap.engine import distributed
from recap.envs.base import Env, stack_observations
from recap.envs.factory import env_factory
from recap.envs.reach import STATE_NAMES, TARGET_STATE_NAMES, ReachEnv
from recap.envs.rollout import evaluate
from recap.errors import RecapError
from recap.loading import ChunkAdapter, PolicyAdapter, load_policy, load_run  # noqa: F401
from recap.models.pi05 import Pi05Policy
from recap.processing.pi05 import (
    NEGATIVE,
    PLAIN_BRANCH,
    POSITIVE,
    PROCESSOR_FILE,
    Pi05Processor,
)
from recap.processing.prompts import PLAIN, POSITIVE_ONLY
from recap.records import Evaluation

log = logs.get(__name__)
# Code version in the fingerprints of this step's stages: bump it when its results change (those
# stages and the ones after them rerun); tests check it against recap/workflow/code_versions.json.
STEP_VERSION = "3"  # 3: replan_steps of each chunk run (were ignored); 2: any Env, reset(seed + k)


@configurable("evaluate_policy")
@dataclass(frozen=True)
class EvaluateConfig:
    """The closed-loop evaluation's settings (gin ``evaluate_policy.*``; module docstring).

    Args:
        run_dir: the policy's run directory (default ``train.run_dir``).
        betas: the guidance strengths evaluated; ``guidance`` (RLinf's ``guidance_type``):
            ``"positive"``, ``"negative"`` (the "Advantage: negative" prompt as the guided
            branch; refused for a policy trained with ``positive_only_conditional``) or
            ``"no_guide"`` (the plain prompt only).
        num_episodes, seed: episodes ``seed .. seed + num_episodes - 1`` (held out from the
            demo data's seeds); ``batch_size`` environments in lockstep.
        num_steps, noise_seed: the flow's sampling steps (default: the processor's) and noise.
        env, env_options: the environment (``recap.envs.factory.env_factory``) and its
            keyword arguments; ``replan_steps``: actions executed of each chunk.
        max_steps, state_targets: reach only: the episode limit and the task's
            ``ReachConfig.state_targets`` (None, the default, reads it from the training data's
            state names: ``reach_state_targets``, as ``recap-demo-data`` wrote them with or
            without ``--state-targets``).
    """

    run_dir: str | None = None
    betas: Sequence[float] = (1.0, 1.5, 2.5)
    num_episodes: int = 100
    seed: int = 1000
    batch_size: int = 50
    num_steps: int | None = None
    max_steps: int = 40
    noise_seed: int = 0
    guidance: str = "positive"
    state_targets: bool | None = None
    env: str = "reach"
    env_options: Mapping[str, Any] | None = None
    replan_steps: int = 1


def evaluate_policy(config: EvaluateConfig) -> Evaluation:
    """The closed-loop evaluation of the policy in ``config.run_dir`` (``EvaluateConfig``):
    success rate per beta (``{"beta_1": rate, ...}``) over ``config.num_episodes`` episodes of
    ``config.env``, each episode's outcome, heading and sensitivity, written to
    ``{run_dir}/closed_loop.json`` (``recap.records.Evaluation``)."""
    c = config
    num_episodes, seed, env, guidance = c.num_episodes, c.seed, c.env, c.guidance
    num_steps, noise_seed, betas = c.num_steps, c.noise_seed, c.betas
    model, processor, run = load_run(c.run_dir)
    if processor.conditioning in PLAIN:
        betas = [1.0]  # one prompt: guidance has nothing to contrast
    options = dict(c.env_options or {})
    if env == "reach" and "state_targets" not in options:  # the layout the policy was trained on
        options["state_targets"] = reach_state_targets(processor, c.state_targets)
    make_env, _ = env_factory(env, max_steps=c.max_steps if env == "reach" else None,
                              options=options, field="evaluate_policy.env")  # fmt: skip

    def policy_at(b: float) -> ChunkAdapter:
        # whole chunks: the loop executes replan_steps of each (1: the first action, as
        # PolicyAdapter returns, from the same noise draw)
        return ChunkAdapter(model, processor, b, num_steps, noise_seed, guidance)

    # under a launcher each rank runs episode k when k % world size is its rank (the merged
    # outcomes on every rank) and rank 0 writes the record: the file one process writes
    with distributed.launched() as sharded:
        results, outcomes, headings = {}, {}, {}
        for beta in betas:
            start = time.perf_counter()
            with torch.no_grad():
                out = evaluate(policy_at, make_env, num_episodes, seed, [float(beta)],
                               c.replan_steps, c.batch_size, sharded)  # fmt: skip
            key = f"beta_{float(beta):g}"
            results[key], outcomes[key] = out["success"][key], out["outcomes"][key]
            heading = out["metrics"].get("heading", {}).get(key)
            headings[key] = round(heading, 6) if heading is not None else None
            seconds = time.perf_counter() - start
            shown = f", heading {heading:.3f}" if heading is not None else ""
            log.info(f"{run.name}: beta {float(beta):g}: success {results[key]:.3f} over "
                     f"{num_episodes} episodes{shown} ({seconds:.0f} s)")  # fmt: skip
        sensitivity = None
        if processor.conditioning not in PLAIN:
            sensitivity = conditioning_sensitivity(model, processor, seed, num_steps, noise_seed,
                                                   env=make_env)  # fmt: skip
            log.info(f"{run.name}: conditioning sensitivity {sensitivity}")
        evaluation = Evaluation(success=results, num_episodes=num_episodes, outcomes=outcomes,
                                heading=headings, env=env, conditioning=processor.conditioning,
                                seed=seed, guidance=guidance, sensitivity=sensitivity)  # fmt: skip
        if distributed.rank() == 0:
            evaluation.write(run)
        return evaluation


def reach_state_targets(data, state_targets: bool | None = None) -> bool:
    """The reaching task's ``state_targets`` the policy was trained for, from the state names of
    its training data (``recap.envs.reach.STATE_NAMES``: False, ``TARGET_STATE_NAMES``: True): a
    processor's ``state_names``, or each dataset's ``meta/info.json`` (a ``PolicyDataset``). An
    explicit ``state_targets`` that contradicts them, datasets that disagree, or names of
    neither kind without an explicit value: one line."""
    kinds = {STATE_NAMES: False, TARGET_STATE_NAMES: True}
    found: dict[bool, object] = {}
    if hasattr(data, "sources"):
        named = []
        for source in data.sources:
            dataset, key = source.frames.dataset, source.frames.key_map.state
            names = tuple(dataset.features.get(key, {}).get("names") or ())
            where = Path(dataset.root) / "meta" / "info.json"
            named.append((names, where, f"features.{key}.names"))
    else:
        named = [(tuple(data.state_names), PROCESSOR_FILE, "state_names")]
    for names, where, label in named:
        if names not in kinds:
            if state_targets is None:
                raise RecapError(f"{where}: {label} {list(names)} are not the reaching task's; "
                                 "set evaluate_policy.state_targets")  # fmt: skip
            continue
        found.setdefault(kinds[names], where)
        if state_targets is not None and kinds[names] != state_targets:
            written = "with" if kinds[names] else "without"
            raise RecapError(f"{where}: {label} {list(names)}: the data was written "
                             f"{written} --state-targets; evaluate_policy.state_targets = "
                             f"{state_targets} contradicts it (remove the binding)")  # fmt: skip
    if len(found) > 1:
        raise RecapError(f"{found[True]}: state names with targets, {found[False]}: without; "
                         "train on datasets of one kind")  # fmt: skip
    return bool(state_targets) if state_targets is not None else next(iter(found), False)


def conditioning_sensitivity(
    model: Pi05Policy,
    processor: Pi05Processor,
    seed: int = 1000,
    num_steps: int | None = None,
    noise_seed: int = 0,
    frames: int = 64,
    env: Callable[[], Env] | None = None,
) -> dict[str, float]:
    """Does the policy read its label? On the first observation of ``frames`` held-out episodes
    (the evaluation's: ``env().reset(seed + k)``, the default reach task's when ``env`` is
    None), the mean L2 distance between action chunks (normalized space, the action's own dims)
    sampled with the same noise from the positive prompt and the plain one
    (``positive_vs_plain``), the negative one (``positive_vs_negative``; omitted for
    ``positive_only_conditional``, which never saw it), and, as the scale of "no effect", from
    the positive prompt with two different noises (``noise_reference``). A policy that ignores
    its label shows ~0 for the first two."""
    probe = (env or ReachEnv)()
    firsts = []
    for k in range(frames):  # each one's images read before the next reset (a lazy env's render)
        first = probe.reset(seed + k)
        firsts.append({**first, "images": {c: np.asarray(v) for c, v in first["images"].items()}})
    obs = stack_observations(firsts)
    processor = getattr(processor, "processor", processor)  # a PolicyDataset carries one
    positive_only = processor.conditioning == POSITIVE_ONLY
    branches = (POSITIVE, PLAIN_BRANCH) if positive_only else (POSITIVE, NEGATIVE, PLAIN_BRANCH)
    batch = processor.obs_to_batch(obs, branches=branches)
    num_steps = num_steps or processor.num_steps
    config = model.config
    shape = (frames, config.action_horizon, config.action_dim)
    generator = torch.Generator().manual_seed(noise_seed)
    noise, other = torch.randn(shape, generator=generator), torch.randn(shape, generator=generator)

    def sample(beta: float, kind: str, eps: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return model.sample_actions(batch, eps, beta, num_steps, guidance=kind,
                                        positive_only=positive_only)  # fmt: skip

    dims = processor.robot_action_dim  # the robot's action dims, not the zero padding

    def distance(a: torch.Tensor, b: torch.Tensor) -> float:
        return float((a - b)[..., :dims].flatten(1).norm(dim=1).mean())

    positive = sample(1.0, "positive", noise)
    out = {"positive_vs_plain": distance(positive, sample(0.0, "positive", noise))}
    if not positive_only:
        out["positive_vs_negative"] = distance(positive, sample(1.0, "negative", noise))
    out["noise_reference"] = distance(positive, sample(1.0, "positive", other))
    return {k: round(v, 6) for k, v in out.items()}

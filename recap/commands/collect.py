"""Closed-loop rollouts of a trained Step 4 policy written as a new LeRobot v3.0 dataset, with
``is_success`` and ``is_correction`` (frames the scripted expert took over; ``--expert``).

recap-collect --gin_file demo/policy.gin --out demo_data/rollout_iter1 --episodes 100
recap-collect --gin_file demo/policy.gin --out demo_data/corrected_iter1 --expert --drift 1.0
recap-collect --gin_file experiments/libero_pi05.gin --env libero --suite libero_10 --task_id 0 \
    --out /data/lerobot/libero10_task0_iter1 --replan_steps 5 --episodes 50
recap-collect --gin_file my_metaworld.gin --env metaworld --expert --max_steps 150 \
    --env_options '{"env_name": "push-v3", "cameras": {"image": "corner"}, "image_size": 64}' \
    --out data/push_iter1 --episodes 50
DS_ACCELERATOR=cpu deepspeed --num_gpus 2 --module recap.commands.collect \
    --gin_file my_metaworld.gin --env metaworld --expert --out data/reach_iter1   (2 ranks)

The policy is loaded as ``recap-evaluate`` loads it (the training run's gin files; ``--run_dir``
defaults to ``train.run_dir``) and samples with guidance ``--beta``; ``--replan_steps`` actions of
each chunk are executed before it is asked again. Episode k starts at ``reset(seed + k)``.
The environment comes from ``recap.envs.factory.env_factory``: ``--env reach`` is the demo's
reaching task (``--max_steps``, ``--state_targets`` as the demo data was written), ``--env
metaworld`` one Meta-World v3 task (``recap.envs.metaworld.MetaWorldEnv``; needs the metaworld
extra), ``--env libero`` one LIBERO task (needs ``hf-libero`` with its assets), ``--env
package.module:Factory`` any callable returning an Env; ``--env_options`` (a JSON object) are
the constructor's keyword arguments. The expert (``--expert``: the reaching task's, or
Meta-World's scripted policy for the task) takes over for ``--takeover_steps`` steps when the
policy's action is farther than ``--drift`` from its own (L2 on the move: dx, dy for reach; dx,
dy, dz for Meta-World).

Launched with several ranks (``deepspeed --num_gpus N``; ``WORLD_SIZE`` > 1) the collection is
sharded: rank r runs episodes r, r + N, ... with its own environments and rank 0 writes the one
merged dataset, the same as the unsharded run's for the same seeds (``recap.envs.rollout``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from recap.cli import build_parser, parse_gin
from recap.errors import RecapError, one_line


def parser():
    """The command's flags; ``--help`` says what each is, its default and its choices."""
    from recap.commands import HelpFormatter

    p = build_parser(__doc__.splitlines()[0])
    p.formatter_class = HelpFormatter
    p.add_argument("--out", required=True, help="the new dataset's directory (must not exist)")
    p.add_argument(
        "--run_dir",
        default=None,
        help="the training run to load; default: train.run_dir of the gin files",
    )
    p.add_argument(
        "--episodes",
        type=int,
        default=100,
        help="episodes to collect; under the DeepSpeed launcher (WORLD_SIZE > 1) each rank "
        "runs its shard and rank 0 writes the one dataset",
    )
    p.add_argument("--seed", type=int, default=2000, help="episode k starts at reset(seed + k)")
    p.add_argument("--beta", type=float, default=1.0, help="classifier-free guidance strength")
    p.add_argument("--guidance", default="positive", choices=("positive", "negative", "no_guide"),
                   help="which advantage text the policy is guided towards")  # fmt: skip
    p.add_argument("--noise_seed", type=int, default=0, help="seed of the flow's initial noise")
    p.add_argument(
        "--num_steps",
        type=int,
        default=None,
        help="flow-matching steps per chunk; default: the model's",
    )
    p.add_argument("--replan_steps", type=int, default=1, help="actions executed per chunk")
    p.add_argument(
        "--num_envs", type=int, default=50, help="environments run in lockstep (per rank)"
    )
    p.add_argument(
        "--env",
        default="reach",
        metavar="{reach,metaworld,libero,package.module:Factory}",
        help="the demo's reaching task, one Meta-World task (metaworld extra), one LIBERO task "
        "(needs hf-libero), or a callable returning an Env",
    )
    p.add_argument(
        "--env_options",
        default="{}",
        help="JSON object: the env constructor's keyword arguments, e.g. "
        '\'{"env_name": "push-v3", "cameras": {"image": "corner"}, "image_size": 64}\'',
    )
    p.add_argument(
        "--max_steps", type=int, default=None, help="episode limit in steps; default: the task's"
    )
    p.add_argument(
        "--state_targets",
        action="store_true",
        help="reach: state[4:8] holds the targets' offsets (ReachConfig.state_targets)",
    )
    p.add_argument("--suite", default="libero_10", help="libero: task suite")
    p.add_argument("--task_id", type=int, default=0, help="libero: task of the suite")
    p.add_argument(
        "--expert",
        action="store_true",
        help="reach, metaworld: the scripted expert corrects",
    )
    p.add_argument(
        "--drift",
        type=float,
        default=1.0,
        help="takeover threshold: the policy's action this far (L2) from the expert's",
    )
    p.add_argument(
        "--takeover_steps",
        type=int,
        default=5,
        help="steps the expert keeps control once it takes over",
    )
    p.add_argument("--naming", default="lerobot", choices=("lerobot", "libero"),
                   help="feature names written: observation.images.<cam> / observation.state / "
                   "action (lerobot) or <cam> / state / actions (libero)")  # fmt: skip
    p.add_argument(
        "--image_dtype",
        default="video",
        choices=("video", "image"),
        help="cameras as mp4 video or PNG images in the parquet files",
    )
    return p


def environment(args, options: dict):
    """``recap.envs.factory.env_factory`` for the command's flags and ``options`` (the parsed
    ``--env_options``): (a constructor of the chosen environment, its expert or None); an env
    without a scripted expert and ``--expert``: one line, before the model loads."""
    from recap.envs.factory import env_factory

    return env_factory(args.env, max_steps=args.max_steps, state_targets=args.state_targets,
                       suite=args.suite, task_id=args.task_id, expert=args.expert,
                       options=options, field="--env")  # fmt: skip


def env_options(text: str) -> dict:
    """``--env_options``: a JSON object, else one line."""
    try:
        options = json.loads(text)
    except json.JSONDecodeError as error:
        raise RecapError(f"--env_options: not JSON ({error.msg} at column {error.colno}); pass "
                         "an object such as '{\"env_name\": \"push-v3\"}'") from None  # fmt: skip
    if not isinstance(options, dict):
        raise RecapError(f"--env_options: {text!r} is not a JSON object; pass an object such as "
                         "'{\"env_name\": \"push-v3\"}'")  # fmt: skip
    return options


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        if args.episodes < 1:
            raise RecapError(f"--episodes {args.episodes}: collect at least one episode")
        if Path(args.out).exists():  # before the model loads; every collection is a new dataset
            raise RecapError(f"--out {args.out}: already exists; give a new directory")
        from recap.registry import register

        register("pi05_policy", "policy_data", "train")  # what the training run's gin files bind
        parse_gin(args.gin_file, args.gin_param)
        from recap.config_check import check_required
        from recap.engine import distributed
        from recap.envs.factory import drift_dims
        from recap.envs.policy import ChunkAdapter, load_run
        from recap.envs.rollout import ActionDrift, collect

        for step in ("pi05_policy", "policy_data"):
            check_required(step)
        options = env_options(args.env_options)
        make_env, expert = environment(args, options)
        with distributed.launched() as sharded:  # under the launcher: each rank its shard
            model, data, run = load_run(args.run_dir)
            policy = ChunkAdapter(model, data, args.beta, args.num_steps, args.noise_seed,
                                  args.guidance)  # fmt: skip
            record = {"run_dir": str(run), "beta": args.beta, "guidance": args.guidance,
                      "conditioning": data.conditioning, "env": args.env,
                      "env_options": options}  # fmt: skip
            drift = ActionDrift(args.drift, dims=drift_dims(args.env))
            summary = collect(policy, make_env, args.episodes, args.seed, args.out,
                              expert=expert, drift=drift, takeover_steps=args.takeover_steps,
                              replan_steps=args.replan_steps, num_envs=args.num_envs,
                              naming=args.naming, image_dtype=args.image_dtype, record=record,
                              sharded=sharded)  # fmt: skip
    except RecapError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    if distributed.rank() > 0:  # one summary line: rank 0's
        return 0
    print(f"{summary['path']}: {summary['episodes']} episodes, {summary['successes']} "
          f"successes, {summary['frames']} frames, {summary['corrections']} corrected frames "
          f"in {summary['corrected_episodes']} episodes", flush=True)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())

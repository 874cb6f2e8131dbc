"""Write the demo LeRobot datasets (sft, rollout, eval) of the synthetic reaching task.

    recap-demo-data --out data/demo [--seed 0] [--force]
    python -m recap.commands.make_demo_data --out data/demo

Existing datasets are kept (and summarized) unless ``--force``; one line per dataset is printed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence

from recap.envs.reach import write_demo_datasets, write_demo_tokenizer
from recap.errors import RecapError


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Command-line flags."""
    return build_parser().parse_args(argv)


def build_parser() -> argparse.ArgumentParser:
    """The flags; ``--help`` says what each is and its default."""
    from recap.commands import HelpFormatter

    parser = argparse.ArgumentParser(prog="recap-demo-data", description=__doc__,
                                     formatter_class=HelpFormatter)  # fmt: skip
    parser.add_argument("--out", required=True, help="folder to hold sft/, rollout/, eval/")
    parser.add_argument("--seed", type=int, default=0, help="one seed fixes every byte written")
    parser.add_argument("--force", action="store_true", help="rewrite datasets that exist")
    parser.add_argument(
        "--sft-episodes",
        type=int,
        default=300,
        help="episodes of the scripted expert (the sft dataset)",
    )
    parser.add_argument(
        "--rollout-episodes",
        type=int,
        default=300,
        help="episodes of the noisy policy, successes and failures (rollout)",
    )
    parser.add_argument(
        "--eval-episodes", type=int, default=60, help="held-out rollout episodes (eval)"
    )
    parser.add_argument("--max-steps", type=int, default=40, help="episode time limit (frames)")
    parser.add_argument("--state-targets", action="store_true",
                        help="state[4:8] = each target's offset from the agent, and state-bin "
                        "words in the tokenizer (for policy_data.state_in_prompt)")  # fmt: skip
    parser.add_argument("--workers", type=int, default=min(3, os.cpu_count() or 1),
                        help="datasets written at once, a process each")  # fmt: skip
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Write (or keep) the datasets and print ``name type version episodes successes frames``."""
    args = parse_args(argv)
    start = time.perf_counter()
    try:
        summary = write_demo_datasets(
            args.out,
            seed=args.seed,
            sft_episodes=args.sft_episodes,
            rollout_episodes=args.rollout_episodes,
            eval_episodes=args.eval_episodes,
            max_steps=args.max_steps,
            force=args.force,
            state_targets=args.state_targets,
            workers=args.workers,
        )
    except (RecapError, FileExistsError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"tokenizer: {write_demo_tokenizer(args.out, args.force, args.state_targets)}")
    for name, row in summary.items():
        status = "written" if row["written"] else "kept"
        print(
            f"{name}: {status} {row['path']} type={row['type']} version={row['version']} "
            f"episodes={row['episodes']} successes={row['successes']} frames={row['frames']}"
        )
    print(f"done in {time.perf_counter() - start:.1f}s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

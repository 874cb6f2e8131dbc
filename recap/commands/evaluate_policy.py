"""Closed-loop success rates of a trained Step 4 policy on the demo reaching task, per beta.

recap-evaluate --gin_file demo/policy.gin
recap-evaluate --gin_file demo/policy_bc.gin --gin_param 'evaluate_policy.num_episodes = 100'
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from recap.cli import run_command


def main(argv: Sequence[str] | None = None) -> int:
    from recap.steps.evaluate_policy import evaluate_policy

    return run_command(evaluate_policy, argv)


if __name__ == "__main__":
    sys.exit(main())

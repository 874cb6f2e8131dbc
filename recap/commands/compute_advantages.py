"""Step 3: value inference over every frame, then meta/advantages_{tag}.parquet and labels.

    recap-advantages --gin_file demo/advantages.gin
    DS_ACCELERATOR=cpu deepspeed --num_gpus 2 --master_port 29521 \\
        --module recap.commands.compute_advantages --gin_file demo/advantages.gin
    deepspeed --num_gpus 8 --module recap.commands.compute_advantages \\
        --gin_file my_advantages.gin [--gin_param 'compute_advantages.positive_quantile = 0.4']
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from recap.cli import run_command


def main(argv: Sequence[str] | None = None) -> int:
    from recap.steps.compute_advantages import compute_advantages

    return run_command(compute_advantages, argv)


if __name__ == "__main__":
    sys.exit(main())

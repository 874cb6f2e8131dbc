"""Train a model on the DeepSpeed engine (ZeRO-3; Ascend NPU, CUDA or CPU). Restart = resume.

    recap-train --gin_file demo/toy.gin [--gin_param 'train.max_steps = 10']
    python -m recap.commands.train --gin_file demo/toy.gin
    DS_ACCELERATOR=cpu deepspeed --num_gpus 2 --master_port 29511 \\
        --module recap.commands.train --gin_file demo/toy.gin
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from recap.cli import run_command


def main(argv: Sequence[str] | None = None) -> int:
    from recap.steps.train import train

    return run_command(train, argv)


if __name__ == "__main__":
    sys.exit(main())

"""Relabel existing advantages with a new quantile, scope or forcing, under a new tag (no model).

    recap-relabel --gin_file relabel.gin \\
        --gin_param 'relabel.datasets = [{"name": "rollout", "root": "/data/rollout"}]' \\
        --gin_param 'relabel.source_tag = "v1"' --gin_param 'relabel.new_tag = "v1_q40"' \\
        --gin_param 'relabel.positive_quantile = 0.4'
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from recap.cli import run_command


def main(argv: Sequence[str] | None = None) -> int:
    from recap.steps.relabel import relabel

    return run_command(relabel, argv)


if __name__ == "__main__":
    sys.exit(main())

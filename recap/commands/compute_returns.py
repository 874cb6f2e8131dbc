"""Step 1: per-frame returns into meta/returns_{tag}.parquet.

recap-returns --gin_file demo/returns.gin [--gin_param 'compute_returns.tag = "v2"']
python -m recap.commands.compute_returns --gin_file demo/returns.gin
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from recap.cli import run_command


def main(argv: Sequence[str] | None = None) -> int:
    from recap.steps.compute_returns import compute_returns

    return run_command(compute_returns, argv)


if __name__ == "__main__":
    sys.exit(main())

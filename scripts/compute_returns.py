"""Step 1: per-frame returns into meta/returns_{tag}.parquet.

    python scripts/compute_returns.py --gin_file demo/returns.gin \
        [--gin_param 'compute_returns.tag = "v2"']
"""

from recap.cli import run_step
from recap.steps.compute_returns import compute_returns

if __name__ == "__main__":
    run_step(compute_returns)

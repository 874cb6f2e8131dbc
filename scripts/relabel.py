"""Relabel existing advantages with a new quantile, scope or forcing, under a new tag (no model).

    python scripts/relabel.py --gin_file relabel.gin \
        --gin_param 'relabel.datasets = [{"name": "rollout", "root": "/data/rollout"}]' \
        --gin_param 'relabel.source_tag = "v1"' --gin_param 'relabel.new_tag = "v1_q40"' \
        --gin_param 'relabel.positive_quantile = 0.4'
"""

from recap.cli import run_step
from recap.steps.relabel import relabel

if __name__ == "__main__":
    run_step(relabel)

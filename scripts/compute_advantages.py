"""Step 3: value inference over every frame, then meta/advantages_{tag}.parquet and labels.

    python scripts/compute_advantages.py --gin_file demo/advantages.gin
    DS_ACCELERATOR=cpu deepspeed --num_gpus 2 --master_port 29521 \
        scripts/compute_advantages.py --gin_file demo/advantages.gin
    deepspeed --num_gpus 8 scripts/compute_advantages.py --gin_file my_advantages.gin \
        [--gin_param 'compute_advantages.positive_quantile = 0.4']
"""

from recap.cli import run_step
from recap.steps.compute_advantages import compute_advantages

if __name__ == "__main__":
    run_step(compute_advantages)

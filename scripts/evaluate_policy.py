"""Closed-loop success rates of a trained Step 4 policy on the demo reaching task, per beta.

    python scripts/evaluate_policy.py --gin_file demo/policy.gin
    python scripts/evaluate_policy.py --gin_file demo/policy_bc.gin \
        --gin_param 'evaluate_policy.num_episodes = 100'
"""

from recap.cli import run_step
from recap.steps.evaluate_policy import evaluate_policy

if __name__ == "__main__":
    run_step(evaluate_policy)

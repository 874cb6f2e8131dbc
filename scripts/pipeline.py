"""Run Steps 1-4 as one job from one gin experiment; finished steps are skipped.

    python scripts/pipeline.py --gin_file demo/pipeline.gin
    python scripts/pipeline.py --gin_file demo/pipeline.gin --gin_param 'value/train.max_steps = 50'
    python scripts/pipeline.py --gin_file demo/pipeline.gin --dry_run      # the plan, nothing runs
    python scripts/pipeline.py --sweep sweeps/demo_value_lr_quantile.yaml  # one pipeline per point

``STEP/binding`` goes to one step (returns, value, advantages, policy, baseline, evaluate, all);
other bindings configure ``pipeline.*``. See recap/pipeline.py.
"""

import sys

from recap.pipeline import main

if __name__ == "__main__":
    sys.exit(main())

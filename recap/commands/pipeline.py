"""Run Steps 1-4 as one job from one gin experiment; finished steps are skipped.

    recap-pipeline --gin_file demo/pipeline.gin
    recap-pipeline --gin_file demo/pipeline.gin --gin_param 'value:train.max_steps = 50'
    recap-pipeline --gin_file demo/pipeline.gin --dry_run      # the plan, nothing runs
    recap-pipeline --sweep sweeps/demo_value_lr_quantile.yaml  # one pipeline per grid point

``STEP:binding`` goes to one step (returns, value, advantages, policy, baseline, evaluate, all;
the older ``STEP/binding`` still works, with a deprecation warning); other bindings configure
``pipeline.*``. The logic is in ``recap.workflow.pipeline``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from recap.workflow.pipeline import main as run_pipeline_command

    return run_pipeline_command(argv)


if __name__ == "__main__":
    sys.exit(main())

"""Iterative RECAP: K rounds of collect-with-the-current-policy then Steps 1-4 over all data.

    recap-iterate --gin_file demo/iterate.gin
    recap-iterate --gin_file demo/iterate.gin --gin_param 'iterate.iterations = 3' \
        --gin_param 'iterate.expert = True' --gin_param 'iterate.drift = 0.5'
    recap-iterate --gin_file demo/iterate.gin --dry_run      # the plan, nothing runs
    recap-iterate --gin_file demo/iterate.gin --recorded rec/round1 --serve \
        --serve_args '--port 8000 --record rec/round2'    # a robot's recordings, then serve

``--recorded DIR ...`` (one ``recap-serve --record`` directory per iteration) makes each
iteration's collection the episodes recorded there instead of simulated rollouts; ``--serve``
serves the last iteration's policy with ``recap-serve`` when the iterations finish.

``iterate.*`` bindings set the loop (``recap.workflow.iterate.IterateConfig``); ``STEP:binding``
goes to one pipeline step (e.g. ``'value:train.max_steps = 100'``), ``pipeline.*`` to the
pipeline, as for ``recap-pipeline``. Rerun the same command and finished iterations are skipped.
The logic is in ``recap.workflow.iterate``.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    from recap.workflow.iterate import main as run_iterate_command

    return run_iterate_command(argv)


if __name__ == "__main__":
    sys.exit(main())

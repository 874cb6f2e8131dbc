"""One module per command, each with ``main(argv=None) -> int``; run them as console scripts
(installed by pip), as ``python -m recap.commands.NAME``, under ``deepspeed --module
recap.commands.NAME``, or in a checkout through the ``scripts/NAME.py`` shims.

=================== ===================== ======================================================
module              console script        what
=================== ===================== ======================================================
pipeline            recap-pipeline        Steps 1-4 as one job (``recap.workflow.pipeline``)
train               recap-train           Step 2 / 4 training on the DeepSpeed engine
compute_returns     recap-returns         Step 1: per-frame returns
compute_advantages  recap-advantages      Step 3: value inference, advantages, labels
relabel             recap-relabel         new labels from existing advantages (no model)
evaluate_policy     recap-evaluate        closed-loop success of a demo policy per beta
doctor              recap-doctor          can this machine run recap
plan_memory         recap-plan-memory     per-rank memory plan of a ZeRO-3 run
sweep               recap-sweep           one training launch per grid point
make_demo_data      recap-demo-data       the demo LeRobot datasets
serve               recap-serve           a policy to robots (openpi websocket protocol)
collect             recap-collect         rollouts (+ expert corrections) as a new dataset
import_rlinf        recap-import          RLinf / LeRobot checkpoints in and out
iterate             recap-iterate         iterative RECAP (collect, relabel, retrain)
init                recap-init            an experiment file for one's own LeRobot datasets
=================== ===================== ======================================================

``HelpFormatter``: every argument's ``--help`` line ends with its default (argparse lists the
choices).
"""

from __future__ import annotations

from recap.cli import HelpFormatter  # noqa: F401  (the commands' --help formatter)

"""The pipeline's own settings as a typed value. gin binds them at the edge
(``recap.workflow.pipeline.pipeline_config``, the ``pipeline.*`` bindings), which checks them and
builds this; the planner, the runner and the summary read only this."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass
class PipelineConfig:
    """What ``pipeline.*`` resolved to (``recap.workflow.pipeline.pipeline_config`` says what
    each is)."""

    name: str
    steps: dict[str, list[str]]
    bindings: dict[str, list[str]]
    run_root: Path
    ranks: int
    launcher: str
    evaluate: bool
    stages: list[str]
    experiment: str
    sweep_name: str = ""
    hostfile: str = ""
    num_nodes: int = 0
    master_addr: str = ""
    multinode_launcher: str = ""

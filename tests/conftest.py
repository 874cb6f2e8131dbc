"""Fixtures shared across test files."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def standins_source(tmp_path_factory):
    """``recap.standins`` written once per session (seed 0): never modified, only copied."""
    from recap.standins import write_standins

    return write_standins(tmp_path_factory.mktemp("standins_source") / "standins")


@pytest.fixture(scope="session")
def fresh_standins(standins_source) -> Callable[[Path], object]:
    """``fresh_standins(dest)``: a private copy of the session's stand-ins at ``dest`` (what
    ``write_standins(dest)`` writes, ~6 s, in ~10 ms), for a run that adds sidecars to them."""
    from recap.standins import StandIns

    def copy(dest: Path) -> StandIns:
        shutil.copytree(standins_source.root, dest)
        return StandIns.at(dest)

    return copy


# `make test` runs the suite on TEST_WORKERS pytest-xdist workers (2, the CI machine's cores) with
# `--dist loadfile --no-loadscope-reorder`: a file is one unit of work (its module fixtures run
# once), and the files that launch multi-process runs start first, heaviest first (as measured
# one after another on 2 cores), so that no worker is left running one of them alone at the end
# while the other has finished. A renamed file only loses its place; nothing depends on it.
HEAVY_FIRST = (
    "tests/test_rehearsal.py",  # ~180 s: the LIBERO pipeline on 2 ranks, two nodes, LoRA
    "tests/test_iterate.py",  # ~120 s
    "tests/test_pipeline.py",  # ~110 s
    "tests/test_rehearsal_aloha.py",  # ~65 s
    "tests/engine/test_ema.py",  # ~55 s
    "tests/engine/test_errors.py",  # ~50 s
    "tests/test_rehearsal_rlinf.py",  # ~45 s
    "tests/engine/test_lora_engine.py",  # ~40 s
    "tests/engine/test_multinode.py",  # ~35 s
    "tests/engine/test_memory_auto.py",  # ~30 s
    "tests/steps/test_train_policy.py",  # ~30 s
    "tests/engine/test_tracking_e2e.py",  # ~25 s
    "tests/test_mlflow_ui.py",  # ~25 s
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {path: i for i, path in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(rank)))  # stable

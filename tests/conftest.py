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

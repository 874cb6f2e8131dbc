"""The slow tier runs only with ``RECAP_SLOW=1`` or an explicit ``-m slow`` selection, so
``make test`` (``pytest tests``) collects and skips it."""

from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    selected = "slow" in (config.getoption("markexpr") or "")
    if os.environ.get("RECAP_SLOW") == "1" or selected:
        return
    skip = pytest.mark.skip(reason="real-size models: run `make test-slow` (RECAP_SLOW=1)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)

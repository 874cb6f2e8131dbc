"""The layering contracts (``.importlinter``, run by ``lint-imports`` in ``make test`` / ``make
lint``): kept by the package as it is, and each broken by the import it forbids, planted in a copy
of the package (a contract no import can break would check nothing)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")
CONTRACTS = (
    "core imports nothing of recap but recap.errors",
    "models and data import no engine (nor steps, commands)",
    "engine imports no models, steps or commands (models reach it through recap.engine.protocol)",
    "models and data never import each other; both build on recap.processing, which imports "
    "neither",
)

pytestmark = pytest.mark.skipif(not LINT_IMPORTS.exists(), reason="import-linter not installed")


def lint(root: Path) -> subprocess.CompletedProcess:
    """``lint-imports`` on the ``recap`` package under ``root`` with the repository's contracts."""
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(REPO / ".importlinter"), "--no-cache"],
        cwd=root, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(root)},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def verdicts(output: str) -> dict[str, str]:
    """``{contract name: "KEPT" | "BROKEN"}`` from the report's summary (names may wrap)."""
    text = " ".join(output.split())
    return {name: verdict for name in CONTRACTS for verdict in ("KEPT", "BROKEN")
            if f"{name} {verdict}" in text}  # fmt: skip


def test_the_package_keeps_every_contract():
    proc = lint(REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert verdicts(proc.stdout) == dict.fromkeys(CONTRACTS, "KEPT")
    assert "Contracts: 4 kept, 0 broken." in proc.stdout


@pytest.fixture(scope="module")
def copy(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("layering")
    shutil.copytree(REPO / "recap", root / "recap", ignore=shutil.ignore_patterns("__pycache__"))
    return root


@pytest.mark.parametrize(
    ("module", "planted", "contract"),
    [
        ("recap/core/returns.py", "from recap.data import specs", CONTRACTS[0]),
        ("recap/data/loader.py", "from recap.engine import distributed", CONTRACTS[1]),
        ("recap/models/losses.py", "import recap.steps.train", CONTRACTS[1]),
        ("recap/engine/ema.py", "from recap.models import adapters", CONTRACTS[2]),
        # indirect: engine -> interop -> models is a chain through another module
        ("recap/engine/tracking.py", "import recap.interop.lerobot", CONTRACTS[2]),
        ("recap/data/specs.py", "from recap.models import losses", CONTRACTS[3]),
        ("recap/models/losses.py", "from recap.data import specs", CONTRACTS[3]),
        ("recap/processing/cameras.py", "import recap.data.lerobot", CONTRACTS[3]),
    ],
)
def test_a_forbidden_import_breaks_its_contract(copy, module, planted, contract):
    path = copy / module
    original = path.read_text()
    path.write_text(original + f"\n\ndef _planted():\n    {planted}\n")
    try:
        proc = lint(copy)
    finally:
        path.write_text(original)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    broken = {name for name, verdict in verdicts(proc.stdout).items() if verdict == "BROKEN"}
    assert contract in broken
    assert module.removesuffix(".py").replace("/", ".") in " ".join(proc.stdout.split())

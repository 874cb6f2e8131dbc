"""The layering contracts (``.importlinter``, run by ``lint-imports`` in ``make test`` / ``make
lint``): kept by the package as it is, and each broken by the import it forbids, planted in a copy
of the package (a contract no import can break would check nothing). And no import cycle between
recap's modules (grimp's graph, lazy imports included): ``KNOWN_CYCLES`` is empty."""

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
    "recap's layers, top to bottom (commands on top, errors at the bottom)",
    "envs import no steps (a rollout needs a policy and an env, not a training step)",
    "nothing imports commands (console entry points sit on top; scripts/ is outside the package)",
    "the workflow plans and launches without the engine (tracking and ports live outside it)",
    "gin only at the edge: the registry, the config checks, the CLI and the commands import it; "
    "library modules declare configurables through recap.configurable",
)
KNOWN_CYCLES: set[tuple[str, ...]] = set()  # none: a cycle that appears fails the test

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
    assert "Contracts: 9 kept, 0 broken." in proc.stdout


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
        ("recap/engine/loader.py", "import recap.interop.lerobot", CONTRACTS[2]),
        ("recap/data/specs.py", "from recap.models import losses", CONTRACTS[3]),
        ("recap/models/losses.py", "from recap.data import specs", CONTRACTS[3]),
        ("recap/processing/cameras.py", "import recap.data.lerobot", CONTRACTS[3]),
        # a lower layer importing a higher one; siblings of an independent layer
        ("recap/cli.py", "import recap.workflow.pipeline", CONTRACTS[4]),
        ("recap/processing/cameras.py", "import recap.viz", CONTRACTS[4]),
        ("recap/envs/reach/task.py", "import recap.steps.relabel", CONTRACTS[5]),
        ("recap/serve/load.py", "import recap.commands.train", CONTRACTS[6]),
        ("recap/workflow/report.py", "from recap.engine import distributed", CONTRACTS[7]),
        # indirect: sweep -> steps -> engine
        ("recap/sweep.py", "import recap.steps.train", CONTRACTS[7]),
        # gin: a library module that imports it, directly or one of its modules
        ("recap/steps/relabel.py", "import gin", CONTRACTS[8]),
        ("recap/workflow/report.py", "from gin import config", CONTRACTS[8]),
        ("recap/models/toy.py", "import gin.config", CONTRACTS[8]),
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


def import_cycles(package: str = "recap") -> list[tuple[str, ...]]:
    """The strongly connected groups of more than one module in ``package``'s import graph
    (Tarjan's algorithm over grimp's graph), each sorted."""
    import grimp

    graph = grimp.build_graph(package)
    imports = {m: sorted(graph.find_modules_directly_imported_by(m)) for m in graph.modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []
    for start in sorted(imports):
        if start in index:
            continue
        work = [(start, iter(imports[start]))]
        index[start] = low[start] = len(index)
        stack.append(start)
        while work:
            module, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    work.append((child, iter(imports[child])))
                elif child in stack:
                    low[module] = min(low[module], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[module])
            if low[module] == index[module]:
                group = []
                while not group or group[-1] != module:
                    group.append(stack.pop())
                if len(group) > 1:
                    cycles.append(tuple(sorted(group)))
    return sorted(cycles)


def test_import_cycles_are_found_with_lazy_imports(tmp_path, monkeypatch):
    package = tmp_path / "cyc"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("import cyc.b\n")
    (package / "b.py").write_text("def f():\n    from cyc import c\n")
    (package / "c.py").write_text("import cyc.a\n")
    (package / "d.py").write_text("import cyc.a\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert import_cycles("cyc") == [("cyc.a", "cyc.b", "cyc.c")]


def test_no_import_cycle_between_recaps_modules():
    found = set(import_cycles())
    assert found - KNOWN_CYCLES == set(), f"import cycles: {sorted(found - KNOWN_CYCLES)}"
    assert KNOWN_CYCLES - found == set(), f"gone, drop from KNOWN_CYCLES: {KNOWN_CYCLES - found}"

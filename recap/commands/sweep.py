"""Run a sweep: one training launch per point of a grid of gin bindings (cartesian product).

    recap-sweep sweeps/toy_lr.yaml [--dry_run] [--gin_param 'train.max_steps = 5']
    python -m recap.commands.sweep sweeps/toy_lr.yaml

A sweep file (YAML; a path, or a name relative to the packaged gin directory, ``recap/gin``)::

    name: toy_lr                    # MLflow tag recap.sweep on every run
    gin_files: [demo/toy.gin]       # the base configuration
    gin_params: ["train.max_steps = 20"]   # fixed extra bindings (optional)
    launcher: python                # or "deepspeed --num_gpus 2" (a free --master_port is added)
    run_root: runs/sweeps           # point i trains in {run_root}/{name}/{i:03d} (optional)
    grid:                           # binding -> list of values (Python/gin literals)
      deepspeed_config.lr: [3.0e-4, 1.0e-3]

Each point launches the module ``recap.commands.train``: ``python -m recap.commands.train`` or
``deepspeed ... --module recap.commands.train`` (any other launcher gets ``-m MODULE``, as
``python`` and ``torchrun`` accept). Every point is checked by gin before anything runs (an
unknown binding exits 2). Each point's MLflow run is tagged with the sweep name and has the
varied bindings among its params.
"""

from __future__ import annotations

import argparse
import shlex
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import recap.sweep
from recap.cli import parse_gin
from recap.errors import RecapError
from recap.sweep import binding as _binding
from recap.sweep import label as _label
from recap.sweep import points
from recap.workflow.launch import gin_flags, module_argv

TRAIN = "recap.commands.train"
KEYS = {"name", "gin_files", "gin_params", "launcher", "run_root", "grid"}

__all__ = ["command", "load_sweep", "main", "point_params", "points", "validate"]


def load_sweep(path: str) -> dict:
    """Read and check a sweep file; errors name the file and the field."""
    return recap.sweep.load_sweep(path, KEYS)


def point_params(spec: dict, index: int, point: dict, extra: Sequence[str]) -> list[str]:
    """All gin bindings of one point: fixed, varied, and the run's name / directory / sweep tag."""
    name = spec["name"]
    label = _label(point)
    run_dir = Path(spec.get("run_root", "runs/sweeps")) / name / f"{index:03d}"
    return [
        *spec.get("gin_params", []),
        *extra,
        *(_binding(k, v) for k, v in point.items()),
        _binding("train.run_dir", str(run_dir)),
        _binding("Tracker.sweep_name", name),
        _binding("Tracker.run_name", f"{name}/{index:03d} {label}".strip()),
    ]


def command(spec: dict, params: Sequence[str]) -> list[str]:
    """Argv of one point's training launch."""
    launcher = shlex.split(spec.get("launcher", "python"))
    return [*module_argv(launcher, TRAIN), *gin_flags(spec["gin_files"], params)]


def validate(spec: dict, all_params: list[list[str]]) -> None:
    """Parse every point with gin (needs the train step's configurables registered)."""
    import recap.steps.train  # noqa: F401
    from recap.configurable import clear_config

    for params in all_params:
        clear_config()
        parse_gin(spec["gin_files"], params)
    clear_config()


def build_parser() -> argparse.ArgumentParser:
    """The flags; ``--help`` says what each is."""
    from recap.commands import HelpFormatter

    parser = argparse.ArgumentParser(prog="recap-sweep", description=__doc__.splitlines()[0],
                                     formatter_class=HelpFormatter)  # fmt: skip
    parser.add_argument("sweep", help="sweep YAML file (path or name under recap/gin)")
    parser.add_argument("--dry_run", action="store_true", help="print the launches, run nothing")
    parser.add_argument(
        "--gin_param",
        action="append",
        default=[],
        help="extra gin binding 'a.b = v' for every point (repeat)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        spec = load_sweep(args.sweep)
        grid = points(spec.get("grid") or {}) or [{}]
        all_params = [point_params(spec, i, p, args.gin_param) for i, p in enumerate(grid)]
        validate(spec, all_params)
    except RecapError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    failed = []
    for index, params in enumerate(all_params):
        cmd = command(spec, params)
        print(shlex.join(cmd), flush=True)
        if not args.dry_run and subprocess.run(cmd).returncode != 0:
            failed.append(index)
    if failed:
        print(f"sweep {spec['name']}: points {failed} failed", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())

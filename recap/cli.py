"""Shared command-line entry: ``--gin_file`` / ``--gin_param`` flags, one-line errors.

Scripts stay thin::

    from recap.cli import run_step
    from recap.steps.compute_returns import compute_returns
    if __name__ == "__main__":
        run_step(compute_returns)

Flags: repeatable ``--gin_file`` (paths, or names relative to the repository's ``gin/``) and
``--gin_param`` (``"binding = value"``); ``--local_rank`` from the DeepSpeed launcher is accepted.
A ``RecapError`` (bad input, bad config) prints one line to stderr and exits with status 2.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from recap.errors import RecapError, one_line

GIN_DIR = Path(__file__).resolve().parent.parent / "gin"


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--gin_file", action="append", default=[], help="gin file (repeatable)")
    parser.add_argument(
        "--gin_param", action="append", default=[], help="gin binding 'a.b = v' (repeatable)"
    )
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)
    return parser


def resolve_gin_file(name: str) -> str:
    """A gin file path as given, else relative to the repository's ``gin/`` directory."""
    path = Path(name)
    if path.is_file():
        return str(path)
    candidate = GIN_DIR / name
    if candidate.is_file():
        return str(candidate)
    raise RecapError(f"{name}: gin file not found (looked here and in {GIN_DIR})")


def parse_gin(files: Sequence[str], params: Sequence[str]) -> None:
    """Parse gin files and bindings; unknown configurables or parameters are a RecapError."""
    import gin

    if str(GIN_DIR) not in gin.config._LOCATION_PREFIXES:
        gin.add_config_file_search_path(str(GIN_DIR))
    resolved = [resolve_gin_file(f) for f in files]
    # gin logs "Path not found" at ERROR for every search-path miss of an `include`.
    quiet = logging.Filter()
    quiet.filter = lambda record: not str(record.msg).startswith("Path not found")
    logging.getLogger().addFilter(quiet)
    try:
        gin.parse_config_files_and_bindings(resolved, list(params), finalize_config=False)
    except (ValueError, KeyError, SyntaxError, ImportError, OSError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise RecapError(
            f"gin config: {first}; check the binding names in {files or params}"
        ) from exc
    finally:
        logging.getLogger().removeFilter(quiet)


def run_step(step: Callable[[], object], argv: Sequence[str] | None = None) -> int:
    """Parse flags and gin, call ``step()`` (its arguments come from gin), map errors to exit 2."""
    args = build_parser(step.__doc__.splitlines()[0] if step.__doc__ else None).parse_args(argv)
    try:
        parse_gin(args.gin_file, args.gin_param)
        step()
        if "torch.distributed" in sys.modules:  # a step that joined a process group leaves it
            from recap.engine import distributed

            distributed.shutdown()
    except RecapError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        sys.exit(2)
    return 0

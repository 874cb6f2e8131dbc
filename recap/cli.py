"""Shared command-line entry: ``--gin_file`` / ``--gin_param`` flags, one-line errors.

Commands (``recap/commands/``) stay thin::

    from recap.cli import run_command
    from recap.steps.compute_returns import compute_returns

    def main(argv=None) -> int:
        return run_command(compute_returns, argv)

Flags: repeatable ``--gin_file`` (paths, or names relative to the gin directory shipped in the
package, ``recap/gin``) and ``--gin_param`` (``"binding = value"``); ``--local_rank`` from the
DeepSpeed launcher is accepted. A ``RecapError`` (bad input, bad config) prints one line to
stderr and gives exit status 2.
"""

from __future__ import annotations

import argparse
import functools
import importlib.resources
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from recap import registry
from recap.config_check import check_config_dicts, check_required, gin_error_line
from recap.configurable import config_class, configured
from recap.errors import RecapError, one_line


def packaged_gin_dir() -> Path:
    """The gin files shipped inside the package (``recap/gin``), wherever recap is installed."""
    return Path(str(importlib.resources.files("recap") / "gin"))


GIN_DIR = packaged_gin_dir()


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """``--help`` with each argument's default appended (``(default: X)``) unless its help
    already states one, it is required, a flag or has no default; descriptions keep their
    line breaks."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if (
            "default" in text
            or action.required
            or action.default is None
            or action.default is False
            or action.default is argparse.SUPPRESS
            or action.default == []
            or isinstance(action, argparse._StoreConstAction | argparse._HelpAction)
        ):
            return text
        return f"{text} (default: %(default)s)"


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    """The flags every gin-configured command takes (``--gin_file``, ``--gin_param``), with
    ``HelpFormatter``; commands add their own."""
    parser = argparse.ArgumentParser(description=description, formatter_class=HelpFormatter)
    parser.add_argument("--gin_file", action="append", default=[], help="gin file (repeatable)")
    parser.add_argument(
        "--gin_param", action="append", default=[], help="gin binding 'a.b = v' (repeatable)"
    )
    parser.add_argument("--local_rank", type=int, default=None, help=argparse.SUPPRESS)
    return parser


def resolve_gin_file(name: str) -> str:
    """A gin file path as given, else relative to the packaged gin directory (``GIN_DIR``)."""
    path = Path(name)
    if path.is_file():
        return str(path)
    candidate = GIN_DIR / name
    if candidate.is_file():
        return str(candidate)
    raise RecapError(f"{name}: gin file not found (looked here and in {GIN_DIR})")


@functools.cache
def _search_packaged_gin() -> None:
    """``include`` finds the packaged gin files (gin keeps search paths across ``clear_config``:
    added once per process)."""
    import gin

    gin.add_config_file_search_path(str(GIN_DIR))


def parse_gin(files: Sequence[str], params: Sequence[str]) -> None:
    """Parse gin files and bindings; unknown configurables or parameters, and unknown keys of
    the model size dicts, are a RecapError (one line, with the nearest valid names).
    Bindings of recap's own configurables that this process has not registered (a file or an
    ``all:`` binding shared by every step) are skipped here; the pipeline registers them all
    (``recap.registry.register_all``) and checks every binding before anything runs. Then the
    registry's parse-time checks of the configurables registered here run (``run_parse_checks``:
    LoRA / frozen towers of the model factories, one line before anything is built)."""
    import gin

    _search_packaged_gin()
    resolved = [resolve_gin_file(f) for f in files]
    # gin logs "Path not found" at ERROR for every search-path miss of an `include`.
    quiet = logging.Filter()
    quiet.filter = lambda record: not str(record.msg).startswith("Path not found")
    logging.getLogger().addFilter(quiet)
    try:
        # recap's configurables this process has not registered (another step's) are skipped
        gin.parse_config_files_and_bindings(resolved, list(params), finalize_config=False,
                                            skip_unknown=list(registry.KNOWN))  # fmt: skip
    except (ValueError, KeyError, SyntaxError, ImportError, OSError) as exc:
        raise RecapError(f"gin config: {gin_error_line(exc, files or params)}") from exc
    finally:
        logging.getLogger().removeFilter(quiet)
    check_config_dicts()  # keys of the model size dicts (pi05_policy.vision = {...})
    registry.run_parse_checks()


def run_command(step: Callable[[Any], object], argv: Sequence[str] | None = None) -> int:
    """Parse flags and gin, call ``step(config)`` with its config dataclass built from gin
    (``recap.configurable.config_class``); a ``RecapError`` prints one line and returns 2,
    success returns 0."""
    args = build_parser(step.__doc__.splitlines()[0] if step.__doc__ else None).parse_args(argv)
    settings = config_class(step)
    try:
        parse_gin(args.gin_file, args.gin_param)
        check_required(settings)  # every REQUIRED value this call reaches, before it runs
        step(configured(settings)())
        if "torch.distributed" in sys.modules:  # a step that joined a process group leaves it
            from recap.engine import distributed

            distributed.shutdown()
    except RecapError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    return 0


def run_step(step: Callable[[Any], object], argv: Sequence[str] | None = None) -> int:
    """``run_command`` that exits with status 2 on a ``RecapError`` (returns 0 otherwise)."""
    code = run_command(step, argv)
    if code:
        sys.exit(code)
    return 0

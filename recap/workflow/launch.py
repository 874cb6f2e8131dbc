"""The argv that runs one step module: the pipeline's stages and the training sweeps' points.
A launcher is the words before the module: ``python`` (this interpreter, ``-m MODULE``) or
``deepspeed ...`` (``--module MODULE``, with a free ``--master_port`` unless the words give
one), so an installed recap needs no checkout."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

from recap.ports import free_port


def deepspeed_executable() -> str:
    """The ``deepspeed`` launcher beside this interpreter, else the one on PATH."""
    launcher = Path(sys.executable).parent / "deepspeed"
    return str(launcher) if launcher.exists() else "deepspeed"


def module_argv(launcher: Sequence[str], module: str) -> list[str]:
    """``launcher``'s words followed by what makes it run ``module``."""
    words = list(launcher)
    if words[0] in ("python", "python3"):
        return [sys.executable, *words[1:], "-m", module]
    if Path(words[0]).name == "deepspeed":
        if "--master_port" not in words:
            words += ["--master_port", str(free_port())]
        return [*words, "--module", module]
    return [*words, "-m", module]


def gin_flags(files: Sequence[str], params: Sequence[str]) -> list[str]:
    """``--gin_file F`` for each file, then ``--gin_param P`` for each binding."""
    return [*(a for f in files for a in ("--gin_file", f)),
            *(a for p in params for a in ("--gin_param", p))]  # fmt: skip

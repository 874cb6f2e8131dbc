"""Atomic file writes: every output of recap replaces its destination whole or not at all."""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path


@contextlib.contextmanager
def _staged(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; removed if the body fails."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    try:
        yield Path(tmp)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_atomic(files: dict[Path, Callable[[Path], None]]) -> None:
    """Write several files so that none is replaced unless all were written.

    ``files`` maps each destination to a writer that fills a temporary path. Files end up
    readable by all (0644, as a plain write would leave them), not mkstemp's 0600.
    """
    staged: list[tuple[Path, Path]] = []
    try:
        with contextlib.ExitStack() as stack:
            for dest, writer in files.items():
                tmp = stack.enter_context(_staged(Path(dest)))
                writer(tmp)
                os.chmod(tmp, 0o644)
                staged.append((tmp, Path(dest)))
            for tmp, dest in staged:
                os.replace(tmp, dest)
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)


def json_writer(obj: object) -> Callable[[Path], None]:
    """A writer for ``write_atomic`` that stores ``obj`` as indented, key-sorted JSON."""
    return lambda tmp: tmp.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n")


def write_json(path: Path, obj: object) -> None:
    """``obj`` as indented, key-sorted JSON at ``path`` (parents created), replaced atomically."""
    write_atomic({Path(path): json_writer(obj)})

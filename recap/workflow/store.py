"""What a finished stage leaves behind, and how a rerun knows it finished: a marker record
``{run_root}/.pipeline/{stage}-{fingerprint}.json`` (written atomically once the stage's process
exits 0) holding the size and modification time of each of its outputs. A stage counts as
finished while its marker exists and every output it stamped is still there as it was; anything
else reruns it (and the stages after it). ``recap-iterate`` keeps its own markers with the same
stamps."""

from __future__ import annotations

import json
from pathlib import Path

from recap.io import write_json

MARKERS = ".pipeline"


def stamp(paths: list[Path]) -> dict[str, list[int]]:
    """Size and modification time (ns) of each file, keyed by its path."""
    out = {}
    for path in paths:
        st = path.stat()
        out[str(path)] = [st.st_size, st.st_mtime_ns]
    return out


def unchanged(outputs: dict[str, list[int]]) -> bool:
    """Whether every file ``stamp`` recorded in ``outputs`` is still there as it was."""
    try:
        return stamp([Path(p) for p in outputs]) == outputs
    except OSError:
        return False


def marker(root: Path, stage: str, fingerprint: str) -> Path:
    """The marker of stage ``stage`` with ``fingerprint`` under ``root``."""
    return root / MARKERS / f"{stage}-{fingerprint}.json"


def finished(root: Path, stage: str, fingerprint: str) -> dict | None:
    """The stage's marker record when its outputs are still as it left them, else None."""
    path = marker(root, stage, fingerprint)
    if not path.is_file():
        return None
    record = json.loads(path.read_text())
    return record if unchanged(record.get("outputs", {})) else None


def record(root: Path, stage: str, fingerprint: str, record: dict) -> None:
    """Write the stage's marker (``record`` holds its ``outputs`` stamps)."""
    write_json(marker(root, stage, fingerprint), record)

"""The records a step leaves beside its outputs for whoever reads its result later (the pipeline's
stages and summary, recap-iterate, the benchmarks): one type per record, its file and both of its
directions here, so the writer and every reader agree on the fields.

- ``Evaluation``: a closed-loop evaluation (``recap-evaluate``, the pipeline's evaluate stages),
  ``{run_dir}/closed_loop.json``.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path

from recap.errors import RecapError
from recap.io import write_atomic

EVALUATION_FILE = "closed_loop.json"


@dataclass(frozen=True)
class Evaluation:
    """A policy's closed-loop evaluation: success rate per beta (``{"beta_1": rate, ...}``) over
    ``num_episodes`` episodes ``seed .. seed + num_episodes - 1`` of ``env``, each episode's
    outcome per beta (``outcomes``, for paired comparisons), the mean ``heading`` per beta (None
    for an environment without that step metric) and the conditioning-sensitivity probe
    (``sensitivity``; None for a policy with one prompt). Fields an older record lacks read as
    None (empty for the per-beta maps)."""

    success: dict[str, float]
    num_episodes: int
    outcomes: dict[str, list[int]] = field(default_factory=dict)
    heading: dict[str, float | None] = field(default_factory=dict)
    env: str | None = None
    conditioning: str | None = None
    seed: int | None = None
    guidance: str | None = None
    sensitivity: dict[str, float] | None = None

    def as_record(self) -> dict:
        """The JSON form (``closed_loop.json``'s fields; no ``sensitivity`` when there is none)."""
        record = dataclasses.asdict(self)
        if record["sensitivity"] is None:
            del record["sensitivity"]
        return record

    def write(self, run_dir: str | Path) -> Path:
        """``{run_dir}/closed_loop.json``, replaced atomically."""
        path = Path(run_dir) / EVALUATION_FILE
        text = json.dumps(self.as_record(), indent=2) + "\n"
        write_atomic({path: lambda tmp: tmp.write_text(text)})
        return path

    @classmethod
    def read(cls, run_dir: str | Path) -> Evaluation:
        """The evaluation recorded in ``run_dir``; a missing or unreadable record, or one without
        ``success`` / ``num_episodes``, is one line naming the file."""
        path = Path(run_dir) / EVALUATION_FILE
        try:
            record = json.loads(path.read_text())
        except FileNotFoundError:
            where = f"evaluate_policy.run_dir = {str(run_dir)!r}"
            raise RecapError(f"{path}: not found; evaluate the policy first (recap-evaluate "
                             f"with {where})") from None  # fmt: skip
        except (OSError, ValueError) as exc:
            raise RecapError(f"{path}: not a JSON record ({exc}); evaluate the policy "
                             "again") from None  # fmt: skip
        if not isinstance(record, dict):
            raise RecapError(f"{path}: not a JSON object; evaluate the policy again")
        for key in ("success", "num_episodes"):
            if key not in record:
                raise RecapError(f"{path}: field {key!r} missing; evaluate the policy again")
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in record.items() if k in known})

"""What the plan checks of the data before anything runs (``recap-pipeline``, ``--dry_run`` too).

For every pipeline step, with that step's gin configuration parsed, ``PlanChecks.step`` reads
the ``meta/info.json`` of every dataset the step's configurables list (``compute_returns``,
``value_data``, ``compute_advantages``, ``policy_data``; eval sets too) and checks it against
the configuration and the checkpoint:

- keys: the dataset entry's ``cameras`` / ``state_key`` / ``action_key`` exist, and the camera map
  (bound, else detected) fits the models' camera slots (``recap.data.lerobot.spec_key_map``; the
  chosen map and its slot roles are printed once per dataset);
- Step 1: a rollout dataset has its outcome column; a bound ``correction_column`` exists;
- Step 4: state and action at most ``policy_data.action_dim`` (and ``pi05_policy.action_dim``)
  wide, one state/action size across the training datasets, and when the statistics come from
  the checkpoint (``policy_data.norm_stats`` ``checkpoint``, or ``auto`` with a checkpoint that
  carries them) at least as many statistics dims as the data has;
- rates: the look-ahead and the action horizon, in frames, are printed in seconds per rate.

Each mismatch is one line (the same mismatch of one dataset once); ``PlanChecks.finish`` raises
the one found, or logs them all and raises their count, so nothing is launched. A dataset not
written yet (a later iteration's rollouts) is left to its step.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from recap import logs
from recap.configurable import bound
from recap.data.lerobot import MAX_DIM, LocalDataset, feature_dims, spec_key_map
from recap.data.specs import DatasetSpec, parse_dataset_specs
from recap.errors import DatasetError, RecapError, located

log = logs.get(__name__)

RETURNS, VALUE, POLICY = "returns", "value", "policy"
# configurable -> (what its datasets feed, its dataset lists)
DATA_BINDINGS = {
    "compute_returns": (RETURNS, ("datasets",)),
    "value_data": (VALUE, ("datasets", "eval_datasets")),
    "compute_advantages": (VALUE, ("datasets",)),
    "policy_data": (POLICY, ("datasets", "eval_datasets")),
}


def bound_specs(configurable: str, field: str) -> list[DatasetSpec]:
    """The dataset entries bound to ``configurable.field`` now (none when unbound)."""
    entries = bound(f"{configurable}.{field}")
    if not entries or not isinstance(entries, list | tuple):
        return []
    root = bound(f"{configurable}.data_root", "") or ""
    return parse_dataset_specs(list(entries), root, f"{configurable}.{field}")


class PlanChecks:
    """Collects the data mismatches of every planned step; ``finish`` raises them."""

    def __init__(self) -> None:
        self.problems: list[str] = []
        self.failed: set[str] = set()  # dataset roots whose keys were refused (once each)
        self.noted: set[str] = set()

    def add(self, line: str) -> None:
        if line not in self.problems:
            self.problems.append(line)

    def note(self, line: str) -> None:
        """An informational line (rates), printed once."""
        if line not in self.noted:
            self.noted.add(line)
            if logs.is_main():
                log.info(line)

    def step(self, stage: str) -> None:
        """Check the datasets of the step whose gin configuration is parsed now."""
        for configurable, (role, fields) in DATA_BINDINGS.items():
            for field in fields:
                try:
                    specs = bound_specs(configurable, field)
                except RecapError as exc:
                    self.add(f"{stage}: {exc.message}")
                    continue
                infos = self._infos(specs)
                for spec in specs:
                    if spec.name in infos:
                        self._check(stage, role, spec, infos[spec.name], configurable)
                if role == POLICY and field == "datasets":
                    self._check_policy(stage, [s for s in specs if s.name in infos], infos)
        self._rates(stage)

    def _infos(self, specs: Iterable[DatasetSpec]) -> dict[str, dict]:
        infos = {}
        for spec in specs:
            if not (spec.root / "meta" / "info.json").is_file():
                continue  # written later (an iteration's rollouts): its step reads and checks it
            try:
                infos[spec.name] = LocalDataset(spec.root).info
            except DatasetError as exc:
                self.add(exc.message)
        return infos

    def _check(self, stage: str, role: str, spec: DatasetSpec, info: dict, configurable: str):
        features = info["features"]
        where = f"{spec.root}/meta/info.json"
        if role == RETURNS:
            outcome = spec.outcome_column or bound("compute_returns.outcome_column", "is_success")
            if spec.type == "rollout" and outcome not in features:
                self.add(located(where, f"rollout dataset {spec.name!r} has no outcome column "
                                 f"{outcome!r} ({spec.binding}); set its 'outcome_column' (e.g. "
                                 "'next.success') or list it with type 'sft'"))  # fmt: skip
            if spec.correction_column and spec.correction_column not in features:
                self.add(located(where, f"correction_column {spec.correction_column!r} "
                                 f"({spec.binding}) is not a feature of this dataset; its keys: "
                                 f"{', '.join(features)}"))  # fmt: skip
            return
        if str(spec.root) in self.failed:
            return
        try:
            spec_key_map(spec, info, max_dim=self.max_dim() if role == POLICY else None)
        except DatasetError as exc:
            self.failed.add(str(spec.root))
            self.add(exc.message)

    @staticmethod
    def max_dim() -> int:
        """The widest state/action the policy takes: ``policy_data.action_dim`` (and the
        model's ``pi05_policy.action_dim`` when bound), 32 by default."""
        dims = [bound("policy_data.action_dim", MAX_DIM), bound("pi05_policy.action_dim")]
        return min(int(d) for d in dims if d is not None)

    def _check_policy(self, stage: str, specs: list[DatasetSpec], infos: dict[str, dict]):
        """One state/action size across the training datasets, and checkpoint statistics at
        least that wide."""
        if not specs or any(str(s.root) in self.failed for s in specs):
            return
        dims: dict[str, dict[str, int]] = {"state": {}, "action": {}}
        for spec in specs:
            key_map = spec_key_map(spec, infos[spec.name], show=False)
            features = infos[spec.name]["features"]
            dims["state"][spec.name] = feature_dims(features, key_map.state)
            dims["action"][spec.name] = feature_dims(features, key_map.action)
        for name, sizes in dims.items():
            if len(set(sizes.values())) > 1:
                found = ", ".join(f"{n} {d}" for n, d in sizes.items())
                self.add(f"policy_data.datasets: {name} sizes differ ({found}); mix only "
                         "datasets of one robot (same state/action size)")  # fmt: skip
                return
        mode, checkpoint = bound("policy_data.norm_stats", "auto"), bound("policy_data.checkpoint")
        if mode == "data" or checkpoint is None:
            return
        if not Path(checkpoint).is_dir():  # written by an earlier step or iteration
            self.note(f"{stage}: policy_data.checkpoint {checkpoint} not there yet; its "
                      "statistics are checked when the step reads them")  # fmt: skip
            return
        from recap.data.norm_stats import find_norm_stats, read_norm_stats

        try:
            found = find_norm_stats(checkpoint, bound("policy_data.asset_id"))
            if found is None:
                if mode == "checkpoint":
                    self.add(f"{checkpoint}: no normalization statistics (policy_data.norm_stats "
                             "= \"checkpoint\"); use policy_data.norm_stats = \"data\" or "
                             "\"auto\"")  # fmt: skip
                return
            stats = read_norm_stats(found)
        except RecapError as exc:
            self.add(exc.message)
            return
        data = {name: next(iter(sizes.values())) for name, sizes in dims.items()}
        short = [name for name, dim in data.items() if len(stats[name]) < dim]
        if short:
            have = " and ".join(f"{n} {len(stats[n])}" for n in short)
            want = " and ".join(f"{n} {data[n]}" for n in short)
            self.add(f"{found}: the statistics have {have} dims, the data "
                     f"({', '.join(dims['state'])}) {want}; use policy_data.norm_stats = \"data\" "
                     "or a checkpoint of this robot")  # fmt: skip

    def _rates(self, stage: str) -> None:
        """Print the frame-counted horizons in seconds at each dataset's rate."""
        horizons = {"compute_advantages.lookahead": ("compute_advantages", "datasets"),
                    "policy_data.action_horizon": ("policy_data", "datasets")}  # fmt: skip
        seconds = bound("compute_advantages.lookahead_s")
        if seconds is not None:  # a duration: frames per dataset
            horizons.pop("compute_advantages.lookahead")
            try:
                specs = bound_specs("compute_advantages", "datasets")
            except RecapError:
                specs = []
            for spec in specs:
                try:
                    fps = float(LocalDataset(spec.root).info["fps"])
                except (DatasetError, KeyError, TypeError, ValueError):
                    continue
                n = max(1, int(round(float(seconds) * fps)))
                self.note(f"{stage}: compute_advantages.lookahead_s {seconds:g} s = {n} frames at "
                          f"{fps:g} fps ({spec.name})")  # fmt: skip
        for name, (configurable, field) in horizons.items():
            frames = bound(name)
            if frames is None:
                continue
            try:
                specs = bound_specs(configurable, field)
            except RecapError:
                continue
            for spec in specs:
                try:
                    fps = float(LocalDataset(spec.root).info["fps"])
                except (DatasetError, KeyError, TypeError, ValueError):
                    continue
                self.note(f"{stage}: {name} {frames} frames = {int(frames) / fps:g} s at "
                          f"{fps:g} fps ({spec.name})")  # fmt: skip

    def finish(self) -> None:
        """Raise the mismatch found, or log every mismatch (one line each) and raise their
        count (nothing has been launched)."""
        if len(self.problems) == 1:
            raise RecapError(self.problems[0])
        if self.problems:
            for line in self.problems:
                log.error(line)
            raise RecapError(f"plan: {len(self.problems)} mismatches between the datasets and the "
                             "configuration (one line each above); nothing was run")  # fmt: skip

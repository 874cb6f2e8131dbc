"""The list of datasets a step works on, as written in gin.

In gin a dataset is a small dict, so a user lists several without new code::

    compute_returns.data_root = "demo_data"
    compute_returns.datasets = [
        {"name": "sft", "root": "sft", "type": "sft"},
        {"name": "rollout", "root": "rollout", "type": "rollout", "weight": 2.0,
         "failure_reward": -300.0, "outcome_column": "next.success"},
    ]

Relative roots resolve against ``data_root``. An entry may name a dataset as LeRobot users do,
``{"name": "pusht", "repo_id": "lerobot/pusht"}`` instead of a ``root``: it resolves offline, as
LeRobot's ``LeRobotDataset(repo_id)`` does, to ``$HF_LEROBOT_HOME/{repo_id}`` (default
``$HF_HOME/lerobot``, ``~/.cache/huggingface/lerobot``; ``lerobot_home``), and a dataset missing
there is a one-line error naming the path looked at. Nothing is downloaded.

Keys are detected from ``meta/info.json`` (``recap.data.lerobot.detect_key_map``) unless the entry
names them: ``cameras`` fills the model's camera slots in order (base, left wrist, right wrist;
``None`` or ``""`` leaves a slot empty), or a dict by role (``{"base": "cam_high",
"right_wrist": "cam_right_wrist"}``); ``state_key`` and ``action_key`` name the state and action
features. For an ALOHA-style dataset with four cameras::

    policy_data.datasets = [
        {"name": "aloha", "root": "aloha", "type": "sft",
         "cameras": ["cam_high", "cam_left_wrist", "cam_right_wrist"],
         "state_key": "observation.state", "action_key": "action"},
    ]

The chosen map and its slot roles are printed once per dataset (``recap.data.lerobot.
spec_key_map``).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path

from recap.configurable import REQUIRED, declared_name
from recap.core import columns as C
from recap.errors import RecapError


@dataclass(frozen=True)
class DatasetSpec:
    """One dataset entry: where it is, what it is, and per-entry overrides."""

    name: str
    root: Path
    type: str = C.ROLLOUT
    weight: float = 1.0
    gamma: float | None = None
    failure_reward: float | None = None
    outcome_column: str | None = None
    correction_column: str | None = None
    repo_id: str | None = None  # the LeRobot name ``root`` was resolved from (``lerobot_home``)
    cameras: tuple[str, ...] | None = None  # slot order: base, left wrist, right wrist ("" empty)
    state_key: str | None = None
    action_key: str | None = None
    binding: str = field(default="", compare=False)  # where bound: ``value_data.datasets[0]``


SLOT_ROLES = ("base", "left_wrist", "right_wrist")  # the models' camera slots, in order
_NOT_GIN = ("binding",)  # DatasetSpec fields a gin entry cannot set


def slot_cameras(value: object, where: str) -> tuple[str, ...]:
    """A dataset entry's ``cameras`` as one key per slot (``""``: an empty slot): a list in slot
    order, or a dict from roles (``SLOT_ROLES``) to keys; a one-line error otherwise."""
    if isinstance(value, dict):
        unknown = sorted(set(value) - set(SLOT_ROLES))
        if unknown:
            raise RecapError(f"{where}: cameras roles {unknown} unknown; the roles are "
                             f"{list(SLOT_ROLES)}")  # fmt: skip
        value = [value.get(role) for role in SLOT_ROLES]
        while value and not value[-1]:
            value.pop()
    if isinstance(value, str) or not isinstance(value, list | tuple):
        raise RecapError(f"{where}: cameras {value!r} is not a list of camera keys in slot order "
                         f"({', '.join(SLOT_ROLES)}) or a dict by role")  # fmt: skip
    out = tuple("" if v is None else v for v in value)
    if not all(isinstance(v, str) for v in out) or not any(out):
        raise RecapError(f"{where}: cameras {list(value)!r} must name at least one camera key "
                         "(None or \"\" for an empty slot)")  # fmt: skip
    named = [v for v in out if v]
    if len(set(named)) < len(named):
        raise RecapError(f"{where}: cameras {list(value)!r} names a camera twice")
    return out


def lerobot_home() -> Path:
    """LeRobot's ``HF_LEROBOT_HOME``: ``$HF_LEROBOT_HOME``, else ``$HF_HOME/lerobot`` with
    ``HF_HOME`` defaulting to ``$XDG_CACHE_HOME/huggingface`` (``~/.cache/huggingface``), as
    ``lerobot.utils.constants`` (0.6.1) and ``huggingface_hub.constants`` compute it."""
    if "HF_LEROBOT_HOME" in os.environ:
        return Path(os.environ["HF_LEROBOT_HOME"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache"))
    hf_home = os.environ.get("HF_HOME", os.path.join(cache, "huggingface"))
    return Path(os.path.expandvars(os.path.expanduser(hf_home))) / "lerobot"


def resolve_repo_id(repo_id: object, where: str) -> Path:
    """The local root of LeRobot dataset ``repo_id`` (``lerobot_home() / repo_id``), checked
    offline: no ``meta/info.json`` there is one ``RecapError`` line naming the path looked at."""
    if not isinstance(repo_id, str) or not repo_id.strip("/") or ".." in repo_id.split("/"):
        raise RecapError(f"{where}: repo_id {repo_id!r} is not a LeRobot repo id like "
                         "'lerobot/pusht'; fix it or give a root")  # fmt: skip
    root = lerobot_home() / repo_id
    if not (root / "meta" / "info.json").is_file():
        raise RecapError(f"{where}: repo_id {repo_id!r}: no LeRobot dataset at {root} (no "
                         "meta/info.json; recap never downloads); put the dataset there, set "
                         "HF_LEROBOT_HOME, or give a root")  # fmt: skip
    return root


def parse_dataset_specs(
    entries: list[dict], data_root: str | os.PathLike = "", field: str = "datasets"
) -> list[DatasetSpec]:
    """Validate gin dataset entries into ``DatasetSpec``s (unique names, known keys and types)."""
    if not entries:
        raise RecapError(f"{field}: no datasets listed; bind it to a list of dicts in gin")
    known = {f.name for f in fields(DatasetSpec)} - set(_NOT_GIN)
    specs: list[DatasetSpec] = []
    for i, entry in enumerate(entries):
        where = f"{field}[{i}]"
        if not isinstance(entry, dict):
            raise RecapError(f"{where}: expected a dict like {{'name': ..., 'root': ...}}")
        unknown = sorted(set(entry) - known)
        if unknown:
            raise RecapError(f"{where}: unknown keys {unknown}; known keys are {sorted(known)}")
        missing = [k for k in ("name", "root") if k not in entry]
        if "repo_id" in entry:
            missing = [k for k in missing if k != "root"]
            if "root" in entry:
                raise RecapError(f"{where}: both root and repo_id given; keep one (repo_id "
                                 "resolves to $HF_LEROBOT_HOME/{repo_id})")  # fmt: skip
        if missing:
            raise RecapError(f"{where}: missing {missing}; every dataset needs a name and a root "
                             "(or a LeRobot repo_id)")  # fmt: skip
        kind = entry.get("type", C.ROLLOUT)
        if kind not in C.DATASET_TYPES:
            raise RecapError(f"{where}: type {kind!r} is not one of {list(C.DATASET_TYPES)}")
        if "repo_id" in entry:
            root = resolve_repo_id(entry["repo_id"], where)
        else:
            root = Path(entry["root"])
            if not root.is_absolute() and data_root:
                root = Path(data_root) / root
        for key in ("state_key", "action_key"):
            if key in entry and entry[key] is not None and not isinstance(entry[key], str):
                raise RecapError(f"{where}: {key} {entry[key]!r} is not a feature key (a string)")
        cams = entry.get("cameras")
        cams = None if cams is None else slot_cameras(cams, where)
        specs.append(DatasetSpec(**{**entry, "root": root, "type": kind, "cameras": cams,
                                    "binding": where}))  # fmt: skip
    names = [s.name for s in specs]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise RecapError(f"{field}: dataset names {dupes} repeat; give each entry its own name")
    return specs


@dataclass(frozen=True)
class SplitDataConfig:
    """What a data builder with train / eval splits reads (``ValueDataConfig``,
    ``PolicyDataConfig``): ``split`` (``"train"`` or ``"eval"``), the training ``datasets``
    (their statistics normalize both splits), the ``eval_datasets`` and the ``data_root``
    relative roots are under."""

    split: str = "train"
    datasets: list[dict] = REQUIRED
    eval_datasets: list[dict] | None = None
    data_root: str = ""

    def split_specs(self) -> tuple[list[DatasetSpec], list[DatasetSpec]]:
        """``(training specs, the specs of `split`)``: eval sets are normalized with statistics
        of the training specs, so both are returned; errors name the builder's fields."""
        builder = declared_name(type(self)) or type(self).__name__
        if self.split not in ("train", "eval"):
            raise RecapError(f"{builder}.split: {self.split!r}; use 'train' or 'eval'")
        train = parse_dataset_specs(self.datasets, self.data_root, f"{builder}.datasets")
        if self.split == "train":
            return train, train
        if not self.eval_datasets:
            raise RecapError(f"{builder}.eval_datasets: empty; list the eval datasets in gin")
        return train, parse_dataset_specs(self.eval_datasets, self.data_root,
                                          f"{builder}.eval_datasets")  # fmt: skip

"""Write a starting experiment for your own LeRobot datasets: ``recap-init DATASET... --out FILE``.

    recap-init /data/aloha_towel /data/aloha_rollouts --out my_experiment.gin
    recap-pipeline --gin_file my_experiment.gin --dry_run \\
        --gin_param 'all:SIGLIP = "/models/siglip"' ...    # or pass --siglip etc. here

Each dataset's ``meta/info.json`` is read (nothing is written there): its keys, shapes, rate,
episodes and tasks go into the file as comments, and the dataset entries name the chosen cameras
(base, left wrist, right wrist: detected by name, the first three in slot order when there are
more), state and action keys. The look-ahead and the action horizon are one second at the
dataset's rate. Every binding still needed (model directories) is ``%gin.REQUIRED`` with a
comment saying what it is, unless given here. The file is a pipeline file: Steps 1-4 run the
shipped LIBERO experiment files (real model sizes) with this file's bindings after them.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from recap.data.lerobot import LocalDataset, feature_dims, spec_key_map
from recap.data.specs import SLOT_ROLES, DatasetSpec
from recap.errors import RecapError, one_line
from recap.io import write_atomic
from recap.processing.cameras import NUM_CAMERAS, is_wrist

STEP_FILES = {
    "returns": "experiments/libero_returns.gin",
    "value": "experiments/libero_value.gin",
    "advantages": "experiments/libero_advantages.gin",
    "policy": "experiments/libero_pi05.gin",
    "baseline": "experiments/libero_pi05_bc.gin",
}
MODELS = {  # macro -> (flag, what it is)
    "SIGLIP": ("--siglip", "local SigLIP / SigLIP2 directory: the value model's vision tower"),
    "GEMMA": ("--gemma", "local Gemma3 directory with its tokenizer: the value model's backbone"),
    "TOKENIZER": ("--tokenizer", "the policy's PaliGemma tokenizer (paligemma_tokenizer.model)"),
    "PI05_BASE": ("--pi05-base", "the π0.5 checkpoint to fine-tune (openpi or LeRobot layout)"),
}
HORIZON_S = (
    1.0  # seconds: the look-ahead and the action chunk (LIBERO 10 at 10 fps, the paper 50 at 50 Hz)
)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


def build_parser() -> argparse.ArgumentParser:
    """The flags; ``--help`` says what each is and its default."""
    from recap.commands import HelpFormatter

    parser = argparse.ArgumentParser(
        prog="recap-init",
        description=__doc__,
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "datasets",
        nargs="+",
        metavar="DATASET",
        help="LeRobot dataset directories (each holding meta/info.json)",
    )
    parser.add_argument(
        "--out", required=True, help="the experiment gin file to write (refused if it exists)"
    )
    parser.add_argument("--name", default=None,
                        help="experiment name (pipeline.name, the statistics' asset id); "
                        "default: the --out file's stem")  # fmt: skip
    parser.add_argument("--eval", action="append", default=[], metavar="DATASET",
                        help="a dataset (its directory name) held out for evaluation (repeat); "
                        "default: none, evaluation then uses the training datasets")  # fmt: skip
    parser.add_argument("--sft", action="append", default=[], metavar="DATASET",
                        help="a dataset (its directory name) of demonstrations: type 'sft' "
                        "(repeat); default: 'sft' for datasets without an is_success column, "
                        "'rollout' otherwise")  # fmt: skip
    for macro, (flag, what) in MODELS.items():
        parser.add_argument(
            flag,
            default=None,
            metavar="PATH",
            help=f"{what}; default: {macro} = %%gin.REQUIRED in the file",
        )
    parser.add_argument(
        "--ranks", type=int, default=1, help="processes per distributed step (pipeline.ranks)"
    )
    parser.add_argument("--force", action="store_true", help="overwrite --out if it exists")
    return parser


def describe(name: str, dataset: LocalDataset, spec: DatasetSpec) -> tuple[list[str], dict]:
    """Comment lines about one dataset and its gin entry."""
    info, features = dataset.info, dataset.features
    cameras = [k for k in features if features[k].get("dtype") in ("image", "video")]
    chosen = list(spec_key_map(spec, info, slots=len(cameras) or 1, show=False).cameras)
    if len(chosen) > NUM_CAMERAS:  # base first, then up to two wrist cameras
        bases = [c for c in chosen if not is_wrist(c)]
        wrists = [c for c in chosen if is_wrist(c)]
        chosen = list(dict.fromkeys([*bases[:1], *wrists[:2], *chosen]))[:NUM_CAMERAS]
    key_map = spec_key_map(dataclasses.replace(spec, cameras=tuple(chosen)), info, show=False)
    tasks = list(dataset.tasks.values())
    lines = [
        f"# {name}: {dataset.root}",
        f"#   LeRobot {dataset.version}, {dataset.fps:g} fps, {dataset.num_episodes} episodes, "
        f"{info.get('total_frames', '?')} frames, robot_type {info.get('robot_type')!r}",
        f"#   tasks ({len(tasks)}): "
        + "; ".join(json.dumps(t) for t in tasks[:10])
        + (" ..." if len(tasks) > 10 else ""),
        *(
            f"#   camera {c} ({features[c]['dtype']} "
            f"{'x'.join(str(s) for s in features[c].get('shape', []))})"
            for c in cameras
        ),
        "#   slots: "
        + ", ".join(
            f"{role}={cam or '-'}" for role, cam in zip(SLOT_ROLES, key_map.cameras)
        )  # fmt: skip
        + (
            f" (unused: {', '.join(c for c in cameras if c not in key_map.cameras)})"
            if len(cameras) > len(key_map.cameras)
            else ""
        ),  # fmt: skip
        f"#   state {key_map.state} [{feature_dims(features, key_map.state)}], action "
        f"{key_map.action} [{feature_dims(features, key_map.action)}] (at most 32 each)",
    ]
    for what, key in (("state", key_map.state), ("action", key_map.action)):
        if feature_dims(features, key) > 32:
            lines.append(f'#   !! {what} is wider than 32: bind "{what}_key" to a narrower one')
    entry = {"name": name, "root": name, "type": spec.type, "cameras": list(key_map.cameras),
             "state_key": key_map.state, "action_key": key_map.action}  # fmt: skip
    return lines, entry


def gin_dict(entry: dict) -> str:
    """A dataset entry as a gin dict, one key per line."""
    body = "".join(f"\n    {json.dumps(k)}: {json.dumps(v)}," for k, v in entry.items())
    return "{" + body + "\n}"


def render(args: argparse.Namespace, out: Path) -> str:
    roots = [Path(d).expanduser().absolute() for d in args.datasets]
    names = [r.name for r in roots]
    repeated = sorted({n for n in names if names.count(n) > 1})
    if repeated:
        raise RecapError(f"DATASET: directories named {repeated} twice; each dataset's directory "
                         "name is its name, give distinct ones")  # fmt: skip
    for flag, listed in (("--eval", args.eval), ("--sft", args.sft)):
        unknown = sorted(set(listed) - set(names))
        if unknown:
            raise RecapError(f"{flag}: {unknown} not among the datasets {names}")
    if set(args.eval) >= set(names):
        raise RecapError(f"--eval: every dataset is held out ({names}); keep one for training")
    parent = Path(os.path.commonpath([str(r.parent) for r in roots]))
    blocks, entries, rates = [], {}, {}
    for root, name in zip(roots, names, strict=True):
        dataset = LocalDataset(root)
        kind = "sft" if name in args.sft or "is_success" not in dataset.features else "rollout"
        rel = os.path.relpath(root, parent)
        spec = DatasetSpec(name=name, root=root, type=kind)
        lines, entry = describe(name, dataset, spec)
        entry["root"] = rel
        blocks.append("\n".join(lines))
        entries[name] = entry
        rates[name] = dataset.fps
    fps = min(rates.values())
    frames = max(1, round(HORIZON_S * fps))
    rate_note = (f"{fps:g} fps" if len(set(rates.values())) == 1 else
                 f"the slowest rate, {fps:g} fps (rates: " +
                 ", ".join(f"{n} {r:g}" for n, r in rates.items()) + ")")  # fmt: skip
    name = args.name or out.stem
    train = [n for n in names if n not in args.eval]
    held = [n for n in names if n in args.eval]
    macro = {n: n.upper().replace("-", "_").replace(".", "_") for n in names}
    models = []
    for key, (flag, what) in MODELS.items():
        given = getattr(args, flag.lstrip("-").replace("-", "_"))
        value = json.dumps(str(Path(given).expanduser().absolute())) if given else "%gin.REQUIRED"
        models.append(f"# {what}\n{key} = {value}")
    me = json.dumps(str(out.absolute()))
    steps = ",\n".join(f'    "{s}": ["{f}", {me}]' for s, f in STEP_FILES.items())
    dataset_lines = "\n".join(f"{macro[n]} = {gin_dict(entries[n])}" for n in names)
    data_list = ", ".join(f"%{macro[n]}" for n in train)
    eval_list = ", ".join(f"%{macro[n]}" for n in held) if held else data_list
    eval_note = "" if held else "   # no --eval given: the training datasets (hold one out!)"
    return f"""# Experiment {name!r} of {len(names)} dataset(s), by recap-init. Plan it, then run:
#   recap-pipeline --gin_file {out} --dry_run
#   recap-pipeline --gin_file {out}
# A pipeline file: each step runs the shipped LIBERO experiment file (real sizes) and then this
# file, so every binding here wins. Rehearse at tiny sizes first: add
#   --gin_param 'all:include "rehearsal/tiny.gin"'
include "pipeline.gin"

pipeline.name = {json.dumps(name)}
pipeline.steps = {{
{steps},
}}
pipeline.ranks = {args.ranks}
pipeline.evaluate = False   # True: closed loop in evaluate_policy.env (reach task by default)

# ---- required: the models (bind here or with --gin_param 'all:NAME = "..."') ----
{chr(10).join(models)}
ADVANTAGES_TAG = ""   # bound by the pipeline (Step 3's tag)

# ---- the datasets, as their meta/info.json describes them ----
{chr(10).join(blocks)}
#
# Each entry may name "cameras" (slot order: base, left wrist, right wrist; None leaves a slot
# empty, or a dict by role), "state_key", "action_key", "type" ("sft": demonstrations,
# "rollout": needs an outcome column, "outcome_column"), "weight", "correction_column".
DATA = {json.dumps(str(parent))}   # roots below are relative to it
{dataset_lines}
DATASETS = [{data_list}]   # training data of the value model and the policy; Step 3 labels them
EVAL_DATASETS = [{eval_list}]{eval_note}
compute_returns.datasets = [{", ".join(f"%{macro[n]}" for n in names)}]

# ---- rates: {HORIZON_S:g} s at {rate_note} ----
# the n-step advantage's look-ahead in seconds (frames at each dataset's fps)
compute_advantages.lookahead_s = {HORIZON_S:g}
policy_data.action_horizon = {frames}     # the policy's action chunk, as the model's
pi05_policy.action_horizon = {frames}

# ---- the policy's normalization: this data's statistics, exported under this experiment ----
policy_data.norm_stats = "data"
policy_data.asset_id = {json.dumps(name)}
policy_data.state_in_prompt = False   # True: the state binned into the prompt (π0.5 discrete state)
"""


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out).expanduser()
    try:
        if out.exists() and not args.force:
            raise RecapError(f"{out}: exists; pass --force to overwrite it or choose another --out")
        text = render(args, out)
        write_atomic({out: lambda tmp: tmp.write_text(text)})
    except RecapError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    print(f"wrote {out}; plan it: recap-pipeline --gin_file {out} --dry_run")
    return 0


if __name__ == "__main__":
    sys.exit(main())

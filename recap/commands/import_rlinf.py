"""Import RLinf artifacts into recap's formats.

recap-import rlinf-value full_weights.pt --out DIR [--vision-config F] [--text-config F]
    [--truncate] [--keep-unused]
recap-import export-rlinf-value DIR --out full_weights.pt
recap-import rlinf-policy full_weights.pt --out DIR [--base DIR] [--variant NAME]
recap-import export-rlinf-policy DIR --out full_weights.pt
recap-import export-lerobot-policy DIR --out OUT --camera KEY [--camera KEY ...]
    --state-dim S --action-dim A

``rlinf-value`` maps every key of RLinf's value-model FSDP full state dict (``torch.save``,
or ``.safetensors``) onto recap's value model with the Gemma1-style critic expert
(``expert_style = "gemma1"``) and writes ``DIR/model.safetensors`` + ``DIR/config.json``
(``recap.models.value.load_value_model`` and Step 3's ``model_path`` read them). SigLIP's
pooling head and both ``lm_head`` tensors are dropped (with ``--keep-unused`` kept in
``DIR/rlinf_unused.safetensors``, so the export gives back the input bit for bit);
``--truncate`` also drops the Gemma3 layers the expert never reads. The SigLIP and Gemma3
configs default to siglip2-so400m-patch14-224 and gemma-3-270m (RLinf's); pass a model
directory or its config.json otherwise. The expert's sizes come from the tensors.

``rlinf-policy`` maps RLinf's CFG π0.5 ``full_weights.pt`` (openpi's ``PI0Pytorch.state_dict()``:
no prefix, both ``lm_head`` tensors, the text embedding tied to ``paligemma.lm_head``) onto
openpi's layout: ``DIR/model.safetensors`` keyed exactly as openpi's ``save_model`` writes it
(the tied embedding only as ``lm_head``; checked to equal it), plus ``config.json`` /
``recap_pi05.json``; every source key is used or dropped (the tied duplicate), every target key
filled with its shape, else one line naming the first key. The sizes come from ``--base`` (the
π0.5 checkpoint RLinf fine-tuned from: a recap / openpi / LeRobot directory, or an openpi
training checkpoint with ``--variant``), whose ``assets/**/norm_stats.json`` is copied along;
without it, the real sizes of ``--variant`` (default ``pi05_libero``). ``load_pi05(DIR)``,
``pi05_policy.checkpoint`` and evaluation read the result. ``export-rlinf-policy`` writes an
openpi-layout directory's weights back as RLinf's full state dict (the tied embedding
restored), bit for bit what ``rlinf-policy`` read; a recap training run directory (its
``model.safetensors`` holds ``Pi05Policy`` keys) exports too, the expert's unused ``lm_head``
as zeros. ``export-lerobot-policy`` writes a π0.5 directory that LeRobot 0.6.1's
``PI05Policy.from_pretrained`` loads (``recap.interop.lerobot``: LeRobot keys and a ``config.json``
with the camera / state / action features); LeRobot-saved π0.5 directories load in recap as they
are (``load_pi05``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

UNUSED_FILE = "rlinf_unused.safetensors"


def _config(path: str | None, default: dict, vision: bool) -> dict:
    if path is None:
        return dict(default)
    p = Path(path)
    data = json.loads((p / "config.json" if p.is_dir() else p).read_text())
    if vision and "vision_config" in data:  # a SiglipModel directory
        data = data["vision_config"]
    return {k: v for k, v in data.items() if k not in ("architectures", "transformers_version")}


def load_state(path: str | Path) -> dict:
    """RLinf's checkpoint: ``torch.save`` dict or ``.safetensors`` (one-line error otherwise)."""
    import torch
    from safetensors.torch import load_file

    from recap.errors import RecapError

    path = Path(path)
    if not path.is_file():
        raise RecapError(
            f"{path}: not found; pass RLinf's .../actor/model_state_dict/full_weights.pt"
        )
    if path.suffix == ".safetensors":
        return load_file(str(path))
    state = torch.load(path, map_location="cpu", weights_only=True)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise RecapError(f"{path}: not a state dict of tensors (RLinf's full_weights.pt is one)")
    return state


def import_value(
    source, out, vision=None, text=None, truncate=False, keep_unused=False, return_range=None,
    resize="bilinear", value_range=None,
) -> Path:  # fmt: skip
    """Write ``out/model.safetensors`` + ``out/config.json`` from RLinf's value checkpoint, and
    its processor (``out/processor.json``: the image ``resize`` rule, RLinf's ``bilinear``
    without antialiasing by default, and with ``return_range`` (RLinf's ``data.return_min`` /
    ``return_max`` the model was trained with) the range Step 3 reads the values back with;
    ``out/return_range.json`` too, for older readers). The value support ``v_min`` / ``v_max``
    comes from the source run's config when it records one (``rlinf.value_range``), else
    ``value_range``, else ``rlinf.DEFAULT_VALUE_RANGE``; one line says which, and which
    vision/text configs were used."""
    import dataclasses

    import torch

    from recap.errors import RecapError
    from recap.interop import rlinf
    from recap.models.value import (
        CONFIG_FILE,
        GEMMA3_270M,
        SIGLIP_SO400M_224,
        WEIGHTS_FILE,
        build_value_model,
    )  # fmt: skip
    from recap.weights import save_safetensors

    state = load_state(source)
    config0 = rlinf.infer_value_config(
        rlinf.split_value_state(state)[0], _config(vision, SIGLIP_SO400M_224, True),
        _config(text, GEMMA3_270M, False), truncate,
    )  # fmt: skip
    recorded = rlinf.value_range(source)
    if recorded is not None:
        (low, high), where = recorded[0], str(recorded[1])
        if value_range is not None and tuple(map(float, value_range)) != (low, high):
            raise RecapError(f"{where}: records v_min/v_max {low:g} {high:g} but --value-range "
                             f"gives {value_range[0]:g} {value_range[1]:g}; drop the flag or "
                             "fix the config")  # fmt: skip
    elif value_range is not None:
        (low, high), where = tuple(map(float, value_range)), "--value-range"
    else:
        (low, high), where = rlinf.DEFAULT_VALUE_RANGE, "the default (no --value-range)"
    if not low < high:
        raise RecapError(f"{where}: v_min {low:g} must be below v_max {high:g}")
    config0 = dataclasses.replace(config0, v_min=low, v_max=high)
    configs = ", ".join(
        f"{what} {path or f'{default} (default)'}"
        for what, path, default in (
            ("vision", vision, "siglip2-so400m-patch14-224"),
            ("text", text, "gemma-3-270m"),
        )
    )
    print(f"rlinf-value: value range [{low:g}, {high:g}] from {where}; configs: {configs}")
    recap, unused = rlinf.split_value_state(state, config0.expert_depth if truncate else None)
    with torch.device("meta"):
        target = build_value_model(config0).state_dict()
    rlinf.check_value_state(recap, target)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: recap[k].contiguous() for k in target}
    save_safetensors(tensors, out / WEIGHTS_FILE, {"format": "pt", "source": "rlinf"})
    (out / CONFIG_FILE).write_text(json.dumps(dataclasses.asdict(config0), indent=2))
    if keep_unused and unused:
        save_safetensors({k: v.contiguous() for k, v in unused.items()}, out / UNUSED_FILE)
    if return_range is not None:
        from recap.core.normalize import ReturnRange
        from recap.data.datasets import write_return_range

        write_return_range(out, ReturnRange(*map(float, return_range)), ["rlinf"])
    from recap.processing.value import ValueProcessor

    size = int(config0.vision.get("image_size", 224))
    rng = None if return_range is None else tuple(map(float, return_range))
    ValueProcessor("", rng, size, resize).for_model(config0).save(out)
    return out


def export_value(directory, out) -> Path:
    """RLinf's full state dict (``torch.save``) from a directory ``import_value`` wrote (or any
    gemma1-style ``save_pretrained`` directory); ``rlinf_unused.safetensors`` is put back."""
    import torch
    from safetensors.torch import load_file

    from recap.interop import rlinf
    from recap.models.value import WEIGHTS_FILE

    directory = Path(directory)
    extra = directory / UNUSED_FILE
    state = rlinf.join_value_state(
        load_file(str(directory / WEIGHTS_FILE)), load_file(str(extra)) if extra.is_file() else {}
    )
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, out)
    return Path(out)


def sizes_config(path: str | Path):
    """The ``Pi05Config`` of a sizes file: a ``recap_pi05.json`` (the fields recap writes beside
    every π0.5 it saves), or a directory holding one; unknown fields are a one-line error."""
    import dataclasses

    from recap.errors import RecapError
    from recap.models.checkpoints import RECAP_CONFIG_FILE
    from recap.models.pi05 import Pi05Config

    path = Path(path)
    file = path / RECAP_CONFIG_FILE if path.is_dir() else path
    try:
        fields = json.loads(file.read_text())
    except (OSError, ValueError) as exc:
        raise RecapError(f"{file}: not a readable JSON sizes file ({exc}); pass a "
                         f"{RECAP_CONFIG_FILE}") from exc  # fmt: skip
    known = {f.name for f in dataclasses.fields(Pi05Config)}
    unknown = sorted(set(fields) - known) if isinstance(fields, dict) else ["(not an object)"]
    if unknown:
        raise RecapError(f"{file}: unknown fields {unknown}; the fields are {sorted(known)}")
    return Pi05Config(**fields)


def import_policy(source, out, base=None, variant="pi05_libero", sizes=None) -> Path:
    """Write ``out/model.safetensors`` (openpi layout), ``config.json``, ``recap_pi05.json`` and
    the base checkpoint's norm stats from RLinf's CFG policy checkpoint. Sizes: ``sizes`` (a
    ``recap_pi05.json``), else ``base``'s, else ``variant``'s real ones."""
    import shutil

    import torch

    from recap.errors import RecapError
    from recap.interop import rlinf
    from recap.models import checkpoints as ckpt
    from recap.models.pi05 import Pi05Config, build_pi05

    state = load_state(source)
    if sizes is not None:
        config = sizes_config(sizes)
    elif base is not None:
        config = ckpt.read_config(base, variant)
    else:
        config = Pi05Config(**ckpt.variant_fields(variant))
    with torch.device("meta"):
        target = ckpt.file_state(build_pi05(config), ckpt.OPENPI)
    try:
        tensors, _ = rlinf.split_policy_state(state, target)
    except RecapError as exc:
        raise RecapError(f"{source}: {exc.message}") from exc
    stats = ckpt.find_norm_stats(base) if base is not None else None
    out = Path(out)
    ckpt.write_pi05_files(out, tensors, config, ckpt.OPENPI, {"source": "rlinf"})
    if stats is not None and stats.name == ckpt.NORM_STATS_FILE:
        dest = out / stats.relative_to(Path(base))
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(stats, dest)
    return out


def export_policy(directory, out) -> Path:
    """RLinf's CFG policy full state dict (``torch.save``) from a π0.5 directory: openpi's
    layout (``import_policy``'s output, ``save_pi05``, openpi checkpoints) or a recap training
    run directory (``rlinf.join_policy_state``)."""
    import torch
    from safetensors.torch import load_file

    from recap.errors import RecapError
    from recap.interop import rlinf
    from recap.models.checkpoints import WEIGHTS_FILE

    weights = Path(directory) / WEIGHTS_FILE
    if not weights.is_file():
        raise RecapError(f"{weights}: not found; pass a π0.5 directory holding model.safetensors")
    state = rlinf.join_policy_state(load_file(str(weights)))
    Path(out).parent.mkdir(parents=True, exist_ok=True)
    torch.save(state, out)
    return Path(out)


def build_parser() -> argparse.ArgumentParser:
    """recap-import's parser: every argument says what it is, its default and its choices."""
    from recap.commands import HelpFormatter
    from recap.interop.rlinf import DEFAULT_VALUE_RANGE
    from recap.models.checkpoints import NAMED_VARIANTS

    fmt = HelpFormatter
    parser = argparse.ArgumentParser(prog="recap-import", description=__doc__.splitlines()[0],
                                     formatter_class=fmt)  # fmt: skip
    sub = parser.add_subparsers(dest="what", required=True, metavar="COMMAND",
                                help="what to import or export (COMMAND --help for its "
                                "arguments)")  # fmt: skip
    imp = sub.add_parser("rlinf-value", formatter_class=fmt,
                         help="RLinf value-model full_weights.pt -> recap value directory",
                         description="RLinf's value-model FSDP full state dict (torch.save or "
                         ".safetensors) -> DIR/model.safetensors, config.json, processor.json "
                         "(recap's value model, Gemma1-style critic expert).")  # fmt: skip
    imp.add_argument("source", help="RLinf's .../actor/model_state_dict/full_weights.pt "
                     "(or a .safetensors of the same keys)")  # fmt: skip
    imp.add_argument("--out", required=True, help="directory to write (created)")
    imp.add_argument("--vision-config", default=None, metavar="PATH",
                     help="the SigLIP config: a model directory or its config.json; default: "
                     "siglip2-so400m-patch14-224's (RLinf's), used when omitted")  # fmt: skip
    imp.add_argument("--text-config", default=None, metavar="PATH",
                     help="the Gemma3 config: a model directory or its config.json; default: "
                     "gemma-3-270m's (RLinf's), used when omitted")  # fmt: skip
    imp.add_argument("--truncate", action="store_true",
                     help="drop the Gemma3 layers the critic expert never reads (deeper than "
                     "the expert)")  # fmt: skip
    imp.add_argument("--keep-unused", action="store_true",
                     help=f"keep the tensors recap does not use (SigLIP's pooling head, both "
                     f"lm_heads) in DIR/{UNUSED_FILE}, so the export gives the input back bit "
                     "for bit")  # fmt: skip
    imp.add_argument("--return-range", nargs=2, type=float, metavar=("MIN", "MAX"), default=None,
                     help="RLinf's data.return_min/return_max the value model was trained with "
                     "(recorded for Step 3); default: none recorded, Step 3 then uses its "
                     "datasets' range")  # fmt: skip
    imp.add_argument("--value-range", nargs=2, type=float, metavar=("V_MIN", "V_MAX"),
                     default=None,
                     help="the value support v_min v_max of the model's bins, when the source "
                     "run's config (config.yaml, .hydra/config.yaml or config.json beside or "
                     "above the checkpoint) does not record it; default: "
                     f"{DEFAULT_VALUE_RANGE[0]:g} {DEFAULT_VALUE_RANGE[1]:g}")  # fmt: skip
    imp.add_argument("--resize", choices=("bilinear", "antialias"), default="bilinear",
                     help="how the model's images were resized in training: bilinear without "
                     "antialiasing (RLinf's value preprocessing) or antialias (a value model "
                     "recap trained and exported)")  # fmt: skip
    exp = sub.add_parser(
        "export-rlinf-value",
        formatter_class=fmt,
        help="recap gemma1 value directory -> RLinf full_weights.pt",
    )
    exp.add_argument("directory", help="a directory rlinf-value wrote (or any gemma1-style "
                     "value model directory)")  # fmt: skip
    exp.add_argument("--out", required=True, help="the .pt file to write (torch.save)")
    pol = sub.add_parser("rlinf-policy", formatter_class=fmt,
                         help="RLinf CFG π0.5 full_weights.pt -> openpi-layout directory",
                         description="RLinf's CFG π0.5 full state dict -> DIR/model.safetensors "
                         "(openpi's layout), config.json, recap_pi05.json; sizes from --sizes, "
                         "else --base, else --variant.")  # fmt: skip
    pol.add_argument("source", help="RLinf's .../actor/model_state_dict/full_weights.pt")
    pol.add_argument("--out", required=True, help="directory to write (created)")
    pol.add_argument("--base", default=None, metavar="DIR",
                     help="the π0.5 checkpoint RLinf fine-tuned from (recap / openpi / LeRobot "
                     "directory): its sizes and assets/**/norm_stats.json; default: none, the "
                     "sizes of --sizes or --variant")  # fmt: skip
    pol.add_argument("--sizes", default=None, metavar="FILE",
                     help="a recap_pi05.json (or a directory holding one) with the model's sizes "
                     "(Pi05Config fields: vision, text, expert, action_horizon, action_dim, ...); "
                     "default: none")  # fmt: skip
    pol.add_argument("--variant", default="pi05_libero", choices=sorted(NAMED_VARIANTS),
                     help="openpi's named config whose real sizes are used without --sizes, or "
                     "with a --base that is an openpi training checkpoint")  # fmt: skip
    pexp = sub.add_parser(
        "export-rlinf-policy",
        formatter_class=fmt,
        help="openpi-layout π0.5 directory -> RLinf full_weights.pt",
    )
    pexp.add_argument("directory", help="a π0.5 directory holding model.safetensors (openpi's "
                      "layout, rlinf-policy's output, or a recap training run)")  # fmt: skip
    pexp.add_argument("--out", required=True, help="the .pt file to write (torch.save)")
    lexp = sub.add_parser(
        "export-lerobot-policy",
        formatter_class=fmt,
        help="π0.5 directory -> LeRobot PI05Policy directory",
    )
    lexp.add_argument("directory", help="a π0.5 directory (load_pi05 reads it)")
    lexp.add_argument("--out", required=True, help="directory to write")
    lexp.add_argument("--camera", action="append", default=[], required=True,
                      help="an image feature, e.g. observation.images.image (repeat, in slot "
                      "order: base, left wrist, right wrist)")  # fmt: skip
    lexp.add_argument(
        "--state-dim",
        type=int,
        required=True,
        help="the robot's state size (observation.state shape)",
    )
    lexp.add_argument(
        "--action-dim", type=int, required=True, help="the robot's action size (action shape)"
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from recap.errors import RecapError

    args = build_parser().parse_args(argv)
    try:
        if args.what == "rlinf-value":
            path = import_value(args.source, args.out, args.vision_config, args.text_config,
                                args.truncate, args.keep_unused, args.return_range,
                                args.resize, args.value_range)  # fmt: skip
        elif args.what == "rlinf-policy":
            path = import_policy(args.source, args.out, args.base, args.variant, args.sizes)
        elif args.what == "export-rlinf-policy":
            path = export_policy(args.directory, args.out)
        elif args.what == "export-lerobot-policy":
            from recap.interop.lerobot import export_lerobot_policy

            path = export_lerobot_policy(args.directory, args.out, args.camera, args.state_dim,
                                         args.action_dim)  # fmt: skip
        else:
            path = export_value(args.directory, args.out)
    except (RecapError, OSError, ValueError) as exc:
        print(f"recap-import: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Import RLinf artifacts into recap's formats.

recap-import rlinf-value full_weights.pt --out DIR [--vision-config F] [--text-config F]
    [--truncate] [--keep-unused]
recap-import export-rlinf-value DIR --out full_weights.pt

``rlinf-value`` maps every key of RLinf's value-model FSDP full state dict (``torch.save``,
or ``.safetensors``) onto recap's value model with the Gemma1-style critic expert
(``expert_style = "gemma1"``) and writes ``DIR/model.safetensors`` + ``DIR/config.json``
(``recap.models.value.load_value_model`` and Step 3's ``model_path`` read them). SigLIP's
pooling head and both ``lm_head`` tensors are dropped (with ``--keep-unused`` kept in
``DIR/rlinf_unused.safetensors``, so the export gives back the input bit for bit);
``--truncate`` also drops the Gemma3 layers the expert never reads. The SigLIP and Gemma3
configs default to siglip2-so400m-patch14-224 and gemma-3-270m (RLinf's); pass a model
directory or its config.json otherwise. The expert's sizes come from the tensors.
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


def import_value(source, out, vision=None, text=None, truncate=False, keep_unused=False) -> Path:
    """Write ``out/model.safetensors`` + ``out/config.json`` from RLinf's value checkpoint."""
    import dataclasses

    import torch
    from safetensors.torch import save_file

    from recap.interop import rlinf
    from recap.models.value import (
        CONFIG_FILE,
        GEMMA3_270M,
        SIGLIP_SO400M_224,
        WEIGHTS_FILE,
        build_value_model,
    )  # fmt: skip

    state = load_state(source)
    config0 = rlinf.infer_value_config(
        rlinf.split_value_state(state)[0], _config(vision, SIGLIP_SO400M_224, True),
        _config(text, GEMMA3_270M, False), truncate,
    )  # fmt: skip
    recap, unused = rlinf.split_value_state(state, config0.expert_depth if truncate else None)
    with torch.device("meta"):
        target = build_value_model(config0).state_dict()
    rlinf.check_value_state(recap, target)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: recap[k].contiguous() for k in target}
    save_file(tensors, str(out / WEIGHTS_FILE), metadata={"format": "pt", "source": "rlinf"})
    (out / CONFIG_FILE).write_text(json.dumps(dataclasses.asdict(config0), indent=2))
    if keep_unused and unused:
        save_file({k: v.contiguous() for k, v in unused.items()}, str(out / UNUSED_FILE))
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


def main(argv: Sequence[str] | None = None) -> int:
    from recap.errors import RecapError

    parser = argparse.ArgumentParser(prog="recap-import", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="what", required=True)
    imp = sub.add_parser("rlinf-value", help="RLinf value-model full_weights.pt -> recap dir")
    imp.add_argument("source")
    imp.add_argument("--out", required=True)
    imp.add_argument("--vision-config", default=None)
    imp.add_argument("--text-config", default=None)
    imp.add_argument("--truncate", action="store_true")
    imp.add_argument("--keep-unused", action="store_true")
    exp = sub.add_parser("export-rlinf-value", help="recap gemma1 value dir -> RLinf .pt")
    exp.add_argument("directory")
    exp.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    try:
        if args.what == "rlinf-value":
            path = import_value(args.source, args.out, args.vision_config, args.text_config,
                                args.truncate, args.keep_unused)  # fmt: skip
        else:
            path = export_value(args.directory, args.out)
    except (RecapError, OSError, ValueError) as exc:
        print(f"recap-import: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

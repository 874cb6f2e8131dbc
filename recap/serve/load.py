"""Load an exported policy for serving: ``recap.loading.load_policy`` (weights + processor).

``--policy DIR`` is any layout ``load_policy`` reads: a recap run or export (its
``processor.json`` and ``recap_pi05.json`` say everything; no gin file is needed), a LeRobot or
openpi checkpoint (their own files: statistics, and for LeRobot its normalization formula,
``num_inference_steps`` and prompt style), or an older recap run without a processor (pass the
gin files it was trained with, ``--gin_file``, once). A policy without normalization statistics is
refused, since unnormalized actions would move the robot by the wrong amounts. Tokenizer:
``--tokenizer``, else the processor's, else one inside the directory
(``paligemma_tokenizer.model``, ``tokenizer.model`` or Hugging Face tokenizer files).

Order: ``preflight`` checks the directory, the weights file, the processor file, the statistics
and the tokenizer's path with the standard library only (no torch import: a wrong path is
reported at once); ``load_served`` then validates the processor and loads the tokenizer, and
only then reads the weights. An openpi or LeRobot checkpoint whose ``config.json`` names the
real variants but whose weights are of other sizes (a tiny LeRobot π0.5, ``python -m
recap.standins``' ``pi05_base``) is served with the sizes of its tensors' shapes, read from the
safetensors header (``recap.models.checkpoints.read_config``, ``recap.models.pi05_sizes``: heads
by π0.5's convention, as no tensor shows them); sizes a gin file binds
(``--gin_file rehearsal/tiny.gin``: ``pi05_policy.*``, as training reads them) replace them, and
widths that are not the weights' are one line before any weight is read.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from recap.errors import RecapError
from recap.processing.files import DTYPE_NAMES, own_tokenizer

WEIGHTS = "model.safetensors"
PROCESSOR = "processor.json"
RECAP_CONFIG = "recap_pi05.json"
TIED_KEY = "recap_tied"  # recap.engine.inference.TIED_KEY: the trainer's exports carry it
LEROBOT_NORMALIZER = "policy_preprocessor_step_*_normalizer_processor.safetensors"
SIZE_FIELDS = ("vision", "text", "expert", "action_horizon", "action_dim")
MAX_HEADER = 100 * 2**20


def _header(weights: Path) -> dict:
    """The JSON header of a safetensors file (names, shapes, metadata), read without torch."""
    try:
        with open(weights, "rb") as handle:
            (size,) = struct.unpack("<Q", handle.read(8))
            if size > MAX_HEADER:
                raise ValueError(f"header of {size} bytes")
            return json.loads(handle.read(size))
    except (OSError, ValueError, struct.error) as exc:
        raise RecapError(f"--policy: {weights} is not a safetensors file ({exc}); re-export "
                         "the policy") from None  # fmt: skip


def preflight(
    policy_dir: str | Path, *, tokenizer: str | None = None, dtype: str = "float32",
    asset_id: str | None = None, gin: bool = False,
) -> Path | None:  # fmt: skip
    """The checks that need no torch, one line each (``RecapError``): the weights file, the
    dtype, the processor file and its tokenizer, else (openpi / LeRobot) the statistics and a
    tokenizer. Returns the tokenizer path it found (None: an older recap run, whose tokenizer
    comes from its gin files, ``gin``)."""
    path = Path(policy_dir)
    weights = path / WEIGHTS
    if not weights.is_file():
        raise RecapError(f"--policy: {weights} not found; point it at an exported policy "
                         "directory (recap run, openpi or LeRobot layout)")  # fmt: skip
    if dtype not in DTYPE_NAMES:
        raise RecapError(f"--dtype: {dtype!r} is not one of {list(DTYPE_NAMES)}")
    if tokenizer is not None and not Path(tokenizer).exists():
        raise RecapError(f"--tokenizer: {tokenizer} not found; pass PaliGemma's "
                         "paligemma_tokenizer.model or a directory of tokenizer files")  # fmt: skip
    header = _header(weights)
    processor = path / PROCESSOR
    if processor.is_file():
        try:
            raw = json.loads(processor.read_text())
        except ValueError as exc:
            raise RecapError(f"{processor}: not valid JSON ({exc}); re-export the model") from None
        if tokenizer is not None:
            return Path(tokenizer)
        named = raw.get("tokenizer") if isinstance(raw, dict) else None
        if not isinstance(named, str) or not named:
            raise RecapError(f"{processor}: field 'tokenizer' missing; re-export the model or "
                             "pass --tokenizer PATH")  # fmt: skip
        found = Path(named) if Path(named).is_absolute() else path / named
        if not found.exists():
            raise RecapError(f"{processor}: tokenizer {found} not found; pass --tokenizer PATH "
                             "(the policy's own tokenizer)")  # fmt: skip
        return found
    if TIED_KEY in (header.get("__metadata__") or {}):  # an older recap run: its gin says it
        if tokenizer is None and not gin:
            raise RecapError(f"--policy: {path} is a recap training run without processor.json; "
                             "pass its gin files (--gin_file, the ones it was trained with) so "
                             "the model's sizes and inputs are known")  # fmt: skip
        return Path(tokenizer) if tokenizer is not None else None
    if asset_id is not None:
        stats = [path / "assets" / asset_id / "norm_stats.json"]
        stats = [s for s in stats if s.is_file()]
    else:
        stats = sorted((path / "assets").glob("**/norm_stats.json"))
    if not stats and not sorted(path.glob(LEROBOT_NORMALIZER)):
        raise RecapError(f"--policy: {path} has no assets/<asset_id>/norm_stats.json or LeRobot "
                         "normalizer file; a policy runs with the statistics it was trained "
                         "with")  # fmt: skip
    found = Path(tokenizer) if tokenizer is not None else own_tokenizer(path)
    if found is None:
        raise RecapError(f"--tokenizer: {path} carries no tokenizer; pass --tokenizer PATH "
                         "(PaliGemma's paligemma_tokenizer.model for π0.5)")  # fmt: skip
    return found


def _shape(header: dict, suffix: str) -> list[int] | None:
    for name, entry in header.items():
        if name.endswith(suffix) and isinstance(entry, dict):
            return list(entry.get("shape", []))
    return None


def check_sizes(path: Path, config) -> None:
    """One line when the weights' widths are not those of ``config`` (the gin-bound sizes; read
    from the header only)."""
    header = _header(path / WEIGHTS)
    found = {
        "vision hidden_size": (_shape(header, "embeddings.patch_embedding.weight") or [None])[0],
        "text hidden_size": (_shape(header, "paligemma.lm_head.weight") or [None, None])[1],
        "expert hidden_size": (_shape(header, "action_in_proj.weight") or [None])[0],
    }
    expected = {"vision hidden_size": config.vision.get("hidden_size"),
                "text hidden_size": config.text.get("hidden_size"),
                "expert hidden_size": config.expert.get("hidden_size")}  # fmt: skip
    for name, value in found.items():
        if value is not None and expected[name] is not None and value != expected[name]:
            raise RecapError(f"--policy: {path / WEIGHTS} has {name} {value} but its config "
                             f"says {expected[name]}; the pi05_policy.* sizes bound by "
                             "--gin_file do not match them (leave them unbound to read the "
                             "sizes from the weights)")  # fmt: skip


def _bound_sizes() -> dict:
    """The ``pi05_policy`` size fields the parsed gin files bind (empty when none)."""
    from recap.configurable import bound

    fields = {name: bound(f"pi05_policy.{name}") for name in SIZE_FIELDS}
    return {k: (dict(v) if isinstance(v, dict) else v) for k, v in fields.items() if v is not None}


def load_served(
    policy_dir: str | Path,
    *,
    tokenizer: str | None = None,
    gin_files: tuple[str, ...] = (),
    gin_params: tuple[str, ...] = (),
    asset_id: str | None = None,
    prompt_style: str | None = None,
    state_in_prompt: bool | None = None,
    label_position: str | None = None,
    conditioning: str | None = None,
    dtype: str = "float32",
    device=None,
    **settings,
):
    """A ``ServedPolicy`` of ``policy_dir``; ``settings`` go to ``ServedPolicy`` (beta,
    guidance, num_steps, spec, seed). The prompt settings given here replace the processor's
    (for a checkpoint whose files do not say them)."""
    path = Path(policy_dir)
    gin = bool(gin_files or gin_params)
    found_tokenizer = preflight(path, tokenizer=tokenizer, dtype=dtype, asset_id=asset_id, gin=gin)
    from recap import loading
    from recap.processing.pi05 import read_policy_processor
    from recap.serve.policy import ServedPolicy, ServeSpec

    sizes = {}
    if gin:  # an older recap run (its processor rebuilt from its bindings), or stand-in sizes
        import recap.data.policy_data  # noqa: F401  (declares policy_data)
        import recap.models.pi05  # noqa: F401  (declares pi05_policy)
        from recap.cli import parse_gin

        parse_gin(list(gin_files), list(gin_params))
        sizes = _bound_sizes()
    overrides = {"prompt_style": prompt_style, "state_in_prompt": state_in_prompt,
                 "label_position": label_position, "conditioning": conditioning}  # fmt: skip
    overrides = {k: v for k, v in overrides.items() if v is not None}
    # the processor and the tokenizer before any weight is read
    saved = read_policy_processor(path)
    if saved is not None and tokenizer is not None:
        saved = saved.replace(tokenizer=str(tokenizer))
    if saved is not None:
        saved.load_tokenizer()  # vocabulary and BOS checked against the processor
    elif found_tokenizer is not None:
        from recap.processing.transforms import load_tokenizer

        load_tokenizer(found_tokenizer)  # readable; checked against the model's vocabulary below
    foreign = saved is None and TIED_KEY not in (
        _header(path / WEIGHTS).get("__metadata__") or {})  # fmt: skip
    if sizes and foreign and not (path / RECAP_CONFIG).is_file():
        from recap.models.checkpoints import read_config

        check_sizes(path, read_config(path, **sizes))
    # an openpi / LeRobot directory takes the gin-bound sizes (stand-in checkpoints)
    sizes = sizes if foreign and not (path / RECAP_CONFIG).is_file() else None
    model, processor = loading.load_policy(path, tokenizer=tokenizer, asset_id=asset_id,
                                           dtype=dtype, sizes=sizes, **overrides)  # fmt: skip
    if saved is not None and str(processor.tokenizer) == str(saved.tokenizer):
        processor.use_tokenizer(saved.load_tokenizer())  # loaded once, above
    if device is None:
        from recap.engine import accelerator

        device = accelerator.device()
    spec = settings.pop("spec", None) or ServeSpec()
    spec.max_tokens = min(spec.max_tokens, processor.max_length)  # it trained on no longer ones
    from recap.processing.norm_stats import find_norm_stats
    from recap.processing.pi05 import PROCESSOR_FILE

    own = path / PROCESSOR_FILE
    stats = own if own.is_file() else find_norm_stats(path, asset_id) or find_norm_stats(
        path, "recap")  # fmt: skip
    info = {
        "server": "recap-serve",
        "checkpoint": str(path.resolve()),
        "processor": str(own.resolve()) if own.is_file() else None,
        "norm_stats": str(Path(stats).resolve()) if stats is not None else None,
        "dtype": dtype,
        "tokenizer": str(processor.tokenizer),
    }
    return ServedPolicy(model, processor, spec=spec, device=device, info=info, **settings)


def describe(policy) -> str:
    """One log line: what is served, from where, on which device."""
    meta = policy.metadata()
    return (
        f"serving {meta['checkpoint']} on {meta['device']} ({meta['dtype']}): beta "
        f"{meta['beta']:g}, guidance {meta['guidance']}, {meta['normalization']} normalization, "
        f"{meta['num_steps']} steps, actions [{meta['action_horizon']}, {meta['action_dim']}]"
    )

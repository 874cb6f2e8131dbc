"""Load an exported policy for serving: weights, config, normalization statistics, tokenizer.

Layouts (``--policy DIR``):

- openpi / LeRobot / ``save_pi05`` directories (``config.json`` or ``recap_pi05.json`` beside
  ``model.safetensors``) and openpi training checkpoints (``<step>/``): ``load_pi05``.
- a recap training run directory (the trainer's ``model.safetensors`` export) with the run's gin
  files (``--gin_file demo/policy.gin``): the model is ``pi05_policy()`` of those bindings, and
  the prompt settings and tokenizer default to the run's ``policy_data`` bindings.

Statistics: the directory's own (openpi ``assets/<asset_id>/norm_stats.json`` or LeRobot's
normalizer file, ``checkpoints.find_norm_stats``); a policy without them is refused, since
unnormalized actions would move the robot by the wrong amounts. Tokenizer: ``--tokenizer``, else
the run's ``policy_data.tokenizer_path``, else a tokenizer inside the directory
(``paligemma_tokenizer.model``, ``tokenizer.model`` or Hugging Face tokenizer files).
"""

from __future__ import annotations

from pathlib import Path

import torch

from recap.errors import RecapError

TOKENIZER_FILES = ("paligemma_tokenizer.model", "tokenizer.model")
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _is_recap_export(weights: Path) -> bool:
    """True for a ``model.safetensors`` the trainer exported (its metadata names tied keys)."""
    from safetensors import safe_open

    from recap.engine.inference import TIED_KEY

    with safe_open(str(weights), framework="pt") as handle:
        return TIED_KEY in (handle.metadata() or {})


def _own_tokenizer(directory: Path) -> Path | None:
    for name in TOKENIZER_FILES:
        if (directory / name).is_file():
            return directory / name
    if any((directory / name).is_file() for name in HF_TOKENIZER_FILES):
        return directory
    return None


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
    device: torch.device | str | None = None,
    **settings,
):
    """A ``ServedPolicy`` of ``policy_dir``; ``settings`` go to ``ServedPolicy`` (beta,
    guidance, num_steps, spec, seed). Unset prompt settings come from the run's gin bindings,
    else openpi's defaults (``openpi`` style, state in the prompt, ``paper`` conditioning)."""
    from recap.data.transforms import load_tokenizer
    from recap.models.checkpoints import find_norm_stats, load_pi05, read_norm_stats
    from recap.serve.policy import ServedPolicy, ServeSpec

    path = Path(policy_dir)
    weights = path / "model.safetensors"
    if not weights.is_file():
        raise RecapError(
            f"--policy: {weights} not found; point it at an exported policy "
            "directory (recap run, openpi or LeRobot layout)"
        )
    if dtype not in DTYPES:
        raise RecapError(f"--dtype: {dtype!r} is not one of {list(DTYPES)}")
    bound: dict[str, object] = {}
    if gin_files or gin_params:
        import recap.data.policy_data  # noqa: F401  (registers policy_data with gin)
        from recap.cli import parse_gin
        from recap.config_check import bound as gin_bound
        from recap.models.pi05 import pi05_policy, set_precision

        parse_gin(list(gin_files), list(gin_params))
        for name in (
            "tokenizer_path",
            "prompt_style",
            "state_in_prompt",
            "label_position",
            "conditioning",
            "asset_id",
            "max_length",
        ):
            bound[name] = gin_bound(f"policy_data.{name}")
        if _is_recap_export(weights):
            from recap.engine.inference import load_exported

            model = pi05_policy()
            load_exported(model, weights)
            model = set_precision(model, DTYPES[dtype])
        else:
            model = load_pi05(path, dtype=DTYPES[dtype])
    else:
        if _is_recap_export(weights) and not (path / "recap_pi05.json").is_file():
            raise RecapError(
                f"--policy: {path} is a recap training run; pass its gin files "
                "(--gin_file, the ones it was trained with) so the model's sizes "
                "are known"
            )
        model = load_pi05(path, dtype=DTYPES[dtype])
    asset_id = asset_id or bound.get("asset_id")
    found = find_norm_stats(path, asset_id)
    if found is None:
        from recap.data.policy_data import DEFAULT_ASSET_ID

        found = find_norm_stats(path, DEFAULT_ASSET_ID)
    if found is None:
        raise RecapError(
            f"--policy: {path} has no assets/<asset_id>/norm_stats.json or LeRobot "
            "normalizer file; a policy is served with the statistics it was "
            "trained with"
        )
    stats = read_norm_stats(found)
    tokenizer_path = tokenizer or bound.get("tokenizer_path") or _own_tokenizer(path)
    if tokenizer_path is None:
        raise RecapError(
            f"--tokenizer: {path} carries no tokenizer; pass --tokenizer PATH "
            "(PaliGemma's paligemma_tokenizer.model for π0.5)"
        )
    if device is None:
        from recap.engine import accelerator

        device = accelerator.device()

    def pick(value, name, default):
        if value is not None:
            return value
        return bound[name] if bound.get(name) is not None else default

    spec = settings.pop("spec", None) or ServeSpec()
    if bound.get("max_length") is not None:  # the run trained on prompts of at most this
        spec.max_tokens = min(spec.max_tokens, int(bound["max_length"]))
    info = {
        "server": "recap-serve",
        "checkpoint": str(path.resolve()),
        "norm_stats": str(Path(found).resolve()),
        "dtype": dtype,
        "tokenizer": str(tokenizer_path),
    }
    return ServedPolicy(
        model,
        load_tokenizer(tokenizer_path),
        stats,
        conditioning=pick(conditioning, "conditioning", "paper"),
        prompt_style=pick(prompt_style, "prompt_style", "openpi"),
        state_in_prompt=bool(pick(state_in_prompt, "state_in_prompt", True)),
        label_position=pick(label_position, "label_position", "task"),
        spec=spec,
        device=device,
        info=info,
        **settings,
    )


def describe(policy) -> str:
    """One log line: what is served, from where, on which device."""
    meta = policy.metadata()
    return (
        f"serving {meta['checkpoint']} on {meta['device']} ({meta['dtype']}): beta "
        f"{meta['beta']:g}, guidance {meta['guidance']}, norm stats {meta['norm_stats']}, "
        f"actions [{meta['action_horizon']}, {meta['action_dim']}]"
    )

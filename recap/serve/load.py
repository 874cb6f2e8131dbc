"""Load an exported policy for serving: ``recap.loading.load_policy`` (weights + processor).

``--policy DIR`` is any layout ``load_policy`` reads: a recap run or export (its
``processor.json`` and ``recap_pi05.json`` say everything; no gin file is needed), a LeRobot or
openpi checkpoint (their own files: statistics, and for LeRobot its normalization formula,
``num_inference_steps`` and prompt style), or an older recap run without a processor (pass the
gin files it was trained with, ``--gin_file``, once). A policy without normalization statistics is
refused, since unnormalized actions would move the robot by the wrong amounts. Tokenizer:
``--tokenizer``, else the processor's, else one inside the directory
(``paligemma_tokenizer.model``, ``tokenizer.model`` or Hugging Face tokenizer files).
"""

from __future__ import annotations

from pathlib import Path

import torch

from recap.errors import RecapError
from recap.loading import DTYPES, HF_TOKENIZER_FILES, TOKENIZER_FILES  # noqa: F401


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
    guidance, num_steps, spec, seed). The prompt settings given here replace the processor's
    (for a checkpoint whose files do not say them)."""
    from recap.loading import load_policy
    from recap.serve.policy import ServedPolicy, ServeSpec

    path = Path(policy_dir)
    if not (path / "model.safetensors").is_file():
        raise RecapError(
            f"--policy: {path / 'model.safetensors'} not found; point it at an exported policy "
            "directory (recap run, openpi or LeRobot layout)"
        )
    if dtype not in DTYPES:
        raise RecapError(f"--dtype: {dtype!r} is not one of {list(DTYPES)}")
    if gin_files or gin_params:  # an older recap run: its processor rebuilt from its bindings
        import recap.data.policy_data  # noqa: F401  (registers policy_data with gin)
        import recap.models.pi05  # noqa: F401  (registers pi05_policy with gin)
        from recap.cli import parse_gin

        parse_gin(list(gin_files), list(gin_params))
    model, processor = load_policy(
        path, tokenizer=tokenizer, asset_id=asset_id, dtype=dtype, prompt_style=prompt_style,
        state_in_prompt=state_in_prompt, label_position=label_position,
        conditioning=conditioning,
    )  # fmt: skip
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

"""A tiny model and synthetic data for testing the engine end to end on CPU.

``ToyRegressor``: a 2-layer Llama causal LM (width 32, tied input/output embeddings, built with
transformers ``from_config`` so ZeRO-3 can partition it at construction) whose mean-pooled hidden
state feeds a linear ``head`` that regresses a scalar. ``ToyRegressionData``: token sequences whose
target is their mean token value mapped to [-1, 1]. Same protocol as the real models
(see ``recap.models``).
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch
from torch import nn

from recap.configurable import configurable
from recap.errors import RecapError


def _backbone(config: dict, backbone_path: str | os.PathLike | None) -> nn.Module:
    from transformers import AutoModelForCausalLM, LlamaConfig

    if backbone_path is None:
        return AutoModelForCausalLM.from_config(LlamaConfig(**config))
    path = Path(backbone_path)
    if not (path / "config.json").is_file():
        raise RecapError(
            f"{path}: no config.json (model directory missing or incomplete); set "
            "toy_model.backbone_path to a local Hugging Face model directory (None: random init)"
        )
    return AutoModelForCausalLM.from_pretrained(str(path), local_files_only=True)


class ToyRegressor(nn.Module):
    """``input_ids`` int64[B, L] -> prediction float32[B]; loss = squared error per example."""

    def __init__(self, backbone: nn.Module):
        super().__init__()
        self.backbone = backbone
        self.head = nn.Linear(backbone.config.hidden_size, 1)

    def forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, dict]:
        hidden = self.backbone.model(input_ids=batch["input_ids"]).last_hidden_state
        prediction = self.head(hidden.mean(dim=1)).squeeze(-1).float()
        target = batch["target"].float()
        error = prediction - target
        metrics = {"mae": error.abs().detach(), "prediction": prediction.detach(), "target": target}
        return error.square(), metrics

    def summarize_eval(self, outputs: dict[str, torch.Tensor]) -> dict[str, float]:
        """Set-level metric over the whole eval set: Pearson r of prediction and target."""
        pred, target = outputs["prediction"].double(), outputs["target"].double()
        if pred.numel() < 2 or pred.std() == 0 or target.std() == 0:
            return {"pearson": 0.0}
        return {"pearson": float(torch.corrcoef(torch.stack([pred, target]))[0, 1])}

    def eval_figures(self, outputs: dict[str, torch.Tensor]) -> dict:
        """A prediction-vs-target scatter (empty when matplotlib is not installed)."""
        try:
            import matplotlib

            matplotlib.use("Agg")
            from matplotlib import pyplot as plt
        except ImportError:
            return {}
        fig, ax = plt.subplots(figsize=(3, 3))
        ax.scatter(outputs["target"].numpy(), outputs["prediction"].numpy(), s=4)
        ax.set_xlabel("target")
        ax.set_ylabel("prediction")
        return {"prediction_vs_target": fig}


@configurable()
def toy_model(
    vocab_size: int = 32,
    hidden_size: int = 32,
    intermediate_size: int = 64,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 2,
    num_key_value_heads: int = 1,
    backbone_path: str | None = None,
) -> ToyRegressor:
    """Build the toy regressor (random init, or the backbone from a local HF directory)."""
    config = {
        "vocab_size": vocab_size,
        "hidden_size": hidden_size,
        "intermediate_size": intermediate_size,
        "num_hidden_layers": num_hidden_layers,
        "num_attention_heads": num_attention_heads,
        "num_key_value_heads": num_key_value_heads,
        "max_position_embeddings": 64,
        "tie_word_embeddings": True,
    }
    return ToyRegressor(_backbone(config, backbone_path))


class ToyRegressionData(torch.utils.data.Dataset):
    """``num_examples`` sequences of ``seq_len`` tokens (fixed by ``seed``); target in [-1, 1]."""

    def __init__(self, num_examples: int, seq_len: int = 8, vocab_size: int = 32, seed: int = 0):
        rng = np.random.default_rng(seed)
        self.tokens = torch.from_numpy(rng.integers(0, vocab_size, (num_examples, seq_len)))
        self.targets = self.tokens.float().mean(dim=1) / (vocab_size - 1) * 2 - 1

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        return {
            "input_ids": self.tokens[index],
            "target": self.targets[index],
            "index": torch.tensor(index),
        }


@configurable()
def toy_data(num_examples: int = 256, seq_len: int = 8, vocab_size: int = 32, seed: int = 0):
    """Gin factory for ``ToyRegressionData`` (scope it: ``train/toy_data``, ``eval/toy_data``)."""
    return ToyRegressionData(num_examples, seq_len, vocab_size, seed)

"""Tiny value-model configs, a tiny word-level tokenizer and batches shared by the model tests."""

from __future__ import annotations

from pathlib import Path

import torch

from recap.models.value import ValueModelConfig

WORDS = ("task", ":", ".", "pick", "up", "the", "bowl", "put", "it", "on", "plate", "open")
SPECIAL = ("<pad>", "<eos>", "<bos>", "<unk>")  # Gemma's ids: pad 0, eos 1, bos 2

VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 2, "image_size": 28, "patch_size": 14}  # fmt: skip
TEXT = {"vocab_size": 32, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 4,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 16,
        "max_position_embeddings": 128, "sliding_window": 512,
        "layer_types": ["sliding_attention", "full_attention"] * 2}  # fmt: skip
EXPERT = {"expert_width": 16, "expert_depth": 2, "expert_mlp": 32, "expert_head_dim": 16}


def tiny_config(**overrides) -> ValueModelConfig:
    """SigLIP 2 layers width 32 (28 px, patch 14: 4 tokens per camera), Gemma3 text 4 layers
    width 32 (head_dim 16, one kv head), expert depth 2 width 16."""
    return ValueModelConfig(vision=dict(VISION), text=dict(TEXT), **{**EXPERT, **overrides})


def save_tiny_tokenizer(directory: Path) -> Path:
    """A word-level tokenizer (lower-cased, split on whitespace and punctuation) saved the way
    Hugging Face saves tokenizers; load it back with ``AutoTokenizer.from_pretrained``."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {w: i for i, w in enumerate(SPECIAL + WORDS)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<bos>", eos_token="<eos>", pad_token="<pad>",
        unk_token="<unk>",
    )  # fmt: skip
    fast.save_pretrained(str(directory))
    return directory


def tiny_batch(batch_size: int = 3, seed: int = 0, num_cameras: int = 3) -> dict[str, torch.Tensor]:
    """Random images in [-1, 1]; example 1 misses camera 1, nobody has camera 2; text lengths
    6, 3, 4 of 6 (BOS id 2 first)."""
    g = torch.Generator().manual_seed(seed)
    masks = torch.tensor([[1, 1, 0], [1, 0, 0], [1, 1, 0], [1, 1, 0]], dtype=torch.bool)
    lengths = torch.tensor([6, 3, 4, 5])[:batch_size]
    ids = torch.randint(4, 16, (batch_size, 6), generator=g)
    ids[:, 0] = 2
    text_mask = torch.arange(6)[None] < lengths[:, None]
    return {
        "images": torch.rand(batch_size, num_cameras, 3, 28, 28, generator=g) * 2 - 1,
        "image_masks": masks[:batch_size, :num_cameras],
        "input_ids": ids.masked_fill(~text_mask, 0),
        "attention_mask": text_mask,
        "target": torch.tensor([-0.1, -0.5, -0.9, -0.3023])[:batch_size],
    }

"""The names of a policy directory's files that loaders look for, without torch: the checks that
run before a model loads (``recap.serve.load.preflight``) and the loader itself
(``recap.loading``) read them from here."""

from __future__ import annotations

from pathlib import Path

TOKENIZER_FILES = ("paligemma_tokenizer.model", "tokenizer.model")  # SentencePiece files
HF_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")  # a Hugging Face tokenizer
DTYPE_NAMES = ("float32", "bfloat16", "float16")  # the precisions a policy loads in


def own_tokenizer(directory: Path) -> Path | None:
    """A tokenizer inside ``directory`` (PaliGemma's SentencePiece file or Hugging Face files)."""
    for name in TOKENIZER_FILES:
        if (directory / name).is_file():
            return directory / name
    if any((directory / name).is_file() for name in HF_TOKENIZER_FILES):
        return directory
    return None

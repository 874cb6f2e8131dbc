"""Byte-reproducible safetensors files.

``safetensors`` keeps the ``__metadata__`` of a file in a hash map, so two processes saving the
same tensors with the same metadata write headers whose metadata keys come in different orders:
identical trainings gave files that differed only there. ``safetensors_bytes`` rewrites the header
with the metadata keys sorted (the tensor entries keep the library's own deterministic order and
their data offsets), so equal inputs give equal bytes; ``save_safetensors`` writes that atomically.
Readers see the same tensors and metadata as before.
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import torch

ALIGN = 8  # safetensors pads its header with spaces to a multiple of 8 bytes


def safetensors_bytes(
    tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None
) -> bytes:
    """The safetensors serialization of ``tensors`` with a canonical header (metadata sorted)."""
    from safetensors.torch import save

    raw = save(tensors, metadata=metadata)
    (size,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8 : 8 + size])
    meta = header.pop("__metadata__", None)
    ordered = {} if meta is None else {"__metadata__": dict(sorted(meta.items()))}
    ordered.update(header)
    text = json.dumps(ordered, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % ALIGN)
    return struct.pack("<Q", len(text)) + text + raw[8 + size :]


def save_safetensors(
    tensors: dict[str, torch.Tensor],
    path: str | os.PathLike,
    metadata: dict[str, str] | None = None,
) -> Path:
    """Write ``tensors`` to ``path`` atomically (``recap.io.write_atomic``; mode 0644)."""
    from recap.io import write_atomic

    path = Path(path)
    write_atomic({path: lambda tmp: tmp.write_bytes(safetensors_bytes(tensors, metadata))})
    return path

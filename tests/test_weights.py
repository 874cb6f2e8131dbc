"""Byte-reproducible safetensors: equal tensors and metadata give equal files, in any process."""

from __future__ import annotations

import hashlib
import json
import struct
import subprocess
import sys

import torch
from safetensors.torch import load_file, safe_open

from recap.weights import safetensors_bytes, save_safetensors

META = {"format": "pt", "step": "3", "recap_weights": "ema", "tied": "{}", "zeta": "1", "a": "2"}
SAVE = """
import sys, torch
from recap.weights import save_safetensors
state = {"b": torch.arange(6.0).reshape(2, 3), "a": torch.ones(4, dtype=torch.bfloat16)}
save_safetensors(state, sys.argv[1], {"recap_weights": "ema", "recap_ema_decay": "0.999",
                 "recap_ema_updates": "7", "format": "pt", "step": "7", "tied": "{}"})
"""


def test_header_is_canonical_and_tensors_round_trip(tmp_path):
    tensors = {"w": torch.arange(12.0).reshape(3, 4), "b": torch.tensor([1, 2], dtype=torch.int64)}
    blobs = {safetensors_bytes(tensors, META) for _ in range(8)}
    assert len(blobs) == 1
    blob = blobs.pop()
    (size,) = struct.unpack("<Q", blob[:8])
    assert size % 8 == 0
    header = json.loads(blob[8 : 8 + size])
    assert list(header["__metadata__"]) == ["a", "format", "recap_weights", "step", "tied", "zeta"]
    path = save_safetensors(tensors, tmp_path / "m.safetensors", META)
    assert path.read_bytes() == blob and oct(path.stat().st_mode & 0o777) == "0o644"
    loaded = load_file(str(path))
    assert torch.equal(loaded["w"], tensors["w"]) and torch.equal(loaded["b"], tensors["b"])
    with safe_open(str(path), "pt") as f:
        assert f.metadata() == META
    assert not list(tmp_path.glob(".*.tmp"))


def test_two_processes_write_identical_exports(tmp_path):
    """Two separate processes (each with its own hash-map seed) write the same bytes."""
    digests = []
    for k in range(2):
        out = tmp_path / f"run{k}.safetensors"
        subprocess.run([sys.executable, "-c", SAVE, str(out)], check=True)
        digests.append(hashlib.sha256(out.read_bytes()).hexdigest())
    assert digests[0] == digests[1]

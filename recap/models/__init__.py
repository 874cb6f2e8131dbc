"""Models as ``nn.Module``s; the engine (``recap.engine``) trains any model of this protocol.

What the engine needs from a model is ``recap.engine.protocol``: ``loss, metrics = model(batch)``
(``TrainableModel``), optional ``summarize_eval`` / ``eval_figures`` (``EvalSummaries`` /
``EvalFigures``), ``export_state`` / ``prepare_to_load_exported`` (``ExportHooks``: LoRA's,
``adapters.AdapterHooks``), and, on a model's config dataclass, the memory planner's
``MemoryProbe`` (``memory_depths``, ``memory_scaled``, ``memory_build``, ``example_batch``,
``set_checkpointing``). The engine imports nothing from here (``.importlinter``).
"""

from __future__ import annotations

import os

# transformers must never reach for TensorFlow / JAX (it once segfaulted under NumPy 2).
os.environ.setdefault("USE_TF", "0")
os.environ.setdefault("TRANSFORMERS_NO_TF", "1")
os.environ.setdefault("USE_FLAX", "0")
os.environ.setdefault("USE_TORCH", "1")

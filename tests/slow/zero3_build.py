"""Launched by ``test_real_size.py`` under ``deepspeed --num_gpus 2`` (CPU accelerator): build the
real-size value model through the engine's ``build_model`` (``HfDeepSpeedConfig`` alive,
transformers ``from_config`` inside ``deepspeed.zero.Init``) and print one ``ZERO3 {json}`` line
per rank with the full and the local (partitioned) parameter counts."""

from __future__ import annotations

import json
import resource
import time

import gin

import recap.steps.train  # noqa: F401  (registers value_model)
from recap.cli import parse_gin
from recap.configurable import configured
from recap.engine import distributed
from recap.engine.deepspeed_config import deepspeed_config, for_deepspeed
from recap.engine.trainer import build_model


def local_numel(param) -> int:
    """Elements this rank holds: the ZeRO-3 partition when partitioned, else the whole tensor."""
    return param.ds_tensor.numel() if hasattr(param, "ds_tensor") else param.numel()


def main() -> None:
    distributed.init()
    parse_gin(["value.gin", "models/value_real.gin"], [])
    world = distributed.world_size()
    config = for_deepspeed(
        configured(deepspeed_config)(world_size=world, max_steps=1, global_batch_size=64)
    )
    start = time.perf_counter()
    model, keepalive = build_model(gin.query_parameter("train.model_fn").scoped_configurable_fn,
                                   config)  # fmt: skip
    seconds = time.perf_counter() - start
    params = list(model.parameters())
    record = {
        "rank": distributed.rank(),
        "world": world,
        "full": sum(getattr(p, "ds_numel", p.numel()) for p in params),
        "local": sum(local_numel(p) for p in params),
        "partitioned": sum(hasattr(p, "ds_tensor") for p in params),
        "partitioned_numel": sum(p.ds_numel for p in params if hasattr(p, "ds_tensor")),
        "tensors": len(params),
        "build_s": round(seconds, 1),
        "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2),
    }
    print("ZERO3 " + json.dumps(record), flush=True)
    distributed.barrier()
    del keepalive


if __name__ == "__main__":
    main()

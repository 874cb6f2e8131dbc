"""Per-rank memory plan of a ZeRO-3 training run from its gin config (value model or π0.5).

    recap-plan-memory --gin_file value.gin --gin_file models/value_real.gin
    recap-plan-memory --gin_file experiments/libero_pi05.gin --ranks 8 --device_gb 64

Parameters are counted on the meta device; activations are measured on CPU (a few minutes)
unless ``--activation_gb_per_sample`` is given. See ``recap.engine.memory``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from recap.errors import RecapError


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gin_file", action="append", default=[], help="gin file (repeatable)")
    parser.add_argument("--gin_param", action="append", default=[], help="gin binding")
    parser.add_argument("--ranks", type=int, default=8, help="devices (ZeRO-3 ranks)")
    parser.add_argument("--device_gb", type=float, default=64.0, help="GiB per device (910B: 64)")
    parser.add_argument("--micro_batch", type=int, default=None, help="default: the gin value")
    parser.add_argument("--activation_gb_per_sample", type=float, default=None,
                        help="GiB per sample as configured (with checkpointing if on); "
                        "skips the measurement")  # fmt: skip
    parser.add_argument("--cameras", type=int, default=3, help="camera slots per sample")
    parser.add_argument("--prompt_tokens", type=int, default=200, help="padded prompt length")
    parser.add_argument("--reserve_gb", type=float, default=4.0, help="buffers, fragmentation")
    return parser.parse_args(argv)


def plan(args: argparse.Namespace):
    """The ``Plan`` for the parsed flags (gin already parsed)."""
    from recap.config_check import bound
    from recap.engine import memory

    model_fn = bound("train.model_fn", None)
    if model_fn is None:
        raise RecapError("plan_memory: the gin files bind no train.model_fn; include a model")
    model = memory.build_on_meta(model_fn.scoped_configurable_fn)
    config = model.config
    offload = bool(bound("deepspeed_config.offload_optimizer", False))
    if args.activation_gb_per_sample is None:
        acts = memory.measure_activations(config, args.cameras, args.prompt_tokens)
    else:
        acts = memory.Activations(args.activation_gb_per_sample, None, "given on the command line")
    counts = memory.count_parameters(model)
    return memory.Plan(
        counts=counts, ranks=args.ranks, device_gb=args.device_gb,
        micro_batch=args.micro_batch or int(bound("deepspeed_config.micro_batch_size", 32)),
        states=memory.zero3_model_states(counts, args.ranks, offload), activations=acts,
        checkpointing=bool(getattr(config, "gradient_checkpointing", False)),
        offload_optimizer=offload, reserve_gb=args.reserve_gb,
    )  # fmt: skip


SHAPES_ONLY = ["pi05_policy.checkpoint = None"]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import recap.models.pi05  # noqa: F401  (registers pi05_policy)
        import recap.steps.train  # noqa: F401  (registers train, value_model, ...)
        from recap.cli import parse_gin
        from recap.engine.memory import format_plan

        # the plan needs the architecture only: the gin sizes, never a checkpoint's weights
        parse_gin(args.gin_file, [*args.gin_param, *SHAPES_ONLY])
        print("\n".join(format_plan(plan(args))))
    except RecapError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

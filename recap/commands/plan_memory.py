"""Per-rank memory plan of a ZeRO-3 training run from its gin config (value model or π0.5).

    recap-plan-memory --gin_file value.gin --gin_file models/value_real.gin
    recap-plan-memory --gin_file experiments/libero_pi05.gin --ranks 8 --device_gb 64

Parameters are counted on the meta device; activations are measured on CPU (a few minutes)
unless ``--activation_gb_per_sample`` is given. After the configured plan comes the table of
recipes (full, full + optimizer offload, LoRA, LoRA + frozen vision, param offload): per recipe
the trainable parameters, the largest micro batch and the predicted GiB per rank, and for a
configuration that misses, the cheapest recipe that fits with its gin bindings. Last, what
``deepspeed_config.zero_stage = "auto"`` picks: the configuration with the highest predicted
throughput that fits (ZeRO stage 0-3, optimizer / parameter offload, gradient checkpointing on or
off, the largest micro batch that keeps the global batch), with its gin bindings, and the
runner-up. ``--hardware`` names a preset (ranks x GiB): 910b 8 x 64, 910b4 8 x 32, a100 / h100
8 x 80, 24gb 1 x 24. See ``recap.engine.memory``.

    recap-plan-memory --gin_file experiments/libero_pi05.gin --hardware 910b \
        --activation_gb_plain 3.716 --activation_gb_checkpointed 0.938 \
        --vision_activation_gb_per_sample 0.690
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from recap.engine.memory import HARDWARE
from recap.errors import RecapError


def build_parser() -> argparse.ArgumentParser:
    """The command's flags; ``--help`` says what each is, its default and its choices."""
    from recap.cli import build_parser as gin_parser

    parser = gin_parser(__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, default=8, help="devices (ZeRO-3 ranks)")
    parser.add_argument("--device_gb", type=float, default=64.0, help="GiB per device (910B: 64)")
    presets = ", ".join(f"{k}: {n} x {gb:g} GiB" for k, (n, gb) in sorted(HARDWARE.items()))
    parser.add_argument("--hardware", choices=sorted(HARDWARE), default=None,
                        help=f"a preset of --ranks and --device_gb ({presets})")  # fmt: skip
    parser.add_argument("--micro_batch", type=int, default=None, help="default: the gin value")
    parser.add_argument("--activation_gb_per_sample", type=float, default=None,
                        help="GiB per sample as configured (with checkpointing if on); "
                        "skips the measurement")  # fmt: skip
    parser.add_argument(
        "--activation_gb_plain",
        type=float,
        default=None,
        help="GiB per sample without gradient checkpointing (with "
        "--activation_gb_checkpointed: both, skipping the measurement)",
    )
    parser.add_argument("--activation_gb_checkpointed", type=float, default=None,
                        help="GiB per sample with gradient checkpointing")  # fmt: skip
    parser.add_argument("--vision_activation_gb_per_sample", type=float, default=None,
                        help="the vision tower's share of --activation_gb_per_sample (what a "
                        "frozen vision tower saves)")  # fmt: skip
    parser.add_argument("--cameras", type=int, default=3, help="camera slots per sample")
    parser.add_argument("--prompt_tokens", type=int, default=200, help="padded prompt length")
    parser.add_argument("--reserve_gb", type=float, default=4.0, help="buffers, fragmentation")
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    args = build_parser().parse_args(argv)
    if args.hardware is not None:
        args.ranks, args.device_gb = HARDWARE[args.hardware]
    return args


def plan(args: argparse.Namespace):
    """The ``Plan`` for the parsed flags (gin already parsed), as configured: LoRA and frozen
    towers through the trainable count (and a frozen vision tower's activations), both
    offloads through the model states."""
    return plan_all(args)[0]


def plan_all(args: argparse.Namespace):
    """(the configured ``Plan``, the ``RECIPES`` planned, the configured recipe, the model
    factory's gin name, the ``zero_stage = "auto"`` choices ranked)."""
    from recap.config_check import bound
    from recap.engine import memory

    model_fn = bound("train.model_fn", None)
    if model_fn is None:
        raise RecapError("plan_memory: the gin files bind no train.model_fn; include a model")
    model = memory.build_on_meta(model_fn.scoped_configurable_fn)
    config = model.config
    factory = model_fn.configurable.name
    offload = bool(bound("deepspeed_config.offload_optimizer", False))
    offload_param = bound("deepspeed_config.offload_param", "none") not in (None, "none")
    frozen_vision = "vision" in (bound(f"{factory}.freeze", None) or ())
    checkpointing = bool(getattr(config, "gradient_checkpointing", False))
    vision = args.vision_activation_gb_per_sample
    if args.activation_gb_plain is not None and args.activation_gb_checkpointed is not None:
        acts = memory.Activations(args.activation_gb_plain, args.activation_gb_checkpointed,
                                  "given on the command line", vision, vision)  # fmt: skip
    elif args.activation_gb_per_sample is None:
        acts = memory.measure_activations(config, args.cameras, args.prompt_tokens)
    else:
        acts = memory.Activations(args.activation_gb_per_sample, None,
                                  "given on the command line", vision, vision)  # fmt: skip
    micro = args.micro_batch or int(bound("deepspeed_config.micro_batch_size", 32))
    counts = memory.count_parameters(model)
    configured = memory.Plan(
        counts=counts, ranks=args.ranks, device_gb=args.device_gb, micro_batch=micro,
        states=memory.zero3_model_states(counts, args.ranks, offload, offload_param),
        activations=acts.without_vision() if frozen_vision else acts,
        checkpointing=checkpointing, offload_optimizer=offload or offload_param,
        reserve_gb=args.reserve_gb,
    )  # fmt: skip
    auto = auto_choices(args, acts.without_vision() if frozen_vision else acts, checkpointing,
                        micro)  # fmt: skip
    if factory not in ("pi05_policy", "value_model"):  # recipes: the models with towers
        return configured, [], None, factory, auto({"as configured": counts})
    plain = model_fn.scoped_configurable_fn
    lora = bound(f"{factory}.lora", None) is not None
    plain_counts = None if lora or bound(f"{factory}.freeze", None) else counts
    from recap.models.adapters import recipe_steps

    recipe_counts = memory.recipe_counts(lambda: plain(lora=None, freeze=()), recipe_steps(),
                                         full=plain_counts)  # fmt: skip
    recipes = memory.plan_recipes(recipe_counts, acts, args.ranks, args.device_gb, micro,
                                  checkpointing, args.reserve_gb)  # fmt: skip
    mine = memory.configured_recipe(lora, frozen_vision, offload, offload_param)
    trained = {"as configured": counts}
    if not lora:  # what fewer trained parameters buy when no full configuration fits
        trained |= {"LoRA": recipe_counts["lora"],
                    "LoRA + frozen vision": recipe_counts["lora_frozen_vision"]}  # fmt: skip
    return configured, recipes, mine, factory, auto(trained)


def auto_choices(args: argparse.Namespace, acts, checkpointing: bool, micro: int):
    """``trained counts by recipe -> ranked choices`` of ``zero_stage = "auto"``: checkpointing
    on and off when both activation figures are known, else as configured."""
    from recap.config_check import bound
    from recap.engine import memory

    options = (False, True)
    if acts.checkpointed is None:  # one figure: the configured checkpointing only
        options = (checkpointing,)
        if checkpointing:
            acts = memory.Activations(acts.per_sample, acts.per_sample, acts.source,
                                      acts.vision, acts.vision)  # fmt: skip
    global_batch = int(bound("deepspeed_config.global_batch_size", 256))

    def rank(trained):
        return memory.choose(trained, acts, args.ranks, args.device_gb, global_batch, micro,
                             args.reserve_gb, options)  # fmt: skip

    return rank


SHAPES_ONLY = ["pi05_policy.checkpoint = None"]


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import recap.models.pi05  # noqa: F401  (registers pi05_policy)
        import recap.steps.train  # noqa: F401  (registers train, value_model, ...)
        from recap.cli import parse_gin
        from recap.engine.memory import format_choice, format_plan, format_recipes

        # the plan needs the architecture only: the gin sizes, never a checkpoint's weights
        parse_gin(args.gin_file, [*args.gin_param, *SHAPES_ONLY])
        configured, recipes, mine, factory, auto = plan_all(args)
        lines = format_plan(configured)
        if recipes:
            lines += ["", *format_recipes(recipes, args.ranks, factory, mine)]
        flag = f"{factory}.gradient_checkpointing" if factory == "pi05_policy" else None
        lines += ["", *format_choice(auto, args.ranks, args.device_gb, flag)]
        print("\n".join(lines))
    except RecapError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())

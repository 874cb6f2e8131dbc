"""Per-rank memory plan of a run: model states, activations, a verdict and the auto ZeRO stage.

Model states (bytes per parameter, partitioned over ``ranks``): bf16 parameters 2 (every
parameter), bf16 gradients 2 and fp32 master weights + Adam m, v 12 (trainable parameters
only), plus the largest layer gathered whole (4 bytes/param: its bf16 weights and gradients).
DeepSpeed's own estimator (``estimate_zero3_model_states_mem_needs``: 18 bytes/param for every
parameter + 4 x largest layer; frozen parameters counted at their 2 bytes of weights, since the
estimator assumes every parameter trains) is reported beside it; the verdict uses the larger of
the two. Offloads: ``offload_optimizer`` moves the float32 master and Adam states to the host,
``offload_param`` (ZeRO-3) the parameters and gradients too (the device keeps the gathered layers).

Recipes (``RECIPES``, ``plan_recipes``): full fine-tuning, + optimizer offload, LoRA (peft's
trainable count on the meta device, ``recipe_counts``), LoRA + frozen vision (the SigLIP
activations removed), parameter offload; per recipe the largest micro batch and the predicted
GiB per rank, and for the configured recipe when it misses, the cheapest one that fits.

``zero_stage = "auto"`` (``choose``, ``auto_stage``): model states per ZeRO stage 0-3
(``stage_model_states``) with or without the optimizer / parameter offload, activations with
checkpointing on or off, each at the largest micro batch that fits and keeps the global batch,
ranked by a relative throughput model (``STAGE_SPEED`` and the factors beside it: OpenTau's
measured ZeRO-3 / ZeRO-2 ratio, recomputation's extra forward, host offload); the configured
trained parameters first, LoRA only when none of their configurations fits.

Activations are the bytes autograd keeps for backward (``saved_tensors_hooks``; parameters
excluded), measured on CPU at batch 1 with the real widths and sequence lengths but depth 1/2 per
stack (vocabulary cut to 1024: the embedding's output does not depend on it), extrapolated
linearly to the real depths and multiplied by the micro batch. What the planner needs of a model
is its config's ``MemoryProbe`` (``recap.engine.protocol``): this module imports no model.
"""

from __future__ import annotations

import dataclasses
import gc
import math
from collections.abc import Callable, Sequence

import torch
from torch import nn

from recap.engine.protocol import MemoryProbe
from recap.errors import RecapError

GIB = float(2**30)
BYTES_PARAM = 2  # bf16 weights
BYTES_GRAD = 2  # bf16 gradients
BYTES_OPTIM = 12  # fp32 master + Adam m + v
GATHER_BYTES = 4  # largest layer gathered: bf16 weights + gradients
MEASURE_VOCAB = 1024


@dataclasses.dataclass(frozen=True)
class ParamCounts:
    """Parameter counts: all, trainable, and the largest single module (its own tensors)."""

    total: int
    trainable: int
    largest_layer: int

    @property
    def frozen(self) -> int:
        return self.total - self.trainable


@dataclasses.dataclass(frozen=True)
class ModelStates:
    """Per-rank GiB of each ZeRO-3 model state; ``deepspeed`` is DeepSpeed's estimate."""

    params: float
    grads: float
    optimizer: float
    gathered: float
    deepspeed: float

    @property
    def total(self) -> float:
        return self.params + self.grads + self.optimizer + self.gathered

    @property
    def planned(self) -> float:
        """What the verdict uses: the larger of this breakdown and DeepSpeed's estimate."""
        return max(self.total, self.deepspeed)


@dataclasses.dataclass(frozen=True)
class Activations:
    """GiB per sample kept for backward; ``checkpointed`` with gradient checkpointing (None when
    the model has none); ``source`` says where the figure comes from."""

    per_sample: float
    checkpointed: float | None
    source: str
    vision: float | None = None  # the vision stack's share of per_sample (None: unknown)
    vision_checkpointed: float | None = None

    def gib_per_sample(self, checkpointing: bool) -> float:
        """GiB per sample as trained: the checkpointed figure when checkpointing is on and the
        model has one."""
        if checkpointing and self.checkpointed is not None:
            return self.checkpointed
        return self.per_sample

    def without_vision(self) -> Activations:
        """The activations with the vision tower frozen (it saves nothing for backward: its
        input needs no gradient); unchanged when the vision share is unknown."""
        if self.vision is None:
            return self
        ckpt = self.checkpointed
        if ckpt is not None and self.vision_checkpointed is not None:
            ckpt = max(ckpt - self.vision_checkpointed, 0.0)
        return dataclasses.replace(
            self, per_sample=max(self.per_sample - self.vision, 0.0), checkpointed=ckpt,
            vision=0.0, vision_checkpointed=0.0 if ckpt is not None else None,
            source=self.source + "; vision tower frozen: its share removed",
        )  # fmt: skip


def build_on_meta(model_fn: Callable[[], nn.Module]) -> nn.Module:
    """``model_fn()`` built on the meta device (shapes only, no memory)."""
    with torch.device("meta"):
        return model_fn()


def count_parameters(model: nn.Module) -> ParamCounts:
    """Counts of ``model`` (ZeRO-3 ``ds_numel`` when partitioned)."""
    sizes = [(getattr(p, "ds_numel", p.numel()), p.requires_grad) for p in model.parameters()]
    largest = max(
        (sum(getattr(p, "ds_numel", p.numel()) for p in m.parameters(recurse=False))
         for m in model.modules()),
        default=0,
    )  # fmt: skip
    return ParamCounts(
        sum(n for n, _ in sizes), sum(n for n, trainable in sizes if trainable), largest
    )


def optimizer_footprint(engine) -> tuple[int, int]:
    """(parameters the DeepSpeed optimizer updates, this rank's bytes of optimizer state as
    allocated: the float32 master partitions plus the inner optimizer's state tensors)."""
    opt = engine.optimizer
    groups = getattr(opt, "fp16_groups", None) or getattr(opt, "bit16_groups", None)
    groups = groups or [g["params"] for g in opt.param_groups]
    numel = sum(getattr(p, "ds_numel", p.numel()) for group in groups for p in group)
    masters = (getattr(opt, "fp32_partitioned_groups_flat", None)
               or getattr(opt, "single_partition_of_fp32_groups", None) or [])  # fmt: skip
    inner = getattr(opt, "optimizer", opt)
    state = sum(t.nbytes for s in inner.state.values() for t in s.values() if torch.is_tensor(t)
                and t.dim())  # fmt: skip
    return numel, state + sum(t.nbytes for t in masters)


def deepspeed_estimate_gib(
    counts: ParamCounts, ranks: int, offload_optimizer: bool, offload_param: bool = False
) -> float:
    """DeepSpeed's per-device ZeRO-3 model-state estimate in GiB (8 devices per node). It
    counts every parameter as trainable; with frozen parameters (LoRA) it overestimates, so the
    plan then scales its optimizer/gradient share to the trainable fraction."""
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    per_node = min(ranks, 8)
    _, device_bytes, _ = estimate_zero3_model_states_mem_needs(
        counts.total, counts.largest_layer, num_gpus_per_node=per_node,
        num_nodes=math.ceil(ranks / per_node), cpu_offload=offload_optimizer or offload_param,
        cpu_offload_params=offload_param,
    )  # fmt: skip
    if counts.trainable < counts.total and not (offload_optimizer or offload_param):
        # estimator: 18 B/param (2 weights + 16 grads/states) over the ranks + 4 x largest layer
        largest = 4 * counts.largest_layer
        states = (device_bytes - largest) * (2 + 16 * counts.trainable / counts.total) / 18
        device_bytes = states + largest
    return device_bytes / GIB


def zero3_model_states(
    counts: ParamCounts, ranks: int, offload_optimizer: bool = False, offload_param: bool = False
) -> ModelStates:
    """Per-rank model states (module docstring); the optimizer is on the host when offloaded,
    and with ``offload_param`` (ZeRO-3 ``offload_param``, which implies the optimizer's) the
    parameters and gradients too: the device keeps only the layers gathered for compute."""
    if ranks < 1:
        raise RecapError(f"plan_memory: ranks {ranks} must be >= 1")
    offload_optimizer = offload_optimizer or offload_param
    optimizer = 0.0 if offload_optimizer else BYTES_OPTIM * counts.trainable / ranks / GIB
    host = 0.0 if offload_param else 1.0
    return ModelStates(
        params=host * BYTES_PARAM * counts.total / ranks / GIB,
        grads=host * BYTES_GRAD * counts.trainable / ranks / GIB,
        optimizer=optimizer,
        gathered=GATHER_BYTES * counts.largest_layer / GIB,
        deepspeed=deepspeed_estimate_gib(counts, ranks, offload_optimizer, offload_param),
    )


def extrapolate(base: float, slopes: dict[str, float], depths: dict[str, int]) -> float:
    """Value at the real ``depths`` of a quantity measured at depth 1 everywhere (``base``)
    growing by ``slopes[k]`` per extra layer of stack k: base + sum slope_k (depth_k - 1)."""
    return base + sum(slopes[k] * (depths[k] - 1) for k in slopes)


def max_micro_batch(device_gb: float, fixed_gb: float, per_sample_gb: float) -> int:
    """Largest micro batch with fixed + micro x per_sample <= device (0 when none fits)."""
    if per_sample_gb <= 0:
        raise RecapError(f"plan_memory: activation per sample {per_sample_gb} GiB must be > 0")
    return max(0, math.floor((device_gb - fixed_gb) / per_sample_gb))


# ---- activation measurement (CPU, batch 1, real widths, depth 1/2) ---------------------------


def probe(config) -> MemoryProbe:
    """``config`` as the planner's ``MemoryProbe`` (``recap.engine.protocol``), else a one-line
    error."""
    if not isinstance(config, MemoryProbe):
        raise RecapError(f"plan_memory: no activation measurement for {type(config).__name__}; "
                         "pass --activation_gb_per_sample")  # fmt: skip
    return config


def depth_knobs(config) -> dict[str, int]:
    """Real depth of each stack whose activations grow with its layer count."""
    return probe(config).memory_depths()


def scaled_config(config, depths: dict[str, int]):
    """``config`` with the given stack depths and a ``MEASURE_VOCAB`` vocabulary."""
    return probe(config).memory_scaled(depths, MEASURE_VOCAB)


def build_scaled(config, dtype: torch.dtype = torch.bfloat16) -> nn.Module:
    """A randomly initialized model of a (scaled) config."""
    return probe(config).memory_build(dtype)


def sample_batch(config, cameras: int, prompt_tokens: int, batch_size: int = 1) -> dict:
    """A training batch of the model's keys: ``cameras`` valid images, a full prompt."""
    return probe(config).example_batch(cameras, prompt_tokens, batch_size, MEASURE_VOCAB)


def saved_activation_bytes(model: nn.Module, batch: dict) -> int:
    """Bytes of the distinct storages autograd saves for backward in one training forward
    (parameters excluded)."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in params:
            seen[storage.data_ptr()] = max(seen.get(storage.data_ptr(), 0), storage.nbytes())
        return tensor

    dtype = next(model.parameters()).dtype
    batch = {k: v.to(dtype) if v.is_floating_point() else v for k, v in batch.items()}
    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss, _ = model(batch)
    del loss
    return sum(seen.values())


def _measure_depths(config, depths: dict[str, int], cameras: int, prompt_tokens: int) -> tuple:
    """(bytes without, bytes with checkpointing or None) of one scaled model at batch 1."""
    scaled = scaled_config(config, depths)
    model = build_scaled(scaled)
    batch = sample_batch(config, cameras, prompt_tokens)
    scaled.set_checkpointing(model, False)
    plain = saved_activation_bytes(model, batch)
    ckpt = saved_activation_bytes(model, batch) if scaled.set_checkpointing(model, True) else None
    del model
    gc.collect()
    return plain, ckpt


def measure_activations(config, cameras: int = 3, prompt_tokens: int = 200) -> Activations:
    """Activations per sample at the real depths (module docstring). With checkpointing, one
    layer's full activations (recomputed during backward) are added to the saved inputs."""
    real = depth_knobs(config)
    ones = {k: 1 for k in real}
    base, base_ckpt = _measure_depths(config, ones, cameras, prompt_tokens)
    slopes, ckpt_slopes = {}, {}
    for knob in real:
        plain, ckpt = _measure_depths(config, ones | {knob: 2}, cameras, prompt_tokens)
        slopes[knob] = plain - base
        ckpt_slopes[knob] = None if ckpt is None else ckpt - base_ckpt
    per_sample = extrapolate(base, slopes, real) / GIB
    checkpointed = None
    if base_ckpt is not None:
        ckpt_bytes = extrapolate(base_ckpt, ckpt_slopes, real) + max(slopes.values())
        checkpointed = ckpt_bytes / GIB
    shape = ", ".join(f"{k} {real[k]} layers: {slopes[k] / 2**20:.1f} MiB/layer" for k in real)
    source = (f"measured on CPU, batch 1, {cameras} cameras, {prompt_tokens} prompt tokens, "
              f"bf16; base {base / 2**20:.1f} MiB; {shape}")  # fmt: skip
    # the vision share: its slope per layer times its depth (what a frozen tower saves)
    vision = slopes["vision"] * real["vision"] / GIB
    vision_ckpt = None
    if ckpt_slopes.get("vision") is not None:
        vision_ckpt = ckpt_slopes["vision"] * real["vision"] / GIB
    return Activations(per_sample, checkpointed, source, vision, vision_ckpt)


# ---- plan and verdict ------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Plan:
    """Everything the verdict rests on, per rank, in GiB."""

    counts: ParamCounts
    ranks: int
    device_gb: float
    micro_batch: int
    states: ModelStates
    activations: Activations
    checkpointing: bool = False
    offload_optimizer: bool = False
    reserve_gb: float = 4.0

    @property
    def per_sample_gb(self) -> float:
        return self.activations.gib_per_sample(self.checkpointing)

    @property
    def activation_gb(self) -> float:
        return self.per_sample_gb * self.micro_batch

    @property
    def total_gb(self) -> float:
        return self.states.planned + self.activation_gb + self.reserve_gb

    @property
    def fits(self) -> bool:
        return self.total_gb <= self.device_gb


def verdict(plan: Plan) -> str:
    """One line: fits / does not fit, and what to change."""
    fixed = plan.states.planned + plan.reserve_gb
    best = max_micro_batch(plan.device_gb, fixed, plan.per_sample_gb)
    head = f"{plan.total_gb:.1f} GiB of {plan.device_gb:g} GiB per rank at micro batch "
    if plan.fits:
        return f"FITS: {head}{plan.micro_batch} (largest micro batch that fits: {best})"
    fixes = []
    if fixed > plan.device_gb and not plan.offload_optimizer:
        off = zero3_model_states(plan.counts, plan.ranks, offload_optimizer=True).planned
        fixes.append(f"offload the optimizer (deepspeed_config.offload_optimizer = True: model "
                     f"states {off:.1f} GiB) or use more ranks")  # fmt: skip
    ckpt = plan.activations.checkpointed
    if ckpt is not None and not plan.checkpointing:
        fits_ckpt = max_micro_batch(plan.device_gb, fixed, ckpt)
        fixes.append(f"gradient checkpointing (pi05_policy.gradient_checkpointing = True: "
                     f"{ckpt * plan.micro_batch:.1f} GiB activations, up to micro "
                     f"{fits_ckpt})")  # fmt: skip
    if best >= 1:
        fixes.append(f"micro batch {best} (deepspeed_config.micro_batch_size; accumulation "
                     "keeps the global batch)")  # fmt: skip
    change = "; or ".join(fixes or ["use more ranks"])
    return f"DOES NOT FIT: {head}{plan.micro_batch}; change: {change}"


def format_plan(plan: Plan) -> list[str]:
    """The report's lines (GiB per rank), ending with the verdict."""
    c, s, a = plan.counts, plan.states, plan.activations
    ckpt = "n/a (model has none)" if a.checkpointed is None else f"{a.checkpointed:.3f} GiB"
    return [
        f"parameters: {c.total:,} total, {c.trainable:,} trainable, {c.frozen:,} frozen; "
        f"largest layer {c.largest_layer:,}",
        f"ZeRO-3 over {plan.ranks} ranks (per rank): bf16 params {s.params:.2f} + bf16 grads "
        f"{s.grads:.2f} + fp32 master/Adam {s.optimizer:.2f}"
        f"{' (offloaded)' if plan.offload_optimizer else ''} + largest layer gathered "
        f"{s.gathered:.2f} = {s.total:.2f} GiB; DeepSpeed estimator {s.deepspeed:.2f} GiB",
        f"activations per sample: {a.per_sample:.3f} GiB; with gradient checkpointing {ckpt} "
        f"({a.source})",
        f"activations at micro batch {plan.micro_batch}"
        f"{' (checkpointed)' if plan.checkpointing else ''}: {plan.activation_gb:.2f} GiB; "
        f"reserve (buffers, fragmentation) {plan.reserve_gb:.1f} GiB",
        f"total {plan.total_gb:.2f} GiB = model states {s.planned:.2f} + activations "
        f"{plan.activation_gb:.2f} + reserve {plan.reserve_gb:.1f}",
        verdict(plan),
    ]


# ---- recipes: which training recipe fits the card you have ---------------------------------


@dataclasses.dataclass(frozen=True)
class Recipe:
    """A training recipe: LoRA (``LoraOptions`` as bound in gin, openpi's defaults otherwise),
    the vision tower frozen, the optimizer and/or the parameters offloaded to the host."""

    name: str
    lora: bool = False
    freeze_vision: bool = False
    offload_optimizer: bool = False
    offload_param: bool = False

    def bindings(self, factory: str) -> list[str]:
        """The gin bindings that select this recipe for the model factory ``factory``."""
        out = [f"{factory}.lora = @LoraOptions()"] if self.lora else []
        out += [f"{factory}.freeze = ['vision']"] if self.freeze_vision else []
        out += ["deepspeed_config.offload_optimizer = True"] if self.offload_optimizer else []
        out += ['deepspeed_config.offload_param = "cpu"'] if self.offload_param else []
        return out


# cheapest first: what a run gives up (speed, then trained parameters, then host traffic)
RECIPES = (
    Recipe("full"),
    Recipe("full + optimizer offload", offload_optimizer=True),
    Recipe("LoRA", lora=True),
    Recipe("LoRA + frozen vision", lora=True, freeze_vision=True),
    Recipe("param offload", offload_optimizer=True, offload_param=True),
)


@dataclasses.dataclass(frozen=True)
class RecipePlan:
    """One recipe on ``ranks`` devices of ``device_gb``: model states, activations per sample
    and the largest micro batch that fits (capped at ``micro_cap``, the configured one)."""

    recipe: Recipe
    counts: ParamCounts
    states: ModelStates
    per_sample_gb: float
    device_gb: float
    micro_cap: int
    reserve_gb: float = 4.0

    @property
    def largest_micro(self) -> int:
        fixed = self.states.planned + self.reserve_gb
        return min(max_micro_batch(self.device_gb, fixed, self.per_sample_gb), self.micro_cap)

    @property
    def fits(self) -> bool:
        return self.largest_micro >= 1

    @property
    def micro(self) -> int:
        """The micro batch the per-rank figure is predicted at (1 when none fits)."""
        return max(self.largest_micro, 1)

    @property
    def total_gb(self) -> float:
        return self.states.planned + self.reserve_gb + self.per_sample_gb * self.micro


def recipe_counts(
    build: Callable[[], nn.Module],
    steps: Sequence[tuple[str, Callable[[nn.Module], nn.Module]]],
    full: ParamCounts | None = None,
) -> dict[str, ParamCounts]:
    """Parameter counts of the plain model (``"full"``, built on the meta device by ``build``)
    and after each of ``steps`` (name, transform), applied in turn to one meta-device model:
    LoRA, then the vision tower frozen on top (``recap.models.adapters.recipe_steps``; the LoRA
    counts are peft's own ``requires_grad``). ``full``: the plain model's counts when already
    known (one build fewer)."""
    full = full or count_parameters(build_on_meta(build))
    counts = {"full": full}
    with torch.device("meta"):
        model = build()
        for name, step in steps:
            model = step(model)
            counts[name] = count_parameters(model)
    return counts


def plan_recipes(
    counts: dict[str, ParamCounts], activations: Activations, ranks: int, device_gb: float,
    micro_cap: int, checkpointing: bool = False, reserve_gb: float = 4.0,
) -> list[RecipePlan]:  # fmt: skip
    """``RECIPES`` planned on ``ranks`` x ``device_gb``. LoRA keeps the activations of full
    fine-tuning (the adapters sit in every layer, so backward still runs through all of them);
    a frozen vision tower saves none (``Activations.without_vision``)."""
    plans = []
    for recipe in RECIPES:
        if recipe.lora:
            key = "lora_frozen_vision" if recipe.freeze_vision else "lora"
        else:
            key = "full"
        acts = activations.without_vision() if recipe.freeze_vision else activations
        per_sample = acts.gib_per_sample(checkpointing)
        states = zero3_model_states(counts[key], ranks, recipe.offload_optimizer,
                                    recipe.offload_param)  # fmt: skip
        plans.append(RecipePlan(recipe, counts[key], states, per_sample, device_gb, micro_cap,
                                reserve_gb))  # fmt: skip
    return plans


def configured_recipe(lora: bool, freeze_vision: bool, offload_optimizer: bool,
                      offload_param: bool) -> Recipe | None:  # fmt: skip
    """The recipe the current config selects (None: a combination outside ``RECIPES``)."""
    want = (lora, freeze_vision, offload_optimizer or offload_param, offload_param)
    for recipe in RECIPES:
        if (recipe.lora, recipe.freeze_vision, recipe.offload_optimizer,
                recipe.offload_param) == want:  # fmt: skip
            return recipe
    return None


def format_recipes(
    plans: list[RecipePlan], ranks: int, factory: str, configured: Recipe | None = None
) -> list[str]:
    """A table of the recipes (one row each; a miss names the cheapest recipe that fits) and
    the verdict on the configured recipe with the gin bindings of the cheapest change."""
    device = plans[0].device_gb
    first = next((p for p in plans if p.fits), None)
    lines = [
        f"recipes on {ranks} x {device:g} GiB (micro batch capped at {plans[0].micro_cap}; "
        "predictions, GiB per rank):",
        "| recipe | trainable | model states | activations/sample | largest micro | GiB/rank "
        "| fits |",
        "|---|---|---|---|---|---|---|",
    ]
    for p in plans:
        verdict = "yes" if p.fits else f"no: {first.recipe.name} fits" if first else "no"
        lines.append(
            f"| {p.recipe.name} | {p.counts.trainable:,} | {p.states.planned:.2f} | "
            f"{p.per_sample_gb:.3f} | {p.largest_micro} | {p.total_gb:.1f} (micro {p.micro}) | "
            f"{verdict} |"
        )
    mine = next((p for p in plans if p.recipe == configured), None)
    if mine is None:
        return lines
    head = f"configured recipe ({mine.recipe.name}): "
    if mine.fits:
        lines.append(f"{head}fits up to micro batch {mine.micro} ({mine.total_gb:.1f} GiB per "
                     "rank there)")  # fmt: skip
    elif first is None:
        lines.append(f"{head}DOES NOT FIT ({mine.total_gb:.1f} GiB at micro 1) and no recipe "
                     f"fits {ranks} x {device:g} GiB; use more or larger devices")  # fmt: skip
    else:
        change = " ".join(f"--gin_param '{b}'" for b in first.recipe.bindings(factory))
        lines.append(f"{head}DOES NOT FIT ({mine.total_gb:.1f} GiB at micro 1); cheapest change "
                     f"that fits: {first.recipe.name} ({change}): {first.total_gb:.1f} GiB at "
                     f"micro {first.micro}")  # fmt: skip
    return lines


# ---- zero_stage = "auto": the fastest configuration that fits --------------------------------

# Relative throughput of each choice (samples/s, 1.0 = ZeRO-0 without offload or checkpointing).
# ZeRO-3: OpenTau's π0.5 on 8 x A100-80GB at 16 samples per GPU, 13.0 samples/s against ZeRO-2's
# 24.2 (0.54 of it); stages 0-2 move the same gradient bytes per step (all-reduce, or
# reduce-scatter + all-gather), stage 1/2 a little bookkeeping more. Offloading the optimizer runs
# Adam on the host and moves gradients and weights across PCIe each step; offloading the
# parameters moves them for every layer's use. Gradient checkpointing recomputes the forward:
# 4 passes of work instead of 3. A micro batch m keeps the device busy m / (m + 2) of the time
# (a fixed launch and communication cost of about two samples' compute per micro-batch).
STAGE_SPEED = {0: 1.0, 1: 0.98, 2: 0.95, 3: 0.54}
OFFLOAD_OPTIMIZER_SPEED = 0.5
OFFLOAD_PARAM_SPEED = 0.25
CHECKPOINTING_SPEED = 0.75
MICRO_HALF = 2
# name -> (ranks, GiB per device)
HARDWARE = {
    "910b": (8, 64.0),
    "910b4": (8, 32.0),
    "a100": (8, 80.0),
    "h100": (8, 80.0),
    "24gb": (1, 24.0),
}


def stage_model_states(
    counts: ParamCounts, ranks: int, stage: int, offload_optimizer: bool = False,
    offload_param: bool = False,
) -> ModelStates:  # fmt: skip
    """Per-rank model states at ZeRO ``stage`` (bf16 weights, fp32 master and Adam states).
    Stage 3: ``zero3_model_states``. Stages 0-2 keep every weight whole (2 B/param); stage 1
    partitions the fp32 master and Adam states (12 B per trained parameter over the ranks),
    stage 2 the bf16 gradients too; stage 0 (DeepSpeed's bf16 optimizer) partitions the states
    like stage 1 but keeps whole bf16 gradients and their float32 accumulation (6 B per trained
    parameter). The optimizer offload (stages 1-3) moves the float32 states to the host; the
    parameter offload is ZeRO-3's."""
    if stage == 3:
        return zero3_model_states(counts, ranks, offload_optimizer, offload_param)
    if stage not in (0, 1, 2):
        raise RecapError(f"plan_memory: zero stage {stage}; use 0, 1, 2 or 3")
    if offload_param or (offload_optimizer and stage == 0):
        raise RecapError(f"plan_memory: ZeRO-{stage} cannot offload "
                         f"{'parameters' if offload_param else 'the optimizer'}")  # fmt: skip
    if ranks < 1:
        raise RecapError(f"plan_memory: ranks {ranks} must be >= 1")
    grads = (6 if stage == 0 else BYTES_GRAD) * counts.trainable / (ranks if stage == 2 else 1)
    optimizer = 0.0 if offload_optimizer else BYTES_OPTIM * counts.trainable / ranks
    params = BYTES_PARAM * counts.total
    total = (params + grads + optimizer) / GIB
    return ModelStates(params / GIB, grads / GIB, optimizer / GIB, 0.0, total)


@dataclasses.dataclass(frozen=True)
class Choice:
    """One configuration the auto planner weighs: its memory per rank and predicted speed."""

    recipe: str
    stage: int
    offload_optimizer: bool
    offload_param: bool
    checkpointing: bool
    micro: int
    states: ModelStates
    per_sample_gb: float
    device_gb: float
    reserve_gb: float = 4.0

    @property
    def total_gb(self) -> float:
        return self.states.planned + self.reserve_gb + self.per_sample_gb * self.micro

    @property
    def fits(self) -> bool:
        return self.micro >= 1 and self.total_gb <= self.device_gb

    @property
    def speed(self) -> float:
        """Predicted samples/s relative to ZeRO-0 at an unbounded micro batch (see
        ``STAGE_SPEED``)."""
        speed = STAGE_SPEED[self.stage] * self.micro / (self.micro + MICRO_HALF)
        if self.offload_param:
            speed *= OFFLOAD_PARAM_SPEED
        elif self.offload_optimizer:
            speed *= OFFLOAD_OPTIMIZER_SPEED
        return speed * (CHECKPOINTING_SPEED if self.checkpointing else 1.0)

    def describe(self) -> str:
        offload = "optimizer offload" if self.offload_optimizer else "no offload"
        offload = "parameter + optimizer offload" if self.offload_param else offload
        return (f"{self.recipe}, ZeRO-{self.stage}, {offload}, gradient checkpointing "
                f"{'on' if self.checkpointing else 'off'}, micro batch {self.micro}: "
                f"{self.total_gb:.1f} GiB of {self.device_gb:g} per rank (model states "
                f"{self.states.planned:.1f} + activations {self.per_sample_gb * self.micro:.1f} + "
                f"reserve {self.reserve_gb:g}), relative throughput {self.speed:.2f}")  # fmt: skip

    def bindings(self, checkpointing_flag: str | None = None) -> list[str]:
        """The gin bindings of the choice; ``checkpointing_flag``: the model's gin parameter
        that turns gradient checkpointing on (e.g. ``pi05_policy.gradient_checkpointing``)."""
        out = [f"{checkpointing_flag} = {self.checkpointing}"] if checkpointing_flag else []
        out += [f"deepspeed_config.zero_stage = {self.stage}",
               f"deepspeed_config.micro_batch_size = {self.micro}",
               f"deepspeed_config.offload_optimizer = {self.offload_optimizer}"]  # fmt: skip
        if self.offload_param:
            out.append('deepspeed_config.offload_param = "cpu"')
        return out


def micro_batches(global_batch: int, ranks: int, cap: int) -> list[int]:
    """Micro batches that keep ``global_batch`` whole (divisors of global / ranks), <= ``cap``."""
    if global_batch % ranks:
        return list(range(1, cap + 1))
    per_rank = global_batch // ranks
    return [m for m in range(1, min(cap, per_rank) + 1) if per_rank % m == 0]


def choices(
    counts: ParamCounts, activations: Activations, ranks: int, device_gb: float,
    global_batch: int, micro_cap: int, recipe: str = "as configured", reserve_gb: float = 4.0,
    checkpointing: Sequence[bool] = (False, True),
) -> list[Choice]:  # fmt: skip
    """Every stage x offload x checkpointing at its largest micro batch that fits (micro 1 when
    none does), fastest first (ties: less memory)."""
    out = []
    micros = micro_batches(global_batch, ranks, micro_cap)
    offloads = [(False, False), (True, False), (True, True)]
    for stage in (0, 1, 2, 3):
        for offload_optimizer, offload_param in offloads:
            if (offload_param and stage != 3) or (offload_optimizer and stage == 0):
                continue
            states = stage_model_states(counts, ranks, stage, offload_optimizer, offload_param)
            for ckpt in checkpointing:
                if ckpt and activations.checkpointed is None:
                    continue
                per_sample = activations.gib_per_sample(ckpt)
                made = [Choice(recipe, stage, offload_optimizer, offload_param, ckpt, m, states,
                               per_sample, device_gb, reserve_gb) for m in micros]  # fmt: skip
                fitting = [c for c in made if c.fits]
                out.append(fitting[-1] if fitting else made[0])
    return sorted(out, key=lambda c: (not c.fits, -c.speed, c.total_gb))


def choose(
    counts_by_recipe: dict[str, ParamCounts], activations: Activations, ranks: int,
    device_gb: float, global_batch: int, micro_cap: int, reserve_gb: float = 4.0,
    checkpointing: Sequence[bool] = (False, True),
) -> list[Choice]:  # fmt: skip
    """The auto planner: the fastest configuration that fits, then the runner-up, ... For the
    first recipe of ``counts_by_recipe`` (the configured trained parameters) when any of its
    configurations fits; else the next (LoRA, then LoRA + frozen vision: what fewer trained
    parameters buy). Empty when nothing fits at all."""
    for recipe, counts in counts_by_recipe.items():
        acts = activations.without_vision() if "frozen vision" in recipe else activations
        ranked = choices(counts, acts, ranks, device_gb, global_batch, micro_cap, recipe,
                         reserve_gb, checkpointing)  # fmt: skip
        fitting = [c for c in ranked if c.fits]
        if fitting:
            return fitting
    return []


def format_choice(
    ranked: list[Choice], ranks: int, device_gb: float, checkpointing_flag: str | None = None
) -> list[str]:
    """The auto planner's lines: the choice, its bindings and the runner-up."""
    if not ranked:
        return [f'zero_stage = "auto" on {ranks} x {device_gb:g} GiB: no configuration fits; '
                "use more or larger devices"]  # fmt: skip
    best = ranked[0]
    lines = [f'zero_stage = "auto" on {ranks} x {device_gb:g} GiB: {best.describe()}',
             "  bindings: " + " ".join(f"--gin_param '{b}'"
                                      for b in best.bindings(checkpointing_flag))]  # fmt: skip
    if len(ranked) > 1:
        lines.append(f"  runner-up: {ranked[1].describe()}")
    return lines


def auto_stage(
    counts: ParamCounts, ranks: int, device_gb: float, micro: int, per_sample_gb: float,
    offload_optimizer: bool, reserve_gb: float = 4.0,
) -> Choice | None:  # fmt: skip
    """What a training run with ``zero_stage = "auto"`` uses: the fastest stage (0-3, and the
    optimizer offload when it is asked for) that fits at the configured micro batch and
    checkpointing (``per_sample_gb``: activations per sample as configured); None when none
    fits."""
    acts = Activations(per_sample_gb, None, "training run")
    ranked = choices(counts, acts, ranks, device_gb, micro * ranks, micro, "as configured",
                     reserve_gb, (False,))  # fmt: skip
    fitting = [c for c in ranked if c.fits and c.micro == micro and not c.offload_param
               and c.offload_optimizer == offload_optimizer]  # fmt: skip
    return fitting[0] if fitting else None

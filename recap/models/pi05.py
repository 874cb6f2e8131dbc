"""Step 4 policy: π0.5 (openpi ``PI0Pytorch(pi05=True)``) trained by flow matching, sampled with
classifier-free guidance between the advantage-conditioned and the plain prompt.

Prefix = per camera ``(image_size / patch_size)**2`` SigLIP tokens through
``multi_modal_projector.linear`` (no rescaling), then the prompt's Gemma embeddings (scaled by
sqrt(width)). π0.5 has no state token: the (quantile-normalized, 256-bin discretized) state is
part of the prompt text (``recap.processing.prompts.pi05_prompt``), as in openpi. Suffix =
``action_in_proj(x_t)``, one token per action step; the flow time t enters only the expert's
adaptive norms through cond = silu(time_mlp_out(silu(time_mlp_in(sinusoid(t))))), sinusoid
periods 4e-3 .. 4 (``pi05_layers``).

Training (``forward``): t = Beta(1.5, 1) * 0.999 + 0.001, eps ~ N(0, I),
x_t = t eps + (1 - t) a, u = eps - a, loss = masked mean of (v_theta(x_t, t) - u)^2 per example.
Sampling (``sample_actions``): Euler from t = 1 to 0, x <- x - v / num_steps, with
v = v_u + beta (v_g - v_u) at every step, v_g from the "Advantage: positive" prompt
(``guidance="positive"``) or the "Advantage: negative" one (``"negative"``, RLinf's definition:
the same combination with the negative prompt); ``"no_guide"`` is v_u alone. beta = 1 runs only
the guidance branch, beta = 0 only the plain one, otherwise both run as one stacked batch over one
prefix KV cache.

Batch keys: ``images`` float[B, C, 3, S, S] in [-1, 1] (cameras base, left wrist, right wrist);
``image_masks`` bool[B, C]; ``input_ids`` int64[B, L] / ``attention_mask`` bool[B, L] (the
training prompt, or at inference the conditional one); ``uncond_input_ids`` /
``uncond_attention_mask`` (plain prompt, CFG with beta != 1 only); ``neg_input_ids`` /
``neg_attention_mask`` (the negative prompt, ``guidance="negative"`` only); ``actions``
float[B, H, A] (normalized, padded to A = 32; training); ``action_mask`` bool broadcastable to
[B, H, A] (optional: False at padded steps/dims); ``conditional`` bool[B] (optional: the prompt
carries the advantage text; per-branch loss metrics).

Precision (``Pi05Config.openpi_precision``, on by default): the text embeddings are scaled by
``math.sqrt(width)`` in float32 (transformers rounds the scale to the weights' dtype first), and
``build_pi05`` / ``set_precision`` with a low-precision dtype keep openpi's float32 modules
(``FP32_MODULES``: SigLIP patch/position embeddings, every input/post-attention norm, the final
norms) and cast the rest. DeepSpeed's bf16 mode casts every parameter to bf16 (its ZeRO
partitions are flat buffers of one dtype) and keeps float32 masters in the optimizer, so under the
engine the policy applies to the text scale and the norms' float32 arithmetic; the float32 module
weights apply where the model runs without DeepSpeed (inference, evaluation, export loading).
"""

from __future__ import annotations

import dataclasses
import fnmatch
import json
import math
import os
from collections.abc import Sequence
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file
from torch import nn
from transformers import AutoModel, GemmaConfig, SiglipVisionConfig

from recap.configurable import config_fields, configurable
from recap.errors import RecapError
from recap.models.adapters import AdapterHooks, LoraOptions, adapt, check_freeze
from recap.models.losses import flow_matching_loss
from recap.models.pi05_files import (
    CONFIG_FILE,
    GEMMA_300M,
    PALIGEMMA_2B,
    RECAP_CONFIG_FILE,
    WEIGHTS_FILE,
    check_layout,
    detect_layout,
    load_strict,
    save_pi05,
    steps_hint,
    to_model_keys,
    variant_fields,
)
from recap.models.pi05_layers import (
    ATTENTION,
    ActionExpert,
    PaliGemmaWithExpert,
    Prefix,
    VisionTower,
    time_embedding,
)
from recap.models.value import SIGLIP_SO400M_224, example_inputs, with_layers
from recap.processing.pi05 import BRANCH_KEYS, GUIDANCE, guidance_branches  # noqa: F401
from recap.processing.prompts import POSITIVE_ONLY
from recap.processing.transforms import frames_to_images

# GemmaConfig arguments ``Pi05Config.expert_config`` sets itself (an ``expert`` key among them
# would be a second value for one keyword)
EXPERT_FROM_TEXT = ("vocab_size", "pad_token_id", "bos_token_id", "eos_token_id", "rms_norm_eps",
                    "hidden_act")  # fmt: skip
SHARED_HEADS = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim")
# openpi ``to_bfloat16_for_selected_params``: modules kept in float32 under bf16 (fnmatch on names)
FP32_MODULES = (
    "*.vision_model.embeddings.patch_embedding", "*.vision_model.embeddings.position_embedding",
    "*.input_layernorm", "*.post_attention_layernorm", "*.language_model.norm",
    "*.gemma_expert.model.norm",
)  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Pi05Config:
    """Sizes and flow-matching constants. ``vision``: SigLIP vision config dict; ``text``: Gemma
    config dict of the PaliGemma decoder; ``expert``: the action expert's Gemma sizes (depth,
    heads, kv heads and head dim must equal the decoder's: attention is shared per layer)."""

    vision: dict = dataclasses.field(default_factory=lambda: dict(SIGLIP_SO400M_224))
    text: dict = dataclasses.field(default_factory=lambda: dict(PALIGEMMA_2B))
    expert: dict = dataclasses.field(default_factory=lambda: dict(GEMMA_300M))
    action_dim: int = 32
    action_horizon: int = 50
    num_steps: int = 10
    min_period: float = 4e-3
    max_period: float = 4.0
    time_alpha: float = 1.5
    time_beta: float = 1.0
    time_scale: float = 0.999
    time_offset: float = 0.001
    attn_implementation: str = "sdpa"
    gradient_checkpointing: bool = False
    augment_images: bool = True  # openpi augmentation of uint8 ``frames`` batches in training
    openpi_precision: bool = True  # float32 text scale; FP32_MODULES kept float32 (module doc)

    def vision_config(self) -> SiglipVisionConfig:
        config = SiglipVisionConfig.from_dict({**self.vision, "vision_use_head": False})
        config._attn_implementation = self.attn_implementation
        return config

    def text_config(self) -> GemmaConfig:
        config = GemmaConfig.from_dict(dict(self.text))
        config._attn_implementation = self.attn_implementation
        return config

    def expert_config(self) -> GemmaConfig:
        """The expert's Gemma config: its sizes, the decoder's norm eps and activation."""
        text = self.text_config()
        return GemmaConfig(vocab_size=1, pad_token_id=None, bos_token_id=None, eos_token_id=None,
                           **self.expert, rms_norm_eps=text.rms_norm_eps,
                           hidden_act=text.hidden_act)  # fmt: skip

    def validate(self) -> None:
        """Raise ``RecapError`` when the parts cannot share attention."""
        text, expert = self.text_config(), self.expert_config()
        problems = [f"expert {k} {getattr(expert, k)} != text {k} {getattr(text, k)}"
                    for k in SHARED_HEADS if getattr(expert, k) != getattr(text, k)]  # fmt: skip
        if self.attn_implementation not in ATTENTION:
            problems.append(f"attn_implementation {self.attn_implementation!r} not in {ATTENTION}")
        if expert.hidden_size % 2:
            problems.append(f"expert hidden_size {expert.hidden_size} must be even")
        if problems:
            raise RecapError(f"pi05 config: {'; '.join(problems)}; fix the sizes")

    # ---- recap.engine.protocol.MemoryProbe: what recap-plan-memory measures ----------------

    def memory_depths(self) -> dict[str, int]:
        """The SigLIP tower's depth and the decoder's (the expert shares it, layer by layer)."""
        return {"vision": self.vision["num_hidden_layers"],
                "decoder": self.text["num_hidden_layers"]}  # fmt: skip

    def memory_scaled(self, depths: dict[str, int], vocab_size: int) -> Pi05Config:
        decoder = depths["decoder"]
        text = with_layers({**self.text, "vocab_size": vocab_size}, decoder)
        vision = with_layers(self.vision, depths["vision"])
        expert = with_layers(self.expert, decoder)
        return dataclasses.replace(self, vision=vision, text=text, expert=expert)

    def memory_build(self, dtype: torch.dtype) -> Pi05Policy:
        return build_pi05(self, dtype=dtype)

    def example_batch(
        self, cameras: int, prompt_tokens: int, batch_size: int, vocab_size: int
    ) -> dict[str, torch.Tensor]:
        batch = example_inputs(self.vision, cameras, prompt_tokens, batch_size, vocab_size)
        actions = torch.randn(batch_size, self.action_horizon, self.action_dim)
        return batch | {"actions": actions}

    def set_checkpointing(self, model: nn.Module, enabled: bool) -> bool:
        model.paligemma_with_expert.gradient_checkpointing = enabled
        return True


class Pi05Policy(AdapterHooks, nn.Module):
    """π0.5 flow-matching policy; ``loss, metrics = model(batch)`` (engine protocol).

    State-dict keys are openpi's (``paligemma_with_expert.…``, ``action_in_proj``, …); see
    ``recap.models.checkpoints`` for loading/saving openpi and LeRobot files.
    """

    def __init__(self, config: Pi05Config, vision_tower: nn.Module, language_model: nn.Module):
        super().__init__()
        config.validate()
        self.config = config
        width = config.expert_config().hidden_size
        linear = nn.Linear(vision_tower.config.hidden_size, language_model.config.hidden_size)
        projector = nn.ModuleDict({"linear": linear})
        self.paligemma_with_expert = PaliGemmaWithExpert(
            VisionTower(vision_tower), projector, language_model,
            ActionExpert(config.expert_config()), config.attn_implementation,
        )  # fmt: skip
        self.paligemma_with_expert.gradient_checkpointing = config.gradient_checkpointing
        self.action_in_proj = nn.Linear(config.action_dim, width)
        self.action_out_proj = nn.Linear(width, config.action_dim)
        self.time_mlp_in = nn.Linear(width, width)
        self.time_mlp_out = nn.Linear(width, width)
        freeze_unreachable(language_model)
        self.text_scale: float | None = None
        if config.openpi_precision:  # scale in float32 here, not rounded to the weights' dtype
            embed = language_model.embed_tokens
            self.text_scale = math.sqrt(language_model.config.hidden_size)
            embed.scalar_embed_scale = 1.0
            with torch.no_grad():
                embed.embed_scale.fill_(1.0)
        # float32 patch/position embeddings feed the encoder in its own dtype
        siglip = getattr(vision_tower, "vision_model", vision_tower)  # transformers 4 / 5 layout
        if hasattr(siglip, "encoder"):
            siglip.encoder.register_forward_pre_hook(_inputs_to_own_dtype, with_kwargs=True)

    # ---- training ------------------------------------------------------------------------

    def forward(
        self,
        batch: dict[str, torch.Tensor],
        noise: torch.Tensor | None = None,
        time: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """``(loss float32[B], metrics)``; ``noise`` float[B, H, A] and ``time`` float[B] are
        drawn (N(0, I); Beta(1.5, 1) * 0.999 + 0.001) unless given, as arguments or as batch
        keys ``noise`` / ``time`` (data that fixes them: tests, benchmarks)."""
        noise = batch.get("noise") if noise is None else noise
        time = batch.get("time") if time is None else time
        batch = self.with_images(batch)
        actions = batch["actions"].float()
        noise = torch.randn_like(actions) if noise is None else noise.float()
        time = self.sample_time(actions.shape[0], actions.device) if time is None else time
        t = time.float()[:, None, None]
        x_t = t * noise + (1 - t) * actions
        prefix = self.embed_prefix(
            batch["images"], batch["image_masks"], batch["input_ids"], batch["attention_mask"]
        )
        velocity = self.velocity(prefix, x_t, time)
        loss = flow_matching_loss(velocity, noise, actions, batch.get("action_mask"))
        conditional = batch.get("conditional")
        metrics = {} if conditional is None else branch_metrics(loss, conditional, self.training)
        return loss, metrics

    def sample_time(self, n: int, device: torch.device | str | None = None) -> torch.Tensor:
        """float32[n]: Beta(alpha, beta) * scale + offset; Beta(alpha, 1) as U^(1/alpha)."""
        c = self.config
        if c.time_beta == 1.0:
            draw = torch.rand(n, device=device) ** (1.0 / c.time_alpha)
        else:
            dist = torch.distributions.Beta(torch.tensor(c.time_alpha), torch.tensor(c.time_beta))
            draw = dist.sample((n,)).to(device)
        return draw * c.time_scale + c.time_offset

    # ---- embeddings ----------------------------------------------------------------------

    def with_images(self, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``batch`` with ``images`` from uint8 ``frames`` [B, C, S, S, 3] when it has no
        ``images`` (``frames_to_images``: augmented in training when ``augment_images``)."""
        if "images" in batch or "frames" not in batch:
            return batch
        train = self.training and self.config.augment_images
        dtype = self.action_in_proj.weight.dtype
        return {**batch, "images": frames_to_images(batch["frames"], train).to(dtype)}

    def embed_images(
        self, images: torch.Tensor, image_masks: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tokens float[B, C' * T, W], valid bool[B, C' * T])`` of the camera slots used by
        any example (a slot masked for the whole batch changes nothing and is skipped)."""
        keep = image_masks.bool().any(0)
        images, masks = images[:, keep], image_masks.bool()[:, keep]
        batch, cams = masks.shape
        parts = self.paligemma_with_expert.paligemma["model"]
        proj = parts["multi_modal_projector"]["linear"]
        if cams == 0:
            width = proj.out_features
            return images.new_zeros(batch, 0, width, dtype=proj.weight.dtype), masks
        pixels = images.flatten(0, 1).to(proj.weight.dtype)
        tokens = proj(parts["vision_tower"](pixels).to(proj.weight.dtype))
        per_image = tokens.shape[1]
        return tokens.reshape(batch, cams * per_image, -1), masks.repeat_interleave(per_image, 1)

    def embed_prefix(self, images, image_masks, input_ids, attention_mask) -> Prefix:
        """Image tokens then text tokens (module docstring) with their validity."""
        tokens, valid = self.embed_images(images, image_masks)
        return self.prefix_from(tokens, valid, input_ids, attention_mask)

    def prefix_from(self, image_tokens, image_valid, input_ids, attention_mask) -> Prefix:
        text = self.paligemma_with_expert.language_model.embed_tokens(input_ids)
        if self.text_scale is not None:  # openpi: emb * math.sqrt(width), float32 arithmetic
            text = (text.float() * self.text_scale).to(text.dtype)
        embeds = torch.cat([image_tokens.to(text.dtype), text], dim=1)
        return Prefix(embeds, torch.cat([image_valid, attention_mask.bool()], dim=1))

    def embed_suffix(
        self, x_t: torch.Tensor, time: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(tokens float[B, H, We], cond float[B, We])``: action_in_proj(x_t) and the time MLP
        over the sinusoidal embedding of ``time`` float[B]."""
        dtype = self.action_in_proj.weight.dtype
        c = self.config
        emb = time_embedding(time, self.time_mlp_in.in_features, c.min_period, c.max_period)
        cond = F.silu(self.time_mlp_out(F.silu(self.time_mlp_in(emb.to(dtype)))))
        return self.action_in_proj(x_t.to(dtype)), cond

    def velocity(self, prefix: Prefix, x_t: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
        """float32[B, H, A] v_theta(x_t, t) with prefix and actions in one joint pass."""
        suffix, cond = self.embed_suffix(x_t, time)
        return self._out(self.paligemma_with_expert.joint(prefix, suffix, cond))

    def _out(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.action_out_proj(hidden.to(self.action_out_proj.weight.dtype)).float()

    # ---- sampling ------------------------------------------------------------------------

    @torch.no_grad()
    def sample_actions(
        self,
        batch: dict[str, torch.Tensor],
        noise: torch.Tensor | None = None,
        beta: float = 1.0,
        num_steps: int | None = None,
        use_cache: bool = True,
        guidance: str = "positive",
        positive_only: bool = False,
    ) -> torch.Tensor:
        """float32[B, H, A] normalized actions: Euler steps from ``noise`` (t = 1) to t = 0 with
        the guided velocity ``v = v_u + beta (v_g - v_u)`` (RLinf ``(1 - w) v_u + w v_g``).

        ``guidance`` (RLinf ``guidance_type``): ``"positive"``: v_g from ``input_ids`` (the
        "Advantage: positive" prompt); ``"negative"``: v_g from ``neg_input_ids`` (the
        "Advantage: negative" prompt), refused when ``positive_only`` (the policy was trained
        with ``positive_only_conditional``, so it never saw that prompt); ``"no_guide"``: v_u
        alone (the plain prompt ``uncond_input_ids``; ``beta`` ignored). beta = 1 runs only the
        guidance branch, beta = 0 only the plain one. ``use_cache=False`` recomputes the prefix
        at every step (the reference the cache must equal)."""
        batch = self.with_images(batch)
        images, masks = batch["images"], batch["image_masks"]
        n = images.shape[0]
        steps = num_steps or self.config.num_steps
        shape = (n, self.config.action_horizon, self.config.action_dim)
        x = torch.randn(shape, device=images.device) if noise is None else noise.float()
        prompts = guidance_prompts(batch, beta, guidance, positive_only)
        tokens, valid = self.embed_images(images, masks)
        reps = len(prompts)
        ids, text_mask = stack_prompts(prompts)
        prefix = self.prefix_from(tokens.repeat(reps, 1, 1), valid.repeat(reps, 1), ids, text_mask)
        velocity = self._cached_velocity(prefix) if use_cache else self.velocity
        for k in range(steps):
            time = torch.full((n * reps,), 1.0 - k / steps, device=x.device)
            v = velocity(prefix, x.repeat(reps, 1, 1), time)
            if reps == 2:
                v_guide, v_uncond = v.chunk(2)
                v = v_uncond + beta * (v_guide - v_uncond)
            x = x - v / steps
        return x

    def _cached_velocity(self, prefix: Prefix):
        """v_theta(x_t, t) reading the prefix keys/values computed once here."""
        cache = self.paligemma_with_expert.prefix_cache(prefix)

        def velocity(prefix: Prefix, x_t: torch.Tensor, time: torch.Tensor) -> torch.Tensor:
            suffix, cond = self.embed_suffix(x_t, time)
            hidden = self.paligemma_with_expert.suffix_with_cache(cache, prefix, suffix, cond)
            return self._out(hidden)

        return velocity

    # ---- eval and I/O --------------------------------------------------------------------

    def summarize_eval(self, outputs: dict[str, torch.Tensor]) -> dict[str, float]:
        """Per-branch losses over the whole eval set and their ratio (needs ``conditional``;
        a branch without examples is left out)."""
        if "conditional" not in outputs:
            return {}
        stats = branch_metrics(outputs["loss"].float(), outputs["conditional"].bool(), True)
        out = {k: float(stats[k].mean()) for k in ("loss_conditional", "loss_unconditional")
               if stats[k].numel()}  # fmt: skip
        return out | ({"loss_ratio": float(stats["loss_ratio"])} if len(out) == 2 else {})

    def save_pretrained(self, directory: str | os.PathLike, layout: str = "openpi") -> None:
        """Write ``model.safetensors`` in the openpi or LeRobot key layout plus configs."""
        save_pi05(self, directory, layout)


def _prompt(batch: dict[str, torch.Tensor], which: str, why: str) -> tuple:
    keys = BRANCH_KEYS[which]
    if any(k not in batch for k in keys):
        raise RecapError(
            f"sample_actions: {why} needs batch keys {'/'.join(keys)} (the {which} prompt); "
            "build them with the policy's processor (Pi05Processor.obs_to_batch)"
        )
    return tuple(batch[k] for k in keys)


def guidance_prompts(
    batch: dict[str, torch.Tensor], beta: float, guidance: str = "positive",
    positive_only: bool = False,
) -> list[tuple]:  # fmt: skip
    """The prompt batches whose velocities are combined (``sample_actions``), in the order of
    ``recap.processing.pi05.guidance_branches``: [guide] for beta = 1, [plain] for beta = 0 or
    ``no_guide``, else [guide, plain]."""
    try:
        branches = guidance_branches(beta, guidance, POSITIVE_ONLY if positive_only else None)
    except RecapError as exc:
        raise RecapError(f"sample_actions: {exc}") from None
    why = f"guidance={guidance!r} beta={beta}"
    return [_prompt(batch, branch, why) for branch in branches]


def stack_prompts(prompts: list[tuple]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(ids int64[k * B, L], mask bool[k * B, L])``: prompt batches right-padded to one L."""
    length = max(ids.shape[1] for ids, _ in prompts)
    ids = [F.pad(i, (0, length - i.shape[1])) for i, _ in prompts]
    masks = [F.pad(m.bool(), (0, length - m.shape[1])) for _, m in prompts]
    return torch.cat(ids), torch.cat(masks)


def branch_metrics(loss: torch.Tensor, conditional: torch.Tensor, per_branch: bool) -> dict:
    """``conditional`` float[B] (1 = advantage text in the prompt) and, when ``per_branch``
    (training), ``loss_conditional`` float[n_c] / ``loss_unconditional`` float[n_u] (the losses
    of each branch's examples: averaged over examples, they give exact branch means across
    micro-batches and ranks) and ``loss_ratio`` float[] = mean_c / mean_u of this batch (1 when a
    branch is absent from it). Eval reads ``conditional`` only (``summarize_eval``)."""
    cond = conditional.bool().to(loss.device)
    out = {"conditional": cond.float()}
    if per_branch:
        lc, lu = loss.detach()[cond], loss.detach()[~cond]
        both = lc.numel() > 0 and lu.numel() > 0
        ratio = lc.mean() / lu.mean().clamp_min(1e-12) if both else loss.new_tensor(1.0)
        out |= {"loss_conditional": lc, "loss_unconditional": lu, "loss_ratio": ratio}
    return out


def freeze_unreachable(language_model: nn.Module) -> None:
    """Freeze decoder parameters the action loss cannot reach: the final norm and, in the last
    layer, everything but what projects keys/values (suffix tokens read only those)."""
    language_model.norm.requires_grad_(False)
    last = language_model.layers[-1]
    for module in (last.self_attn.q_proj, last.self_attn.o_proj, last.post_attention_layernorm,
                   last.mlp):  # fmt: skip
        module.requires_grad_(False)


def _inputs_to_own_dtype(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Forward pre-hook: floating inputs cast to the dtype of ``module``'s parameters."""
    dtype = next(module.parameters()).dtype

    def cast(x):
        return x.to(dtype) if torch.is_tensor(x) and x.is_floating_point() else x

    return tuple(cast(a) for a in args), {k: cast(v) for k, v in kwargs.items()}


def keeps_fp32(name: str) -> bool:
    """Module ``name`` is one openpi keeps in float32 under bf16 (``FP32_MODULES``)."""
    return any(fnmatch.fnmatchcase(name, pattern) for pattern in FP32_MODULES)


def set_precision(model: Pi05Policy, dtype: torch.dtype) -> Pi05Policy:
    """Cast ``model`` to ``dtype``; with ``config.openpi_precision`` and a dtype below float32,
    the ``FP32_MODULES`` stay float32 (openpi's bf16 policy; their forwards cast). Returns it."""
    model.to(dtype)
    if model.config.openpi_precision and dtype in (torch.bfloat16, torch.float16):
        for name, module in model.named_modules():
            if keeps_fp32(name):
                module.float()
    return model


def build_pi05(config: Pi05Config, dtype: torch.dtype = torch.float32) -> Pi05Policy:
    """Randomly initialized policy of ``dtype`` (``set_precision``); SigLIP and the Gemma
    decoder come from transformers ``from_config`` (so ZeRO-3 partitions them at construction)."""
    config.validate()
    vision = AutoModel.from_config(config.vision_config(), dtype=dtype)
    text = AutoModel.from_config(config.text_config(), dtype=dtype)
    return set_precision(Pi05Policy(config, vision, text), dtype)


@configurable()
@config_fields(Pi05Config, vision=SiglipVisionConfig, text=GemmaConfig,
               expert=(GemmaConfig, EXPERT_FROM_TEXT))  # fmt: skip
def pi05_policy(
    checkpoint: str | None = None,
    layout: str | None = None,
    variant: str | None = None,
    lora: LoraOptions | None = None,
    freeze: Sequence[str] = (),
    **fields,
) -> Pi05Policy:
    """Gin entry point: a local openpi/LeRobot/recap checkpoint directory, or (``checkpoint``
    None) random init from ``Pi05Config`` ``fields`` (default: the real sizes). ``variant``
    names an openpi config (``pi05_base``, ``pi05_libero``, ...) for checkpoints that carry no
    config file (openpi's training checkpoints); ``fields`` still win. ``lora``
    (``@LoraOptions()``) and ``freeze`` (towers: ``vision``, ``language_model``, ``expert``,
    ``projector``): ``recap.models.adapters``. Each ``Pi05Config`` field is a parameter gin
    checks at parse time (``config_fields``), as are the keys of ``vision`` / ``text`` /
    ``expert`` (``SiglipVisionConfig`` / ``GemmaConfig`` arguments)."""
    freeze = check_freeze(freeze, "pi05_policy.freeze")
    if checkpoint is not None:
        model = load_pi05(checkpoint, layout=layout, variant=variant, **fields)
    else:
        model = build_pi05(Pi05Config(**variant_fields(variant) | fields))
    return adapt(model, lora, freeze)


# ---- checkpoints (the files: recap.models.pi05_files) --------------------------------------------


def read_config(
    directory: str | os.PathLike, variant: str | None = None, **overrides
) -> Pi05Config:
    """The config of a checkpoint directory: ``recap_pi05.json`` (exact), else the openpi /
    LeRobot ``config.json`` (horizon, action dim, steps, image resolution) with the sizes of
    ``model.safetensors``' shapes (``recap.models.pi05_sizes``: read from its header, one log
    line when they are not the variants' ``gemma_2b`` + ``gemma_300m``; other variant names
    only with weights), else, for an openpi training checkpoint (``<step>/model.safetensors``
    and no config file, as ``scripts/train_pytorch.py`` writes it), the named openpi
    ``variant`` (``pi05_base``, ``pi05_libero``, ...) with the caller's sizes (gin
    ``pi05_policy.*``) on top, the real ones by default. ``overrides`` replace fields (e.g.
    ``action_horizon``, ``attn_implementation``; sizes passed are never read from the
    weights)."""
    path = Path(directory)
    if (path / RECAP_CONFIG_FILE).is_file():
        fields = json.loads((path / RECAP_CONFIG_FILE).read_text())
        known = {f.name for f in dataclasses.fields(Pi05Config)}
        return Pi05Config(**{k: v for k, v in fields.items() if k in known} | overrides)
    if not (path / CONFIG_FILE).is_file():
        if (path / WEIGHTS_FILE).is_file():  # an openpi training checkpoint
            return Pi05Config(**variant_fields(variant) | overrides)
        raise RecapError(
            f"{path}: no {RECAP_CONFIG_FILE}, {CONFIG_FILE} or {WEIGHTS_FILE}{steps_hint(path)}; "
            "point it at an openpi / LeRobot π0.5 checkpoint directory or pass a Pi05Config"
        )
    raw = json.loads((path / CONFIG_FILE).read_text())
    variants = (raw.get("paligemma_variant"), raw.get("action_expert_variant"))
    weights = path / WEIGHTS_FILE
    if variants != ("gemma_2b", "gemma_300m") and not weights.is_file():
        raise RecapError(f"{path / CONFIG_FILE}: paligemma_variant/action_expert_variant "
                         f"{variants} not supported (expected ('gemma_2b', 'gemma_300m')); "
                         "pass a Pi05Config with the sizes")  # fmt: skip
    fields = {"text": dict(PALIGEMMA_2B), "expert": dict(GEMMA_300M)}
    for ours, theirs in (("action_horizon", ("action_horizon", "chunk_size")),
                         ("action_dim", ("action_dim", "max_action_dim")),
                         ("num_steps", ("num_inference_steps",))):  # fmt: skip
        value = next((raw[k] for k in theirs if k in raw), None)
        if value is not None:
            fields[ours] = int(value)
    config = Pi05Config(**fields | overrides)
    if "image_resolution" in raw and "vision" not in overrides:
        config.vision["image_size"] = int(raw["image_resolution"][0])
    if weights.is_file():  # the sizes the names cannot say, from the tensors' shapes
        from recap.models.pi05_sizes import SIZE_FIELDS, weights_sizes

        implied = {k: getattr(config, k) for k in SIZE_FIELDS if k not in overrides}
        stated = {"image_size": (raw.get("image_resolution") or [None])[0],
                  "action_dim": fields.get("action_dim")}  # fmt: skip
        read = weights_sizes(weights, implied, stated, path / CONFIG_FILE)
        config = dataclasses.replace(config, **read)
    return config


def load_pi05(
    directory: str | os.PathLike,
    config: Pi05Config | None = None,
    layout: str | None = None,
    dtype: torch.dtype = torch.float32,
    **overrides,
) -> Pi05Policy:
    """A policy from a local openpi / LeRobot / ``save_pi05`` directory or an openpi training
    checkpoint step directory (sizes from ``overrides`` then, see ``read_config``); layout
    detected from the keys unless given, weights cast to ``dtype``; strict (``load_strict``)."""
    path = Path(directory)
    weights = path / WEIGHTS_FILE
    if not weights.is_file():
        raise RecapError(f"{weights}: file not found{steps_hint(path)}; point it at a local "
                         "π0.5 checkpoint directory holding model.safetensors (openpi or "
                         "LeRobot)")  # fmt: skip
    config = config or read_config(path, **overrides)
    state = load_file(str(weights))
    layout = check_layout(layout or detect_layout(state))
    model = build_pi05(config, dtype)
    load_strict(model, to_model_keys(state, layout), weights, layout)
    return model


def count_parameters(config: Pi05Config | None = None) -> int:
    """Parameters of the policy of ``config`` (default: the real sizes, ~3.3B), built on the
    meta device (nothing allocated)."""
    with torch.device("meta"):
        model = build_pi05(config or Pi05Config())
    return sum(p.numel() for p in model.parameters())

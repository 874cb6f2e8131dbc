"""A π0.5 policy behind openpi's observation/reply conventions, with guidance.

``ServedPolicy.prepare(obs)`` checks one decoded observation against what the policy expects and
turns it into model inputs (CPU work, per request); ``ServedPolicy.infer_batch(requests)`` runs
the requests that arrived together, one ``sample_actions`` call per distinct beta, and returns
each request's actions unnormalized to the robot's action space; ``ServedPolicy.infer(obs)`` is
both for one observation (what the server computes for that request, called in-process).

Observation (openpi's keys; ``ServeSpec`` names them): each camera key (default
``observation/image`` base, ``observation/wrist_image`` wrist) uint8 [H, W, 3] (or [3, H, W]),
resized with padding to the model's size (``ServeSpec.strict_shapes``: any other size than the
model's ``image_size`` square is refused instead); ``observation/state`` float[D] with D the state
statistics' size, finite (required when the policy puts the state into its prompt, else checked
when present); ``prompt`` a string of at most ``max_prompt_chars`` characters and
``max_tokens`` tokens once the prompt is built. Optional per request: ``beta`` (a finite number
>= 0, the guidance strength; the server's when absent) and ``noise_seed`` (an integer: the
request's noise is ``torch.randn(H, A)`` of a generator seeded with it, so a reply can be
reproduced; absent, noise comes from the server's seeded generator). A field may also be nested
(``{"observation": {"image": ...}}``). Anything else is a ``RequestError`` whose message starts
with the field's name.

Everything between the request and the model is the policy's processor (``Pi05Processor``, read
from the directory by ``recap.loading.load_policy``): camera slots (the ``image_keys`` in order),
the normalization formula and statistics, the prompt in its style with the binned state and the
label at its position, the guidance branches a request's beta needs (v = v_plain + beta
(v_guided - v_plain); beta = 1 computes only the guided branch) and the sampling steps. A
behaviour-cloning policy (``conditioning="none"`` or ``"filtered"``) has one prompt and is served
at beta 1.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from recap.errors import RecapError
from recap.models.pi05 import Pi05Policy
from recap.processing.pi05 import BRANCH_KEYS, Pi05Processor, check_guidance
from recap.processing.transforms import pad_token_rows
from recap.serve.wire import find_bad
from recap.serve.wire import lookup as _lookup

log = logging.getLogger(__name__)

MAX_IMAGE_SIDE = 4096
MAX_SEED = 2**63 - 1
MAX_FIELD_NAME = 80


class RequestError(ValueError):
    """A request the server refuses; ``str()`` is one line starting with the field's name."""

    def __init__(self, field_name: str, message: str):
        if len(field_name) > MAX_FIELD_NAME:  # a client-chosen key is echoed back: bound it
            field_name = field_name[: MAX_FIELD_NAME - 3] + "..."
        self.field = field_name
        super().__init__(f"{field_name}: {message}")


@dataclass
class ServeSpec:
    """The observation keys and limits of a served policy."""

    image_keys: tuple[str, ...] = ("observation/image", "observation/wrist_image")
    state_key: str = "observation/state"
    prompt_key: str = "prompt"
    beta_key: str = "beta"
    seed_key: str = "noise_seed"
    max_prompt_chars: int = 512
    max_tokens: int = 200
    strict_shapes: bool = False  # refuse images that are not image_size x image_size


@dataclass
class Prepared:
    """One validated request: model inputs of one example."""

    frames: torch.Tensor  # uint8[NUM_CAMERAS, S, S, 3]
    image_mask: torch.Tensor  # bool[NUM_CAMERAS]
    prompts: dict[str, list[int]]  # "positive" / "negative" / "plain" -> token ids (BOS first)
    beta: float
    noise: torch.Tensor | None  # float32[H, A] when the request carried noise_seed
    received: float = field(default_factory=time.monotonic)


def _describe(value: object) -> str:
    if isinstance(value, np.ndarray):
        return f"{value.dtype} {list(value.shape)}"
    return type(value).__name__


class ServedPolicy:
    """A loaded π0.5 policy and its processor, behind openpi's request conventions
    (``load_served`` builds one). ``guidance`` and ``num_steps`` default to the processor's."""

    def __init__(
        self,
        model: Pi05Policy,
        processor: Pi05Processor,
        *,
        beta: float = 1.5,
        guidance: str | None = None,
        num_steps: int | None = None,
        spec: ServeSpec | None = None,
        device: torch.device | str = "cpu",
        seed: int = 0,
        info: dict | None = None,
    ):
        guidance = check_guidance(guidance or processor.guidance, processor.conditioning,
                                  "--guidance")  # fmt: skip
        self.spec = spec or ServeSpec()
        if len(self.spec.image_keys) > processor.num_slots or not self.spec.image_keys:
            raise RecapError(
                f"--image-keys: {len(self.spec.image_keys)} cameras; the policy has "
                f"1 to {processor.num_slots} camera slots"
            )
        self.device = torch.device(device)
        self.model = model.to(self.device).eval()
        self.processor = processor
        self.processor.load_tokenizer()  # vocabulary and BOS checked before serving
        self.guidance, self.conditioning = guidance, processor.conditioning
        if num_steps is not None and num_steps < 1:
            raise RecapError(f"--num-steps: {num_steps} must be >= 1")
        self.num_steps = num_steps or processor.num_steps
        try:
            self.beta = self.check_beta(beta, "--beta")
        except RequestError as exc:
            raise RecapError(str(exc)) from None
        config = model.config
        self.image_size = processor.image_size
        self.horizon, self.model_action_dim = config.action_horizon, config.action_dim
        self.action_dim, self.state_dim = processor.robot_action_dim, processor.state_dim
        if self.action_dim > self.model_action_dim:
            raise RecapError(
                f"norm stats: {self.action_dim} action dims exceed the model's "
                f"{self.model_action_dim}; use the policy's own statistics"
            )
        self.generator = torch.Generator().manual_seed(int(seed))
        self.info = dict(info or {})

    @property
    def tokenizer(self):
        """The processor's tokenizer (loaded)."""
        return self.processor.load_tokenizer()

    @property
    def stats(self) -> dict:
        """``{"state", "action"}`` normalization statistics (the processor's)."""
        return {"state": self.processor.state_stats, "action": self.processor.action_stats}

    # ---- validation -------------------------------------------------------------------

    def check_beta(self, beta: object, name: str = "beta") -> float:
        if isinstance(beta, np.generic):
            beta = beta.item()
        if isinstance(beta, bool) or not isinstance(beta, int | float):
            raise RequestError(name, f"expected a number, got {_describe(beta)}")
        if not math.isfinite(beta) or beta < 0:
            raise RequestError(name, f"{beta!r} must be finite and >= 0")
        return self.processor.check_beta(beta)  # 1 for one prompt: nothing to contrast

    def _image(self, obs: dict, key: str) -> torch.Tensor:
        """uint8[1, H, W, 3]: the request's camera image ``key``, checked (``RequestError``)."""
        value = _lookup(obs, key)
        if value is None:
            raise RequestError(key, "missing (a uint8 [H, W, 3] camera image)")
        if not isinstance(value, np.ndarray) or value.dtype != np.uint8 or value.ndim != 3:
            raise RequestError(key, f"expected uint8 [H, W, 3], got {_describe(value)}")
        if value.shape[-1] != 3 and value.shape[0] == 3:
            value = value.transpose(1, 2, 0)  # openpi also accepts channels first
        h, w, c = value.shape
        if c != 3 or not (1 <= h <= MAX_IMAGE_SIDE and 1 <= w <= MAX_IMAGE_SIDE):
            raise RequestError(
                key,
                f"expected uint8 [H, W, 3] with 1 <= H, W <= "
                f"{MAX_IMAGE_SIDE}, got {_describe(value)}",
            )
        size = self.processor.image_size
        if self.spec.strict_shapes and (h, w) != (size, size):
            raise RequestError(
                key, f"{h}x{w} image refused (--strict-shapes): send {size}x{size}, the model's "
                "image_size",
            )  # fmt: skip
        return torch.from_numpy(np.ascontiguousarray(value)[None].copy())

    def _state(self, obs: dict) -> np.ndarray | None:
        key = self.spec.state_key
        value = _lookup(obs, key)
        if value is None:
            if self.processor.state_in_prompt:
                raise RequestError(key, f"missing (float[{self.state_dim}] robot state)")
            return None
        if (
            not isinstance(value, np.ndarray)
            or value.dtype.kind not in "fiu"
            or value.shape != (self.state_dim,)
        ):
            raise RequestError(key, f"expected float[{self.state_dim}], got {_describe(value)}")
        state = value.astype(np.float64)
        if not np.isfinite(state).all():
            bad = int(np.flatnonzero(~np.isfinite(state))[0])
            raise RequestError(key, f"non-finite value {state[bad]} at index {bad}")
        return state

    def _prompt(self, obs: dict) -> str:
        key = self.spec.prompt_key
        value = _lookup(obs, key)
        if value is None:
            raise RequestError(key, "missing (the task text)")
        if not isinstance(value, str):
            raise RequestError(key, f"expected a string, got {_describe(value)}")
        if not value.strip():
            raise RequestError(key, "empty")
        if len(value) > self.spec.max_prompt_chars:
            raise RequestError(
                key,
                f"{len(value)} characters exceed the limit of "
                f"{self.spec.max_prompt_chars} (--max-prompt-chars)",
            )
        return value

    def _tokens(self, prompt: tuple[str, ...]) -> list[int]:
        tokens = self.processor.prompt_tokens(prompt)
        if len(tokens) > self.spec.max_tokens:
            raise RequestError(
                self.spec.prompt_key,
                f"{len(tokens)} tokens once built exceed "
                f"the limit of {self.spec.max_tokens} (--max-tokens)",
            )
        return tokens

    def branches(self, beta: float) -> tuple[str, ...]:
        """The prompts a request at ``beta`` needs (``Pi05Processor.branches``)."""
        return self.processor.branches(beta, self.guidance)

    def prepare(self, obs: dict) -> Prepared:
        """Validate one decoded observation (``RequestError`` naming the field) and build its
        model inputs."""
        if not isinstance(obs, dict):
            raise RequestError(
                "frame", f"expected a map of observation fields, got {type(obs).__name__}"
            )
        bad = find_bad(obs)
        if bad is not None:
            raise RequestError(bad[0] or "frame", bad[1].reason)
        keys = self.spec.image_keys
        images = {key: self._image(obs, key) for key in keys}  # validated, in key order
        frames, mask = self.processor.pack(images, keys)  # [1, slots, ...]: the keys' order
        state = self._state(obs)
        task = self._prompt(obs)
        beta = obs.get(self.spec.beta_key)
        beta = self.beta if beta is None else self.check_beta(beta, self.spec.beta_key)
        seed = obs.get(self.spec.seed_key)
        noise = None
        if seed is not None:
            if isinstance(seed, np.generic):
                seed = seed.item()
            if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= MAX_SEED:
                raise RequestError(
                    self.spec.seed_key, f"expected an integer in [0, 2**63), got {_describe(seed)}"
                )
            noise = self.noise(seed)
        normalized = None
        if state is not None and self.processor.state_in_prompt:
            normalized = self.processor.normalize_state(state)
        prompts = self.processor.branch_prompts(task, normalized, self.branches(beta))
        prompts = {b: self._tokens(prompt) for b, prompt in prompts.items()}
        return Prepared(frames[0], mask[0], prompts, beta, noise)

    def noise(self, seed: int | None) -> torch.Tensor:
        """float32[H, A]: the noise of a request carrying ``noise_seed = seed``; without one,
        the next draw of the server's own generator."""
        generator = self.generator if seed is None else torch.Generator().manual_seed(int(seed))
        return torch.randn((self.horizon, self.model_action_dim), generator=generator)

    # ---- inference --------------------------------------------------------------------

    def model_batch(self, group: Sequence[Prepared]) -> dict[str, torch.Tensor]:
        """The ``sample_actions`` batch of requests sharing one beta."""
        batch = {
            "frames": torch.stack([p.frames for p in group]),
            "image_masks": torch.stack([p.image_mask for p in group]),
        }
        for name in group[0].prompts:
            ids_key, mask_key = BRANCH_KEYS[name]
            batch[ids_key], batch[mask_key] = pad_token_rows([p.prompts[name] for p in group])
        return {k: v.to(self.device) for k, v in batch.items()}

    @torch.no_grad()
    def infer_batch(self, requests: Sequence[Prepared]) -> list[np.ndarray]:
        """float32[H, action dims] per request, in order; one forward per distinct beta."""
        out: list[np.ndarray | None] = [None] * len(requests)
        by_beta: dict[float, list[int]] = {}
        for i, request in enumerate(requests):
            by_beta.setdefault(request.beta, []).append(i)
        for beta, index in by_beta.items():
            group = [requests[i] for i in index]
            noise = torch.stack([self.noise(None) if p.noise is None else p.noise for p in group])
            batch = self.model_batch(group)
            actions = self.processor.sample(self.model, batch, noise.to(self.device), beta,
                                            self.num_steps, self.guidance)  # fmt: skip
            for j, i in enumerate(index):
                out[i] = actions[j].astype(np.float32)
        return out  # type: ignore[return-value]

    def infer(self, obs: dict) -> dict[str, np.ndarray]:
        """``{"actions": float32[H, action dims]}`` for one observation (in-process)."""
        return {"actions": self.infer_batch([self.prepare(obs)])[0]}

    def metadata(self) -> dict:
        """What the server reports on connect and at ``/healthz``."""
        return {
            **self.info,
            "beta": self.beta,
            "guidance": self.guidance,
            "conditioning": self.conditioning,
            "prompt_style": self.processor.prompt_style,
            "state_in_prompt": self.processor.state_in_prompt,
            "label_position": self.processor.label_position,
            "normalization": self.processor.normalization,
            "num_steps": self.num_steps,
            "image_size": self.image_size,
            "images": (
                "must be image_size x image_size (--strict-shapes)"
                if self.spec.strict_shapes
                else "resized with padding to image_size (aspect ratio kept)"
            ),
            "strict_shapes": self.spec.strict_shapes,
            "device": str(self.device),
            "action_horizon": self.horizon,
            "action_dim": self.action_dim,
            "state_dim": self.state_dim,
            "image_keys": list(self.spec.image_keys),
            "state_key": self.spec.state_key,
            "prompt_key": self.spec.prompt_key,
            "max_prompt_chars": self.spec.max_prompt_chars,
            "max_tokens": self.spec.max_tokens,
        }

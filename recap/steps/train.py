"""Train a model on the DeepSpeed engine: the step behind ``scripts/train.py``.

Everything comes from gin (see ``gin/engine.gin`` and ``gin/demo/toy.gin``): the model factory
(``train.model_fn``, e.g. ``@toy_model``; later the value model and the policy), the dataset
factories, the loop options, ``deepspeed_config.*`` and ``Tracker.*``. Run the same command again
and it resumes from the run directory's latest checkpoint.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import recap.data.datasets  # noqa: F401  (declares value_data)
import recap.data.policy_data  # noqa: F401  (declares policy_data)
import recap.models.pi05  # noqa: F401  (declares pi05_policy: gin/policy.gin wires both)
import recap.models.toy  # noqa: F401  (declares toy_model / toy_data)
import recap.models.value  # noqa: F401  (declares value_model)
from recap import logs
from recap.configurable import REQUIRED, check_given, configurable, configured
from recap.engine import distributed
from recap.engine.deepspeed_config import EngineConfig, check_nvme_offload
from recap.engine.trainer import FitResult, LoopOptions, fit
from recap.errors import RecapError
from recap.tracking import Tracker

log = logs.get(__name__)
# Code version in the fingerprints of this step's stages: bump it when its results change (those
# stages and the ones after them rerun); tests check it against recap/workflow/code_versions.json.
STEP_VERSION = "1"


@configurable("train")
@dataclass(frozen=True)
class TrainConfig(LoopOptions):
    """The training step's settings (gin ``train.*``; the engine's own: ``deepspeed_config.*``):
    the loop's options (``recap.engine.trainer.LoopOptions``: intervals in steps, 0 meaning
    only at the last step; checkpoints kept, seed, eval batch size, workers; ``step_name``: the
    progress bar's label and the MLflow run's ``recap.step`` tag) and what the loop trains.

    Args:
        run_dir: checkpoints, exported weights and the processor; a rerun resumes from it.
        max_steps: optimizer steps.
        model_fn: builds the model (e.g. ``@toy_model``, ``@value_model``, ``@pi05_policy``).
        data_fn, eval_data_fn: return the training and evaluation data, or a data config whose
            ``build()`` makes it (``@value_data``, ``@policy_data``); the training data vets
            the model it will feed (``check_model``) and carries the processor saved beside
            the weights.
    """

    run_dir: str | Path = REQUIRED
    max_steps: int = REQUIRED
    model_fn: Callable = REQUIRED
    data_fn: Callable = REQUIRED
    eval_data_fn: Callable | None = None

    def __post_init__(self):
        check_given(self)
        if self.max_steps < 1:
            raise RecapError(f"gin config: train.max_steps={self.max_steps}; set it to a "
                             "positive integer")  # fmt: skip
        object.__setattr__(self, "run_dir", Path(self.run_dir))


def train(config: TrainConfig) -> FitResult:
    """Train ``model_fn()`` on ``data_fn()`` for ``max_steps`` optimizer steps (resumable)."""
    c = config
    ds_config = configured(EngineConfig)().build(
        world_size=distributed.env_world_size(), max_steps=c.max_steps
    )
    check_nvme_offload(ds_config["zero_optimization"].get("offload_param", {}).get("device", ""))
    train_data = built_data(c.data_fn())
    eval_data = built_data(c.eval_data_fn()) if c.eval_data_fn is not None else None
    check = getattr(train_data, "check_model", None)  # the data vets the model it will feed
    built: dict = {}

    def build():
        model = c.model_fn()
        if check is not None:
            check(model)
        built["config"] = getattr(model, "config", None)
        return model

    result = fit(build, train_data, eval_data, ds_config, c, configured(Tracker)())
    save_processor(train_data, built.get("config"), c.run_dir)
    final = {**result.train_metrics, **result.eval_metrics}
    shown = ", ".join(f"{k} {v:.5g}" for k, v in final.items() if "loss" in k)
    log.info(f"{c.step_name}: step {result.step}; {shown}; weights in {result.export_path}")
    return result


def built_data(made: object) -> object:
    """What a ``data_fn`` returned, built when it is a data config (``ValueDataConfig``,
    ``PolicyDataConfig``: ``build()``); a dataset as it is (``toy_data``)."""
    build = getattr(made, "build", None)
    return build() if callable(build) else made


def save_processor(train_data, model_config, run_dir: Path) -> None:
    """Write the training data's processor (``Pi05Processor``, ``ValueProcessor``) beside the
    exported weights (rank 0), completed with what only the model knows (sampling steps,
    vocabulary): ``load_policy`` / ``load_value`` then need the run directory alone. A policy's
    statistics also go to openpi's ``assets/<export_asset>/norm_stats.json`` when the data
    names an asset (``policy_data.export_stats``)."""
    processor = getattr(train_data, "processor", None)
    if processor is None or not distributed.is_main():
        return
    processor = processor.for_model(model_config)
    processor.save(run_dir)
    asset = getattr(train_data, "export_asset", None)
    if asset is not None:
        from recap.processing.norm_stats import write_norm_stats

        stats = {"state": processor.state_stats, "action": processor.action_stats}
        write_norm_stats(run_dir, asset, stats)
    from recap.loading import VALUE_CONFIG_FILE
    from recap.models.checkpoints import RECAP_CONFIG_FILE
    from recap.models.pi05 import Pi05Config
    from recap.models.value import ValueModelConfig

    files = {Pi05Config: RECAP_CONFIG_FILE, ValueModelConfig: VALUE_CONFIG_FILE}
    name = files.get(type(model_config))
    if name is not None:  # the sizes, so the run loads without gin
        import dataclasses
        import json

        from recap.io import write_atomic

        text = json.dumps(dataclasses.asdict(model_config), indent=2)
        write_atomic({run_dir / name: lambda tmp: tmp.write_text(text)})
    log.info(f"processor written to {run_dir / 'processor.json'}")

"""``recap.configurable``: library code declares its configurables and says where a call takes
its settings from the configuration; gin is bound to it at the edge (``recap.registry``)."""

from __future__ import annotations

import dataclasses
import pickle
import subprocess
import sys

import gin
import pytest

from recap import registry
from recap.cli import parse_gin
from recap.config_check import check_required
from recap.configurable import (
    DECLARED,
    REQUIRED,
    bound,
    check_given,
    config_class,
    config_entries,
    configurable,
    configured,
    declared_name,
)
from recap.errors import RecapError


@configurable("probe_scale")
def probe_scale(x: float = 1.0, factor: float = 2.0, name: str = REQUIRED) -> tuple:
    """A configurable of this test."""
    return x * factor, name


@configurable()
class ProbeOptions:
    def __init__(self, rank: int = 4, alpha: float = 1.0):
        self.rank, self.alpha = rank, alpha


def test_a_declared_function_is_returned_unchanged_and_gin_binds_it_at_the_edge():
    assert DECLARED["probe_scale"] is probe_scale and declared_name(probe_scale) == "probe_scale"
    gin.clear_config()
    try:
        parse_gin([], ["probe_scale.factor = 10.0", "probe_scale.name = 'bound'"])
        assert probe_scale(3.0, name="direct") == (6.0, "direct")  # a plain call: no injection
        assert configured(probe_scale)(3.0) == (30.0, "bound")
        assert configured(probe_scale)(3.0, factor=0.5) == (1.5, "bound")  # the caller wins
        assert bound("probe_scale.factor") == 10.0 and bound("probe_scale.x", -1) == -1
        assert config_entries() == [("probe_scale.factor", "10.0"), ("probe_scale.name", "'bound'")]
        assert registry.name_of(probe_scale) == "probe_scale"
        assert registry.declared(gin.get_configurable("probe_scale")) is probe_scale
    finally:
        gin.clear_config()


def test_a_declared_class_is_configured_and_stays_its_own_type():
    gin.clear_config()
    try:
        parse_gin([], ["ProbeOptions.rank = 16"])
        options = configured(ProbeOptions)(alpha=0.5)
        assert type(options) is ProbeOptions and (options.rank, options.alpha) == (16, 0.5)
        assert ProbeOptions().rank == 4
    finally:
        gin.clear_config()


def test_required_is_recaps_own_and_checked_before_a_call():
    assert repr(REQUIRED) == "REQUIRED"
    assert pickle.loads(pickle.dumps(REQUIRED)) is REQUIRED
    gin.clear_config()
    try:
        parse_gin([], ["probe_scale.factor = 10.0"])
        with pytest.raises(RecapError) as err:
            check_required(probe_scale)
        assert str(err.value) == (
            "probe_scale.name is required (not bound); bind it, e.g. "
            "--gin_param 'probe_scale.name = ...'"
        )
    finally:
        gin.clear_config()


def test_an_undeclared_object_is_its_own_configured_version():
    assert configured(len) is len


def test_a_bare_decorator_or_a_name_declared_twice_is_an_error():
    with pytest.raises(TypeError) as err:

        @configurable
        def bare():
            pass

    assert str(err.value).startswith("write @configurable() or @configurable('name'), not ")
    with pytest.raises(ValueError) as err:

        @configurable("probe_scale")
        def other():
            pass

    assert str(err.value) == (
        "configurable 'probe_scale' is declared twice: tests.test_configurable.probe_scale and "
        "tests.test_configurable.test_a_bare_decorator_or_a_name_declared_twice_is_an_error."
        "<locals>.other"
    )


def test_library_modules_import_no_gin_and_take_no_settings_without_the_edge():
    code = (
        "import sys\n"
        "import recap.steps.compute_returns, recap.steps.relabel, recap.tracking\n"
        "from recap.configurable import bound, configured, config_text\n"
        "from recap.steps.compute_returns import ReturnsConfig\n"
        "assert 'gin' not in sys.modules, 'gin imported'\n"
        "assert configured(ReturnsConfig) is ReturnsConfig\n"
        "assert bound('compute_returns.gamma', 0.5) == 0.5 and config_text() == ''\n"
        "import recap.registry\n"
        "assert configured(ReturnsConfig) is not ReturnsConfig\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "ok\n"


@configurable("probe_step")
@dataclasses.dataclass(frozen=True)
class ProbeStepConfig:
    datasets: list = REQUIRED
    gamma: float = 0.99

    def __post_init__(self):
        check_given(self)


def probe_step(config: ProbeStepConfig) -> float:
    return config.gamma * len(config.datasets)


def test_a_step_takes_its_config_dataclass_built_directly_or_from_the_configuration():
    assert probe_step(ProbeStepConfig(datasets=[1, 2], gamma=0.5)) == 1.0  # a plain call
    with pytest.raises(RecapError) as err:
        ProbeStepConfig(gamma=0.5)
    assert str(err.value) == (
        "probe_step.datasets is required; give ProbeStepConfig(datasets=...) or bind it, e.g. "
        "--gin_param 'probe_step.datasets = ...'"
    )
    with pytest.raises(dataclasses.FrozenInstanceError):
        ProbeStepConfig(datasets=[1]).gamma = 1.0  # type: ignore[misc]
    assert config_class(probe_step) is ProbeStepConfig
    with pytest.raises(TypeError) as err:
        config_class(probe_scale)
    assert str(err.value) == (
        "tests.test_configurable.probe_scale: a step takes one parameter, annotated with its "
        "config dataclass declared @configurable('<step name>')"
    )
    gin.clear_config()
    try:
        parse_gin([], ["probe_step.datasets = ['a', 'b', 'c']"])
        config = configured(ProbeStepConfig)()
        assert type(config) is ProbeStepConfig and probe_step(config) == pytest.approx(2.97)
        assert pickle.loads(pickle.dumps(config)) == config
    finally:
        gin.clear_config()


def test_every_step_takes_its_config_declared_under_the_steps_name():
    from recap.steps.compute_advantages import compute_advantages
    from recap.steps.compute_returns import compute_returns
    from recap.steps.evaluate_policy import evaluate_policy
    from recap.steps.relabel import relabel
    from recap.steps.train import train

    steps = [compute_advantages, compute_returns, evaluate_policy, relabel, train]
    assert {s.__name__: declared_name(config_class(s)) for s in steps} == {
        "compute_advantages": "compute_advantages",
        "compute_returns": "compute_returns",
        "evaluate_policy": "evaluate_policy",
        "relabel": "relabel",
        "train": "train",
    }
    assert [type(config_class(s)).__name__ for s in steps] == ["type"] * 5
    assert all(config_class(s).__dataclass_params__.frozen for s in steps)


def test_the_data_builders_and_the_engine_are_frozen_configs_that_build_what_they_configure():
    from recap.data.datasets import ValueDataConfig
    from recap.data.policy_data import PolicyDataConfig
    from recap.engine.deepspeed_config import EngineConfig
    from recap.engine.trainer import LoopOptions
    from recap.steps.train import built_data

    builders = {"value_data": ValueDataConfig, "policy_data": PolicyDataConfig,
                "deepspeed_config": EngineConfig}  # fmt: skip
    for name, config in builders.items():
        assert DECLARED[name] is config and config.__dataclass_params__.frozen
        assert callable(config.build)
    assert LoopOptions.__dataclass_params__.frozen
    built = EngineConfig(micro_batch_size=4, global_batch_size=16).build(world_size=2, max_steps=9)
    assert built["gradient_accumulation_steps"] == 2
    assert built["recap"]["schedule"]["total_steps"] == 9
    with pytest.raises(RecapError) as err:  # checked when the config is made
        EngineConfig(zero_stage=5)
    assert str(err.value) == 'gin config: deepspeed_config.zero_stage=5; use 0, 1, 2, 3 or "auto"'
    with pytest.raises(RecapError) as err:
        ValueDataConfig(datasets=[])
    assert str(err.value) == (
        "value_data.tokenizer_path is required; give ValueDataConfig(tokenizer_path=...) or bind "
        "it, e.g. --gin_param 'value_data.tokenizer_path = ...'"
    )
    with pytest.raises(RecapError) as err:  # checked when built from the files, too
        PolicyDataConfig(datasets=[], tokenizer_path="t", prompt_style="mine")
    assert str(err.value).startswith("policy_data.prompt_style: 'mine' is not one of [")
    data = [1, 2]
    assert built_data(data) is data  # a factory's dataset (toy_data) is used as it is

"""Stage fingerprints over the resolved config and the step's code version
(``recap.workflow.fingerprints``): canonical forms on a small configurable, then the demo
pipeline planned (gin only, nothing launched): binding defaults changes no fingerprint, a
changed default or ``STEP_VERSION`` reruns exactly the stages that read or run it and those
after them."""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import gin
import pytest

import recap.steps.compute_advantages
from recap import registry
from recap.config_resolve import bound_keys, resolved_config
from recap.errors import RecapError
from recap.workflow.code_versions import step_version
from recap.workflow.pipeline import load_pipeline, plan, split_params

DEMO = "demo/scratch.gin"


@gin.configurable
def fp_probe(
    lr=1e-3,
    betas=(0.9, 0.95),
    path=Path("runs/x"),
    model_fn=None,
    name=gin.REQUIRED,
    table=None,
    *args,
    **kwargs,
):
    """A configurable for the canonical forms below (never called)."""


@gin.configurable
def fp_inner(width=4):
    """Referenced by fp_probe.model_fn (never called)."""


def resolved(config: str) -> dict:
    gin.clear_config()
    try:
        gin.parse_config(config)
        return resolved_config(gin.config_str(max_line_length=10_000), ["fp_probe"], "probe")
    finally:
        gin.clear_config()


PROBE = {"lr": 0.001, "betas": [0.9, 0.95], "path": "runs/x", "model_fn": None,
         "name": {"gin": "REQUIRED"}, "table": None}  # fmt: skip


def test_unbound_parameters_count_with_their_defaults_in_canonical_form():
    assert resolved("") == {"fp_probe": PROBE}
    assert json.dumps(PROBE["lr"]) == "0.001"  # floats as their shortest repr


def test_binding_a_default_in_any_spelling_resolves_the_same():
    same = """
        fp_probe.lr = 0.001
        fp_probe.betas = [0.9, 0.95]       # a list for the tuple default
        fp_probe.path = "runs/x"           # a string for the Path default
        fp_probe.name = %gin.REQUIRED
        RATE = 1e-3
        fp_probe.table = None
        s/fp_probe.lr = %RATE              # a scope that resolves as the unscoped one: nothing
        Tracker.experiment = "elsewhere"   # where a run is logged: never counts
        UNUSED = 5                         # a macro no value reads: nothing
    """
    assert resolved(same) == {"fp_probe": PROBE}


def test_bound_values_scopes_macros_and_references_resolve():
    config = resolved(
        """
        WIDTH = 8
        fp_probe.lr = 3e-4
        fp_probe.kwargs_only = 1           # **kwargs: bound names count
        fp_probe.model_fn = @s/fp_inner
        fp_probe.table = {"b": (1, 2), "a": %WIDTH}
        s/fp_inner.width = %WIDTH
        s/fp_probe.name = "scoped"
        """
    )
    assert config == {
        "fp_probe": {**PROBE, "lr": 0.0003, "kwargs_only": 1, "model_fn": {"gin.ref": "s/fp_inner"},
                     "table": {"b": [1, 2], "a": 8}},
        "s/fp_probe": {**PROBE, "lr": 0.0003, "kwargs_only": 1, "name": "scoped",
                       "model_fn": {"gin.ref": "s/fp_inner"}, "table": {"b": [1, 2], "a": 8}},
        "fp_inner": {"width": 4},  # the reference's own parameters, default included
        "s/fp_inner": {"width": 8},
    }  # fmt: skip


def test_bound_keys_reads_scopes_and_skips_macros():
    text = "# Macros:\nDEMO = 'x'\n\n# Parameters for train:\nvalue/train.max_steps = 1\n"
    text += "recap.steps.train.train.seed = 0\n    continued = 3\n"
    assert bound_keys(text) == [("value", "train"), ("", "recap.steps.train.train")]


def test_a_default_that_has_no_canonical_form_is_one_line():
    @gin.configurable
    def fp_opaque(thing=object()):
        """Never called."""

    gin.clear_config()
    with pytest.raises(RecapError) as err:
        resolved_config("", ["fp_opaque"], "probe")
    assert str(err.value).startswith(
        "pipeline step probe: fingerprint: cannot write a object (<object object at 0x"
    )
    assert str(err.value).endswith("use a literal (number, string, list, dict) as the default")


def test_a_step_without_a_version_is_one_line():
    with pytest.raises(RecapError) as err:
        step_version("recap.steps.relabel")
    assert str(err.value) == (
        'recap.steps.relabel: no STEP_VERSION string; add STEP_VERSION = "1" (the code version '
        "in its stages' fingerprints) and run `python -m recap.workflow.lock --update`"
    )


# ---- the demo pipeline, planned ------------------------------------------------------------------


def fingerprints(*params: str) -> dict[str, str]:
    own, scoped = split_params(list(params))
    return {
        name: item.fingerprint for name, item in plan(load_pipeline([DEMO], own), scoped).items()
    }


@pytest.fixture(scope="module")
def base() -> dict[str, str]:
    return fingerprints()


def test_binding_parameters_to_their_defaults_leaves_every_fingerprint_unchanged(base):
    defaults = [
        "returns:compute_returns.failure_reward = -300.0",  # unbound in the demo: the default
        'returns:compute_returns.outcome_column = "is_success"',
        "advantages:compute_advantages.return_range = None",
        "advantages:compute_advantages.plot_episodes = 4",
        'policy:policy_data.label_position = "task"',
        "value:deepspeed_config.min_lr_ratio = 0.0",
        "value:deepspeed_config.betas = (0.9, 0.95)",  # engine.gin binds the list
        "value:value/train.seed = 0",  # a gin scope resolving as the unscoped train
        "all:LoraOptions.rank = 16",  # a configurable nothing binds
        "all:deepspeed_config.param_persistence_threshold = None",
        'evaluate:evaluate_policy.guidance = "positive"',
        "baseline:deepspeed_config.zero_stage = 1",  # bound already, to the same value
    ]
    assert fingerprints(*defaults) == base
    changed = fingerprints('policy:policy_data.label_position = "action"')
    assert {k for k in base if changed[k] != base[k]} == {"policy", "evaluate_policy"}


def test_changing_a_default_reruns_the_stages_reading_it_and_those_after(base, monkeypatch):
    config = registry.declared(gin.get_configurable("evaluate_policy"))  # EvaluateConfig
    init = config.__init__
    names = list(inspect.signature(init).parameters)
    defaults = list(init.__defaults__)
    defaults[names.index("max_steps") - (len(names) - len(defaults))] = 41  # was 40
    monkeypatch.setattr(init, "__defaults__", tuple(defaults))
    assert inspect.signature(config).parameters["max_steps"].default == 41
    changed = fingerprints()
    assert {k for k in base if changed[k] != base[k]} == {"evaluate_policy", "evaluate_baseline"}


def test_a_new_step_version_reruns_that_stage_and_its_dependents_only(base, monkeypatch):
    assert recap.steps.compute_advantages.STEP_VERSION == "1"
    monkeypatch.setattr(recap.steps.compute_advantages, "STEP_VERSION", "2")
    changed = fingerprints()
    assert {k for k in base if changed[k] != base[k]} == {
        "advantages",
        "policy",
        "evaluate_policy",
    }
    monkeypatch.setattr(recap.steps.compute_advantages, "STEP_VERSION", "1")
    assert fingerprints() == base  # and back

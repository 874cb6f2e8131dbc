"""gin.REQUIRED resolved before anything runs, and the LIBERO experiment files complete."""

from __future__ import annotations

import gin
import pytest

import recap.steps.compute_advantages  # noqa: F401
import recap.steps.compute_returns  # noqa: F401
import recap.steps.evaluate_policy  # noqa: F401
import recap.steps.train  # noqa: F401
import recap.workflow.iterate  # noqa: F401  (registers iterate)
import recap.workflow.pipeline  # noqa: F401  (registers pipeline)
from recap.cli import parse_gin
from recap.config_check import (
    check_required,
    macros_defined,
    macros_read,
    missing_required,
)
from recap.configurable import DECLARED, configured
from recap.errors import RecapError

LIBERO_BINDINGS = [
    'DATA = "/data/lerobot"',
    'SIGLIP = "/models/siglip"',
    'GEMMA = "/models/gemma3"',
    'TOKENIZER = "/models/paligemma_tokenizer.model"',
    'PI05_BASE = "/models/pi05_base"',
    'ADVANTAGES_TAG = "v1"',
]
# step -> (its gin file in experiments/libero_pipeline.gin, the configurable its command calls)
LIBERO_STEPS = {
    "returns": ("experiments/libero_returns.gin", "compute_returns"),
    "value": ("experiments/libero_value.gin", "train"),
    "advantages": ("experiments/libero_advantages.gin", "compute_advantages"),
    "policy": ("experiments/libero_pi05.gin", "train"),
    "baseline": ("experiments/libero_pi05_bc.gin", "train"),
}


@pytest.fixture(autouse=True)
def clean_gin():
    gin.clear_config()
    yield
    gin.clear_config()


def parsed(files, params=()):
    parse_gin(list(files), list(params))


def test_a_missing_macro_is_one_line_naming_parameter_and_macro():
    parsed(["experiments/libero_pi05.gin"], [b for b in LIBERO_BINDINGS if "TOKENIZER" not in b])
    with pytest.raises(RecapError) as err:
        check_required("train")
    assert str(err.value) == (
        "policy_data.tokenizer_path is required (macro TOKENIZER is %gin.REQUIRED); bind it, "
        "e.g. --gin_param 'TOKENIZER = ...'"
    )


def test_missing_step4_data_binding_is_named():
    # what experiments/libero_pi05.gin used to be: the engine and a model, no data
    parsed(["engine.gin"], ["train.model_fn = @pi05_policy", 'train.run_dir = "r"',
                            "train.max_steps = 1"])  # fmt: skip
    with pytest.raises(RecapError) as err:
        check_required("train", "pipeline step policy: ", "policy:")
    assert str(err.value) == (
        "pipeline step policy: train.data_fn is required (not bound); bind it, e.g. "
        "--gin_param 'policy:train.data_fn = ...'"
    )


def test_every_unbound_name_is_listed_once():
    parsed(["experiments/libero_pi05.gin"])
    with pytest.raises(RecapError) as err:
        check_required("train")
    assert str(err.value) == (
        "pi05_policy.checkpoint is required (macro PI05_BASE is %gin.REQUIRED); bind it, e.g. "
        "--gin_param 'PI05_BASE = ...'; also unbound: ADVANTAGES_TAG, DATA, TOKENIZER"
    )
    keys = [m.key for m in missing_required("train")]
    assert keys == [
        "pi05_policy.checkpoint",
        "policy_data.advantages_tag",
        "policy_data.checkpoint",  # PI05_BASE: the checkpoint's norm stats (norm_stats "auto")
        "policy_data.data_root",
        "policy_data.tokenizer_path",
        "eval/policy_data.advantages_tag",
        "eval/policy_data.checkpoint",
        "eval/policy_data.data_root",
        "eval/policy_data.tokenizer_path",
    ]


@gin.configurable
def check_inner(path: str = gin.REQUIRED, size: int = gin.REQUIRED):
    return path, size


@gin.configurable
def check_outer(inner_fn=check_inner, name: str = gin.REQUIRED):
    return inner_fn(), name


def test_references_inside_scopes_and_defaults_are_followed():
    # a configurable default (inner_fn = the configurable check_inner) is followed like a
    # reference; a scoped reference is followed in its scope
    gin.clear_config()
    gin.parse_config(["check_inner.size = 3"])
    assert {m.key for m in missing_required("check_outer")} == {
        "check_inner.path", "check_outer.name"}  # fmt: skip
    gin.parse_config(["check_outer.name = 'x'", "check_outer.inner_fn = @eval/check_inner",
                      "eval/check_inner.path = 'p'"])  # fmt: skip
    assert missing_required("check_outer") == []
    gin.parse_config(["eval/check_inner.size = %gin.REQUIRED"])
    assert [m.key for m in missing_required("check_outer")] == ["eval/check_inner.size"]
    gin.clear_config()


@pytest.mark.parametrize("step", sorted(LIBERO_STEPS))
def test_libero_steps_resolve_every_required_value(step):
    path, root = LIBERO_STEPS[step]
    parsed([path], LIBERO_BINDINGS + ['compute_advantages.tag = "v1"'])
    assert missing_required(root) == []


def test_every_libero_macro_is_read_by_some_step():
    defined, read = set(), set()
    for path, root in LIBERO_STEPS.values():
        gin.clear_config()
        parsed([path], LIBERO_BINDINGS)
        defined |= macros_defined()
        read |= macros_read(root)
    assert defined - read == set()
    assert {"DATA", "DATASETS", "EVAL_DATASETS", "TOKENIZER", "ADVANTAGES_TAG", "CONDITIONING",
            "MAX_PROMPT_TOKENS", "PI05_BASE", "SIGLIP", "GEMMA"} <= read  # fmt: skip


def macro_value(name: str):
    return gin.query_parameter(f"{name}/gin.macro.value")


def test_the_baseline_reads_no_advantage_text_and_the_policy_does():
    parsed(["experiments/libero_pi05_bc.gin"], LIBERO_BINDINGS)
    assert macro_value("CONDITIONING") == "none"
    assert "CONDITIONING" in macros_read("train")
    gin.clear_config()
    parsed(["experiments/libero_pi05.gin"], LIBERO_BINDINGS)
    assert macro_value("CONDITIONING") == "paper"


def test_a_step_command_refuses_before_it_runs(tmp_path, capsys):
    from recap.cli import run_command
    from recap.steps.train import train

    argv = ["--gin_file", "engine.gin", "--gin_param", "train.model_fn = @pi05_policy",
            "--gin_param", f'train.run_dir = "{tmp_path / "run"}"',
            "--gin_param", "train.max_steps = 1"]  # fmt: skip
    assert run_command(train, argv) == 2
    assert capsys.readouterr().err == (
        "error: train.data_fn is required (not bound); bind it, e.g. "
        "--gin_param 'train.data_fn = ...'\n"
    )
    assert not (tmp_path / "run").exists()


# ---- typed model factories: every binding name and size-dict key checked at parse time ---------


def error_of(files=(), params=()) -> str:
    gin.clear_config()
    with pytest.raises(RecapError) as err:
        parsed(files, params)
    return str(err.value)


def test_a_typod_model_size_binding_is_one_line_naming_the_nearest_fields(tmp_path):
    assert error_of(params=["value_model.expert_widht = 128"]) == (
        "gin config: value_model has no parameter 'expert_widht' (binding "
        "'value_model.expert_widht = 128'); nearest valid: expert_width, expert_depth, "
        "expert_style"
    )
    assert error_of(params=["pi05_policy.actoin_horizon = 10"]) == (
        "gin config: pi05_policy has no parameter 'actoin_horizon' (binding "
        "'pi05_policy.actoin_horizon = 10'); nearest valid: action_horizon"
    )
    path = tmp_path / "sizes.gin"
    path.write_text("value_model.expert_width = 64\nvalue_model.expert_mpl = 128\n")
    assert error_of(files=[str(path)]) == (
        f"gin config: value_model has no parameter 'expert_mpl' ({path} line 2: "
        "value_model.expert_mpl = 128); nearest valid: expert_mlp, expert_style, expert_depth"
    )
    assert error_of(params=["train.max_stepz = 3"]) == (  # every configurable alike
        "gin config: train has no parameter 'max_stepz' (binding 'train.max_stepz = 3'); "
        "nearest valid: max_steps"
    )


def test_an_unknown_key_in_a_size_dict_is_one_line_naming_the_nearest_keys():
    assert error_of(params=["pi05_policy.vision = {'hiden_size': 32}"]) == (
        "gin config: pi05_policy.vision has unknown key 'hiden_size' (not a SiglipVisionConfig "
        "argument); nearest valid: hidden_size, image_size, patch_size"
    )
    # Gemma3 calls it hidden_activation; any scope, macros resolved
    assert error_of(params=["ACT = 'gelu'", "value/value_model.text = {'hidden_act': %ACT}"]) == (
        "gin config: value/value_model.text has unknown key 'hidden_act' (not a Gemma3TextConfig "
        "argument); nearest valid: hidden_activation, hidden_size"
    )
    assert error_of(params=["pi05_policy.expert = {'hidden_size': 32, 'hidden_act': 'gelu'}"]) == (
        "gin config: pi05_policy.expert sets 'hidden_act', which pi05_policy sets itself; remove it"
    )
    assert error_of(params=["value_model.vision = [32]"]) == (
        "gin config: value_model.vision=[32]; bind a dict of SiglipVisionConfig arguments"
    )


def test_the_shipped_gin_files_and_size_dicts_parse():
    from recap.cli import GIN_DIR

    for path in sorted(GIN_DIR.glob("**/*.gin")):
        gin.clear_config()
        parsed([str(path)])
    gin.clear_config()
    parsed([], ["pi05_policy.vision = {'hidden_size': 32, 'model_type': 'siglip_vision_model'}",
                "pi05_policy.text = {'vocab_size': 32, 'hidden_act': 'gelu_pytorch_tanh'}",
                "value_model.text = {'hidden_activation': 'gelu_pytorch_tanh'}"])  # fmt: skip


def test_the_typed_factories_take_exactly_their_config_fields_and_pass_only_bound_ones():
    import dataclasses
    import inspect

    from recap.models.pi05 import Pi05Config, pi05_policy
    from recap.models.value import ValueModelConfig, value_model
    from tests.models import EXPERT, TEXT, VISION

    for fn, config, own in (
        (value_model, ValueModelConfig, ["siglip_path", "gemma_path", "lora", "freeze"]),
        (pi05_policy, Pi05Config, ["checkpoint", "layout", "variant", "lora", "freeze"]),
    ):
        fields = [f.name for f in dataclasses.fields(config)]
        assert set(inspect.signature(fn).parameters) == {*own, *fields}
    parsed([], [f"value_model.vision = {VISION!r}", f"value_model.text = {TEXT!r}",
                *(f"value_model.{k} = {v!r}" for k, v in EXPERT.items())])  # fmt: skip
    model = configured(value_model)()
    assert (model.config.expert_width, model.config.expert_mlp) == (16, 32)
    assert model.config.num_bins == ValueModelConfig.num_bins  # unbound: the config's default


def test_a_step_command_refuses_a_typod_size_before_it_runs(tmp_path, capsys):
    from recap.cli import run_command
    from recap.steps.train import train

    argv = ["--gin_file", "engine.gin", "--gin_param", "train.model_fn = @value_model",
            "--gin_param", f'train.run_dir = "{tmp_path / "run"}"',
            "--gin_param", "value_model.expert_widht = 64"]  # fmt: skip
    assert run_command(train, argv) == 2
    assert capsys.readouterr().err == (
        "error: gin config: value_model has no parameter 'expert_widht' (binding "
        "'value_model.expert_widht = 64'); nearest valid: expert_width, expert_depth, "
        "expert_style\n"
    )
    assert not (tmp_path / "run").exists()


def _decorated_configurables() -> dict[str, str]:
    """``{name: module}`` of every ``@configurable(...)`` (``recap.configurable``) in recap's
    source (read, not imported); a gin decorator or registration outside the registry fails."""
    import ast
    from pathlib import Path

    import recap

    root = Path(recap.__file__).parent
    found = {}
    for path in sorted(root.rglob("*.py")):
        module = ".".join(path.relative_to(root.parent).with_suffix("").parts)
        for node in ast.walk(ast.parse(path.read_text())):
            registers = ("configurable", "register", "external_configurable")
            if isinstance(node, ast.Attribute) and node.attr in registers:
                gin_call = isinstance(node.value, ast.Name) and node.value.id == "gin"
                assert module == "recap.registry" or not gin_call, path
            if not isinstance(node, ast.FunctionDef | ast.ClassDef):
                continue
            for deco in node.decorator_list:
                call = deco if isinstance(deco, ast.Call) else None
                if call and ast.unparse(call.func) == "configurable":
                    name = call.args[0].value if call.args else node.name
                    found[name] = module
    return found


def test_the_registry_knows_every_configurable_in_recap_and_its_module():
    from recap import registry

    assert registry.CONFIGURABLES == _decorated_configurables()
    assert len(registry.KNOWN) == 16
    registry.register_all()
    for name, module in registry.CONFIGURABLES.items():
        assert gin.get_configurable(name).__module__ == module, name
        assert registry.declared(gin.get_configurable(name)) is DECLARED[name], name


def test_the_registry_names_a_configurable_by_its_function():
    from recap import registry
    from recap.models.toy import toy_model
    from recap.steps.train import TrainConfig
    from recap.workflow.iterate import IterateConfig

    assert registry.name_of(toy_model) == "toy_model"
    assert registry.name_of(TrainConfig) == "train"  # a step's config, under the step's name
    assert registry.name_of(IterateConfig) == "iterate"
    assert registry.name_of(check_inner) == f"{__name__}.check_inner"  # not recap's: gin's name
    with pytest.raises(RecapError) as err:
        registry.name_of(len)
    assert str(err.value) == "gin: <built-in function len> is not a gin configurable"
    with pytest.raises(RecapError) as err:
        registry.register("trian")
    assert str(err.value).startswith("gin: 'trian' is not one of recap's configurables (")


def test_config_entries_are_the_bindings_and_macros_gin_writes():
    from recap.config_check import config_entries

    gin.clear_config()
    gin.parse_config(["A = 3", "check_inner.size = %A", "sc/check_inner.path = 'p'",
                      "check_outer.inner_fn = @sc/check_inner"])  # fmt: skip
    try:
        assert config_entries() == [("check_inner.size", "%A"), ("sc/check_inner.path", "'p'"),
                                    ("check_outer.inner_fn", "@sc/check_inner")]  # fmt: skip
        assert config_entries(macros=True) == [("A", "3")]
        assert macros_defined() == {"A"}
    finally:
        gin.clear_config()

"""gin.REQUIRED resolved before anything runs, and the LIBERO experiment files complete."""

from __future__ import annotations

import gin
import pytest

import recap.pipeline  # noqa: F401  (registers pipeline)
import recap.steps.compute_advantages  # noqa: F401
import recap.steps.compute_returns  # noqa: F401
import recap.steps.evaluate_policy  # noqa: F401
import recap.steps.train  # noqa: F401
from recap.cli import parse_gin
from recap.config_check import (
    KNOWN_CONFIGURABLES,
    check_required,
    macros_defined,
    macros_read,
    missing_required,
)
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
        check_required("train", "pipeline step policy: ", "policy/")
    assert str(err.value) == (
        "pipeline step policy: train.data_fn is required (not bound); bind it, e.g. "
        "--gin_param 'policy/train.data_fn = ...'"
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


def test_references_inside_scopes_and_defaults_are_followed():
    # evaluate_policy's defaults are the configurables pi05_policy / policy_data themselves
    parsed(["policy.gin"], ["pi05_policy.checkpoint = None", 'train.run_dir = "r"'])
    assert {m.key for m in missing_required("evaluate_policy")} == {
        "policy_data.advantages_tag",
        "policy_data.datasets",
        "policy_data.tokenizer_path",
    }


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


def test_known_configurables_are_exactly_recaps():
    from gin import config as gin_config

    registered = {e.name for _, e in gin_config._REGISTRY.items() if e.module.startswith("recap")}
    assert registered == set(KNOWN_CONFIGURABLES)


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

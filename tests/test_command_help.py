"""Every command's --help says what each argument is, its default and its choices (#39)."""

from __future__ import annotations

import argparse

import pytest

from recap import cli
from recap.commands import collect, import_rlinf, init, make_demo_data, plan_memory, serve, sweep
from recap.workflow import iterate, pipeline


def parsers() -> dict[str, argparse.ArgumentParser]:
    out = {"recap-collect": collect.parser(), "recap-demo-data": make_demo_data.build_parser(),
           "recap-sweep": sweep.build_parser(), "recap-init": init.build_parser(),
           "recap-plan-memory": plan_memory.build_parser(), "recap-serve": serve.build_parser(),
           "recap-pipeline": pipeline.build_parser(), "recap-iterate": iterate.build_parser(),
           # recap-train, -returns, -advantages, -relabel, -evaluate (recap.cli.run_command)
           "recap-train": cli.build_parser("a gin-configured step")}  # fmt: skip
    top = import_rlinf.build_parser()
    out["recap-import"] = top
    for action in top._actions:
        if isinstance(action, argparse._SubParsersAction):
            out.update({f"recap-import {n}": p for n, p in action.choices.items()})
    return out


@pytest.mark.parametrize("name", sorted(parsers()))
def test_every_argument_is_explained_with_its_default_and_choices(name):
    parser = parsers()[name]
    text = parser.format_help()
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, f"{name}: {action.dest} has no help"
        shown = parser._get_formatter()._get_help_string(action)
        meaningful = action.default not in (None, False, [], argparse.SUPPRESS)
        if meaningful and not action.required:
            assert "default" in shown, f"{name}: {action.dest} does not state its default"
        for choice in action.choices or ():
            assert str(choice) in text, f"{name}: {action.dest} does not list {choice!r}"


def test_rlinf_value_help_states_the_configs_used_when_omitted(capsys):
    with pytest.raises(SystemExit):
        import_rlinf.main(["rlinf-value", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for words in (
        "--vision-config PATH the SigLIP config: a model directory or its config.json; default: "
        "siglip2-so400m-patch14-224's (RLinf's), used when omitted",
        "--text-config PATH the Gemma3 config: a model directory or its config.json; default: "
        "gemma-3-270m's (RLinf's), used when omitted",
        "does not record it; default: -1 0",
        "--resize {bilinear,antialias}",
    ):
        assert words in text, words


def test_variant_lists_its_values_and_its_error_does_not_talk_about_gin(capsys):
    with pytest.raises(SystemExit):
        import_rlinf.main(["rlinf-policy", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--variant {pi05_base,pi05_droid,pi05_libero}" in text
    assert "(default: pi05_libero)" in text
    with pytest.raises(SystemExit) as exit_:
        import_rlinf.main(["rlinf-policy", "w.pt", "--out", "o", "--variant", "aloha"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "gin" not in err
    assert err.splitlines()[-1] == (
        "recap-import rlinf-policy: error: argument --variant: invalid choice: 'aloha' (choose "
        "from 'pi05_base', 'pi05_droid', 'pi05_libero')"
    )


def test_plan_memory_help_names_the_hardware_presets_and_defaults(capsys):
    with pytest.raises(SystemExit):
        plan_memory.parse_args(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--ranks RANKS devices (ZeRO-3 ranks) (default: 8)" in text
    assert "24gb: 1 x 24 GiB" in text and "910b: 8 x 64 GiB" in text

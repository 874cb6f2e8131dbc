"""recap.serve.launch: recap-serve's flags as typed options (recap-serve and recap-iterate --serve
launch through them)."""

from __future__ import annotations

import pytest

from recap.serve.launch import ServeOptions, parse_options


def test_the_flags_defaults_are_the_options_defaults():
    assert parse_options(["--policy", "run"]) == ServeOptions("run")


def test_flags_become_typed_options():
    options = parse_options(["--policy", "run", "--port", "0", "--gin_file", "a.gin", "--gin_file",
                             "b.gin", "--no-state-in-prompt", "--max-frame-mib", "1.5",
                             "--record", "rec"])  # fmt: skip
    assert options == ServeOptions("run", port=0, gin_file=("a.gin", "b.gin"), record="rec",
                                   state_in_prompt=False, max_frame_mib=1.5)  # fmt: skip


def test_an_unknown_flag_is_argparses_usage_error(capsys):
    with pytest.raises(SystemExit) as exc:
        parse_options(["--policy", "run", "--prot", "1"])
    assert exc.value.code == 2
    assert (
        capsys.readouterr().err.splitlines()[-1]
        == "recap-serve: error: unrecognized arguments: --prot 1"
    )

"""recap.envs.factory: environments by name for recap-collect, recap-iterate and the evaluate
step."""

from __future__ import annotations

import pytest

from recap.envs.factory import env_factory
from recap.errors import RecapError


def test_reach_with_its_settings_and_expert():
    make_env, expert = env_factory("reach", max_steps=7, state_targets=True, expert=True)
    env = make_env()
    assert (env.spec.max_steps, env.config.state_targets) == (7, True)
    assert callable(expert)
    make_env, expert = env_factory("reach")
    assert (make_env().spec.max_steps, make_env().config.state_targets, expert) == (40, False, None)


@pytest.mark.parametrize(
    ("name", "expert", "line"),
    [
        ("libero", True, "env: 'libero' has no scripted expert; collect without it, or pass a "
         "controller to recap.envs.collect(expert=...)"),
        ("maze", False, "env: 'maze' is not one of ['reach', 'metaworld', 'libero'] nor "
         "'package.module:Factory'; name one of them"),
        ("maze:", False, "env: 'maze:' is not one of ['reach', 'metaworld', 'libero'] nor "
         "'package.module:Factory'; name one of them"),
    ],
)  # fmt: skip
def test_an_unknown_env_or_a_missing_expert_is_one_line(name, expert, line):
    with pytest.raises(RecapError) as exc:
        env_factory(name, expert=expert)
    assert str(exc.value) == line

"""recap.envs.factory: environments by name for recap-collect, recap-iterate and the evaluate
step."""

from __future__ import annotations

import pytest

from recap.envs.factory import env_factory
from recap.errors import RecapError
from tests.envs.test_metaworld import needs_metaworld


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


def test_an_option_the_constructor_does_not_take_is_one_line():
    with pytest.raises(RecapError) as exc:
        env_factory("metaworld", options={"task": "push-v3"}, field="--env")
    assert str(exc.value) == (
        "--env_options: 'task' is not an option of MetaWorldEnv; use one of ['env_name', "
        "'cameras', 'image_size', 'max_steps', 'lazy_images', 'shadows', 'backend']"
    )
    with pytest.raises(RecapError) as exc:
        env_factory("libero", options={"camera": "agentview"})
    assert str(exc.value) == (
        "env_options: 'camera' is not an option of LiberoEnv; use one of ['suite', 'task_id', "
        "'resolution', 'seed', 'num_steps_wait', 'max_steps', 'backend']"
    )
    with pytest.raises(RecapError) as exc:
        env_factory("tests.envs.test_factory:line_env", options={"steps": 3})
    assert str(exc.value) == (
        "env_options: 'steps' is not an option of line_env; use one of ['max_steps']"
    )
    assert env_factory("tests.envs.test_factory:line_env", options={"max_steps": 3})[0]() == 3


def line_env(max_steps: int = 2) -> int:
    """A stand-in factory: its options are checked against this signature."""
    return max_steps


def test_the_takeover_compares_the_move():
    from recap.envs.factory import drift_dims

    assert [drift_dims(n) for n in ("reach", "metaworld", "libero")] == [2, 3, None]


@needs_metaworld
def test_metaworld_with_its_options_and_expert():
    import numpy as np

    from recap.envs.metaworld import MetaWorldExpert

    make_env, expert = env_factory("metaworld", max_steps=9, expert=True,
                                   options={"env_name": "push-v3", "image_size": 8})  # fmt: skip
    env = make_env()
    try:
        assert (env.env_name, env.max_steps, env.spec.max_steps) == ("push-v3", 9, 9)
        assert isinstance(expert, MetaWorldExpert) and expert.env_name == "push-v3"
        obs = env.reset(3)
        assert obs["images"]["image"].shape == (8, 8, 3)
        action = expert(obs)
        assert action.shape == (4,) and action.dtype == np.float32
    finally:
        env.close()
    assert env_factory("metaworld")[1] is None

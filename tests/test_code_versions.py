"""The code-version lock (``recap/workflow/code_versions.json``): it matches the sources as they
are (else one line per step: bump ``STEP_VERSION`` if its results change, then update), its hash
follows code and not docstrings, comments or layout, and every configurable a shipped pipeline
binds for a stage is one its step's modules register (what its fingerprint resolves)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from recap.config_resolve import EXCLUDED, bound_keys, short
from recap.registry import register_all
from recap.workflow import code_versions
from recap.workflow import lock as lock_module
from recap.workflow.code_versions import lock, reads, step_module
from recap.workflow.lock import _normalized, compute, problems
from recap.workflow.pipeline import _parse_step, config_text, load_pipeline
from recap.workflow.stages import BY_NAME, STAGES

GIN = Path(__file__).resolve().parents[1] / "recap" / "gin"
UPDATE = "run `python -m recap.workflow.lock --update`"


@pytest.fixture(scope="module")
def now() -> dict[str, dict]:
    """The lock of the sources as they are."""
    register_all()
    return compute(STAGES)


def test_the_lock_matches_the_sources(now):
    found = problems(now, lock())
    assert not found, "\n".join(found)
    assert {step_module(s.entry) for s in STAGES} == set(lock())
    assert reads("recap.steps.compute_returns") == ("compute_returns",)


def test_a_step_whose_sources_changed_is_one_line():
    entry = {"version": "1", "sha256": "a" * 64, "modules": 3, "configurables": ["train"]}
    now = {"recap.steps.train": {**entry, "sha256": "b" * 64}, "recap.steps.new": entry}
    recorded = {"recap.steps.train": entry, "recap.steps.gone": entry}
    assert problems(now, recorded) == [
        f"code_versions.json: recap.steps.gone runs in no stage; {UPDATE}",
        f"code_versions.json: no entry for recap.steps.new; {UPDATE}",
        "recap.steps.train: its sources changed since code_versions.json was written; bump "
        f"STEP_VERSION in recap/steps/train.py if its results change, then {UPDATE}",
    ]
    bumped = {"recap.steps.train": {**entry, "version": "2"}}
    assert len(problems(bumped, {"recap.steps.train": entry})) == 1  # the lock records it too
    assert problems({"recap.steps.train": entry}, {"recap.steps.train": entry}) == []


def test_the_hash_follows_code_not_docstrings_comments_or_layout():
    def norm(source: str) -> str:
        return _normalized(ast.parse(source))

    base = norm('"""Module."""\n\ndef f(x):\n    """Doc."""\n    return x + 1\n')
    assert norm("def f(x):  # a comment\n\n\n    return (x +\n            1)\n") == base
    assert norm('def f(x):\n    """Another doc."""\n    return x + 1\n') == base
    assert norm("def f(x):\n    return x + 2\n") != base
    assert norm("def f(y):\n    return y + 1\n") != base


def test_a_step_reads_the_configurables_of_the_modules_it_runs(now):
    assert now["recap.steps.compute_returns"]["configurables"] == ["compute_returns"]
    # Tracker, which every training step reads, never counts (where a run is logged)
    assert now["recap.steps.train"]["configurables"] == [
        "LoraOptions",
        "deepspeed_config",
        "pi05_policy",
        "policy_data",
        "toy_data",
        "toy_model",
        "train",
        "value_data",
        "value_model",
    ]
    assert "relabel" in now["recap.steps.compute_advantages"]["configurables"]


def pipelines() -> list[str]:
    shipped = ["demo/pipeline.gin", "demo/scratch.gin"]
    shipped += sorted(f"experiments/{p.name}" for p in (GIN / "experiments").glob("*_pipeline.gin"))
    return [p for p in shipped if (GIN / p).is_file()]


@pytest.mark.parametrize("path", pipelines())
def test_every_configurable_a_shipped_pipeline_binds_is_one_its_step_reads(path):
    register_all()
    config = load_pipeline([path], [])
    unread = {}
    seen = set()
    for name in config.stages:
        stage = BY_NAME[name]
        bindings = [b for k in stage.scopes for b in config.bindings.get(k, [])]
        key = (stage.entry, tuple(config.steps[stage.step]), tuple(bindings))
        if key in seen:
            continue
        seen.add(key)
        _parse_step(config.steps[stage.step], bindings, name)
        bound = {short(s) for _, s in bound_keys(config_text(name))} - set(EXCLUDED)
        missing = bound - set(reads(step_module(stage.entry)))
        if missing:
            unread[name] = sorted(missing)
    assert unread == {}


def test_the_update_writes_the_lock_and_the_check_reads_it(now, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(code_versions, "LOCK", tmp_path / "code_versions.json")
    monkeypatch.setattr(lock_module, "compute", lambda stages: now)  # computed once above
    lock.cache_clear()
    try:
        assert lock_module.main([]) == 1  # no lock yet
        assert capsys.readouterr().err.startswith(
            f"error: code_versions.json: no entry for recap.steps.compute_advantages; {UPDATE}\n"
        )
        assert lock_module.main(["--update"]) == 0
        assert lock() == now
        assert lock_module.main([]) == 0
    finally:
        lock.cache_clear()
    versions = ", ".join(f"{step} {now[step]['version']}" for step in sorted(now))
    assert capsys.readouterr().out == f"wrote {tmp_path / 'code_versions.json'}: {versions}\n"

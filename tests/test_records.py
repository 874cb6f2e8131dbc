"""``recap.records``: the record a step leaves for later readers, written and read by one type."""

from __future__ import annotations

import json

import pytest

from recap.errors import RecapError
from recap.records import EVALUATION_FILE, Evaluation


def test_an_evaluation_round_trips_and_an_older_record_reads_with_what_it_has(tmp_path):
    evaluation = Evaluation(success={"beta_1": 0.5, "beta_2": 0.75}, num_episodes=4,
                            outcomes={"beta_1": [1, 0, 1, 0], "beta_2": [1, 1, 1, 0]},
                            heading={"beta_1": 0.25, "beta_2": None}, env="line",
                            conditioning="paper", seed=1000, guidance="positive")  # fmt: skip
    path = evaluation.write(tmp_path)
    assert path == tmp_path / EVALUATION_FILE
    written = json.loads(path.read_text())
    assert "sensitivity" not in written and written["heading"] == {"beta_1": 0.25, "beta_2": None}
    assert Evaluation.read(tmp_path) == evaluation
    # a record from before outcomes, headings and the probe: those read as empty / None
    path.write_text(json.dumps({"success": {"beta_1": 0.2}, "num_episodes": 10, "seconds": 3}))
    old = Evaluation.read(tmp_path)
    assert (old.success, old.num_episodes, old.outcomes, old.heading, old.env) == (
        {"beta_1": 0.2}, 10, {}, {}, None)  # fmt: skip


def test_a_missing_or_broken_record_is_one_line_naming_the_file(tmp_path):
    path = tmp_path / EVALUATION_FILE
    with pytest.raises(RecapError) as err:
        Evaluation.read(tmp_path)
    assert str(err.value) == (
        f"{path}: not found; evaluate the policy first (recap-evaluate with "
        f"evaluate_policy.run_dir = {str(tmp_path)!r})"
    )
    path.write_text(json.dumps({"success": {"beta_1": 1.0}}))
    with pytest.raises(RecapError) as err:
        Evaluation.read(tmp_path)
    assert str(err.value) == f"{path}: field 'num_episodes' missing; evaluate the policy again"
    path.write_text("[1, 2]")
    with pytest.raises(RecapError) as err:
        Evaluation.read(tmp_path)
    assert str(err.value) == f"{path}: not a JSON object; evaluate the policy again"
    path.write_text("{")
    with pytest.raises(RecapError) as err:
        Evaluation.read(tmp_path)
    assert str(err.value).startswith(f"{path}: not a JSON record (")

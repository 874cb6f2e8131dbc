import os
import re
import subprocess
import sys
from pathlib import Path

import gin
import numpy as np
import pyarrow as pa
import pytest
import yaml

from recap.core import columns as C
from recap.core.advantages import VALUE, add_advantages, labeling_of
from recap.core.frames import align_to_frames
from recap.core.normalize import ReturnRange
from recap.core.thresholds import IS_CORRECTION, LabelOptions
from recap.data.lerobot import LocalDataset
from recap.data.sidecars import read_advantages, read_returns, write_advantages
from recap.errors import DatasetError, RecapError
from recap.steps.compute_returns import ReturnsConfig, compute_returns
from recap.steps.relabel import RelabelConfig, relabel
from tests.helpers import REPO, copy_fixture, tree_hashes

NEW_FILES = ("meta/advantages_v2.parquet", "meta/mixture_config.yaml")


@pytest.fixture(autouse=True)
def _clear_gin():
    gin.clear_config()
    yield
    gin.clear_config()


@pytest.fixture
def datasets(tmp_path):
    """A rollout (v3.0, 6 episodes) and an sft (v2.1, 7 episodes) dataset with returns tag "r"."""
    roll = copy_fixture("libero_like_v30_images", tmp_path)
    sft = copy_fixture("rlinf_like_v21_video", tmp_path)
    entries = [
        {"name": "roll", "root": str(roll), "type": "rollout"},
        {"name": "sft", "root": str(sft), "type": "sft"},
    ]
    compute_returns(ReturnsConfig(datasets=entries, tag="r"))
    return entries


def _frames(entry, correction=None):
    """Returns sidecar + a made-up value column (+ is_correction from ``correction``)."""
    returns, stats = read_returns(entry["root"], "r")
    ep, fr = returns.column(C.EPISODE_INDEX).to_numpy(), returns.column(C.FRAME_INDEX).to_numpy()
    values = -0.5 + 0.4 * np.sin(1.7 * ep + 0.3 * fr)
    table = returns.append_column(VALUE, pa.array(values))
    table = table.append_column(C.DATASET_NAME, pa.array([entry["name"]] * len(table)))
    if correction:
        with LocalDataset(entry["root"]) as ds:
            flags = ds.read_columns([C.EPISODE_INDEX, C.FRAME_INDEX, correction])
        table = align_to_frames(table, flags, [correction], "frames")
        table = table.rename_columns([*table.column_names[:-1], IS_CORRECTION])
    return table, ReturnRange(stats["return_min"], stats["return_max"])


def _fresh(entries, q, scope, correction=None):
    """What Step 3 would label and write: all datasets together, sft forced positive (as on
    disk: dataset_name a plain string column)."""
    loaded = [_frames(e, correction if e["type"] == "rollout" else None) for e in entries]
    tables = [t for t, _ in loaded]
    if correction:
        tables = [
            t
            if IS_CORRECTION in t.column_names
            else t.append_column(IS_CORRECTION, pa.array(np.zeros(len(t), dtype=bool)))
            for t in tables
        ]
    options = LabelOptions(q, scope, force_positive_datasets=("sft",))
    rng = ReturnRange.union([r for _, r in loaded])
    out = add_advantages(pa.concat_tables(tables), return_range=rng, lookahead=3, labels=options)
    names = out.column(C.DATASET_NAME).to_numpy(zero_copy_only=False)
    out = out.cast(C.ADVANTAGES_SCHEMA.with_metadata(out.schema.metadata))
    return {n: out.filter(pa.array(names == n)) for n in np.unique(names)}


def _write_source(entries, tag="v1"):
    parts = _fresh(entries, 0.3, "global")
    for e in entries:
        part = parts[e["name"]]
        record = {**labeling_of(part), "datasets": [{"name": x["name"]} for x in entries]}
        write_advantages(e["root"], tag, part, record)


def _yaml(entry):
    return yaml.safe_load((Path(entry["root"]) / "meta" / "mixture_config.yaml").read_text())


@pytest.mark.parametrize("scope", ["global", "per_task", "per_dataset"])
def test_relabel_equals_fresh_labeling(datasets, scope, capsys):
    _write_source(datasets)
    paths = relabel(
        RelabelConfig(
            datasets=datasets, source_tag="v1", new_tag="v2", positive_quantile=0.55, scope=scope
        )
    )
    fresh = _fresh(datasets, 0.55, scope)
    for e in datasets:
        assert paths[e["name"]].name == "advantages_v2.parquet"
        table, record = read_advantages(e["root"], "v2")
        assert table.equals(fresh[e["name"]])
        expected = labeling_of(fresh[e["name"]])
        assert record["thresholds"] == expected["thresholds"]
        assert record["positive_quantile"] == 0.55 and record["scope"] == scope
        assert record["source_tag"] == "v1" and record["lookahead"] == 3
        assert labeling_of(table)["thresholds"] == expected["thresholds"]
    assert table.column(C.ADVANTAGE).to_pylist() == [True] * 71  # sft forced positive
    source, _ = read_advantages(datasets[0]["root"], "v1")
    roll, _ = read_advantages(datasets[0]["root"], "v2")
    assert roll.column(C.ADVANTAGE_CONTINUOUS).equals(source.column(C.ADVANTAGE_CONTINUOUS))
    assert not roll.column(C.ADVANTAGE).equals(source.column(C.ADVANTAGE))
    out = capsys.readouterr().out
    assert f"tag 'v2' from 'v1': positive_quantile 0.55, scope {scope}" in out


def test_relabel_touches_nothing_else(datasets):
    _write_source(datasets)
    before = {e["name"]: tree_hashes(Path(e["root"])) for e in datasets}
    yaml_before = {e["name"]: _yaml(e) for e in datasets}
    relabel(RelabelConfig(datasets=datasets, source_tag="v1", new_tag="v2", positive_quantile=0.4))
    for e in datasets:
        after = tree_hashes(Path(e["root"]))
        assert set(after) - set(before[e["name"]]) == {NEW_FILES[0]}
        for path, digest in before[e["name"]].items():
            if path != NEW_FILES[1]:
                assert after[path] == digest, path
        config = _yaml(e)
        assert config["tags"]["v1"] == yaml_before[e["name"]]["tags"]["v1"]
        assert sorted(config["tags"]) == ["v1", "v2"]
        assert config["tags"]["v2"]["positive_quantile"] == 0.4
        assert config["tags"]["v2"]["unified_threshold"] == pytest.approx(
            labeling_of(_fresh(datasets, 0.4, "global")["roll"])["unified_threshold"], abs=0
        )
        assert config["global_return_min"] == -309.0 and config["global_return_max"] == 0.0
        assert [d["name"] for d in config["datasets"]] == ["roll", "sft"]


def test_corrections_are_forced_positive(datasets):
    # the fixtures' boolean `done` column (last frame) stands in for human corrections
    _write_source(datasets)
    entries = [{**datasets[0], "correction_column": "done"}, datasets[1]]
    relabel(RelabelConfig(datasets=entries, source_tag="v1", new_tag="v2", positive_quantile=0.2))
    fresh = _fresh(datasets, 0.2, "global", correction="done")["roll"]
    table, record = read_advantages(datasets[0]["root"], "v2")
    assert table.equals(fresh)
    last = np.append(np.diff(table.column(C.EPISODE_INDEX).to_numpy()) != 0, True)
    assert table.column(C.ADVANTAGE).to_numpy()[last].all()
    plain = _fresh(datasets, 0.2, "global")["roll"]
    assert labeling_of(plain)["unified_threshold"] == record["unified_threshold"]
    newly = table.column(C.ADVANTAGE).to_numpy() & ~plain.column(C.ADVANTAGE).to_numpy()
    assert newly.any() and not newly[~last].any()  # only correction frames changed
    assert record["num_forced_positive"] == labeling_of(fresh)["num_forced_positive"]


def _run(*params, gin_file="relabel.gin"):
    args = [sys.executable, str(REPO / "scripts" / "relabel.py"), "--gin_file", gin_file]
    for p in params:
        args += ["--gin_param", p]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(args, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def _datasets_param(entries):
    return f"relabel.datasets = {entries!r}"


def test_script_runs_from_gin(datasets):
    _write_source(datasets)
    proc = _run(
        _datasets_param(datasets),
        'relabel.source_tag = "v1"',
        'relabel.new_tag = "v2"',
        "relabel.positive_quantile = 0.5",
        'relabel.scope = "per_task"',
    )
    assert proc.returncode == 0, proc.stderr
    assert "tag 'v2' from 'v1': positive_quantile 0.5, scope per_task" in proc.stdout
    table, _ = read_advantages(datasets[0]["root"], "v2")
    assert table.equals(_fresh(datasets, 0.5, "per_task")["roll"])


def _corrupt(entry):
    """Rewrite the source sidecar of ``entry`` with a NaN advantage at row 5."""
    table, record = read_advantages(entry["root"], "v1")
    values = table.column(C.ADVANTAGE_CONTINUOUS).to_numpy().copy()
    values[5] = np.nan
    i = table.column_names.index(C.ADVANTAGE_CONTINUOUS)
    write_advantages(
        entry["root"], "v1", table.set_column(i, C.ADVANTAGE_CONTINUOUS, pa.array(values)), record
    )


@pytest.mark.parametrize(
    ("params", "setup", "message"),
    [
        (
            ['relabel.source_tag = "nope"'],
            None,
            r"^error: \S+/meta/advantages_nope\.parquet: advantages sidecar for tag 'nope' not "
            r"found \(tags here: 'v1'\); run Step 3 with this tag first, or name an existing tag$",
        ),
        (
            ["relabel.positive_quantile = 1.5"],
            None,
            r"^error: positive_quantile: 1\.5 is outside \(0, 1\); it is the fraction of frames "
            r"labeled positive, e\.g\. 0\.3$",
        ),
        (
            ['relabel.new_tag = "v1"'],
            None,
            r"^error: new_tag: 'v1' equals source_tag; relabeling writes a new tag$",
        ),
        (['relabel.scope = "per_episode"'], None, r"^error: scope: 'per_episode' is not one of"),
        (
            [],
            _corrupt,
            r"^error: \S+/meta/advantages_v1\.parquet: advantage_continuous: 1 NaN/null/infinite "
            r"values \(first at episode_index=0, frame_index=5\); recompute the advantages",
        ),
    ],
)
def test_script_errors_write_nothing(datasets, params, setup, message):
    _write_source(datasets)
    if setup:
        setup(datasets[1])
    before = [tree_hashes(Path(e["root"])) for e in datasets]
    base = [_datasets_param(datasets), 'relabel.source_tag = "v1"', 'relabel.new_tag = "v2"']
    proc = _run(*base, *params)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and re.match(message, lines[0]), proc.stderr
    assert [tree_hashes(Path(e["root"])) for e in datasets] == before


def test_sidecar_not_matching_the_dataset(datasets):
    _write_source(datasets)
    table, record = read_advantages(datasets[0]["root"], "v1")
    write_advantages(datasets[0]["root"], "v1", table.slice(1), record)
    with pytest.raises(
        DatasetError,
        match=r"advantages_v1\.parquet: dataset frames: 1 rows match no frame of the dataset",
    ):
        relabel(RelabelConfig(datasets=datasets, source_tag="v1", new_tag="v2", scope="per_task"))
    with pytest.raises(RecapError, match="new_tag"):
        relabel(RelabelConfig(datasets=datasets, source_tag="v1", new_tag="v1"))


# ---- the per-tag record: meta/mixture_config.yaml in RLinf's layout -----------------------


def _tiny_sidecar():
    table = pa.table(
        {C.EPISODE_INDEX: [0, 0], C.FRAME_INDEX: [0, 1], C.REWARD: [-1.0, 0.0], VALUE: [-0.5, 0.0]}
    )
    return add_advantages(table, return_range=ReturnRange(-2, 0), lookahead=1, dataset_name="d")


def test_record_file_keeps_other_tags(tmp_path):
    table = _tiny_sidecar()
    write_advantages(tmp_path, "", table, {**labeling_of(table), "datasets": [{"name": "d"}]})
    write_advantages(tmp_path, "b", table, {"unified_threshold": 0.5, "positive_quantile": 0.4})
    config = yaml.safe_load((tmp_path / "meta" / "mixture_config.yaml").read_text())
    assert sorted(config["tags"]) == ["", "b"]
    assert config["unified_threshold"] == labeling_of(table)["unified_threshold"]  # empty tag
    assert (config["global_return_min"], config["global_return_max"]) == (-2.0, 0.0)
    assert config["datasets"] == [{"name": "d"}]
    back, record = read_advantages(tmp_path, "")
    on_disk = table.cast(C.ADVANTAGES_SCHEMA.with_metadata(table.schema.metadata))  # plain strings
    assert back.equals(on_disk) and labeling_of(back) == labeling_of(table)
    assert record == labeling_of(table) | {"datasets": [{"name": "d"}]}
    assert read_advantages(tmp_path, "b")[1] == {"unified_threshold": 0.5, "positive_quantile": 0.4}
    assert sorted(p.name for p in (tmp_path / "meta").iterdir()) == [
        "advantages.parquet",
        "advantages_b.parquet",
        "mixture_config.yaml",
    ]


def test_rlinf_written_record_is_read(tmp_path):
    table = _tiny_sidecar()
    write_advantages(tmp_path, "", table, {})
    rlinf = {
        "global_return_min": -2,
        "global_return_max": 0,
        "unified_threshold": 0.1,
        "positive_quantile": 0.3,
        "datasets": [{"name": "d", "weight": 1.0}],
    }
    (tmp_path / "meta" / "mixture_config.yaml").write_text(yaml.safe_dump(rlinf))
    assert read_advantages(tmp_path, "")[1] == {"unified_threshold": 0.1, "positive_quantile": 0.3}


def test_bad_record_file_is_one_line_and_writes_nothing(tmp_path):
    table = _tiny_sidecar()
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "mixture_config.yaml").write_text("tags: [unclosed\n")
    with pytest.raises(DatasetError, match=r"mixture_config\.yaml: not valid YAML \(.*\); fix or"):
        write_advantages(tmp_path, "a", table, {})
    assert sorted(p.name for p in (tmp_path / "meta").iterdir()) == ["mixture_config.yaml"]

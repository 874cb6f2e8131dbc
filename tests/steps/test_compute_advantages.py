"""Step 3 end to end on tiny demo data with a random-weight demo-size value model: one rank in
this process, two ranks under the DeepSpeed launcher, relabeling, bad input."""

from __future__ import annotations

import io
import re
import subprocess
import sys
from pathlib import Path

import gin
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
import torch
import yaml

from recap.cli import parse_gin
from recap.configurable import configured
from recap.core import columns as C
from recap.core.advantages import VALUE, LabelOptions, add_advantages, labeling_of
from recap.core.normalize import ReturnRange
from recap.data.datasets import ValueDataset
from recap.data.sidecars import read_advantages, read_returns
from recap.data.specs import parse_dataset_specs
from recap.data.transforms import load_tokenizer
from recap.engine.checkpointing import save_exported
from recap.engine.inference import merge_shards, shard_positions
from recap.engine.loader import worker_order
from recap.envs.reach import write_demo_datasets, write_demo_tokenizer
from recap.errors import RecapError
from recap.models.value import value_model
from recap.ports import free_port
from recap.steps.compute_advantages import AdvantagesConfig, compute_advantages
from recap.steps.compute_returns import ReturnsConfig, compute_returns
from recap.steps.relabel import RelabelConfig, relabel
from tests.helpers import REPO, deepspeed_local, launch_env, one_rank_here, tree_hashes

ENTRIES = [
    {"name": "sft", "root": "sft", "type": "sft"},
    {"name": "rollout", "root": "rollout", "type": "rollout"},
]
COMMON = {"lookahead": 5, "max_length": 16, "batch_size": 16}


_env = launch_env


def run_here(root: Path, **kwargs) -> str:
    """compute_advantages on one rank in this process (MLflow off); returns its stdout."""
    args = {
        "datasets": ENTRIES,
        "data_root": str(root),
        "model_path": str(root / "pretrained"),
        "tokenizer_path": str(root / "tokenizer"),
        **COMMON,
        **kwargs,
    }
    out = io.StringIO()
    with one_rank_here(out):
        gin.bind_parameter("Tracker.enabled", False)
        compute_advantages(AdvantagesConfig(**args))
    return out.getvalue()


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """Demo datasets with returns, a random demo-size value model saved both ways, and the
    one-rank run 'one' (per-dataset thresholds, nothing forced)."""
    root = tmp_path_factory.mktemp("advantages")
    write_demo_datasets(root, sft_episodes=4, rollout_episodes=6, eval_episodes=2)
    write_demo_tokenizer(root)
    gin.clear_config()
    compute_returns(ReturnsConfig(datasets=ENTRIES, data_root=str(root)))
    parse_gin(["demo/value.gin"], [])
    torch.manual_seed(0)
    model = configured(value_model)()
    gin.clear_config()
    model.save_pretrained(root / "pretrained")  # config.json + weights: load_value_model
    save_exported(model.state_dict(), root / "run" / "model.safetensors", step=1)  # as training
    stdout = run_here(
        root,
        tag="one",
        scope="per_dataset",
        force_sft_positive=False,
        output_dir=str(root / "pics"),
    )
    return {"root": root, "model": model.eval(), "stdout": stdout}


def _files(root: Path, tag: str) -> dict[str, bytes]:
    return {
        e["name"]: (root / e["root"] / "meta" / f"advantages_{tag}.parquet").read_bytes()
        for e in ENTRIES
    }


def test_two_ranks_write_the_same_bytes_as_one_rank(demo):
    root = demo["root"]
    port = free_port()
    params = [
        f'compute_advantages.data_root = "{root}"',
        'compute_advantages.tag = "two"',
        f'compute_advantages.model_path = "{root / "run"}"',  # exported + gin architecture
        f'compute_advantages.tokenizer_path = "{root / "tokenizer"}"',
        'compute_advantages.scope = "per_dataset"',
        "compute_advantages.lookahead = 5",
        "compute_advantages.force_sft_positive = False",
        "compute_advantages.batch_size = 16",
        f'compute_advantages.output_dir = "{root}/p2"',
    ]
    cmd = [
        *deepspeed_local(2, port),
        str(REPO / "scripts" / "compute_advantages.py"),
        "--gin_file",
        "demo/advantages.gin",
        *[a for p in params for a in ("--gin_param", p)],
    ]
    done = subprocess.run(
        cmd, cwd=root, env=_env(root), capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "on 2 ranks" in done.stdout
    assert _files(root, "two") == _files(root, "one")
    assert (root / "mlruns").is_dir() and (root / "p2" / "episode_curves.png").is_file()
    config = yaml.safe_load((root / "rollout" / "meta" / "mixture_config.yaml").read_text())
    assert config["tags"]["two"]["thresholds"] == config["tags"]["one"]["thresholds"]


def test_sidecar_is_the_pure_functions_of_the_model_values(demo):
    root, model = demo["root"], demo["model"]
    specs = parse_dataset_specs(ENTRIES, root)
    returns = [read_returns(s.root, "") for s in specs]
    rng = ReturnRange.union([ReturnRange(r["return_min"], r["return_max"]) for _, r in returns])
    data = ValueDataset(specs, "", rng, load_tokenizer(root / "tokenizer"), 64, 16)
    with torch.no_grad():
        direct = model.predict_value(data.__getitems__(list(range(len(data))))).double().numpy()
    tables, sidecars = [], {}
    for spec, (table, _) in zip(specs, returns, strict=True):
        sidecars[spec.name], record = read_advantages(spec.root, "one")
        value = sidecars[spec.name].column(C.VALUE_CURRENT)
        table = table.append_column(VALUE, value).append_column(
            C.DATASET_NAME, pa.array([spec.name] * len(table))
        )
        tables.append(table)
    ordered = np.concatenate([sidecars[s.name].column(C.VALUE_CURRENT).to_numpy() for s in specs])
    np.testing.assert_allclose(ordered, direct, rtol=0, atol=1e-5)  # demo rows are sorted
    assert record["value_model"].endswith("model.safetensors") and record["lookahead"] == 5
    expected = add_advantages(
        pa.concat_tables(tables),
        return_range=rng,
        lookahead=5,
        labels=LabelOptions(0.3, "per_dataset"),
    )
    expected = expected.cast(C.ADVANTAGES_SCHEMA.with_metadata(expected.schema.metadata))
    for name, sidecar in sidecars.items():  # on disk dataset_name is a plain string column
        part = expected.filter(pc.equal(expected.column(C.DATASET_NAME), name))
        assert sidecar.equals(part)
        assert labeling_of(sidecar) == labeling_of(expected)


def test_positive_fraction_is_the_quantile_within_one_frame_per_group(demo):
    for name, table in _tables(demo["root"], "one").items():
        positives = int(np.count_nonzero(table.column(C.ADVANTAGE).to_numpy()))
        assert abs(positives - 0.3 * table.num_rows) <= 1, name
    match = re.search(
        r"positives: (\d+\.\d)% of (\d+) frames; \d+% of positives from successful "
        r"episodes \(success rate of the data \d+%\)",
        demo["stdout"],
    )
    assert match and abs(float(match[1]) - 30.0) < 100 / int(match[2]) * 2
    for name in ("advantage_histogram", "positive_rate_per_episode", "episode_curves"):
        assert (demo["root"] / "pics" / f"{name}.png").read_bytes()[:4] == b"\x89PNG"


def _tables(root: Path, tag: str) -> dict[str, pa.Table]:
    return {e["name"]: read_advantages(root / e["root"], tag)[0] for e in ENTRIES}


def test_relabeling_needs_no_model_and_matches_a_fresh_run(demo):
    root = demo["root"]
    run_here(root, tag="q45", positive_quantile=0.45, scope="per_task", output_dir=str(root / "p"))
    datasets = [{**e, "root": str(root / e["root"])} for e in ENTRIES]
    relabel(
        RelabelConfig(
            datasets=datasets,
            source_tag="one",
            new_tag="one_q45",
            positive_quantile=0.45,
            scope="per_task",
        )
    )
    fresh, relabeled = _tables(root, "q45"), _tables(root, "one_q45")
    for name in fresh:
        assert relabeled[name].equals(fresh[name])
        assert labeling_of(relabeled[name]) == labeling_of(fresh[name])


@pytest.mark.parametrize(
    "change, message",
    [
        ({"model_path": "empty"}, "no value-model weights"),
        ({"returns_tag": "v9"}, r"returns sidecar for tag 'v9' not found \(tags found: ''\)"),
        ({"positive_quantile": 1.5}, r"positive_quantile: 1\.5 is outside \(0, 1\)"),
    ],
)
def test_bad_input_is_one_line_and_writes_nothing(demo, change, message):
    root = demo["root"]
    (root / "empty").mkdir(exist_ok=True)
    if change.get("model_path"):
        change = {"model_path": str(root / "empty")}
    before = {e["name"]: tree_hashes(root / e["root"]) for e in ENTRIES}
    with pytest.raises(RecapError, match=message) as info:
        run_here(root, tag="bad", **change)
    assert "\n" not in info.value.message
    assert {e["name"]: tree_hashes(root / e["root"]) for e in ENTRIES} == before


def test_the_script_exits_2_with_one_line(demo):
    root = demo["root"]
    params = [
        'compute_advantages.tag = "bad"',
        "compute_advantages.positive_quantile = 0",
        f'compute_advantages.data_root = "{root}"',
    ]
    cmd = [
        sys.executable,
        str(REPO / "scripts" / "compute_advantages.py"),
        "--gin_file",
        "demo/advantages.gin",
        *[a for p in params for a in ("--gin_param", p)],
    ]
    done = subprocess.run(cmd, cwd=root, env=_env(root), capture_output=True, text=True)
    assert done.returncode == 2
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(
        "error: positive_quantile: 0 is outside (0, 1)"
    )
    assert not list(root.glob("*/meta/advantages_bad.parquet"))


@pytest.mark.parametrize("num_items, batch", [(1, 4), (10, 4), (37, 5), (64, 16)])
@pytest.mark.parametrize("world", [2, 3])
def test_every_world_size_runs_the_same_batches_in_contiguous_blocks(num_items, batch, world):
    """Step 3's values do not depend on the world size: the batch grid is fixed."""
    one = shard_positions(num_items, 0, 1, batch)
    shards = [shard_positions(num_items, r, world, batch) for r in range(world)]
    assert len({len(s) for s in shards}) == 1
    assert all(s == sorted(s) for s in shards)  # contiguous, front to back
    grid = [s[i : i + batch] for s in shards for i in range(0, len(s), batch)]
    assert grid[: len(one) // batch] == [one[i : i + batch] for i in range(0, len(one), batch)]
    assert merge_shards(torch.tensor(shards), num_items).tolist() == list(range(num_items))


def test_workers_walk_contiguous_runs_of_batches():
    order = worker_order(5, 2)  # worker w gets turns w, w + 2, ...
    assert order == [0, 2, 1, 3, None, 4]
    assert [order[w::2] for w in range(2)] == [[0, 1, None], [2, 3, 4]]
    assert worker_order(1, 3) == [None, None, 0]


@pytest.mark.parametrize("name", ["advantages.gin", "demo/advantages.gin", "demo/relabel.gin"])
def test_gin_files_parse(name):
    gin.clear_config()
    parse_gin([name], [])
    gin.clear_config()


def test_step3_reads_values_back_with_the_range_the_value_run_recorded(demo, tmp_path):
    """A value run records its training return range (the train split's processor, written by
    ``train`` beside the weights); Step 3 uses it by default, not the listed datasets' range
    (they differ when the value model trained on other data, e.g. RLinf's experiment: SFT
    only). Nothing is written through gin's ``train.run_dir`` by the data builder."""
    import shutil

    from recap.core.normalize import ReturnRange
    from recap.data.datasets import ValueDataConfig
    from recap.processing.pi05 import PROCESSOR_FILE
    from recap.processing.value import read_value_processor
    from recap.steps.train import save_processor

    def range_of(name: str) -> ReturnRange:
        stats = read_returns(root / name, "")[1]
        return ReturnRange(stats["return_min"], stats["return_max"])

    root = demo["root"]
    gin.clear_config()
    parse_gin(["demo/value.gin"], [f'train.run_dir = "{tmp_path / "value_run"}"'])
    try:
        tokenizer = str(root / "tokenizer")
        data = configured(ValueDataConfig)(
            datasets=ENTRIES[:1], data_root=str(root), tokenizer_path=tokenizer
        ).build()
    finally:
        gin.clear_config()
    assert not (tmp_path / "value_run").exists()  # the builder writes nothing
    ranged = root / "run_ranged"
    shutil.copytree(root / "pretrained", ranged)
    save_processor(data, None, ranged)  # what ``train`` does after fitting
    sft = ReturnRange(*read_value_processor(ranged).return_range)
    assert sft == range_of("sft")
    union = ReturnRange.union([range_of("sft"), range_of("rollout")])
    assert sft != union
    stdout = run_here(root, tag="ranged", model_path=str(ranged), scope="per_dataset",
                      force_sft_positive=False, output_dir=str(root / "pics2"))  # fmt: skip
    low, high = sft.return_min, sft.return_max
    assert f"return range [{low:g}, {high:g}] from {ranged / PROCESSOR_FILE}" in stdout
    assert "the value model recorded no training range" in demo["stdout"]
    specs, tables = parse_dataset_specs(ENTRIES, root), []
    for spec in specs:  # the same model outputs; the advantages recomputed with the SFT range
        ranged_side = read_advantages(spec.root, "ranged")[0]
        one_side = read_advantages(spec.root, "one")[0]
        assert ranged_side.column(C.VALUE_CURRENT).equals(one_side.column(C.VALUE_CURRENT))
        table = read_returns(spec.root, "")[0]
        table = table.append_column(VALUE, ranged_side.column(C.VALUE_CURRENT))
        tables.append(table.append_column(C.DATASET_NAME, pa.array([spec.name] * len(table))))
    expected = add_advantages(pa.concat_tables(tables), return_range=sft, lookahead=5,
                              labels=LabelOptions(0.3, "per_dataset"))  # fmt: skip
    for spec in specs:
        got = read_advantages(spec.root, "ranged")[0].column(C.ADVANTAGE_CONTINUOUS).to_numpy()
        part = expected.filter(pc.equal(expected.column(C.DATASET_NAME), spec.name))
        np.testing.assert_allclose(got, part.column(C.ADVANTAGE_CONTINUOUS).to_numpy(), atol=1e-9)
        before = read_advantages(spec.root, "one")[0].column(C.ADVANTAGE_CONTINUOUS).to_numpy()
        assert np.abs(got - before).max() > 1e-3  # the range matters

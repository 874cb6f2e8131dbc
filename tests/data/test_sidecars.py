import json

import pyarrow as pa
import pytest

from recap.core import columns as C
from recap.core.returns import add_returns
from recap.data import sidecars
from recap.errors import DatasetError


def _returns_table():
    t = pa.table(
        {
            C.EPISODE_INDEX: [1, 0, 0],
            C.FRAME_INDEX: [0, 1, 0],
            C.IS_SUCCESS: [False, True, True],
        }
    )
    return add_returns(t, prompts=pa.array(["b", "a", "a"]))


def test_paths():
    assert sidecars.sidecar_path("/d", "returns", "").as_posix() == "/d/meta/returns.parquet"
    assert sidecars.sidecar_path("/d", "returns", "v2", ".json").as_posix() == (
        "/d/meta/returns_v2.json"
    )


def test_round_trip(tmp_path):
    table = _returns_table()
    stats = {"return_min": -300.0, "return_max": 0.0}
    path = sidecars.write_returns(tmp_path, "t1", table, stats)
    assert path == tmp_path / "meta" / "returns_t1.parquet"
    back, back_stats = sidecars.read_returns(tmp_path, "t1")
    assert back.equals(table)
    assert back.column(C.RETURN).to_pylist() == [-1.0, 0.0, -300.0]
    assert back_stats == stats
    assert json.loads((tmp_path / "meta" / "returns_t1.json").read_text()) == stats
    # nothing else left behind (no temp files)
    assert sorted(p.name for p in (tmp_path / "meta").iterdir()) == [
        "returns_t1.json",
        "returns_t1.parquet",
    ]


def test_second_tag_leaves_first_untouched(tmp_path):
    sidecars.write_returns(tmp_path, "a", _returns_table(), {"x": 1})
    before = (tmp_path / "meta" / "returns_a.parquet").read_bytes()
    sidecars.write_returns(tmp_path, "b", _returns_table(), {"x": 2})
    assert (tmp_path / "meta" / "returns_a.parquet").read_bytes() == before
    assert sidecars.read_returns(tmp_path, "a")[1] == {"x": 1}


def test_failed_write_replaces_nothing(tmp_path):
    sidecars.write_returns(tmp_path, "", _returns_table(), {"x": 1})
    before = {p.name: p.read_bytes() for p in (tmp_path / "meta").iterdir()}

    def boom(tmp):
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        sidecars.write_atomic(
            {
                tmp_path / "meta" / "returns.parquet": sidecars.table_writer(pa.table({"a": [1]})),
                tmp_path / "meta" / "returns.json": boom,
            }
        )
    assert {p.name: p.read_bytes() for p in (tmp_path / "meta").iterdir()} == before


def test_staged_writes_replace_all_or_nothing(tmp_path):
    sidecars.write_returns(tmp_path, "", _returns_table(), {"x": 1})
    before = {p.name: p.read_bytes() for p in (tmp_path / "meta").iterdir()}

    def boom(tmp):
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"), sidecars.StagedWrites() as staged:
        sidecars.stage_returns_table(staged, tmp_path, "", _returns_table())  # written fine
        staged.add(tmp_path / "meta" / "returns.json", boom)
        staged.commit()
    assert {p.name: p.read_bytes() for p in (tmp_path / "meta").iterdir()} == before
    with sidecars.StagedWrites() as staged:  # left without a commit: nothing, no temporary
        sidecars.stage_returns_stats(staged, tmp_path, "", {"x": 2})
    assert {p.name: p.read_bytes() for p in (tmp_path / "meta").iterdir()} == before


def test_missing_sidecar_names_file_and_fix(tmp_path):
    with pytest.raises(DatasetError) as err:
        sidecars.read_returns(tmp_path, "nope")
    msg = str(err.value)
    assert "returns_nope.parquet" in msg and "run Step 1" in msg and "\n" not in msg


def test_corrupt_sidecar(tmp_path):
    (tmp_path / "meta").mkdir()
    (tmp_path / "meta" / "returns.parquet").write_bytes(b"not parquet")
    (tmp_path / "meta" / "returns.json").write_text("{}")
    with pytest.raises(DatasetError, match=r"returns.parquet: cannot read parquet"):
        sidecars.read_returns(tmp_path, "")


@pytest.mark.parametrize("tag", ["a/b", "../x", ".hidden", "sp ace"])
def test_bad_tags(tag):
    with pytest.raises(DatasetError, match="becomes part of a file name"):
        sidecars.check_tag(tag)


def test_yaml_record_has_no_aliases(tmp_path):
    shared = [{"name": "a"}]
    path = tmp_path / "mixture_config.yaml"
    sidecars.yaml_writer({"datasets": shared, "tags": {"t": {"datasets": shared}}})(path)
    text = path.read_text()
    assert "&id" not in text and "*id" not in text and text.count("name: a") == 2

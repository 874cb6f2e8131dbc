"""Dataset entries that name a LeRobot ``repo_id`` resolve offline as LeRobot resolves them."""

import socket
from pathlib import Path

import pytest

from recap.data.lerobot import LocalDataset
from recap.data.specs import lerobot_home, parse_dataset_specs
from recap.errors import RecapError
from tests.helpers import copy_fixture


@pytest.fixture
def no_network(monkeypatch):
    """Any socket opened while resolving is a test failure (recap never downloads)."""

    def refuse(*args, **kwargs):
        raise AssertionError("network access attempted")

    monkeypatch.setattr(socket, "socket", refuse)
    monkeypatch.setattr(socket, "create_connection", refuse)


def test_lerobot_home_follows_lerobot_and_hub_variables(monkeypatch, tmp_path):
    for name in ("HF_LEROBOT_HOME", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert lerobot_home() == tmp_path / ".cache/huggingface/lerobot"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert lerobot_home() == tmp_path / "xdg/huggingface/lerobot"
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    assert lerobot_home() == tmp_path / "hf/lerobot"
    monkeypatch.setenv("HF_LEROBOT_HOME", "~/lr")
    assert lerobot_home() == tmp_path / "lr"


def test_repo_id_entry_resolves_offline(monkeypatch, tmp_path, no_network):
    home = tmp_path / "hf_lerobot"
    root = copy_fixture("libero_like_v30_images", home / "physical-intelligence")
    monkeypatch.setenv("HF_LEROBOT_HOME", str(home))
    entries = [{"name": "libero", "repo_id": "physical-intelligence/libero_like_v30_images",
                "type": "sft"}]  # fmt: skip
    (spec,) = parse_dataset_specs(entries, data_root="ignored_for_repo_ids")
    assert spec.root == root == home / "physical-intelligence/libero_like_v30_images"
    assert spec.repo_id == "physical-intelligence/libero_like_v30_images"
    assert spec.type == "sft" and spec.name == "libero"
    with LocalDataset(spec.root) as ds:
        assert (ds.num_episodes, ds.num_frames) == (6, 66)


def test_repo_id_default_home_is_the_hub_cache(monkeypatch, tmp_path, no_network):
    for name in ("HF_LEROBOT_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    root = copy_fixture("rlinf_like_v21_video", tmp_path / "hf/lerobot/RLinf")
    (spec,) = parse_dataset_specs([{"name": "r", "repo_id": "RLinf/rlinf_like_v21_video"}])
    assert spec.root == root


def test_missing_repo_id_fails_with_the_path_looked_at(monkeypatch, tmp_path, no_network):
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path))
    with pytest.raises(RecapError) as err:
        parse_dataset_specs([{"name": "d", "root": "d"}, {"name": "p", "repo_id": "lerobot/pusht"}])
    assert str(err.value) == (
        f"datasets[1]: repo_id 'lerobot/pusht': no LeRobot dataset at {tmp_path}/lerobot/pusht "
        "(no meta/info.json; recap never downloads); put the dataset there, set HF_LEROBOT_HOME, "
        "or give a root"
    )
    assert "\n" not in str(err.value)


@pytest.mark.parametrize(
    ("entry", "line"),
    [
        ({"name": "p", "repo_id": "a/b", "root": "x"},
         "datasets[0]: both root and repo_id given; keep one (repo_id resolves to "
         "$HF_LEROBOT_HOME/{repo_id})"),
        ({"name": "p", "repo_id": "../etc"},
         "datasets[0]: repo_id '../etc' is not a LeRobot repo id like 'lerobot/pusht'; fix it or "
         "give a root"),
        ({"repo_id": "a/b"},
         "datasets[0]: missing ['name']; every dataset needs a name and a root (or a LeRobot "
         "repo_id)"),
    ],
)  # fmt: skip
def test_bad_repo_id_entries(monkeypatch, tmp_path, entry, line):
    monkeypatch.setenv("HF_LEROBOT_HOME", str(tmp_path))
    with pytest.raises(RecapError) as err:
        parse_dataset_specs([entry])
    assert str(err.value) == line


def test_root_entries_are_unchanged(tmp_path):
    (spec,) = parse_dataset_specs([{"name": "s", "root": "sft"}], data_root=tmp_path)
    assert spec.root == Path(tmp_path) / "sft" and spec.repo_id is None

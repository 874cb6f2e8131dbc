"""Real-format stand-ins (``recap.standins``): datasets, tokenizers, value-model parts and π0.5
checkpoints read back through recap's own loaders, key patterns equal to openpi's published file,
determinism and refusing to overwrite."""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from recap import standins as S
from recap.configurable import configured
from recap.data.lerobot import LIBERO_KEYS, LocalDataset, detect_key_map
from recap.data.transforms import (
    SentencePieceTokenizer,
    camera_images,
    load_tokenizer,
    tokenize_prompts,
)
from recap.errors import RecapError
from recap.models.checkpoints import load_pi05, read_config
from recap.models.pi05 import Pi05Config
from recap.models.value import from_pretrained_parts

FORMATS = Path(__file__).resolve().parent / "fixtures" / "formats"
PROMPT = f"Task: {S.TASK}, State: 12 0 255 7 128 64 3 99;\nAction: "
# name -> (episodes, frames, successful episodes), seed 0
COUNTS = {
    "libero10_task0_sft": (4, 51, 4),
    "libero10_task0_train": (6, 66, 3),
    "libero10_task0_eval": (4, 45, 2),
}


@pytest.fixture(scope="module")
def standins(tmp_path_factory) -> S.StandIns:
    return S.write_standins(tmp_path_factory.mktemp("standins") / "out", seed=0)


@pytest.fixture(scope="module")
def paligemma(standins) -> SentencePieceTokenizer:
    return load_tokenizer(standins.tokenizer)


def test_layout_and_bindings(standins):
    root = standins.root
    assert standins.sft == root / "data" / "libero10_task0_sft"
    assert standins.tokenizer == root / "models" / "paligemma_tokenizer.model"
    assert standins.pi05_checkpoint == root / "models" / "pi05_libero_checkpoint" / "1000"
    assert sorted(p.name for p in (root / "data").iterdir()) == sorted(COUNTS)
    assert sorted(p.name for p in (root / "models").iterdir()) == [
        "gemma3", "paligemma_tokenizer.model", "pi05_base", "pi05_libero_checkpoint", "siglip",
    ]  # fmt: skip
    assert not list(root.rglob(".*"))  # no temporary leftovers
    assert f'all:DATA = "{root}/data"' in standins.bindings()
    assert f'all:TOKENIZER = "{standins.tokenizer}"' in standins.bindings()
    assert f'all:PI05_BASE = "{standins.pi05_base}"' in standins.bindings()


@pytest.mark.parametrize("name", list(COUNTS))
def test_datasets_read_back(standins, name):
    episodes, frames, successes = COUNTS[name]
    ds = LocalDataset(standins.data / name)
    assert (ds.version, ds.fps, ds.num_episodes, ds.num_frames) == ("v2.1", 10.0, episodes, frames)
    assert detect_key_map(ds.features) == LIBERO_KEYS
    assert ds.tasks == {0: S.TASK}
    table = ds.read_columns(["episode_index", "is_success", "state", "actions"])
    first = np.unique(table.column("episode_index").to_numpy(), return_index=True)[1]
    assert int(table.column("is_success").to_numpy(zero_copy_only=False)[first].sum()) == successes
    assert table.schema.field("state").type.list_size == 8
    assert table.schema.field("actions").type.list_size == 7
    info = ds.info
    assert info["robot_type"] == "panda"
    for camera in ("image", "wrist_image"):
        feature = info["features"][camera]
        assert feature["dtype"] == "video" and feature["shape"] == [256, 256, 3]
        assert feature["info"]["video.codec"] == "av1"
        assert (feature["info"]["video.height"], feature["info"]["video.width"]) == (256, 256)
    assert {"state", "actions", "is_success", "image", "wrist_image"} <= set(info["features"])
    assert not {"observation.state", "action"} & set(info["features"])


def test_frames_follow_the_state_and_differ_per_camera(standins):
    ds = LocalDataset(standins.train)
    rows = np.array([0, 5, 10])  # episode 0 (11 frames): start, middle, end
    base, wrist = ds.frames("image", rows), ds.frames("wrist_image", rows)
    assert base.shape == wrist.shape == (3, 256, 256, 3) and base.dtype == np.uint8
    assert np.abs(base.astype(int) - wrist.astype(int)).mean() > 20
    moved = np.abs(base[0].astype(int) - base[2].astype(int)).max(axis=-1)
    assert (moved > 60).sum() > 300  # the square moved (24 x 24 pixels, twice)
    assert base[0].std() > 20  # not constant


def test_paligemma_tokenizer(paligemma, standins):
    assert isinstance(paligemma, SentencePieceTokenizer) and len(paligemma) == 512
    pieces = [paligemma.processor.id_to_piece(i) for i in range(5)]
    assert pieces == ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"]
    assert (paligemma.pad_token_id, paligemma.eos_token_id) == (0, 1)
    assert (paligemma.bos_token_id, paligemma.unk_token_id) == (2, 3)
    ids = paligemma([PROMPT, "Zürich 1984!"], add_special_tokens=False)["input_ids"]
    assert all(3 not in seq for seq in ids) and all(seq[0] != 2 for seq in ids)
    assert paligemma.decode(ids[0]) == PROMPT and paligemma.decode(ids[1]) == "Zürich 1984!"
    digits = [paligemma.processor.id_to_piece(i) for i in paligemma("255")["input_ids"][1:]]
    assert digits == ["2", "5", "5"]  # split digits, as Gemma
    out, mask = tokenize_prompts(paligemma, [PROMPT], max_length=64)
    assert out[0, 0] == 2 and out[0, 1 : len(ids[0]) + 1].tolist() == ids[0]
    assert int(mask.sum()) == len(ids[0]) + 1 and out[0, -1] == 0
    again = pickle.loads(pickle.dumps(paligemma))
    assert again(PROMPT)["input_ids"] == [2, *ids[0]]


def test_load_tokenizer_file_errors(tmp_path):
    with pytest.raises(RecapError, match=f"{tmp_path / 'missing.model'}: tokenizer file not"):
        load_tokenizer(tmp_path / "missing.model")
    bad = tmp_path / "bad.model"
    bad.write_bytes(b"not a sentencepiece model")
    with pytest.raises(RecapError, match=f"{bad}: not a SentencePiece model"):
        load_tokenizer(bad)
    with pytest.raises(RecapError, match=f"{tmp_path}: no tokenizer"):
        load_tokenizer(tmp_path)


def test_gemma3_directory_and_tokenizer(standins, paligemma):
    config = json.loads((standins.gemma3 / "config.json").read_text())
    assert config["model_type"] == "gemma3_text"
    assert config["layer_types"] == ["sliding_attention", "full_attention"]
    assert (config["vocab_size"], config["hidden_size"], config["head_dim"]) == (512, 32, 16)
    gemma = load_tokenizer(standins.gemma3)
    assert not isinstance(gemma, SentencePieceTokenizer)  # transformers, from tokenizer.json
    assert (gemma.bos_token_id, gemma.pad_token_id, len(gemma)) == (2, 0, 512)
    ids, _ = tokenize_prompts(gemma, [PROMPT], max_length=64)
    assert torch.equal(ids, tokenize_prompts(paligemma, [PROMPT], max_length=64)[0])


def test_value_model_loads_siglip_and_gemma3(standins, paligemma):
    siglip = json.loads((standins.siglip / "config.json").read_text())
    assert siglip["model_type"] == "siglip"
    assert siglip["vision_config"]["image_size"] == 32
    assert siglip["text_config"]["vocab_size"] == 512
    model = from_pretrained_parts(standins.siglip, standins.gemma3, **S.VALUE_SIZES).eval()
    files = load_file(str(standins.siglip / "model.safetensors"))
    patch = files["vision_model.embeddings.patch_embedding.weight"]
    assert torch.equal(model.vision_tower.embeddings.patch_embedding.weight, patch)
    assert any(k.startswith("text_model.") for k in files) and "logit_scale" in files
    embed = load_file(str(standins.gemma3 / "model.safetensors"))["model.embed_tokens.weight"]
    assert torch.equal(model.language_model.embed_tokens.weight, embed)
    frames = LocalDataset(standins.sft).frames("image", np.array([0, 1]))
    images, masks = camera_images({"image": frames}, ["image"], size=32)
    ids, mask = tokenize_prompts(paligemma, [f"Task: {S.TASK}."] * 2, max_length=32)
    batch = {"images": images, "image_masks": masks, "input_ids": ids, "attention_mask": mask}
    with torch.no_grad():
        value = model.predict_value(batch)
    assert value.shape == (2,) and bool(((value >= -1) & (value <= 0)).all())


def _policy_batch(standins, paligemma) -> dict[str, torch.Tensor]:
    ds = LocalDataset(standins.train)
    rows = np.arange(10)
    frames = {cam: ds.frames(cam, rows[:1]) for cam in ("image", "wrist_image")}
    images, masks = camera_images(frames, ["image", "wrist_image"], size=32)
    ids, mask = tokenize_prompts(paligemma, [PROMPT], max_length=48)
    table = ds.read_columns(["actions"])
    actions = np.stack(table.column("actions").to_numpy(zero_copy_only=False)[:10])
    padded = torch.zeros(1, 10, 32)
    padded[0, :, :7] = torch.from_numpy(actions.astype(np.float32))
    return {"images": images, "image_masks": masks, "input_ids": ids, "attention_mask": mask,
            "actions": padded}  # fmt: skip


def test_pi05_base_and_training_checkpoint_load_strictly_and_agree(standins, paligemma):
    base, step = standins.pi05_base, standins.pi05_checkpoint
    converter = json.loads((base / "config.json").read_text())
    assert converter["paligemma_variant"] == "gemma_2b"
    assert converter["action_expert_variant"] == "gemma_300m"
    assert (converter["action_dim"], converter["action_horizon"]) == (32, 10)
    assert not (step / "config.json").exists()
    assert torch.load(step / "metadata.pt", weights_only=True)["global_step"] == 1000
    assert read_config(step) == Pi05Config()  # no config file: the caller's (real) sizes
    assert read_config(step, action_horizon=10).action_horizon == 10
    with pytest.raises(RecapError, match="holds training steps 1000"):
        load_pi05(step.parent, **S.PI05_SIZES)
    a = load_pi05(base, **S.PI05_SIZES).eval()
    b = load_pi05(step, **S.PI05_SIZES).eval()
    assert a.config == b.config == Pi05Config(**S.PI05_SIZES)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys() and all(torch.equal(sa[k], sb[k]) for k in sa)
    batch = _policy_batch(standins, paligemma)
    noise = torch.randn(1, 10, 32, generator=torch.Generator().manual_seed(0))
    time = torch.tensor([0.5])
    with torch.no_grad():
        loss_a, _ = a(batch, noise=noise, time=time)
        loss_b, _ = b(batch, noise=noise, time=time)
        act = a.sample_actions(batch, noise=noise)
    assert torch.equal(loss_a, loss_b) and bool(torch.isfinite(loss_a).all())
    assert torch.equal(act, b.sample_actions(batch, noise=noise))


def test_norm_stats_from_train_data(standins):
    text = (standins.pi05_base / "assets/physical-intelligence/libero/norm_stats.json").read_text()
    step = standins.pi05_checkpoint / "assets/physical-intelligence/libero/norm_stats.json"
    assert step.read_text() == text
    stats = json.loads(text)["norm_stats"]
    table = LocalDataset(standins.train).read_columns(["state", "actions"])
    for name, width in (("state", 8), ("actions", 7)):
        assert set(stats[name]) == {"mean", "std", "q01", "q99"}
        values = np.stack(table.column(name).to_numpy(zero_copy_only=False)).astype(np.float64)
        assert values.shape == (66, width)
        np.testing.assert_allclose(stats[name]["mean"], values.mean(0), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(stats[name]["q99"], np.quantile(values, 0.99, 0), rtol=1e-5,
                                   atol=1e-6)  # fmt: skip


def _patterns(keys) -> set[str]:
    return {re.sub(r"\.\d+\.", ".{i}.", k) for k in keys}


def test_pi05_key_patterns_are_openpis(standins):
    real = json.loads((FORMATS / "openpi_pi05_keys.json").read_text())
    embed, lm_head = real["ties"][0]
    real_file = {k: v for k, v in real["state"].items() if k != embed}  # save_model drops it
    for path in (standins.pi05_base, standins.pi05_checkpoint):
        with safe_open(str(path / "model.safetensors"), "pt") as f:
            shapes = {k: f.get_slice(k).get_shape() for k in f.keys()}
            metadata = f.metadata()
        assert _patterns(shapes) == _patterns(real_file)
        assert embed not in shapes and metadata[embed] == lm_head
        ndims = {re.sub(r"\.\d+\.", ".{i}.", k): len(v[0]) for k, v in real_file.items()}
        assert all(len(shape) == ndims[_patterns([k]).pop()] for k, shape in shapes.items())
        assert shapes[lm_head] == [512, 32]
        assert shapes["paligemma_with_expert.gemma_expert.lm_head.weight"] == [512, 32]
        layer = "paligemma_with_expert.gemma_expert.model.layers.1.input_layernorm.dense.weight"
        assert shapes[layer] == [96, 32]  # adaRMS: scale, shift, gate


def test_same_seed_same_bytes_and_refusing_to_overwrite(standins, tmp_path, capsys):
    out = tmp_path / "again"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(RecapError, match=f"{out}: directory not empty.*force"):
        S.write_standins(out)
    with pytest.raises(RecapError, match="not a directory"):
        S.write_standins(out / "notes.txt")
    assert S.main(["--out", str(out)]) == 2
    assert capsys.readouterr().err.count("\n") == 1  # one line
    assert S.main(["--out", str(out), "--seed", "0", "--force"]) == 0
    again = S.StandIns.at(out)
    printed = capsys.readouterr().out.splitlines()
    assert [line for line in printed if not line.startswith("#")] == again.bindings()
    assert (out / "notes.txt").read_text() == "mine"  # force replaces only the stand-ins
    parquet = sorted(p.relative_to(standins.root) for p in standins.root.rglob("*.parquet"))
    assert len(parquet) == 14
    for rel in parquet:
        assert (again.root / rel).read_bytes() == (standins.root / rel).read_bytes(), rel
    for rel in ("models/paligemma_tokenizer.model", "models/pi05_base/model.safetensors",
                "models/gemma3/tokenizer.json", "models/gemma3/tokenizer_config.json",
                "models/siglip/model.safetensors"):  # fmt: skip
        assert (again.root / rel).read_bytes() == (standins.root / rel).read_bytes(), rel
    other = S.make_episodes(seed=1)["libero10_task0_train"][0].state
    assert not np.array_equal(other, S.make_episodes(seed=0)["libero10_task0_train"][0].state)
    assert pq.read_table(again.train / "data/chunk-000/episode_000000.parquet").num_rows == 11


def test_a_config_less_checkpoint_loads_from_gin_with_a_named_variant(standins):
    """openpi's training checkpoints carry no config.json: ``pi05_policy.variant`` names the
    published config (pi05_libero: horizon 10), gin's sizes sit on top; a wrong name is one
    line."""
    import gin

    import recap.models.pi05  # noqa: F401  (registers pi05_policy)
    from recap.cli import parse_gin
    from recap.errors import RecapError
    from recap.models.pi05 import pi05_policy

    sizes = {k: v for k, v in S.PI05_SIZES.items() if k != "action_horizon"}
    params = [f"pi05_policy.{k} = {v!r}" for k, v in sizes.items()]
    gin.clear_config()
    try:
        parse_gin([], [*params, f'pi05_policy.checkpoint = "{standins.pi05_checkpoint}"',
                       'pi05_policy.variant = "pi05_libero"'])  # fmt: skip
        model = configured(pi05_policy)()
        assert model.config.action_horizon == 10
        gin.bind_parameter("pi05_policy.variant", "pi05_base")  # horizon 50: shapes still fit
        assert configured(pi05_policy)().config.action_horizon == 50
        gin.bind_parameter("pi05_policy.variant", "pi05_libro")
        with pytest.raises(RecapError) as err:
            configured(pi05_policy)()
        assert err.value.message == (  # gin appends "In call to configurable ..." lines
            "pi05_policy.variant 'pi05_libro' is not one of ['pi05_base', 'pi05_droid', "
            "'pi05_libero']; or leave it None and bind the sizes"
        )
    finally:
        gin.clear_config()

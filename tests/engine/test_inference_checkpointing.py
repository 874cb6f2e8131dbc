"""Single-process pieces: inference order, export with tied weights, resume planning."""

from __future__ import annotations

import json

import pytest
import torch

from recap.engine.checkpointing import STATE_FILE, plan_resume, save_exported
from recap.engine.inference import load_exported, predict
from recap.errors import RecapError
from recap.models.toy import ToyRegressionData, toy_model


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    return toy_model()


def test_predict_returns_every_item_in_dataset_order(model):
    data = ToyRegressionData(11, seed=3)
    out = predict(model, data, batch_size=4, fn=lambda m, b: {"index": b["index"], "loss": m(b)[0]})
    assert out["index"].tolist() == list(range(11))
    batch = torch.utils.data.default_collate([data[i] for i in range(11)])
    with torch.no_grad():
        expected, _ = model(batch)
    assert torch.allclose(out["loss"], expected, atol=1e-6)
    assert model.training  # mode restored


def test_export_stores_tied_weights_once_and_loads_back(model, tmp_path):
    path = save_exported(model.state_dict(), tmp_path / "model.safetensors", step=3)
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as handle:
        keys, meta = set(handle.keys()), handle.metadata()
    assert "backbone.lm_head.weight" not in keys
    assert json.loads(meta["recap_tied"]) == {
        "backbone.lm_head.weight": "backbone.model.embed_tokens.weight"
    }
    torch.manual_seed(99)
    fresh = toy_model()
    load_exported(fresh, path)
    for (name, a), (_, b) in zip(model.state_dict().items(), fresh.state_dict().items()):
        assert torch.equal(a, b), name
    assert fresh.backbone.lm_head.weight is fresh.backbone.model.embed_tokens.weight


def test_missing_export_and_missing_backbone_are_one_line_errors(tmp_path):
    with pytest.raises(RecapError, match="exported weights not found"):
        load_exported(torch.nn.Linear(1, 1), tmp_path / "nope.safetensors")
    with pytest.raises(RecapError, match="toy_model.backbone_path"):
        toy_model(backbone_path=str(tmp_path / "no_model"))


def test_backbone_loads_from_a_local_hf_directory(model, tmp_path):
    model.backbone.save_pretrained(tmp_path / "backbone")
    loaded = toy_model(backbone_path=str(tmp_path / "backbone"))
    assert torch.equal(loaded.backbone.model.norm.weight, model.backbone.model.norm.weight)


def fake_checkpoint(root, tag: str, world: int, step: int) -> None:
    (root / "checkpoints" / tag).mkdir(parents=True)
    (root / "checkpoints" / "latest").write_text(tag)
    state = {"step": step, "world_size": world, "global_batch_size": 8}
    (root / "checkpoints" / tag / STATE_FILE).write_text(json.dumps(state))


CONFIG = {"train_batch_size": 8}


def test_plan_resume(tmp_path):
    assert plan_resume(tmp_path, 2, CONFIG).tag is None
    fake_checkpoint(tmp_path, "step_4", world=2, step=4)
    plan = plan_resume(tmp_path, 2, CONFIG)
    assert (plan.tag, plan.step, plan.universal) == ("step_4", 4, False)
    with pytest.raises(RecapError) as err:
        plan_resume(tmp_path, 1, CONFIG)
    message = str(err.value)
    assert "world size 2" in message and "ds_to_universal" in message and "\n" not in message
    (tmp_path / "checkpoints" / "latest_universal").write_text("step_4_universal")
    plan = plan_resume(tmp_path, 1, CONFIG)
    assert (plan.tag, plan.step, plan.universal) == ("step_4_universal", 4, True)

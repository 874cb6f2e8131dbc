"""EMA of the weights: the formula on a plain module, then the engine end to end (2 CPU ranks,
ZeRO-3, partitioned averages): a stop + restart reproduces the averages bit for bit, and the
exported average equals one recomputed in this process from the run's float32 master weights,
and evaluation during training measured the averages (partitioned and persistent parameters)."""

from __future__ import annotations

import math
import shutil

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from recap.engine.checkpointing import WEIGHTS_KEY
from recap.engine.deepspeed_config import EngineConfig
from recap.engine.ema import WeightEMA
from recap.engine.inference import load_exported
from recap.errors import RecapError
from recap.models.toy import ToyRegressionData, toy_model
from tests.engine.conftest import PY, REPO, read_metrics, run
from tests.helpers import deepspeed_local

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")

DECAY, STEPS, CUT = 0.8, 4, 2
PARAMS = [
    f"train.max_steps = {STEPS}",
    "train.log_every = 1",
    "train.eval_every = 2",
    "train.save_every = 1",
    "train.keep_checkpoints = 0",
    "train_data/toy_data.num_examples = 64",
    # the norms and the head (<= 40 elements) stay gathered between steps (ZeRO-3 persistence)
    "deepspeed_config.param_persistence_threshold = 40",
    f"deepspeed_config.ema_decay = {DECAY}",
]


class Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(3, 3)
        self.b = torch.nn.Linear(3, 3)
        self.b.weight = self.a.weight  # tied
        self.frozen = torch.nn.Linear(3, 1).requires_grad_(False)


def test_ema_formula_ties_frozen_and_checkpoint_roundtrip(tmp_path):
    torch.manual_seed(0)
    model = Tied()
    ema = WeightEMA(model, 0.75)
    assert sorted(ema.shadow) == ["a.bias", "a.weight", "b.bias"]  # tied once, frozen skipped
    expected = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    opt = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.05)
    for _ in range(3):
        opt.zero_grad()
        model.b(model.a(torch.randn(4, 3))).square().sum().backward()
        opt.step()
        ema.update()
        for n, p in model.named_parameters():
            if p.requires_grad:
                expected[n] = 0.75 * expected[n] + 0.25 * p.detach()
    for n, value in expected.items():
        torch.testing.assert_close(ema.shadow[n], value, rtol=1e-6, atol=1e-7)
        assert not torch.allclose(value, dict(model.named_parameters())[n])
    state = ema.full_state(model.state_dict())
    assert state["b.weight"] is state["a.weight"]
    assert torch.equal(state["a.weight"], ema.shadow["a.weight"])
    assert torch.equal(state["frozen.weight"], model.frozen.weight)
    ema.save(tmp_path)
    again = WeightEMA(model, 0.75)
    assert not torch.equal(again.shadow["a.weight"], ema.shadow["a.weight"])
    assert again.load(tmp_path) and again.updates == 3
    for n in ema.shadow:
        assert torch.equal(again.shadow[n], ema.shadow[n])


def test_ema_decay_is_checked():
    with pytest.raises(RecapError, match="ema_decay=1.0"):
        EngineConfig(micro_batch_size=1, global_batch_size=1, ema_decay=1.0).build(
            world_size=1, max_steps=1
        )
    assert EngineConfig().build(world_size=1, max_steps=1)["recap"]["ema_decay"] is None


def train_cmd(run_dir, port: int) -> list[str]:
    params = [*PARAMS, f'train.run_dir = "{run_dir}"']
    return [*deepspeed_local(2, port),
            str(REPO / "scripts/train.py"), "--gin_file", str(REPO / "gin/demo/toy.gin"),
            *[arg for p in params for arg in ("--gin_param", p)]]  # fmt: skip


def ema_files(run_dir, step: int) -> list[dict]:
    directory = run_dir / "checkpoints" / f"step_{step}" / "ema"
    return [torch.load(directory / f"rank_{r:05d}.pt", weights_only=True) for r in range(2)]


def master_weights(run_dir, step: int) -> dict[str, torch.Tensor]:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    root = str(run_dir / "checkpoints")
    return get_fp32_state_dict_from_zero_checkpoint(root, tag=f"step_{step}")


@pytest.fixture(scope="module")
def ema_run(tmp_path_factory) -> dict:
    from recap.ports import free_port

    tmp = tmp_path_factory.mktemp("ema")
    run_dir = tmp / "run"
    cmd = train_cmd(run_dir, free_port())
    run(cmd, tmp)
    out = {
        "run_dir": run_dir,
        "export": load_file(run_dir / "model.safetensors"),
        "full": read_metrics(run_dir / "metrics.jsonl"),
        "ema_cut": ema_files(run_dir, CUT),
        "ema_last": ema_files(run_dir, STEPS),
        "masters": {s: master_weights(run_dir, s) for s in range(CUT + 1, STEPS + 1)},
    }
    with safe_open(str(run_dir / "model.safetensors"), framework="pt") as handle:
        out["metadata"] = handle.metadata()
    for step in range(CUT + 1, STEPS + 1):  # as if killed right after the step-CUT checkpoint
        shutil.rmtree(run_dir / "checkpoints" / f"step_{step}")
    (run_dir / "checkpoints" / "latest").write_text(f"step_{CUT}")
    (run_dir / "model.safetensors").unlink()
    done = run(cmd, tmp)
    out["resumed_log"] = done.stdout + done.stderr
    out["resumed_export"] = load_file(run_dir / "model.safetensors")
    out["resumed_ema_last"] = ema_files(run_dir, STEPS)
    return out


def test_resume_reproduces_ema_bit_exactly(ema_run):
    assert f"start_step={CUT}" in ema_run["resumed_log"]
    for before, after in zip(ema_run["ema_last"], ema_run["resumed_ema_last"], strict=True):
        assert before["updates"] == after["updates"] == STEPS
        assert before["shadow"].keys() == after["shadow"].keys()
        for name, tensor in before["shadow"].items():
            assert torch.equal(tensor, after["shadow"][name]), name
    export, resumed = ema_run["export"], ema_run["resumed_export"]
    assert export.keys() == resumed.keys()
    for name, tensor in export.items():
        assert torch.equal(tensor, resumed[name]), name


def consolidate(files: list[dict], name: str, shape: torch.Size) -> torch.Tensor:
    """A ZeRO-3 parameter from its rank partitions (contiguous, padding at the end)."""
    flat = torch.cat([f["shadow"][name] for f in files])
    return flat[: shape.numel()].view(shape)


def test_partitioned_ema_export_equals_single_process_reference(ema_run):
    export, masters = ema_run["export"], ema_run["masters"]
    assert ema_run["metadata"][WEIGHTS_KEY] == "ema"
    assert float(ema_run["metadata"]["recap_ema_decay"]) == DECAY
    assert ema_run["metadata"]["recap_ema_updates"] == str(STEPS)
    names = list(ema_run["ema_cut"][0]["shadow"])
    assert names and all(n in export for n in names)
    # each rank holds only its partition: about half of every parameter
    sizes = [sum(t.numel() for t in f["shadow"].values()) for f in ema_run["ema_cut"]]
    total = sum(export[n].numel() for n in names)
    assert sizes[0] == sizes[1] and total <= 2 * sizes[0] < total + 2 * len(names)
    moved = 0.0
    for name in names:
        shape = export[name].shape
        reference = consolidate(ema_run["ema_cut"], name, shape)  # EMA after step CUT
        for step in range(CUT + 1, STEPS + 1):  # single-process recomputation from the masters
            reference = DECAY * reference + (1 - DECAY) * masters[step][name].detach().float()
        torch.testing.assert_close(export[name], reference, rtol=0, atol=1e-6)
        moved = max(moved, float((export[name] - masters[STEPS][name].detach()).abs().max()))
    assert moved > 1e-4  # the export is the average, not the last weights


def test_exported_ema_model_loads_and_predicts(ema_run):
    torch.manual_seed(5)
    model = toy_model()
    load_exported(model, ema_run["run_dir"] / "model.safetensors")
    assert model.backbone.lm_head.weight is model.backbone.model.embed_tokens.weight
    key = "backbone.model.embed_tokens.weight"
    assert torch.equal(model.backbone.model.embed_tokens.weight, ema_run["export"][key])
    data = ToyRegressionData(16, seed=1)
    batch = torch.utils.data.default_collate([data[i] for i in range(len(data))])
    with torch.no_grad():
        loss, _ = model.eval()(batch)
    assert torch.isfinite(loss).all()


def test_bf16_zero3_trains_and_exports_the_ema(tmp_path):
    """ZeRO-3 flattens partitions into one dtype: the toy's head (built outside zero.Init) is
    cast with the rest, and the EMA of the float32 masters is exported in bf16."""
    run_dir = tmp_path / "run"
    params = [*PARAMS[:-4], "train.max_steps = 2", "train.save_every = 0",
              "train_data/toy_data.num_examples = 32", f"deepspeed_config.ema_decay = {DECAY}",
              'deepspeed_config.precision = "bf16"', f'train.run_dir = "{run_dir}"']  # fmt: skip
    cmd = [PY, str(REPO / "scripts/train.py"), "--gin_file", str(REPO / "gin/demo/toy.gin"),
           *[arg for p in params for arg in ("--gin_param", p)]]  # fmt: skip
    run(cmd, tmp_path)
    with safe_open(str(run_dir / "model.safetensors"), framework="pt") as handle:
        assert handle.metadata()[WEIGHTS_KEY] == "ema"
        tensors = {k: handle.get_tensor(k) for k in handle.keys()}
    assert {t.dtype for t in tensors.values()} == {torch.bfloat16}
    assert all(torch.isfinite(t.float()).all() for t in tensors.values())
    metrics = read_metrics(run_dir / "metrics.jsonl")
    losses = [r["train/loss"] for (_, kind), r in metrics.items() if kind == "train"]
    assert len(losses) == 2 and all(math.isfinite(x) for x in losses)


class Scale(torch.nn.Module):
    """prediction = w x; loss = (w x - target)^2 per example."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor([1.0]))

    def forward(self, batch):
        error = self.w * batch["x"] - batch["target"]
        return error.square(), {}


class Engine(torch.nn.Module):
    """What ``Trainer.maybe_evaluate`` reads of a DeepSpeed engine: a callable with ``module``."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, batch):
        return self.module(batch)


def test_evaluation_during_training_reads_the_ema_weights(tmp_path):
    from recap.engine.trainer import LoopOptions, Trainer
    from recap.tracking import Tracker

    model = Scale()
    ema = WeightEMA(model, 0.5)  # average 1.0
    with torch.no_grad():
        model.w.fill_(3.0)  # a trained step: raw 3.0
    ema.update()  # average 0.5 * 1 + 0.5 * 3 = 2.0
    eval_data = [{"x": torch.tensor(1.0), "target": torch.tensor(0.0)}] * 3
    config = {"gradient_accumulation_steps": 1, "train_micro_batch_size_per_gpu": 2}
    opts = LoopOptions(run_dir=tmp_path, max_steps=1, eval_every=1)
    tracker = Tracker(enabled=False)
    trainer = Trainer(Engine(model), config, opts, tracker, [], eval_data, ema=ema)
    trainer.maybe_evaluate(1)
    assert trainer.last_eval == {"eval/loss": 4.0}  # (2 x 1 - 0)^2, not the raw weight's 9
    assert model.w.item() == 3.0  # the trained weight back for the next step
    assert ema.shadow["w"].item() == 2.0
    trainer.ema = None
    trainer.maybe_evaluate(1)
    assert trainer.last_eval == {"eval/loss": 9.0}


def eval_loss(state: dict[str, torch.Tensor]) -> float:
    """Mean eval loss of the toy model with ``state`` on ``gin/demo/toy.gin``'s eval set."""
    model = toy_model()
    model.load_state_dict(state, strict=False)
    model.backbone.tie_weights()
    data = ToyRegressionData(37, seed=1)
    batch = torch.utils.data.default_collate([data[i] for i in range(len(data))])
    with torch.no_grad():
        loss, _ = model.eval()(batch)
    return float(loss.mean())


def test_evaluation_during_a_zero3_run_reads_the_ema(ema_run):
    logged = ema_run["full"][(STEPS, "eval")]["eval/loss"]
    ema = eval_loss(ema_run["export"])
    raw = eval_loss({k: v.float() for k, v in ema_run["masters"][STEPS].items()})
    assert abs(raw - ema) > 1e-3  # the two weights give measurably different losses
    assert logged == pytest.approx(ema, rel=1e-5, abs=1e-6)

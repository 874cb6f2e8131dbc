"""RLinf interop: its Step 1 returns sidecar (no JSON), the Gemma1-style critic expert, and
importing / exporting its value-model full state dict."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from recap.core import columns as C
from recap.data.lerobot import LocalDataset
from recap.data.sidecars import read_returns
from recap.errors import DatasetError
from recap.steps.compute_returns import ReturnsConfig, compute_returns
from tests.helpers import copy_fixture

FIXTURE = "rlinf_like_v21_video"  # 7 episodes, lengths 11,8,14,7,10,12,9; T,F,T,T,F,T,F
TASK_SOUP = "pick up the alphabet soup and place it in the basket"
RLINF_SCHEMA = pa.schema(
    [("episode_index", pa.int64()), ("frame_index", pa.int64()), ("return", pa.float32()),
     ("reward", pa.float32()), ("prompt", pa.string())]
)  # fmt: skip


def rlinf_returns(root, gamma: float, failure: float = -300.0, split: int | None = None):
    """RLinf's Step 1 sidecar, from its documented format: per episode r = -1 then 0 (success) or
    ``failure`` at the last frame, G_t = r_t + gamma G_{t+1} backwards, rows shuffled
    (completion order). ``split``: that episode is cut after its 4th frame, as RLinf does when
    the episode spans two data files (each part ends with the outcome of its last row)."""
    with LocalDataset(root) as ds:
        t = ds.read_columns(["episode_index", "frame_index", "task_index", "is_success"])
        tasks = ds.tasks
    ep = t.column("episode_index").to_numpy()
    fr = t.column("frame_index").to_numpy()
    ok = t.column("is_success").to_numpy(zero_copy_only=False)
    task = t.column("task_index").to_numpy()
    rows = []
    for e in np.unique(ep):
        sel = np.flatnonzero(ep == e)
        sel = sel[np.argsort(fr[sel])]
        parts = [sel[:4], sel[4:]] if e == split else [sel]
        for part in parts:
            n = len(part)
            r = np.full(n, -1.0)
            r[-1] = 0.0 if ok[part[-1]] else failure
            g = np.zeros(n)
            acc = 0.0
            for i in range(n - 1, -1, -1):
                acc = r[i] + gamma * acc
                g[i] = acc
            rows += [(int(e), int(fr[j]), g[k], r[k], tasks[int(task[j])]) for k, j in
                     enumerate(part)]  # fmt: skip
    order = np.random.default_rng(0).permutation(len(rows))
    cols = list(zip(*[rows[i] for i in order]))
    table = pa.Table.from_arrays(
        [pa.array(c, f.type) for c, f in zip(cols, RLINF_SCHEMA)], schema=RLINF_SCHEMA
    )
    path = root / "meta" / "returns_rl.parquet"
    pq.write_table(table, path)
    return path


@pytest.fixture
def rlinf_data(tmp_path):
    root = copy_fixture(FIXTURE, tmp_path)
    rlinf_returns(root, 0.97)
    return root


def test_rlinf_returns_read_with_step1_statistics(rlinf_data):
    root = rlinf_data
    assert not (root / "meta" / "returns_rl.json").exists()
    table, stats = read_returns(root, "rl")
    assert stats["return_min"] == -300.0 and stats["return_max"] == 0.0
    assert stats["return_mean"] == pytest.approx(-105.6146236540566, abs=1e-9)
    assert stats["return_std"] == pytest.approx(129.25507870820414, abs=1e-9)
    assert (stats["num_frames"], stats["num_episodes"], stats["num_successes"]) == (71, 7, 4)
    assert (
        stats["gamma"] == 0.97 and stats["gamma_source"] == "inferred from 60 frames"
    )  # 64 minus 4 successes' T-2
    assert stats["failure_reward"] == -300.0 and stats["format"] == "rlinf"
    assert stats["task_max_episode_length"] == {
        TASK_SOUP: 11, "turn on the stove": 10, "put the cream cheese in the bowl": 14
    }  # fmt: skip
    # the same numbers as recap's own Step 1 on this dataset, and the same sorted table
    ours = compute_returns(
        ReturnsConfig(
            datasets=[{"name": root.name, "root": str(root), "type": "rollout", "gamma": 0.97}],
            tag="ours",
        )
    )[0]
    keys = [k for k in ours.stats if k not in ("source", "dataset_type", "outcome_column")]
    assert {k: stats[k] for k in keys} == {k: ours.stats[k] for k in keys}
    assert table.column(C.EPISODE_INDEX).to_pylist()[:12] == [0] * 11 + [1]
    assert table.column(C.RETURN).to_pylist()[:2] == pytest.approx([-8.7525, -7.9923], abs=1e-4)
    for name in (C.RETURN, C.REWARD, C.EPISODE_INDEX, C.FRAME_INDEX):
        assert table.column(name).to_pylist() == ours.table.column(name).to_pylist(), name


def test_rlinf_returns_undiscounted_gamma_is_inferred_as_one(tmp_path):
    root = copy_fixture(FIXTURE, tmp_path)
    rlinf_returns(root, 1.0, failure=-50.0)
    _, stats = read_returns(root, "rl")
    assert (stats["gamma"], stats["failure_reward"], stats["return_min"]) == (1.0, -50.0, -59.0)


def test_rlinf_returns_split_episode_is_refused(tmp_path):
    root = copy_fixture(FIXTURE, tmp_path)
    path = rlinf_returns(root, 0.97, split=2)
    with pytest.raises(DatasetError) as err:
        read_returns(root, "rl")
    assert str(err.value) == (
        f"{path}: episode 2 frame 3: reward 0 (an episode end) before its last frame; RLinf's "
        "Step 1 finds episode boundaries per data file, so an episode spanning two data files "
        "was split in two; recompute the returns with recap's Step 1 (scripts/compute_returns.py)"
    )


def test_rlinf_returns_missing_frames_are_refused(rlinf_data):
    path = rlinf_data / "meta" / "returns_rl.parquet"
    table = pq.read_table(path)
    keep = ~((table.column("episode_index").to_numpy() == 5)
             & (table.column("frame_index").to_numpy() >= 10))  # fmt: skip
    pq.write_table(table.filter(pa.array(keep)), path)
    with pytest.raises(DatasetError) as err:
        read_returns(rlinf_data, "rl")
    assert str(err.value) == (
        f"{path}: no rows for frames 10..11 of episode 5 (69 rows for 71 frames); the sidecar "
        "was computed from other data, recompute it"
    )


# ---- the Gemma1-style critic expert and RLinf's value-model state dict -----------------------

VISION = {"hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
          "num_attention_heads": 2, "image_size": 16, "patch_size": 8}  # fmt: skip
TEXT = {"vocab_size": 64, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 3,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 8,
        "query_pre_attn_scalar": 8, "sliding_window": 4}  # fmt: skip
EXPERT = {"expert_width": 16, "expert_depth": 2, "expert_mlp": 24, "expert_heads": 2,
          "expert_kv_heads": 1, "expert_head_dim": 8, "num_bins": 11}  # fmt: skip


def tiny_model(**kw):
    import torch

    from recap.models.value import ValueModelConfig, build_value_model

    torch.manual_seed(0)
    config = ValueModelConfig(vision=VISION, text=TEXT, expert_style="gemma1", **EXPERT, **kw)
    model = build_value_model(config).eval()
    with torch.no_grad():  # norms start at 0 (identity); make them matter
        for name, p in model.named_parameters():
            if name.endswith("layernorm.weight") or name == "expert.norm.weight":
                p.normal_(0.0, 0.5)
    return model


def reference_expert(sd: dict, token, kvs, valid, eps=1e-6):
    """RLinf's critic expert from its description: Gemma1 blocks x + attn(rms(x)),
    x + mlp(rms(x)); rms = x * rsqrt(mean(x^2) + eps) * (1 + w); RoPE base 10000 at position
    = number of valid prefix tokens; keys/values = backbone layer i's (valid) + its own."""
    import torch

    def rms(x, w):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1 + w)

    def rope(x, pos):  # x [H, D] at integer pos, rotate-half convention
        d = x.shape[-1]
        inv = 10000.0 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
        ang = torch.cat([pos * inv, pos * inv])
        x1, x2 = x[..., : d // 2], x[..., d // 2 :]
        return x * ang.cos() + torch.cat([-x2, x1], -1) * ang.sin()

    sd = {k: v.double() for k, v in sd.items()}
    out = []
    for b in range(token.shape[0]):
        h = token[b, 0].double()
        pos = int(valid[b].sum())
        for i, (pk, pv) in enumerate(kvs):
            p = f"expert.layers.{i}."
            x = rms(h, sd[p + "input_layernorm.weight"])
            q = rope((sd[p + "self_attn.q_proj.weight"] @ x).view(2, 8), pos)
            k = rope((sd[p + "self_attn.k_proj.weight"] @ x).view(1, 8), pos)
            v = (sd[p + "self_attn.v_proj.weight"] @ x).view(1, 8)
            keys = torch.cat([pk[b, 0][valid[b]].double(), k])  # [n+1, 8], 1 kv head
            vals = torch.cat([pv[b, 0][valid[b]].double(), v])
            att = torch.softmax(q @ keys.T / 8**0.5, -1) @ vals  # [2 heads, 8]
            h = h + sd[p + "self_attn.o_proj.weight"] @ att.flatten()
            x = rms(h, sd[p + "post_attention_layernorm.weight"])
            gate = torch.nn.functional.gelu(sd[p + "mlp.gate_proj.weight"] @ x, approximate="tanh")
            h = h + sd[p + "mlp.down_proj.weight"] @ (gate * (sd[p + "mlp.up_proj.weight"] @ x))
        out.append(rms(h, sd["expert.norm.weight"]))
    return torch.stack(out)


def _batch(seed=1):
    import torch

    g = torch.Generator().manual_seed(seed)
    return {
        "images": torch.rand(2, 3, 3, 16, 16, generator=g) * 2 - 1,
        "image_masks": torch.tensor([[True, False, True], [True, True, False]]),
        "input_ids": torch.randint(1, 64, (2, 5), generator=g),
        "attention_mask": torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool),
    }


def test_gemma1_expert_matches_the_reference_forward():
    import torch

    from recap.models import layers

    model = tiny_model()
    assert type(model.expert).__name__ == "Gemma1Expert"
    batch = _batch()
    with torch.no_grad():
        embeds, valid = model.embed_prefix(batch["images"], batch["image_masks"],
                                           batch["input_ids"], batch["attention_mask"])  # fmt: skip
        positions = (valid.long().cumsum(1) - 1).clamp(min=0)
        kvs = layers.run_prefix(model.language_model, embeds, valid, positions, 2)
        token = model.head["cls"].weight[None].expand(2, 1, 16)  # not scaled by sqrt(width)
        expected = reference_expert(model.state_dict(), token, kvs, valid)
        got = model.expert(token, kvs, valid, valid.long().sum(1, keepdim=True))
        logits = model.logits(batch)
    assert valid.sum(1).tolist() == [11, 13]  # 2 cameras x 4 tokens + 3 text; 1 camera + 5
    assert (got.double() - expected).abs().max().item() < 1e-5
    ref_logits = expected @ model.head["proj"].weight.double().T + model.head["proj"].bias.double()
    assert (logits.double() - ref_logits).abs().max().item() < 1e-5
    assert got.abs().max().item() > 0.1  # not a degenerate (all-zero) state


def test_expert_style_is_checked_and_defaults_to_gemma3():
    from recap.errors import RecapError
    from recap.models.value import ValueModelConfig

    assert ValueModelConfig().expert_style == "gemma3"
    with pytest.raises(RecapError) as err:
        ValueModelConfig(vision=VISION, text=TEXT, expert_style="gemma2", **EXPERT).validate()
    assert str(err.value) == (
        "value model config: expert_style 'gemma2' not in ('gemma3', 'gemma1'); fix the expert "
        "sizes"
    )


def rlinf_state(model) -> dict:
    """RLinf's full state dict of ``model`` (untruncated), named as FORMATS.md documents it,
    with SigLIP's pooling head and both lm_heads (Gemma3's tied to its embedding)."""
    import torch

    g = torch.Generator().manual_seed(3)
    out = {}
    for key, value in model.state_dict().items():
        for ours, theirs in (("vision_tower.", "value_expert.vision_tower.vision_model."),
                             ("language_model.", "value_expert.gemma3.model."),
                             ("projector.", "value_expert.multi_modal_proj."),
                             ("expert.", "value_expert.experts.value.model."),
                             ("head.cls.", "value_head.cls_embedding."),
                             ("head.proj.", "value_head.value_proj.")):  # fmt: skip
            if key.startswith(ours):
                out[theirs + key[len(ours) :]] = value.clone()
    out["value_expert.gemma3.lm_head.weight"] = out["value_expert.gemma3.model.embed_tokens.weight"]
    out["value_expert.experts.value.lm_head.weight"] = torch.randn(64, 16, generator=g)
    for name in ("probe", "attention.in_proj_weight", "layernorm.weight", "mlp.fc1.weight"):
        out[f"value_expert.vision_tower.vision_model.head.{name}"] = torch.randn(4, generator=g)
    return out


def _write_configs(tmp_path):
    (tmp_path / "vision.json").write_text(json.dumps(VISION))
    (tmp_path / "text.json").write_text(json.dumps(TEXT))
    return ["--vision-config", str(tmp_path / "vision.json"), "--text-config",
            str(tmp_path / "text.json")]  # fmt: skip


def test_import_rlinf_value_round_trips_bit_for_bit(tmp_path):
    import torch
    from safetensors.torch import load_file

    from recap.commands.import_rlinf import main
    from recap.models.value import load_value_model

    source = tiny_model(truncate_backbone=False)
    state = rlinf_state(source)
    torch.save(state, tmp_path / "full_weights.pt")
    torch.save({"model." + k: v for k, v in state.items()}, tmp_path / "prefixed.pt")
    cfg = _write_configs(tmp_path)
    out = tmp_path / "imported"
    assert main(["rlinf-value", str(tmp_path / "full_weights.pt"), "--out", str(out),
                 "--keep-unused", *cfg]) == 0  # fmt: skip
    assert main(["rlinf-value", str(tmp_path / "prefixed.pt"), "--out", str(tmp_path / "p"),
                 *cfg]) == 0  # fmt: skip
    plain, prefixed = (load_file(str(d / "model.safetensors")) for d in (out, tmp_path / "p"))
    assert plain.keys() == prefixed.keys() and all(
        torch.equal(plain[k], prefixed[k]) for k in plain
    )
    config = json.loads((out / "config.json").read_text())
    assert (config["expert_style"], config["expert_width"], config["expert_depth"],
            config["expert_mlp"], config["expert_heads"], config["num_bins"]) == (
            "gemma1", 16, 2, 24, 2, 11)  # fmt: skip
    loaded = load_value_model(out).eval()
    batch = _batch()
    with torch.no_grad():
        assert torch.equal(loaded.logits(batch), source.logits(batch))
    assert main(["export-rlinf-value", str(out), "--out", str(tmp_path / "back.pt")]) == 0
    back = torch.load(tmp_path / "back.pt", weights_only=True)
    assert sorted(back) == sorted(state) and len(state) == 92
    assert all(torch.equal(back[k], state[k]) and back[k].dtype == state[k].dtype for k in state)


def rlinf_resize(images: np.ndarray, size: int):
    """RLinf's value preprocessing as FORMATS.md describes it, written here from the text:
    the longer side resized to ``size`` (bilinear, no antialiasing), centred, padded with 0 in
    uint8, then ``x / 255 * 2 - 1``: float32[N, 3, size, size]."""
    import torch
    import torch.nn.functional as F

    unit = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255.0
    height, width = unit.shape[-2:]
    ratio = max(height / size, width / size)
    new_h, new_w = int(height / ratio), int(width / ratio)
    resized = F.interpolate(unit, size=(new_h, new_w), mode="bilinear", align_corners=False,
                            antialias=False).clamp(0.0, 1.0)  # fmt: skip
    as_uint8 = (resized * 255.0).round()
    top, left = (size - new_h) // 2, (size - new_w) // 2
    padded = F.pad(as_uint8, (left, size - new_w - left, top, size - new_h - top), value=0.0)
    return padded / 255.0 * 2.0 - 1.0


def test_an_imported_rlinf_value_model_gets_rlinfs_v_on_an_image_not_at_model_size(tmp_path):
    import torch

    from recap.commands.import_rlinf import main
    from recap.models.value import load_value_model
    from recap.processing.value import read_value_processor

    torch.save(rlinf_state(tiny_model(truncate_backbone=False)), tmp_path / "w.pt")
    out = tmp_path / "m"
    assert main(["rlinf-value", str(tmp_path / "w.pt"), "--out", str(out),
                 *_write_configs(tmp_path)]) == 0  # fmt: skip
    processor = read_value_processor(out)
    assert (processor.resize, processor.image_size, processor.return_range) == (
        "bilinear", 16, None)  # fmt: skip
    model = load_value_model(out).eval()
    image = np.random.default_rng(0).integers(0, 256, (2, 20, 28, 3), dtype=np.uint8)
    frames, masks = processor.pack({"observation.images.image": image})
    assert frames.shape == (2, 3, 16, 16, 3) and masks.tolist() == [[True, False, False]] * 2
    tokens = {"input_ids": torch.tensor([[2, 7, 9, 4]] * 2),
              "attention_mask": torch.ones(2, 4, dtype=torch.bool)}  # fmt: skip
    reference = torch.zeros(2, 3, 3, 16, 16)  # a missing camera: zeros, mask False
    reference[:, 0] = rlinf_resize(image, 16)
    with torch.no_grad():
        ours = model.predict_value({"frames": frames, "image_masks": masks, **tokens})
        theirs = model.predict_value({"images": reference, "image_masks": masks, **tokens})
        antialiased = processor.replace(resize="antialias").pack(
            {"observation.images.image": image})[0]  # fmt: skip
        other = model.predict_value({"frames": antialiased, "image_masks": masks, **tokens})
    torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-6)
    assert (ours - other).abs().max() > 1e-5  # the rule matters: antialiasing moves V


def test_import_rlinf_value_truncates_and_refuses_unknown_keys(tmp_path, capsys):
    import torch

    from recap.commands.import_rlinf import main

    state = rlinf_state(tiny_model(truncate_backbone=False))
    cfg = _write_configs(tmp_path)
    torch.save(state, tmp_path / "w.pt")
    assert main(["rlinf-value", str(tmp_path / "w.pt"), "--out", str(tmp_path / "t"),
                 "--truncate", *cfg]) == 0  # fmt: skip
    config = json.loads((tmp_path / "t" / "config.json").read_text())
    assert config["truncate_backbone"] is True
    state["value_expert.extra.weight"] = torch.zeros(1)
    state["value_head.value_proj.weight"] = torch.zeros(12, 16)
    torch.save(state, tmp_path / "bad.pt")
    capsys.readouterr()
    assert main(["rlinf-value", str(tmp_path / "bad.pt"), "--out", str(tmp_path / "b"), *cfg]) == 2
    assert capsys.readouterr().err == (
        "recap-import: RLinf value state dict: 1 keys match no RLinf prefix "
        "(value_expert.extra.weight); is this RLinf's value-model full_weights.pt?\n"
    )
    del state["value_expert.extra.weight"], state["value_expert.gemma3.model.norm.weight"]
    torch.save(state, tmp_path / "bad.pt")
    assert main(["rlinf-value", str(tmp_path / "bad.pt"), "--out", str(tmp_path / "b"), *cfg]) == 2
    assert capsys.readouterr().err == (
        "recap-import: RLinf value state dict: 1 keys missing (value_expert.gemma3.model.norm."
        "weight); check the vision/text configs and that this is RLinf's value model\n"
    )
    assert not (tmp_path / "b" / "model.safetensors").exists()


def test_value_dataset_and_step3_accept_rlinf_returns_and_weights(rlinf_data, tmp_path):
    import torch

    from recap.commands.import_rlinf import main
    from recap.core.normalize import ReturnRange
    from recap.data.datasets import ValueDataset, training_return_range
    from recap.data.specs import parse_dataset_specs
    from recap.data.transforms import load_tokenizer, write_word_tokenizer
    from recap.steps.compute_advantages import Plan

    tok = write_word_tokenizer(tmp_path / "tok", [TASK_SOUP, "turn on the stove",
                                                  "put the cream cheese in the bowl"])  # fmt: skip
    specs = parse_dataset_specs([{"name": "rl", "root": str(rlinf_data)}])
    rng = training_return_range(specs, "rl")
    assert rng == ReturnRange(-300.0, 0.0)
    data = ValueDataset(specs, "rl", rng, load_tokenizer(tok), 16, 16)
    assert len(data) == 71
    assert data.sources[0].target[:2].tolist() == pytest.approx(
        [-8.7525 / 300, -7.9923 / 300], abs=1e-6)  # fmt: skip
    torch.save(rlinf_state(tiny_model(truncate_backbone=False)), tmp_path / "w.pt")
    assert main(["rlinf-value", str(tmp_path / "w.pt"), "--out", str(tmp_path / "m"),
                 *_write_configs(tmp_path)]) == 0  # fmt: skip
    plan = Plan.checked([{"name": "rl", "root": str(rlinf_data)}], "", "adv", "rl",
                        tmp_path / "m", tok, 5, None, None, "fp32")  # fmt: skip
    assert (plan.gamma, plan.range, plan.weights) == (
        0.97, ReturnRange(-300.0, 0.0), tmp_path / "m" / "model.safetensors")  # fmt: skip


def test_step4_reads_rlinfs_narrow_advantages_files(tmp_path):
    """RLinf's relabel (recompute mode) and STEAM write 8 columns, not 11: Step 4 needs three
    (episode_index, frame_index, advantage), so such a file labels the frames; a file without
    ``advantage`` is one line."""
    from recap.data.conditioning import dataset_labels

    root = copy_fixture("rlinf_like_v21_video", tmp_path)
    with LocalDataset(root) as ds:
        frames = ds.read_columns([C.EPISODE_INDEX, C.FRAME_INDEX])
    ep, fr = (frames.column(k).to_numpy() for k in (C.EPISODE_INDEX, C.FRAME_INDEX))
    n = len(ep)
    label = np.arange(n) % 3 == 0
    narrow = pa.table({
        C.EPISODE_INDEX: ep, C.FRAME_INDEX: fr,
        C.ADVANTAGE_CONTINUOUS: np.linspace(-1, 1, n), "reward_sum": np.zeros(n),
        "value_current": np.zeros(n), "value_next": np.zeros(n), C.RETURN: np.zeros(n),
        C.ADVANTAGE: label,
    })  # fmt: skip
    path = root / "meta" / "advantages_rl.parquet"
    pq.write_table(narrow.take(np.random.default_rng(0).permutation(n)), path)  # any row order
    assert n == 71
    np.testing.assert_array_equal(dataset_labels(root, "rl", ep, fr), label)
    pq.write_table(narrow.drop_columns([C.ADVANTAGE]), path)
    with pytest.raises(DatasetError) as err:
        dataset_labels(root, "rl", ep, fr)
    assert err.value.message == f"{path}: column 'advantage' missing; rewrite the sidecar"


def test_relabel_reads_rlinfs_narrow_advantages_files(tmp_path, capsys):
    """Relabel needs only advantage_continuous (and the frame keys): RLinf's 8-column file
    relabels; the columns it carries over are kept, the three it lacks are written as nulls,
    and the labels equal those of the same values in a full 11-column file."""
    import yaml

    from recap.data.sidecars import read_advantages
    from recap.steps.relabel import RelabelConfig, relabel

    root = copy_fixture("rlinf_like_v21_video", tmp_path)
    with LocalDataset(root) as ds:
        frames = ds.read_columns([C.EPISODE_INDEX, C.FRAME_INDEX])
    ep, fr = (frames.column(k).to_numpy() for k in (C.EPISODE_INDEX, C.FRAME_INDEX))
    n = len(ep)
    adv = np.linspace(-1.0, 1.0, n)[np.random.default_rng(1).permutation(n)]
    narrow = pa.table({
        C.EPISODE_INDEX: ep, C.FRAME_INDEX: fr, C.ADVANTAGE_CONTINUOUS: adv,
        C.REWARD_SUM: adv / 2, C.VALUE_CURRENT: -adv, C.VALUE_NEXT: adv - 0.5,
        C.RETURN: np.full(n, -3.0), C.ADVANTAGE: adv > 0.5,
    })  # fmt: skip
    pq.write_table(narrow, root / "meta" / "advantages_rl.parquet")
    spec = [{"name": "d", "root": str(root), "type": "rollout"}]
    relabel(RelabelConfig(datasets=spec, source_tag="rl", new_tag="q40", positive_quantile=0.4))
    out, record = read_advantages(root, "q40")
    assert out.column_names == C.ADVANTAGES_SCHEMA.names and out.num_rows == 71
    # the 0.6 quantile of 71 evenly spaced values in [-1, 1] is the 43rd: -1 + 2 * 42/70 = 0.2
    assert record["unified_threshold"] == pytest.approx(0.2, abs=1e-12)
    assert int(np.count_nonzero(out.column(C.ADVANTAGE).to_numpy())) == 29  # 42..70
    np.testing.assert_array_equal(out.column(C.ADVANTAGE).to_numpy(), adv >= 0.2 - 1e-12)
    for name in (C.ADVANTAGE_CONTINUOUS, C.REWARD_SUM, C.VALUE_CURRENT, C.VALUE_NEXT, C.RETURN):
        np.testing.assert_array_equal(out.column(name).to_numpy(), narrow.column(name).to_numpy())
    assert [out.column(k).null_count for k in (C.REWARD_SUM_RAW, C.NUM_VALID_REWARDS)] == [71, 71]
    assert set(out.column(C.DATASET_NAME).to_pylist()) == {"d"}
    config = yaml.safe_load((root / "meta" / "mixture_config.yaml").read_text())
    assert type(config["tags"]["q40"]["unified_threshold"]) is float
    # the same values in recap's full layout label the same frames
    full = narrow.append_column(C.REWARD_SUM_RAW, pa.array(np.zeros(n)))
    full = full.append_column(C.NUM_VALID_REWARDS, pa.array(np.ones(n, dtype=np.int64)))
    full = full.append_column(C.DATASET_NAME, pa.array(["d"] * n)).select(C.ADVANTAGES_SCHEMA.names)
    pq.write_table(full, root / "meta" / "advantages_full.parquet")
    relabel(
        RelabelConfig(datasets=spec, source_tag="full", new_tag="full40", positive_quantile=0.4)
    )
    again, _ = read_advantages(root, "full40")
    assert again.column(C.ADVANTAGE).equals(out.column(C.ADVANTAGE))
    # relabeling the relabeled (partly null) file works too
    relabel(RelabelConfig(datasets=spec, source_tag="q40", new_tag="q10", positive_quantile=0.1))
    assert int(np.count_nonzero(read_advantages(root, "q10")[0].column(C.ADVANTAGE))) == 8
    # without advantage_continuous: one line naming the file and the column
    pq.write_table(
        narrow.drop_columns([C.ADVANTAGE_CONTINUOUS]), root / "meta" / "advantages_x.parquet"
    )
    with pytest.raises(DatasetError) as err:
        relabel(RelabelConfig(datasets=spec, source_tag="x", new_tag="x2"))
    assert err.value.message == (
        f"{root / 'meta' / 'advantages_x.parquet'}: column 'advantage_continuous' missing; "
        "rewrite the sidecar"
    )


# ---- RLinf's CFG π0.5 checkpoint (full_weights.pt) <-> openpi's layout ----------------------


def rlinf_policy_state(policy) -> dict:
    """RLinf's CFG policy full state dict as FORMATS.md documents it: exactly openpi's
    ``PI0Pytorch.state_dict()`` (both lm_heads, the text embedding tied to paligemma's), the
    expert's unused lm_head in RLinf's hard-coded shape [257152, width] at any size."""
    import torch

    from recap.interop.rlinf import RLINF_VOCAB
    from recap.models.checkpoints import EXPERT_LM_HEAD_KEY
    from recap.standins import openpi_module

    state = openpi_module(policy, seed=5).state_dict()
    width = state[EXPERT_LM_HEAD_KEY].shape[1]
    g = torch.Generator().manual_seed(5)
    state[EXPERT_LM_HEAD_KEY] = torch.randn(RLINF_VOCAB, width, generator=g)
    return state


def test_import_rlinf_policy_loads_and_samples_as_the_source(tmp_path, capsys):
    import torch
    from safetensors.torch import load_file

    from recap.commands.import_rlinf import main
    from recap.models import checkpoints as ckpt
    from tests.models.test_checkpoints import openpi_keys, sample
    from tests.models.test_pi05 import tiny_model

    policy = tiny_model(seed=1)
    base = tmp_path / "pi05_base"
    ckpt.save_pi05(policy, base)
    stats = ckpt.norm_stats_path(base, "physical-intelligence/libero")
    stats.parent.mkdir(parents=True)
    stats.write_text('{"norm_stats": {"state": {"q01": [0], "q99": [1]}, '
                     '"actions": {"q01": [-1], "q99": [2]}}}')  # fmt: skip
    state = rlinf_policy_state(policy)
    assert len(state) == len(openpi_keys()) + 1 == 77  # the file's keys + the tied embedding
    assert state[ckpt.EMBED_KEY].data_ptr() == state[ckpt.LM_HEAD_KEY].data_ptr()  # tied
    torch.save(state, tmp_path / "full_weights.pt")
    out = tmp_path / "imported"
    argv = ["rlinf-policy", str(tmp_path / "full_weights.pt"), "--out", str(out)]
    assert main([*argv, "--base", str(base)]) == 0
    file = load_file(str(out / "model.safetensors"))
    assert set(file) == openpi_keys()  # openpi's save_model layout: the embedding as lm_head
    # the expert's unused head, [257152, 32] in RLinf, is zeros of the model's [32, 32]
    assert file[ckpt.EXPERT_LM_HEAD_KEY].shape == (32, 32)
    assert not file[ckpt.EXPERT_LM_HEAD_KEY].any()
    assert (out / "assets/physical-intelligence/libero/norm_stats.json").read_text() == (
        stats.read_text()
    )
    loaded = ckpt.load_pi05(out).eval()
    with torch.no_grad():
        assert torch.equal(sample(loaded), sample(policy))
    assert sample(policy).abs().max().item() > 0.1
    # and back: RLinf's full state dict, bit for bit, the tie restored; the expert's unused
    # head in RLinf's shape, zeros
    assert main(["export-rlinf-policy", str(out), "--out", str(tmp_path / "back.pt")]) == 0
    back = torch.load(tmp_path / "back.pt", weights_only=True)
    assert sorted(back) == sorted(state)
    used = [k for k in state if k != ckpt.EXPERT_LM_HEAD_KEY]
    assert all(torch.equal(back[k], state[k]) and back[k].dtype == state[k].dtype for k in used)
    assert back[ckpt.EXPERT_LM_HEAD_KEY].shape == (257152, 32)
    assert not back[ckpt.EXPERT_LM_HEAD_KEY].any()
    assert back[ckpt.EMBED_KEY].data_ptr() == back[ckpt.LM_HEAD_KEY].data_ptr()
    # recap's training export (Pi05Policy keys: the embedding under its own name, no heads)
    # exports too: RLinf's full key set, the expert's unused head as zeros (as save_pi05)
    from safetensors.torch import save_file

    trained = tmp_path / "trained"
    trained.mkdir()
    save_file({k: v.contiguous() for k, v in policy.state_dict().items()},
              str(trained / "model.safetensors"))  # fmt: skip
    assert main(["export-rlinf-policy", str(trained), "--out", str(tmp_path / "t.pt")]) == 0
    exported = torch.load(tmp_path / "t.pt", weights_only=True)
    assert sorted(exported) == sorted(state)
    assert torch.equal(exported[ckpt.LM_HEAD_KEY], state[ckpt.EMBED_KEY])
    assert exported[ckpt.EXPERT_LM_HEAD_KEY].abs().sum().item() == 0.0
    assert exported[ckpt.EXPERT_LM_HEAD_KEY].shape == state[ckpt.EXPERT_LM_HEAD_KEY].shape
    # strict: an unknown key, an unfilled key, an untied embedding: one line, nothing written
    capsys.readouterr()
    for edit, message in (
        (lambda s: s.update({"value_head.value_proj.weight": torch.zeros(1)}),
         "1 keys unmapped, first 'value_head.value_proj.weight' (not a key of openpi's "
         "PI0Pytorch at this config); is this RLinf's CFG π0.5 full_weights.pt, and are the "
         "sizes (--base) right?"),
        (lambda s: s.pop("time_mlp_out.bias"),
         "1 keys of openpi's layout unfilled, first 'time_mlp_out.bias'; is this RLinf's CFG "
         "π0.5 full_weights.pt, and are the sizes (--base) right?"),
        (lambda s: s.update({ckpt.EMBED_KEY: s[ckpt.EMBED_KEY] + 1}),
         f"{ckpt.EMBED_KEY} differs from {ckpt.LM_HEAD_KEY}, which openpi ties to it; the "
         "checkpoint is not a π0.5 policy's"),
    ):  # fmt: skip
        bad = dict(state)
        edit(bad)
        torch.save(bad, tmp_path / "bad.pt")
        bad_out = tmp_path / "bad_out"
        assert main(["rlinf-policy", str(tmp_path / "bad.pt"), "--out", str(bad_out),
                     "--base", str(base)]) == 2  # fmt: skip
        assert capsys.readouterr().err == (
            f"recap-import: {tmp_path / 'bad.pt'}: RLinf policy state dict: {message}\n"
        )
        assert not bad_out.exists()
    # without --base the sizes are pi05_libero's real ones: the tiny file does not fit
    assert main([*argv[:3], str(tmp_path / "real")]) == 2
    assert "RLinf policy state dict: " in capsys.readouterr().err
    assert not (tmp_path / "real").exists()


def test_rlinf_policy_layout_at_the_real_sizes_is_openpis_file():
    """At the real sizes (meta tensors) RLinf's 813 state-dict entries map onto the 812 keys
    and shapes of openpi's model.safetensors (tests/fixtures/formats/openpi_pi05_keys.json)."""
    import torch

    from recap.interop.rlinf import split_policy_state
    from recap.models import checkpoints as ckpt
    from recap.models.pi05 import Pi05Config, build_pi05
    from tests.helpers import REPO

    real = json.loads((REPO / "tests/fixtures/formats/openpi_pi05_keys.json").read_text())
    state = {k: torch.empty(shape, device="meta") for k, (shape, _) in real["state"].items()}
    state[ckpt.EMBED_KEY] = state[ckpt.LM_HEAD_KEY]  # tied (real["ties"])
    with torch.device("meta"):
        target = ckpt.file_state(build_pi05(Pi05Config(**ckpt.variant_fields("pi05_base"))),
                                 ckpt.OPENPI)  # fmt: skip
    file, dropped = split_policy_state(state, target)
    assert (len(state), len(file), dropped) == (813, 812, [ckpt.EMBED_KEY])
    assert set(file) == set(real["state"]) - {ckpt.EMBED_KEY}


def test_rlinf_policy_without_the_expert_head_round_trips_in_rlinfs_shapes(tmp_path, capsys):
    """#39: an RLinf CFG file without the unused expert lm_head, at a vocabulary that is not the
    real one, imports (one log line) and exports back with RLinf's key list (the real one,
    tests/fixtures/formats/openpi_pi05_keys.json) and the shapes RLinf's strict loader builds
    at these sizes: the expert head [257152, width], every other tensor the source's."""
    import logging

    import torch

    from recap.commands.import_rlinf import main
    from recap.models import checkpoints as ckpt
    from tests.helpers import REPO
    from tests.models.test_pi05 import tiny_model

    policy = tiny_model(seed=1)
    base = tmp_path / "pi05_base"
    ckpt.save_pi05(policy, base)
    rlinf = rlinf_policy_state(policy)  # what RLinf's loader expects at these sizes
    source = {k: v for k, v in rlinf.items() if k != ckpt.EXPERT_LM_HEAD_KEY}
    torch.save(source, tmp_path / "no_head.pt")
    out = tmp_path / "imported"
    logger = logging.getLogger("recap.interop.rlinf")
    records: list[str] = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    logger.addHandler(handler)
    try:
        # sizes from the base's recap_pi05.json, as a sizes file (no --base)
        assert main(["rlinf-policy", str(tmp_path / "no_head.pt"), "--out", str(out),
                     "--sizes", str(base / "recap_pi05.json")]) == 0  # fmt: skip
    finally:
        logger.removeHandler(handler)
    assert records == ["RLinf policy state dict: the expert's lm_head (never read) is absent; "
                       "written as zeros [32, 32]"]  # fmt: skip
    loaded = ckpt.load_pi05(out).eval()
    assert all(torch.equal(loaded.state_dict()[k], v) for k, v in policy.state_dict().items())
    assert main(["export-rlinf-policy", str(out), "--out", str(tmp_path / "back.pt")]) == 0
    back = torch.load(tmp_path / "back.pt", weights_only=True)
    real = json.loads((REPO / "tests/fixtures/formats/openpi_pi05_keys.json").read_text())
    import re

    def layerless(keys) -> set[str]:  # the real model is deeper: compare names per layer
        return {re.sub(r"\.layers\.\d+\.", ".layers.*.", k) for k in keys}

    assert set(back) == set(rlinf) and len(back) == 77
    assert layerless(back) == layerless(real["state"])
    shapes = {k: list(v.shape) for k, v in back.items()}
    assert shapes == {k: list(v.shape) for k, v in rlinf.items()}
    assert shapes[ckpt.EXPERT_LM_HEAD_KEY] == [257152, 32] == [
        real["state"][ckpt.EXPERT_LM_HEAD_KEY][0][0], 32]  # fmt: skip
    assert all(torch.equal(back[k], v) for k, v in source.items())
    capsys.readouterr()
    # a sizes file with a field Pi05Config lacks, and a variant that does not exist
    (tmp_path / "bad.json").write_text('{"action_horizon": 10, "vocab": 3}')
    assert main(["rlinf-policy", str(tmp_path / "no_head.pt"), "--out", str(tmp_path / "x"),
                 "--sizes", str(tmp_path / "bad.json")]) == 2  # fmt: skip
    err = capsys.readouterr().err
    assert err.startswith(f"recap-import: {tmp_path / 'bad.json'}: unknown fields ['vocab']; "
                          "the fields are [")  # fmt: skip
    assert not (tmp_path / "x").exists()
    with pytest.raises(SystemExit) as exit_:
        main(["rlinf-policy", str(tmp_path / "no_head.pt"), "--out", str(tmp_path / "x"),
              "--variant", "pi05_aloha"])  # fmt: skip
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        "recap-import rlinf-policy: error: argument --variant: invalid choice: 'pi05_aloha' "
        "(choose from 'pi05_base', 'pi05_droid', 'pi05_libero')"
    )


def test_rlinf_value_range_from_the_run_config_else_the_flag_else_the_default(tmp_path, capsys):
    import torch

    from recap.commands.import_rlinf import main
    from recap.models.value import load_value_model

    source = tiny_model(truncate_backbone=False)
    cfg = _write_configs(tmp_path)
    run = tmp_path / "run"
    weights = run / "checkpoints/global_step_10/actor/model_state_dict/full_weights.pt"
    weights.parent.mkdir(parents=True)
    torch.save(rlinf_state(source), weights)

    def imported(out: str, *flags: str) -> tuple[int, str]:
        code = main(["rlinf-value", str(weights), "--out", str(tmp_path / out), *cfg, *flags])
        return code, capsys.readouterr()

    code, io = imported("default")
    assert code == 0 and io.out.splitlines()[0] == (
        "rlinf-value: value range [-1, 0] from the default (no --value-range); configs: vision "
        f"{tmp_path / 'vision.json'}, text {tmp_path / 'text.json'}"
    )
    code, io = imported("flag", "--value-range", "-2", "1")
    assert code == 0 and io.out.startswith("rlinf-value: value range [-2, 1] from --value-range;")
    model = load_value_model(tmp_path / "flag")
    assert (model.config.v_min, model.config.v_max) == (-2.0, 1.0)
    # an RLinf run's Hydra config above the checkpoint records the support
    (run / ".hydra").mkdir()
    (run / ".hydra/config.yaml").write_text("actor:\n  model:\n    value_head:\n"
                                            "      v_min: -3.0\n      v_max: 0.5\n")  # fmt: skip
    code, io = imported("config")
    assert code == 0 and io.out.startswith(
        f"rlinf-value: value range [-3, 0.5] from {run / '.hydra/config.yaml'};"
    )
    assert json.loads((tmp_path / "config/config.json").read_text())["v_max"] == 0.5
    assert json.loads((tmp_path / "config/processor.json").read_text())["v_min"] == -3.0
    code, io = imported("clash", "--value-range", "-1", "0")
    assert code == 2 and io.err == (
        f"recap-import: {run / '.hydra/config.yaml'}: records v_min/v_max -3 0.5 but "
        "--value-range gives -1 0; drop the flag or fix the config\n"
    )
    assert not (tmp_path / "clash").exists()

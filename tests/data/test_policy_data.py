"""PolicyDataset on tiny demo data: prompts per conditioning mode (exact counts for a seed, the
same on every fetch), the label lookup error, quantile normalization round trip, action chunks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from recap.core.advantages import LabelOptions, add_advantages
from recap.core.normalize import ReturnRange
from recap.data.conditioning import NEGATIVE_TEXT, POSITIVE_TEXT, unnormalize_quantile
from recap.data.policy_data import PolicyDataset
from recap.data.sidecars import advantages_files, read_returns, write_atomic
from recap.data.specs import parse_dataset_specs
from recap.data.transforms import load_tokenizer
from recap.envs.reach import write_demo_datasets, write_demo_tokenizer
from recap.errors import RecapError
from recap.steps.compute_returns import ReturnsConfig, compute_returns

NAMES = (("sft", "sft"), ("rollout", "rollout"), ("eval", "rollout"))
TAG = "t"
H = 5


def write_test_advantages(data: Path, tag: str = TAG, noise: float = 0.05, seed: int = 0) -> None:
    """Step 1 returns, then an advantages sidecar per dataset from a stand-in value (the
    normalized return plus Gaussian noise) through the Step 3 pure functions."""
    entries = [{"name": n, "root": str(data / n), "type": t} for n, t in NAMES]
    compute_returns(ReturnsConfig(datasets=entries))
    tables = {n: read_returns(data / n, "") for n, _ in NAMES}
    span = ReturnRange.union(
        [ReturnRange(s["return_min"], s["return_max"]) for _, s in tables.values()]
    )
    rng = np.random.default_rng(seed)
    for name, (table, _) in tables.items():
        ret = table.column("return").to_numpy()
        value = (ret - span.offset) / span.scale + noise * rng.standard_normal(ret.shape)
        table = table.append_column("value", pa.array(value))
        out = add_advantages(table, return_range=span, dataset_name=name, labels=LabelOptions())
        write_atomic(advantages_files(data / name, tag, out, {"positive_quantile": 0.3}))


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("policy_data") / "demo_data"
    write_demo_datasets(root, seed=0, sft_episodes=3, rollout_episodes=4, eval_episodes=1)
    write_demo_tokenizer(root)
    write_test_advantages(root)
    return root


def dataset(data: Path, conditioning: str = "paper", **kwargs) -> PolicyDataset:
    specs = parse_dataset_specs([{"name": "sft", "root": "sft", "type": "sft"},
                                 {"name": "rollout", "root": "rollout"}], data)  # fmt: skip
    return PolicyDataset(specs, TAG, load_tokenizer(data / "tokenizer"), image_size=32,
                         action_horizon=H, conditioning=conditioning, state_in_prompt=False,
                         max_length=32, **kwargs)  # fmt: skip


def texts(ds: PolicyDataset, indices) -> list[str]:
    batch = ds.__getitems__(indices)
    tok = ds.tokenizer
    return [tok.decode(ids[mask]) for ids, mask in zip(batch["input_ids"], batch["attention_mask"])]


@pytest.mark.parametrize("mode, prob", [("paper", 0.3), ("positive_only_conditional", 0.1)])
def test_prompts_per_mode_follow_the_seeded_dropout(data, mode, prob):
    ds = dataset(data, mode, seed=3)
    n = len(ds)
    u = torch.rand(n, generator=torch.Generator().manual_seed(3)).numpy()
    expected = u >= prob if mode == "paper" else (u >= prob) & ds.labels
    np.testing.assert_array_equal(ds.conditional, expected)
    got = texts(ds, list(range(n)))
    with_text = np.array(["advantage" in t for t in got])
    positive = np.array([POSITIVE_TEXT.split()[-1] in t.split() for t in got])
    negative = np.array([NEGATIVE_TEXT.split()[-1] in t.split() for t in got])
    np.testing.assert_array_equal(with_text, expected)
    np.testing.assert_array_equal(positive, expected & ds.labels)
    np.testing.assert_array_equal(negative, expected & ~ds.labels)
    # demo seed 0 (3 sft + 4 rollout episodes, 155 frames, 47 positive), dropout seed 3
    counts = {"paper": (32, 66), "positive_only_conditional": (43, 0)}
    assert (n, int(ds.labels.sum())) == (155, 47)
    assert (int(positive.sum()), int(negative.sum())) == counts[mode]
    # epoch-free: the same item gets the same prompt in any batch, in a rebuilt dataset too
    again = dataset(data, mode, seed=3)
    assert texts(again, [7, 3, 120]) == [got[7], got[3], got[120]]


def test_none_is_plain_behaviour_cloning(data):
    ds = dataset(data, "none")
    assert not ds.conditional.any() and "conditional" not in ds.__getitems__([0, 1])
    assert all("advantage" not in t for t in texts(ds, list(range(0, len(ds), 17))))


def test_missing_label_names_the_file_and_the_frame(data, tmp_path):
    import shutil

    copy = tmp_path / "demo_data"
    shutil.copytree(data, copy)
    path = copy / "rollout" / "meta" / f"advantages_{TAG}.parquet"
    table = pq.read_table(path)
    pq.write_table(table.slice(1), path)  # drop (episode 0, frame 0)
    with pytest.raises(RecapError) as err:
        dataset(copy)
    message = str(err.value)
    assert str(path) in message and "episode_index=0, frame_index=0" in message
    assert "\n" not in message


def test_actions_are_normalized_chunks_that_round_trip(data):
    ds = dataset(data, "none")
    source = ds.sources[1]
    frames = source.frames
    raw = frames._action
    ep, fr = frames.columns["episode_index"], frames.columns["frame_index"]
    start = int(np.flatnonzero((ep == ep[0]) & (fr == 0))[0])
    last = int(np.flatnonzero(ep == ep[0])[np.argmax(fr[ep == ep[0]])])
    item = int(np.flatnonzero((ds.source_of == 1) & (ds.row_of == last))[0])
    first = int(np.flatnonzero((ds.source_of == 1) & (ds.row_of == start))[0])
    batch = ds.__getitems__([first, item])
    actions, mask = batch["actions"], batch["action_mask"]
    assert actions.shape == (2, H, 32) and mask.shape == (2, H, 32)
    assert not mask[:, :, raw.shape[1] :].any()
    assert mask[0, :, : raw.shape[1]].all()  # first frame: all H steps inside the episode
    assert mask[1, 0].any() and not mask[1, 1:].any()  # last frame: only its own action
    back = unnormalize_quantile(actions[0].double().numpy(), ds.stats["action"])
    chunk = raw[[int(np.flatnonzero((ep == ep[0]) & (fr == k))[0]) for k in range(H)]]
    q01, q99 = ds.stats["action"].q01, ds.stats["action"].q99
    np.testing.assert_allclose(back, chunk, atol=1e-5)  # unclipped (openpi): every value returns
    outside = (chunk < q01) | (chunk > q99)
    assert outside.any() and (actions[0, :, :7].abs() > 1.0).numpy().tolist() == outside.tolist()
    assert batch["frames"].dtype == torch.uint8 and batch["frames"].shape == (2, 3, 32, 32, 3)
    assert batch["image_masks"].tolist() == [[True, True, False]] * 2


def test_eval_split_uses_the_training_statistics(data):
    from recap.data.policy_data import PolicyDataConfig

    kwargs = dict(
        datasets=[{"name": "sft", "root": "sft", "type": "sft"},
                  {"name": "rollout", "root": "rollout"}],
        eval_datasets=[{"name": "eval", "root": "eval"}], data_root=str(data), advantages_tag=TAG,
        tokenizer_path=str(data / "tokenizer"), image_size=32, action_horizon=H,
        state_in_prompt=False, max_length=32,
    )  # fmt: skip
    train = PolicyDataConfig(split="train", **kwargs).build()
    held_out = PolicyDataConfig(split="eval", **kwargs).build()
    assert [s.spec.name for s in held_out.sources] == ["eval"]
    for name in ("state", "action"):
        np.testing.assert_array_equal(held_out.stats[name].q01, train.stats[name].q01)
        np.testing.assert_array_equal(held_out.stats[name].q99, train.stats[name].q99)
    with pytest.raises(RecapError, match="policy_data.eval_datasets: empty"):
        PolicyDataConfig(split="eval", **{**kwargs, "eval_datasets": None}).build()


def test_the_data_refuses_a_model_its_tokens_or_chunks_do_not_fit(data):
    from types import SimpleNamespace

    ds = dataset(data)
    size = len(ds.tokenizer)

    def model(vocab, horizon=ds.action_horizon):
        return SimpleNamespace(config=SimpleNamespace(text={"vocab_size": vocab},
                                                      action_horizon=horizon))  # fmt: skip

    ds.check_model(model(size))  # the demo's 32-word tokenizer and a 32-row embedding fit
    with pytest.raises(RecapError) as err:
        ds.check_model(model(size - 1))
    assert str(err.value) == (
        f"{data / 'tokenizer'}: tokenizer vocabulary {size} exceeds the model's {size - 1} "
        "(pi05_policy.text vocab_size, or the checkpoint's); use the checkpoint's own tokenizer "
        "(PaliGemma's paligemma_tokenizer.model for π0.5: 257,152)"
    )
    with pytest.raises(RecapError, match=r"^policy_data.action_horizon \d+ != pi05_policy"):
        ds.check_model(model(size, ds.action_horizon + 1))


@pytest.mark.parametrize("mode, prob", [("paper", 0.3), ("positive_only_conditional", 0.1)])
def test_dropout_is_drawn_afresh_each_epoch_within_binomial_bounds(data, mode, prob):
    """Use index epoch * len + item: each epoch an independent draw seeded by (seed, epoch), the
    same after a rebuild; over 8 epochs every eligible frame is seen both with and without its
    text about as often as the dropout says (3-sigma binomial bounds)."""
    ds = dataset(data, mode, seed=3)
    n, epochs = len(ds), 8
    eligible = np.ones(n, dtype=bool) if mode == "paper" else ds.labels
    uses = np.arange(epochs * n)
    cond = ds.__getitems__(uses.tolist())["conditional"].numpy().reshape(epochs, n)
    np.testing.assert_array_equal(cond[0], ds.conditional)  # epoch 0 = the plain-index draw
    assert not (cond[:, ~eligible]).any()  # RLinf: negatives never carry the text
    trials = int(epochs * eligible.sum())
    dropped = int(trials - cond[:, eligible].sum())
    sigma = (trials * prob * (1 - prob)) ** 0.5
    assert abs(dropped - trials * prob) <= 3 * sigma, (dropped, trials)
    # epochs differ from each other (not one fixed subset for the whole run) ...
    assert all((cond[e] != cond[0]).any() for e in range(1, epochs))
    # ... and a frame fixed in every epoch is as rare as chance allows: P(always kept) = (1-p)^8
    always = cond[:, eligible].all(0).mean()
    assert always < (1 - prob) ** epochs + 0.15, always
    again = dataset(data, mode, seed=3)
    batch = again.__getitems__([5 * n + 7, 2 * n + 3])["conditional"].numpy()
    np.testing.assert_array_equal(batch, [cond[5, 7], cond[2, 3]])
    prompts = texts(again, [5 * n + 7, 7])
    assert ("advantage" in prompts[0]) == bool(cond[5, 7])
    assert ("advantage" in prompts[1]) == bool(cond[0, 7])


def test_dropout_seed_follows_the_training_seed(data):
    import gin

    import recap.steps.train  # noqa: F401  (registers train, whose seed is read)
    from recap.data.policy_data import PolicyDataConfig

    entries = [{"name": "sft", "root": "sft", "type": "sft"},
               {"name": "rollout", "root": "rollout"}]  # fmt: skip
    common = dict(datasets=entries, data_root=str(data), advantages_tag=TAG,
                  tokenizer_path=str(data / "tokenizer"), image_size=32, action_horizon=H,
                  state_in_prompt=False, max_length=32, export_stats=False)  # fmt: skip
    draws = {}
    for seed in (0, 1):
        gin.clear_config()
        gin.parse_config(f"train.seed = {seed}")
        draws[seed] = PolicyDataConfig(**common).build().conditional
    gin.clear_config()
    explicit = PolicyDataConfig(seed=1, **common).build().conditional
    np.testing.assert_array_equal(draws[1], explicit)
    assert (draws[0] != draws[1]).mean() > 0.2


def test_labels_reach_their_frames_from_a_hand_made_table(data, tmp_path):
    """A sidecar written by hand (rows shuffled; label = (7 * episode + frame) % 3 == 0) and no
    dropout: every item's prompt says its own frame's label."""
    import shutil

    copy = tmp_path / "demo_data"
    shutil.copytree(data, copy)
    for name in ("sft", "rollout"):
        path = copy / name / "meta" / f"advantages_{TAG}.parquet"
        keys = pq.read_table(path, columns=["episode_index", "frame_index"])
        ep = keys.column("episode_index").to_numpy()
        fr = keys.column("frame_index").to_numpy()
        order = np.random.default_rng(5).permutation(len(ep))
        hand = pa.table({"episode_index": ep[order], "frame_index": fr[order],
                         "advantage": (7 * ep[order] + fr[order]) % 3 == 0})  # fmt: skip
        pq.write_table(hand, path)  # no source record: accepted as a pre-record sidecar
    ds = dataset(copy, "paper", dropout=0.0)
    got = texts(ds, list(range(len(ds))))
    for i, text in enumerate(got):
        frames = ds.sources[ds.source_of[i]].frames
        row = ds.row_of[i]
        ep, fr = int(frames.columns["episode_index"][row]), int(frames.columns["frame_index"][row])
        word = "positive" if (7 * ep + fr) % 3 == 0 else "negative"
        assert text.split()[-1] == word, (i, ep, fr, text)
    assert len(got) == 155 and sum(t.endswith("positive") for t in got) == 52


def test_inference_prompts_and_frames_equal_training_for_the_same_frame(data):
    """The closed-loop adapter builds, from an observation of a frame, the same token ids (with
    the positive text and plain) and camera slots as training does for that frame."""
    from recap.steps.evaluate_policy import PolicyAdapter

    specs = parse_dataset_specs([{"name": "sft", "root": "sft", "type": "sft"},
                                 {"name": "rollout", "root": "rollout"}], data)  # fmt: skip
    tok = load_tokenizer(data / "tokenizer")
    common = dict(image_size=32, action_horizon=H, state_in_prompt=True, max_length=200)
    labelled = PolicyDataset(specs, TAG, tok, dropout=0.0, **common)
    plain = PolicyDataset(specs, TAG, tok, dropout=1.0, **common)
    items = [int(np.flatnonzero(labelled.labels)[0]), int(np.flatnonzero(labelled.labels)[-1])]
    adapter = PolicyAdapter(torch.nn.Identity(), labelled, beta=2.0)  # both branches
    for i in items:
        source = labelled.sources[labelled.source_of[i]]
        row = np.array([labelled.row_of[i]])
        raw = source.frames.__getitems__(row)
        obs = {"images": {c: raw["images"][c].numpy() for c in source.frames.key_map.cameras},
               "state": raw["state"].numpy(), "task": [source.tasks[row[0]]]}  # fmt: skip
        batch = adapter.batch(obs)
        for key, reference in (("input_ids", labelled), ("uncond_input_ids", plain)):
            train = reference.__getitems__([i])
            mask = "attention_mask" if key == "input_ids" else "uncond_attention_mask"
            assert batch[key][0, batch[mask][0]].tolist() == (
                train["input_ids"][0, train["attention_mask"][0]].tolist()
            )
        assert torch.equal(batch["frames"], train["frames"])
        assert torch.equal(batch["image_masks"], train["image_masks"])
    text = tok.decode(batch["input_ids"][0, batch["attention_mask"][0]])
    # the demo's word-level tokenizer: the state bins are unknown words, the label text is not
    assert text.startswith("<bos> task : reach the") and "advantage : positive <unk>" in text


def test_filtered_behaviour_cloning_keeps_only_positive_frames_with_plain_prompts(data):
    paper, filtered = dataset(data, "paper"), dataset(data, "filtered")
    assert len(filtered) == int(paper.labels.sum()) == 47 and filtered.labels.all()
    kept = set(zip(filtered.source_of.tolist(), filtered.row_of.tolist()))
    positives = np.flatnonzero(paper.labels)
    assert kept == set(zip(paper.source_of[positives].tolist(), paper.row_of[positives].tolist()))
    assert all("advantage" not in t for t in texts(filtered, list(range(len(filtered)))))
    assert "conditional" not in filtered.__getitems__([0, 1])


def test_a_max_length_that_can_cut_a_prompt_is_refused_before_training(data):
    """The bound is every label and every state bin at its longest (the demo's word tokenizer:
    "-1", below the statistics' range, takes two words): 32 with the label, 29 without; one
    token less is a one-line error naming the binding and the fix, and a prompt longer than the
    processor's max_length (a new task at inference) is refused, never cut."""
    specs = parse_dataset_specs([{"name": "sft", "root": "sft", "type": "sft"},
                                 {"name": "rollout", "root": "rollout"}], data)  # fmt: skip
    tok = load_tokenizer(data / "tokenizer")
    common = dict(image_size=32, action_horizon=H, state_in_prompt=True)
    fits = PolicyDataset(specs, TAG, tok, max_length=32, **common)
    assert fits.processor.longest_prompt(["reach the blue target"]) == (32, "reach the blue target")
    batch = fits.__getitems__(list(range(len(fits))))
    assert int(batch["attention_mask"].sum(1).max()) == 25  # what this data's frames take
    assert (
        PolicyDataset(
            specs, TAG, tok, max_length=29, conditioning="none", **common
        ).processor.longest_prompt(["reach the blue target"])[0]
        == 29
    )
    with pytest.raises(RecapError) as err:
        PolicyDataset(specs, TAG, tok, max_length=31, **common)
    assert str(err.value) == (
        "policy_data.max_length = 31: the prompts of task 'reach the blue target' take up to 32 "
        "tokens (BOS, task, state, label); bind policy_data.max_length = 32 or more"
    )
    with pytest.raises(
        RecapError,
        match=r"^policy_data.max_length = 28: .* up to 29 tokens "
        r"\(BOS, task, state\); bind",
    ):
        PolicyDataset(specs, TAG, tok, max_length=28, conditioning="none", **common)
    short = fits.processor.replace(max_length=7)
    prompt = short.prompt("reach the blue target", True, None)  # openpi's prompt without state
    assert len(short.prompt_tokens(prompt)) == 8
    with pytest.raises(RecapError) as err:
        short.tokenize([prompt])
    assert str(err.value) == (
        "prompt 'reach the blue target Advantage: positive\\n': 8 tokens, more than the "
        "policy's max_length 7 (policy_data.max_length); train with a longer max_length or "
        "shorten the task text"
    )

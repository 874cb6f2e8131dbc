"""π0.5 prompt styles: the token ids of openpi's ``PaligemmaTokenizer`` and LeRobot's π0.5
processor, with and without state, for every advantage text, from a SentencePiece model trained
in the test; the references are built here from the published recipes (FORMATS.md) and encoded
by ``sentencepiece`` itself."""

from __future__ import annotations

import numpy as np
import pytest
import sentencepiece as spm

from recap.data.conditioning import (
    NEGATIVE_TEXT,
    POSITIVE_TEXT,
    advantage_prompt,
    normalize_quantile,
    pi05_prompt,
)
from recap.data.policy_data import PolicyDataset
from recap.data.specs import parse_dataset_specs
from recap.data.transforms import SentencePieceTokenizer, tokenize_prompts
from recap.standins import sentencepiece_model
from tests.data.test_policy_data import TAG, write_test_advantages

TASK = "put_the bowl"
STATE = np.array([-1.2, -0.5, 0.0, 0.999, 1.5])  # normalized; bins -1 64 128 255 255
BOS, NEWLINE = 2, 493
# ids of the SentencePiece model ``sentencepiece_model(0)``, per (style, state?, label)
TASK_IDS = [313, 263, 417]  # "put the bowl"
POSITIVE = [470, 312, 485, 370]  # " Advantage: positive"
NEGATIVE = [470, 312, 485, 369]  # " Advantage: negative"
STATE_TEXT = [508, 361, 485, 470, 50, 491, 470, 506, 501, 470, 491, 495, 507, 470, 495, 500, 500,
              470, 495, 500, 500]  # ", State: -1 64 128 255 255"  # fmt: skip
ACTION = [290, 308, 485, 470]  # ";\nAction: "
TASK_PREFIX = [287, 485, 278, 263, 417]  # "Task: put the bowl"
LITERAL = {
    ("openpi", False, True): [BOS, *TASK_IDS, *POSITIVE, NEWLINE],
    ("openpi", False, False): [BOS, *TASK_IDS, *NEGATIVE, NEWLINE],
    ("openpi", False, None): [BOS, *TASK_IDS, NEWLINE],
    ("lerobot", False, True): [BOS, *TASK_PREFIX, *POSITIVE, *ACTION],
    ("lerobot", False, False): [BOS, *TASK_PREFIX, *NEGATIVE, *ACTION],
    ("lerobot", False, None): [BOS, *TASK_PREFIX, *ACTION],
}
for _style in ("openpi", "lerobot"):  # with state the two systems write the same text
    LITERAL[(_style, True, True)] = [BOS, *TASK_PREFIX, *POSITIVE, *STATE_TEXT, *ACTION]
    LITERAL[(_style, True, False)] = [BOS, *TASK_PREFIX, *NEGATIVE, *STATE_TEXT, *ACTION]
    LITERAL[(_style, True, None)] = [BOS, *TASK_PREFIX, *STATE_TEXT, *ACTION]


@pytest.fixture(scope="module")
def model_proto() -> bytes:
    return sentencepiece_model(0)


@pytest.fixture(scope="module")
def sp(model_proto) -> spm.SentencePieceProcessor:
    processor = spm.SentencePieceProcessor()
    processor.LoadFromSerializedProto(model_proto)
    return processor


@pytest.fixture(scope="module")
def tokenizer(model_proto, tmp_path_factory) -> SentencePieceTokenizer:
    path = tmp_path_factory.mktemp("tok") / "paligemma_tokenizer.model"
    path.write_bytes(model_proto)
    return SentencePieceTokenizer(path)


def rlinf_prompt(task: str, label: bool | None) -> str:
    """RLinf's Step 4 text before openpi's tokenizer (FORMATS "RLinf RECAP / Step 4")."""
    if label is None:
        return task
    return f"{task}\nAdvantage: {'positive' if label else 'negative'}"


def reference_ids(sp, style: str, prompt: str, state: np.ndarray | None) -> list[int]:
    """openpi ``PaligemmaTokenizer.tokenize`` / LeRobot's π0.5 prompt, written from FORMATS.md."""
    cleaned = prompt.strip().replace("_", " ").replace("\n", " ")
    if state is not None:
        bins = np.digitize(state, bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1
        text = f"Task: {cleaned}, State: {' '.join(map(str, bins))};\nAction: "
        return sp.encode(text, add_bos=True)
    if style == "openpi":
        return sp.encode(cleaned, add_bos=True) + sp.encode("\n")
    return sp.encode(f"Task: {cleaned};\nAction: ", add_bos=True)


def recap_ids(tokenizer, style: str, task: str, label, state, max_length: int = 64) -> list[int]:
    ids, mask = tokenize_prompts(
        tokenizer, [pi05_prompt(advantage_prompt(task, label), state, style)], max_length
    )
    return ids[0, mask[0]].tolist()


@pytest.mark.parametrize("label", [True, False, None])
@pytest.mark.parametrize("with_state", [False, True])
@pytest.mark.parametrize("style", ["openpi", "lerobot"])
def test_token_ids_equal_the_reference_systems(sp, tokenizer, style, with_state, label):
    state = STATE if with_state else None
    ours = recap_ids(tokenizer, style, TASK, label, state)
    assert ours == LITERAL[(style, with_state, label)]
    assert ours == reference_ids(sp, style, rlinf_prompt(TASK, label), state)


def test_advantage_texts_are_rlinf_and_the_newline_is_openpis_own_token(sp, tokenizer):
    assert (POSITIVE_TEXT, NEGATIVE_TEXT) == ("Advantage: positive", "Advantage: negative")
    assert sp.encode("\n") == [NEWLINE]
    # openpi's cleaning turns RLinf's "\n" into a space: the advantage text reads " Advantage:"
    assert sp.decode(POSITIVE) == " Advantage: positive"
    ids, mask = tokenize_prompts(tokenizer, [pi05_prompt(TASK), "put the bowl"], 16)
    assert ids.tolist() == [[BOS, *TASK_IDS, NEWLINE] + [0] * 11, [BOS, *TASK_IDS] + [0] * 12]
    assert mask.sum(1).tolist() == [5, 4]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    from recap.envs.reach import write_demo_datasets

    root = tmp_path_factory.mktemp("styles") / "demo_data"
    write_demo_datasets(root, seed=0, sft_episodes=2, rollout_episodes=2, eval_episodes=1)
    write_test_advantages(root)
    return root


@pytest.mark.parametrize("style", ["openpi", "lerobot"])
def test_policy_data_batches_carry_the_reference_ids(data, sp, tokenizer, style):
    specs = parse_dataset_specs([{"name": "sft", "root": "sft", "type": "sft"},
                                 {"name": "rollout", "root": "rollout"}], data)  # fmt: skip
    ds = PolicyDataset(specs, TAG, tokenizer, image_size=32, action_horizon=3,
                       state_in_prompt=True, max_length=200, seed=1,
                       prompt_style=style)  # fmt: skip
    kinds = [~ds.conditional, ds.conditional & ds.labels, ds.conditional & ~ds.labels]
    items = [int(np.flatnonzero(kind)[0]) for kind in kinds] + [len(ds) - 1]  # each prompt kind
    batch = ds.__getitems__(items)
    q01, q99 = ds.stats["state"].q01, ds.stats["state"].q99
    for k, i in enumerate(items):
        source = ds.sources[ds.source_of[i]]
        row = int(ds.row_of[i])
        raw = source.frames.__getitems__(np.array([row]))["state"].numpy()[0]
        state = (raw - q01) / (q99 - q01 + 1e-6) * 2 - 1  # openpi's map, unclipped
        np.testing.assert_allclose(normalize_quantile(raw, ds.stats["state"]), state)
        label = bool(ds.labels[i]) if ds.conditional[i] else None
        expected = reference_ids(sp, style, rlinf_prompt(source.tasks[row], label), state)
        got = batch["input_ids"][k, batch["attention_mask"][k]].tolist()
        assert got == expected
    assert sorted(set(items)) == sorted(items)


# ---- label_position = "action": the advantage text after the state, right before "Action: " ----


def label_before_action_ids(sp, task: str, label: bool, state: np.ndarray) -> list[int]:
    """The reference: openpi's state prompt with "Advantage: ...\\n" inserted before "Action: "."""
    cleaned = task.strip().replace("_", " ").replace("\n", " ")
    bins = np.digitize(state, bins=np.linspace(-1, 1, 256 + 1)[:-1]) - 1
    word = "positive" if label else "negative"
    text = f"Task: {cleaned}, State: {' '.join(map(str, bins))};\nAdvantage: {word}\nAction: "
    return sp.encode(text, add_bos=True)


@pytest.mark.parametrize("style", ["openpi", "lerobot"])
def test_label_before_action_puts_the_advantage_text_after_the_state(sp, tokenizer, style):
    from recap.data.conditioning import conditioned_prompt

    for label in (True, False):
        prompt = conditioned_prompt(TASK, label, STATE, style, "action")
        word = "positive" if label else "negative"
        assert prompt == (f"Task: put the bowl, State: -1 64 128 255 255;\nAdvantage: {word}\n"
                          "Action: ",)  # fmt: skip
        ids, mask = tokenize_prompts(tokenizer, [prompt], 64)
        ours = ids[0, mask[0]].tolist()
        assert ours == label_before_action_ids(sp, TASK, label, STATE)
        assert ours[: 1 + len(TASK_PREFIX) + len(STATE_TEXT)] == [BOS, *TASK_PREFIX, *STATE_TEXT]
    # the plain prompt is the same in both positions; without state openpi's prompt ends with the
    # task text, so the label stays there; "task" is what RLinf and openpi build
    assert conditioned_prompt(TASK, None, STATE, style, "action") == pi05_prompt(TASK, STATE, style)
    assert conditioned_prompt(TASK, True, None, "openpi", "action") == pi05_prompt(
        advantage_prompt(TASK, True), None, "openpi"
    )
    assert conditioned_prompt(TASK, True, STATE, style, "task") == pi05_prompt(
        advantage_prompt(TASK, True), STATE, style
    )


def test_a_label_position_that_does_not_exist_is_one_line(data, tokenizer):
    from recap.errors import RecapError

    specs = parse_dataset_specs([{"name": "sft", "root": "sft", "type": "sft"}], data)
    with pytest.raises(RecapError) as err:
        PolicyDataset(specs, TAG, tokenizer, image_size=32, action_horizon=3,
                      label_position="end")  # fmt: skip
    assert str(err.value) == ("policy_data.label_position: 'end' is not one of "
                              "['task', 'action']")  # fmt: skip


def test_policy_data_batches_carry_the_label_before_action_ids(data, sp, tokenizer):
    """Training batches (and evaluate_policy, which builds its prompts with the same
    ``PolicyDataset.prompt``) carry the reference ids for every prompt kind."""
    specs = parse_dataset_specs([{"name": "sft", "root": "sft", "type": "sft"},
                                 {"name": "rollout", "root": "rollout"}], data)  # fmt: skip
    ds = PolicyDataset(specs, TAG, tokenizer, image_size=32, action_horizon=3,
                       state_in_prompt=True, max_length=200, seed=1,
                       label_position="action")  # fmt: skip
    kinds = [~ds.conditional, ds.conditional & ds.labels, ds.conditional & ~ds.labels]
    items = [int(np.flatnonzero(kind)[0]) for kind in kinds]
    batch = ds.__getitems__(items)
    for k, i in enumerate(items):
        source = ds.sources[ds.source_of[i]]
        row = int(ds.row_of[i])
        raw = source.frames.__getitems__(np.array([row]))["state"].numpy()[0]
        state = normalize_quantile(raw, ds.stats["state"])
        got = batch["input_ids"][k, batch["attention_mask"][k]].tolist()
        if k == 0:
            assert got == reference_ids(sp, "openpi", source.tasks[row], state)
        else:
            assert got == label_before_action_ids(sp, source.tasks[row], k == 1, state)

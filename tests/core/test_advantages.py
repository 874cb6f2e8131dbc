import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from recap.core import columns as C
from recap.core.advantages import VALUE, add_advantages, labeling_of, relabel_advantages
from recap.core.frames import align_to_frames
from recap.core.normalize import TASK_LENGTH, ReturnRange, normalize_returns
from recap.core.thresholds import LabelOptions, quantile_threshold
from recap.errors import RecapError

# SPEC Step 3 example: Step 1's success T=6 and failure T=5 (failure_reward -300) concatenated.
SPEC_EPISODE = [0] * 6 + [1] * 5
SPEC_FRAME = list(range(6)) + list(range(5))
SPEC_REWARD = [-1.0] * 5 + [0.0] + [-1.0] * 4 + [-300.0]
SPEC_RETURN = [-5.0, -4, -3, -2, -1, 0, -304, -303, -302, -301, -300]
SPEC_VALUE = np.linspace(-0.02, -0.9, 11)
SPEC_A = [-0.18258, -0.18258, -0.18258, -0.18258, 0.36871, 0.46]
SPEC_A += [-0.18258, -0.18258, -0.18258, -0.17813, -0.08684]
SPEC_LABEL = [False] * 4 + [True, True] + [False] * 3 + [True, True]
SPEC_RANGE = ReturnRange(-304.0, 0.0)


def _spec_table(**extra):
    cols = {
        C.EPISODE_INDEX: SPEC_EPISODE,
        C.FRAME_INDEX: SPEC_FRAME,
        C.REWARD: SPEC_REWARD,
        C.RETURN: SPEC_RETURN,
        VALUE: SPEC_VALUE,
    }
    return pa.table({**cols, **extra})


def _col(table, name):
    return table.column(name).to_numpy()


def test_spec_worked_example():
    out = add_advantages(
        _spec_table(), return_range=SPEC_RANGE, lookahead=2, gamma=1.0, dataset_name="d"
    )
    # dataset_name stays dictionary-encoded in memory; otherwise exactly the SPEC schema
    assert out.schema.field(C.DATASET_NAME).type == pa.dictionary(pa.int32(), pa.string())
    assert out.cast(C.ADVANTAGES_SCHEMA).schema == C.ADVANTAGES_SCHEMA
    np.testing.assert_allclose(_col(out, C.ADVANTAGE_CONTINUOUS), SPEC_A, atol=1e-5)
    assert _col(out, C.ADVANTAGE).tolist() == SPEC_LABEL
    record = labeling_of(out)
    assert record["unified_threshold"] == pytest.approx(-0.178132, abs=1e-6)
    assert record["thresholds"] == {"all": record["unified_threshold"]}
    assert (record["num_positive"], record["num_frames"], record["scope"]) == (4, 11, "global")
    assert (record["return_min"], record["return_max"], record["lookahead"]) == (-304, 0, 2)
    v = SPEC_VALUE
    assert _col(out, C.VALUE_NEXT).tolist() == [
        v[2],
        v[3],
        v[4],
        v[5],
        0,
        0,
        v[8],
        v[9],
        v[10],
        0,
        0,
    ]
    assert _col(out, C.REWARD_SUM_RAW).tolist() == [-2, -2, -2, -2, -1, 0, -2, -2, -2, -301, -300]
    assert _col(out, C.NUM_VALID_REWARDS).tolist() == [2, 2, 2, 2, 2, 1, 2, 2, 2, 2, 1]
    np.testing.assert_allclose(_col(out, C.REWARD_SUM), _col(out, C.REWARD_SUM_RAW) / 304)
    assert _col(out, C.RETURN).tolist() == SPEC_RETURN
    assert _col(out, C.VALUE_CURRENT).tolist() == v.tolist()
    assert out.column(C.DATASET_NAME).to_pylist() == ["d"] * 11


def test_spec_example_from_returns_only_and_shuffled_rows():
    perm = np.array([10, 3, 0, 7, 5, 1, 9, 2, 8, 6, 4])
    table = _spec_table().drop_columns([C.REWARD]).take(perm)
    table = table.set_column(0, C.EPISODE_INDEX, pa.array(np.array(SPEC_EPISODE)[perm] * 7 + 3))
    out = add_advantages(table, return_range=SPEC_RANGE, lookahead=2, dataset_name="d")
    assert out.column(C.EPISODE_INDEX).to_pylist() == [3] * 6 + [10] * 5
    assert out.column(C.FRAME_INDEX).to_pylist() == SPEC_FRAME
    np.testing.assert_allclose(_col(out, C.ADVANTAGE_CONTINUOUS), SPEC_A, atol=1e-5)
    assert _col(out, C.ADVANTAGE).tolist() == SPEC_LABEL


def test_return_max_not_zero_uses_the_shared_map():
    # range [-304, 16]: scale 320, offset 16. Inside the window the n-step sum maps as s/320;
    # the Monte-Carlo remainder is a return and maps as (G - 16)/320, like the value targets.
    out = add_advantages(
        _spec_table(), return_range=ReturnRange(-304.0, 16.0), lookahead=2, dataset_name="d"
    )
    expected = [-0.18225] * 4 + [0.318875, 0.41] + [-0.18225] * 3 + [-0.178625, -0.0875]
    np.testing.assert_allclose(_col(out, C.ADVANTAGE_CONTINUOUS), expected, atol=1e-12)
    rs = _col(out, C.REWARD_SUM)
    np.testing.assert_allclose(rs[[0, 4, 5, 10]], [-2 / 320, -17 / 320, -16 / 320, -316 / 320])


@pytest.mark.parametrize("lookahead", [1, 2, 3, 5, 50])
def test_perfect_value_model_gives_zero_advantage(lookahead):
    # all failures: return_max = -300 != 0. With V = the Step 2 target (the shared map), gamma 1,
    # Steps 2 and 3 agree: every advantage is 0.
    table = _spec_table().filter(pa.array(np.array(SPEC_EPISODE) == 1))
    table = pa.concat_tables([table, table.set_column(0, C.EPISODE_INDEX, pa.array([4] * 5))])
    rng = ReturnRange(-304.0, -300.0)
    target = normalize_returns(_col(table, C.RETURN), rng.offset, rng.scale)
    table = table.set_column(table.column_names.index(VALUE), VALUE, pa.array(target))
    out = add_advantages(table, return_range=rng, lookahead=lookahead, dataset_name="d")
    np.testing.assert_allclose(_col(out, C.ADVANTAGE_CONTINUOUS), 0.0, atol=1e-12)


def test_discounted_literal():
    # one failed episode T=3, r = [-1, -1, -300], gamma 0.5, N = 1, range [-100, 0]
    table = pa.table(
        {
            C.EPISODE_INDEX: [0, 0, 0],
            C.FRAME_INDEX: [0, 1, 2],
            C.REWARD: [-1.0, -1.0, -300.0],
            VALUE: [-0.1, -0.2, -0.3],
        }
    )
    out = add_advantages(
        table, return_range=ReturnRange(-100, 0), lookahead=1, gamma=0.5, dataset_name="d"
    )
    # A_0 = -1/100 + 0.5*(-0.2) + 0.1; A_1 = -1/100 + 0.5*(-0.3) + 0.2; A_2 = -3 + 0.3
    np.testing.assert_allclose(_col(out, C.ADVANTAGE_CONTINUOUS), [-0.01, 0.04, -2.7], atol=1e-12)
    np.testing.assert_allclose(_col(out, C.RETURN), [-76.5, -151.0, -300.0])
    assert _col(out, C.NUM_VALID_REWARDS).tolist() == [1, 1, 1]


def test_task_length_normalization():
    # paper mode: offset 0, scale = longest episode of the task (both episodes: task "a" -> 6)
    out = add_advantages(
        _spec_table(prompt=["a"] * 11),
        normalization=TASK_LENGTH,
        lookahead=2,
        dataset_name="d",
    )
    a = _col(out, C.ADVANTAGE_CONTINUOUS)
    assert a[0] == pytest.approx(-2 / 6 + SPEC_VALUE[2] - SPEC_VALUE[0])
    assert a[10] == pytest.approx(-300 / 6 - SPEC_VALUE[10])
    assert labeling_of(out)["normalization"] == "task_length"


def _two_datasets():
    """The SPEC table as dataset "b" and a shifted copy as dataset "a" (same episode ids)."""
    b = _spec_table(dataset_name=["b"] * 11, prompt=["pick"] * 6 + ["place"] * 5)
    shifted = pa.array(SPEC_VALUE[::-1] - 0.3)
    a = b.set_column(b.column_names.index(VALUE), VALUE, shifted)
    a = a.set_column(a.column_names.index(C.DATASET_NAME), C.DATASET_NAME, pa.array(["a"] * 11))
    return pa.concat_tables([b, a])


def _kwargs(**labels):
    return {"return_range": SPEC_RANGE, "lookahead": 2, "labels": LabelOptions(**labels)}


@pytest.mark.parametrize("scope", ["global", "per_dataset", "per_task"])
def test_scopes_match_numpy_percentile(scope):
    out = add_advantages(_two_datasets(), **_kwargs(positive_quantile=0.25, scope=scope))
    names = out.column(C.DATASET_NAME).to_pylist()
    assert names == ["a"] * 11 + ["b"] * 11  # sorted by (dataset, episode, frame)
    a = _col(out, C.ADVANTAGE_CONTINUOUS)
    np.testing.assert_allclose(a[11:], SPEC_A, atol=1e-5)
    key = {
        "global": ["all"] * 22,
        "per_dataset": names,
        "per_task": (["pick"] * 6 + ["place"] * 5) * 2,
    }[scope]
    key = np.array(key)
    thresholds = {k: np.percentile(a[key == k], 75) for k in np.unique(key)}
    record = labeling_of(out)
    assert record["thresholds"] == pytest.approx(thresholds, abs=0)
    expected = a >= np.array([thresholds[k] for k in key])
    assert _col(out, C.ADVANTAGE).tolist() == expected.tolist()
    # always a float for RLinf's tools: the global threshold, whatever the scope
    assert record["unified_threshold"] == pytest.approx(np.percentile(a, 75), abs=0)
    assert float(record["unified_threshold"]) == record["unified_threshold"]


def test_task_index_groups_per_dataset_when_no_prompt():
    table = _two_datasets().drop_columns([C.PROMPT])
    table = table.append_column(C.TASK_INDEX, pa.array(([0] * 6 + [1] * 5) * 2))
    out = add_advantages(table, **_kwargs(scope="per_task"))
    assert sorted(labeling_of(out)["thresholds"]) == ["a/0", "a/1", "b/0", "b/1"]


def test_forced_positive_frames_take_part_in_the_threshold():
    table = _two_datasets().append_column("fix", pa.array([False] * 8 + [True] + [False] * 13))
    plain = add_advantages(table, **_kwargs(correction_column=None))
    forced = add_advantages(
        table, **_kwargs(force_positive_datasets=("a",), correction_column="fix")
    )
    assert labeling_of(forced)["unified_threshold"] == labeling_of(plain)["unified_threshold"]
    base, new = _col(plain, C.ADVANTAGE), _col(forced, C.ADVANTAGE)
    assert new[:11].all()  # dataset "a" forced
    assert new[11 + 8] and not base[11 + 8]  # b's episode 1 frame 2: a correction
    changed = np.flatnonzero(new != base)
    assert set(changed) <= set(range(11)) | {19}
    assert labeling_of(forced)["num_forced_positive"] == len(changed)


def test_relabel_equals_fresh_labeling():
    table = _two_datasets()
    first = add_advantages(table, **_kwargs(positive_quantile=0.3))
    fresh = add_advantages(table, **_kwargs(positive_quantile=0.6, scope="per_task"))
    source = first.append_column(C.PROMPT, pa.array((["pick"] * 6 + ["place"] * 5) * 2))
    again = relabel_advantages(source, LabelOptions(positive_quantile=0.6, scope="per_task"))
    assert again.equals(fresh)
    assert labeling_of(again) == labeling_of(fresh)


@pytest.mark.parametrize("q", [0, 1, 1.5, -0.1, True, "0.3", float("nan")])
def test_bad_quantile(q):
    with pytest.raises(RecapError, match=r"^positive_quantile: .* is outside \(0, 1\);"):
        LabelOptions(positive_quantile=q)
    with pytest.raises(RecapError, match="positive_quantile"):
        quantile_threshold(np.zeros(3), q)


@pytest.mark.parametrize(
    ("column", "row", "message"),
    [
        (
            VALUE,
            3,
            r"^value: 1 NaN/null/infinite values \(first at episode_index=0, frame_index=3\); "
            r"run value inference over every frame",
        ),
        (
            C.REWARD,
            9,
            r"^reward: 1 NaN/null/infinite values \(first at episode_index=1, "
            r"frame_index=3\); recompute the returns sidecar",
        ),
    ],
)
def test_nan_inputs(column, row, message):
    table = _spec_table()
    values = _col(table, column).copy()
    values[row] = np.nan
    table = table.set_column(table.column_names.index(column), column, pa.array(values))
    with pytest.raises(RecapError, match=message):
        add_advantages(table, return_range=SPEC_RANGE, lookahead=2, dataset_name="d")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"lookahead": 0}, r"^lookahead: 0 must be an integer >= 1"),
        ({"gamma": 0.0}, r"^gamma: 0.0 is outside \(0, 1\]"),
        ({"return_range": None}, r"^return_range: global normalization needs"),
        ({"normalization": "minmax"}, r"^normalization: 'minmax' is not one of"),
        ({"labels": LabelOptions(scope="per_task")}, r"need a 'prompt' or 'task_index' column"),
        ({"dataset_name": None}, r"^dataset_name: no column and no name given"),
    ],
)
def test_bad_arguments(kwargs, message):
    args = {"return_range": SPEC_RANGE, "lookahead": 2, "dataset_name": "d", **kwargs}
    with pytest.raises(RecapError, match=message):
        add_advantages(_spec_table(), **args)


def test_bad_scope_and_missing_column():
    with pytest.raises(RecapError, match=r"^scope: 'per_robot' is not one of"):
        LabelOptions(scope="per_robot")
    with pytest.raises(RecapError, match=r"^value: column missing"):
        add_advantages(
            _spec_table().drop_columns([VALUE]), return_range=SPEC_RANGE, dataset_name="d"
        )


def test_duplicate_frame_names_the_dataset():
    table = _two_datasets()
    table = table.set_column(1, C.FRAME_INDEX, pa.array(SPEC_FRAME + [0, 0] + SPEC_FRAME[2:]))
    with pytest.raises(
        RecapError, match=r"^dataset 'a': .*duplicate row \(episode_index=0, frame_index=0\)"
    ):
        add_advantages(table, **_kwargs())


def test_align_values():
    frames = _spec_table().drop_columns([VALUE])
    values = pa.table(
        {C.EPISODE_INDEX: SPEC_EPISODE[::-1], C.FRAME_INDEX: SPEC_FRAME[::-1], VALUE: SPEC_VALUE}
    )
    joined = align_to_frames(frames, values, [VALUE], "value table")
    assert joined.column(VALUE).to_pylist() == SPEC_VALUE[::-1].tolist()
    with pytest.raises(
        RecapError,
        match=r"^value table: no row for \(episode_index=1, frame_index=2\) \(1 of 11 frames "
        r"missing\); it must cover every frame",
    ):
        align_to_frames(frames, values.filter(pa.array(np.arange(11) != 2)), [VALUE], "value table")
    with pytest.raises(
        RecapError, match=r"^value table: duplicate row \(episode_index=0, frame_index=5"
    ):
        align_to_frames(
            frames, pa.concat_tables([values, values.slice(5, 1)]), [VALUE], "value table"
        )
    extra = pa.table({C.EPISODE_INDEX: [7], C.FRAME_INDEX: [0], VALUE: [0.0]})
    with pytest.raises(RecapError, match=r"^value table: 1 rows match no frame"):
        align_to_frames(frames, pa.concat_tables([values, extra]), [VALUE], "value table")


# ---- property test against a per-frame reference ------------------------------------------


def _reference(lengths, failures, values, lookahead, gamma, rng):
    """Per-frame double loop straight from the SPEC formula (slow and obviously correct)."""
    out, start = [], 0
    for length, failure in zip(lengths, failures, strict=True):
        rewards = [-1.0] * (length - 1) + [failure]
        for t in range(length):
            window = min(lookahead, length - t)
            s = sum(gamma**k * rewards[t + k] for k in range(window))
            v = values[start + t]
            if t + lookahead < length:
                a = s / rng.scale + gamma**lookahead * values[start + t + lookahead] - v
            else:
                a = (s - rng.offset) / rng.scale - v
            out.append(a)
        start += length
    return np.array(out)


@st.composite
def _episodes(draw):
    lengths = draw(st.lists(st.integers(1, 12), min_size=1, max_size=8))
    failures = draw(
        st.lists(
            st.sampled_from([0.0, -300.0, -7.5, -1.0]), min_size=len(lengths), max_size=len(lengths)
        )
    )
    ids = draw(
        st.lists(st.integers(-50, 10**6), min_size=len(lengths), max_size=len(lengths), unique=True)
    )
    return sorted(ids), lengths, failures


@settings(max_examples=150, deadline=None)
@given(
    episodes=_episodes(),
    lookahead=st.integers(1, 15),
    gamma=st.one_of(st.just(1.0), st.floats(0.05, 1.0)),
    return_max=st.sampled_from([0.0, 3.0, -2.0]),
    q=st.floats(0.01, 0.99),
    seed=st.integers(0, 2**31),
    from_returns=st.booleans(),
    sorted_chunks=st.booleans(),
)
def test_matches_per_frame_reference(
    episodes, lookahead, gamma, return_max, q, seed, from_returns, sorted_chunks
):
    ids, lengths, failures = episodes
    n = sum(lengths)
    random = np.random.default_rng(seed)
    values = random.uniform(-1, 0, n)
    rng = ReturnRange(-400.0, return_max)
    rewards = np.concatenate(
        [[-1.0] * (m - 1) + [f] for m, f in zip(lengths, failures, strict=True)]
    )
    table = pa.table(
        {
            C.EPISODE_INDEX: np.repeat(ids, lengths),
            C.FRAME_INDEX: np.concatenate([np.arange(m) for m in lengths]),
            C.REWARD: rewards,
            VALUE: values,
        }
    )
    if from_returns:  # only G given, computed per frame with the same gamma
        ends = np.repeat(np.cumsum(lengths), lengths)
        g = [sum(gamma ** (k - t) * rewards[k] for k in range(t, ends[t])) for t in range(n)]
        table = table.drop_columns([C.REWARD]).append_column(C.RETURN, pa.array(g))
    if sorted_chunks:  # sorted rows in Arrow chunks cut anywhere (the chunk-wise fast path)
        cuts = np.unique(np.concatenate([[0, n], random.integers(0, n + 1, 3)]))
        given = pa.concat_tables([table.slice(a, b - a) for a, b in zip(cuts[:-1], cuts[1:])])
    else:
        given = table.take(pa.array(random.permutation(n)))
    out = add_advantages(
        given,
        return_range=rng,
        lookahead=lookahead,
        gamma=gamma,
        labels=LabelOptions(positive_quantile=q),
        dataset_name="d",
    )
    expected = _reference(lengths, failures, values, lookahead, gamma, rng)
    got = _col(out, C.ADVANTAGE_CONTINUOUS)
    np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9)
    assert _col(out, C.EPISODE_INDEX).tolist() == np.repeat(ids, lengths).tolist()
    threshold = labeling_of(out)["unified_threshold"]
    assert threshold == np.quantile(got, 1 - q)  # bit for bit
    assert threshold == pytest.approx(np.percentile(got, 100 * (1 - q)), rel=1e-12, abs=1e-12)
    assert _col(out, C.ADVANTAGE).tolist() == (got >= threshold).tolist()


@settings(max_examples=300, deadline=None)
@given(
    values=st.lists(
        st.one_of(st.sampled_from([-1.0, 0.0, 0.5]), st.floats(-1e6, 1e6)),
        min_size=1,
        max_size=60,
    ),
    q=st.floats(1e-6, 1 - 1e-6),
)
def test_quantile_threshold_is_numpys(values, q):
    assert quantile_threshold(np.array(values), q) == np.quantile(np.array(values), 1 - q)

"""recap-serve with the real openpi-client: replies, guidance, bad input, batching, health."""

from __future__ import annotations

import json
import threading
import urllib.request

import numpy as np
import pytest
import torch
from openpi_client import msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.sync.client import connect

from recap.data.conditioning import advantage_prompt, pi05_prompt
from recap.data.transforms import resize_frames, tokenize_prompts
from recap.serve.server import BackgroundServer, ServerConfig
from tests.serve.conftest import (
    ACTION_Q01,
    ACTION_Q99,
    STATE_Q01,
    STATE_Q99,
    TASK,
    observation,
)

OPEN: list[WebsocketClientPolicy] = []


def client(server) -> WebsocketClientPolicy:
    """An openpi client, closed after the test (openpi-client has no close of its own)."""
    OPEN.append(WebsocketClientPolicy("127.0.0.1", server.port))
    return OPEN[-1]


@pytest.fixture(autouse=True)
def close_clients():
    yield
    while OPEN:
        OPEN.pop()._ws.close()


def by_hand(served, obs: dict, beta: float, seed: int) -> np.ndarray:
    """The reply computed from the model and the statistics without recap.serve."""
    model, size = served.model, 28
    frames = torch.zeros(1, 3, size, size, 3, dtype=torch.uint8)
    masks = torch.tensor([[True, True, False]])
    for slot, key in enumerate(("observation/image", "observation/wrist_image")):
        frames[0, slot] = resize_frames(torch.from_numpy(obs[key][None]), size)[0]
    state = obs["observation/state"].astype(np.float64)
    q01, q99 = np.array(STATE_Q01), np.array(STATE_Q99)
    normalized = (state - q01) / (q99 - q01 + 1e-6) * 2 - 1
    texts = [pi05_prompt(advantage_prompt(TASK, True), normalized)]
    plain = [pi05_prompt(TASK, normalized)]
    ids, mask = tokenize_prompts(served.tokenizer, texts, 200)
    uncond_ids, uncond_mask = tokenize_prompts(served.tokenizer, plain, 200)
    batch = {"frames": frames, "image_masks": masks, "input_ids": ids, "attention_mask": mask,
             "uncond_input_ids": uncond_ids, "uncond_attention_mask": uncond_mask}  # fmt: skip
    noise = torch.randn((1, 4, 6), generator=torch.Generator().manual_seed(seed))
    chunk = model.sample_actions(batch, noise, beta)[0, :, :5].double().numpy()
    a01, a99 = np.array(ACTION_Q01), np.array(ACTION_Q99)
    return (chunk + 1) / 2 * (a99 - a01 + 1e-6) + a01


def test_metadata_on_connect_and_health(server, policy_dir):
    meta = client(server).get_server_metadata()
    assert meta["checkpoint"] == str(policy_dir.resolve())
    assert meta["norm_stats"] == str((policy_dir / "assets/robot/norm_stats.json").resolve())
    assert (meta["beta"], meta["device"], meta["guidance"]) == (1.5, "cpu", "positive")
    assert (meta["action_horizon"], meta["action_dim"], meta["state_dim"]) == (4, 5, 3)
    assert meta["api_key_required"] is False
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/healthz", timeout=30) as reply:
        health = json.loads(reply.read())
    assert reply.status == 200
    assert health["checkpoint"] == meta["checkpoint"] and health["beta"] == 1.5
    assert health["norm_stats"] == meta["norm_stats"] and health["device"] == "cpu"


def test_infer_equals_the_policy_called_directly(server, served):
    policy = client(server)
    obs = observation(1, noise_seed=7)
    first = policy.infer(obs)
    assert first["actions"].dtype == np.float32 and first["actions"].shape == (4, 5)
    direct = served.infer(observation(1, noise_seed=7))["actions"]
    np.testing.assert_allclose(first["actions"], direct, rtol=0, atol=1e-6)
    np.testing.assert_allclose(first["actions"], by_hand(served, obs, 1.5, 7), rtol=0, atol=1e-5)
    assert first["server_timing"]["infer_ms"] > 0 and "prev_total_ms" not in first["server_timing"]
    assert first["policy_timing"]["batch_size"] == 1
    second = policy.infer(obs)
    assert second["server_timing"]["prev_total_ms"] > 0
    np.testing.assert_array_equal(second["actions"], first["actions"])  # same noise_seed


def test_per_request_beta(server, served):
    policy = client(server)
    replies = {b: policy.infer(observation(2, noise_seed=3, beta=b))["actions"]
               for b in (0.0, 1.0, 1.5, 2.5)}  # fmt: skip
    for beta, actions in replies.items():
        expected = by_hand(served, observation(2), beta, 3)
        np.testing.assert_allclose(actions, expected, rtol=0, atol=1e-5)
    np.testing.assert_array_equal(
        replies[1.5], policy.infer(observation(2, noise_seed=3))["actions"]
    )  # the server's beta is 1.5
    assert np.abs(replies[2.5] - replies[1.5]).max() > 1e-3


@pytest.mark.parametrize(("beta", "rows"), [(1.0, 1), (0.0, 1), (1.5, 2)])
def test_beta_one_computes_one_branch(served, monkeypatch, beta, rows):
    seen = []
    cache = served.model.paligemma_with_expert.prefix_cache

    def record(prefix):
        seen.append(prefix.embeds.shape[0])
        return cache(prefix)

    monkeypatch.setattr(served.model.paligemma_with_expert, "prefix_cache", record)
    served.infer(observation(3, beta=beta))
    assert seen == [rows]


def image(shape, dtype=np.uint8):
    return np.zeros(shape, dtype)


BAD = [
    ({"observation/wrist_image": None},
     "observation/wrist_image: missing (a uint8 [H, W, 3] camera image)"),
    ({"observation/image": image((32, 40))},
     "observation/image: expected uint8 [H, W, 3], got uint8 [32, 40]"),
    ({"observation/image": image((32, 40, 4))},
     "observation/image: expected uint8 [H, W, 3] with 1 <= H, W <= 4096, got uint8 [32, 40, 4]"),
    ({"observation/image": image((32, 40, 3), np.float32)},
     "observation/image: expected uint8 [H, W, 3], got float32 [32, 40, 3]"),
    ({"observation/state": np.array([0.5, np.nan, 2.5], np.float32)},
     "observation/state: non-finite value nan at index 1"),
    ({"observation/state": np.array([0.5, 1.0, np.inf])},
     "observation/state: non-finite value inf at index 2"),
    ({"observation/state": np.zeros(4, np.float32)},
     "observation/state: expected float[3], got float32 [4]"),
    ({"observation/state": None}, "observation/state: missing (float[3] robot state)"),
    ({"prompt": "x" * 600}, "prompt: 600 characters exceed the limit of 512 (--max-prompt-chars)"),
    ({"prompt": "bowl " * 100}, "prompt: 116 tokens once built exceed the limit of 100 "
     "(--max-tokens)"),
    ({"prompt": None}, "prompt: missing (the task text)"),
    ({"prompt": 5}, "prompt: expected a string, got int"),
    ({"beta": float("nan")}, "beta: nan must be finite and >= 0"),
    ({"beta": -1.0}, "beta: -1.0 must be finite and >= 0"),
    ({"beta": "high"}, "beta: expected a number, got str"),
    ({"noise_seed": -3}, "noise_seed: expected an integer in [0, 2**63), got int"),
]  # fmt: skip


@pytest.fixture(scope="module")
def short_tokens(served):
    limit = served.spec.max_tokens
    served.spec.max_tokens = 100
    yield
    served.spec.max_tokens = limit


@pytest.mark.parametrize(("change", "line"), BAD, ids=[line.split(":")[0] for _, line in BAD])
def test_bad_input_gets_an_error_and_the_next_request_succeeds(server, short_tokens, change, line):
    policy = client(server)
    obs = {k: v for k, v in (observation(4) | change).items() if v is not None}
    with pytest.raises(RuntimeError) as exc:
        policy.infer(obs)
    assert str(exc.value) == f"Error in inference server:\n{line}"
    assert policy.infer(observation(4))["actions"].shape == (4, 5)  # same connection


@pytest.mark.parametrize(
    ("frame", "line"),
    [
        (b"\xc1\x00", "frame: not a msgpack-numpy message (FormatError)"),
        ("hello", "frame: expected a binary msgpack frame, got text"),
        (msgpack_numpy.packb([1, 2]), "frame: expected a map of observation fields, got list"),
    ],
)
def test_malformed_frames_get_an_error_reply(server, frame, line):
    with connect(f"ws://127.0.0.1:{server.port}", compression=None, max_size=None) as ws:
        ws.recv()  # metadata
        ws.send(frame)
        assert ws.recv() == line
        ws.send(msgpack_numpy.packb(observation(5)))
        assert msgpack_numpy.unpackb(ws.recv())["actions"].shape == (4, 5)


def test_concurrent_clients_are_batched_and_each_reply_is_its_own(server, served):
    seeds = [[100 * c + i for i in range(4)] for c in range(6)]
    got, errors = {}, []
    # a long wait, so that requests of clients started together share forwards on a busy machine
    alone, expected = client(server), {}
    for s in [s for row in seeds for s in row]:  # one at a time: forwards of one request
        reply = alone.infer(observation(s, noise_seed=s))
        assert reply["policy_timing"]["batch_size"] == 1
        expected[s] = reply["actions"]
    server = BackgroundServer(served, ServerConfig(port=0, max_batch=8, batch_wait_ms=200.0))
    server.__enter__()
    start = threading.Barrier(len(seeds))

    def run(row):
        try:
            policy = client(server)
            start.wait(60)
            for s in row:
                got[s] = policy.infer(observation(s, noise_seed=s))["actions"]
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(row,)) for row in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    server.__exit__()
    assert errors == [] and sorted(got) == sorted(expected)
    for s, actions in got.items():  # a batched forward rounds a little differently (float32)
        np.testing.assert_allclose(actions, expected[s], rtol=1e-4, atol=1e-5)
    batches = server.server.batches
    assert sum(batches) == 24 and max(batches) > 1, batches


def test_a_vanished_or_silent_client_blocks_nobody(server):
    silent = connect(f"ws://127.0.0.1:{server.port}", compression=None, max_size=None)
    silent.recv()
    for s in range(3):  # requests whose replies it never reads
        silent.send(msgpack_numpy.packb(observation(s)))
    gone = connect(f"ws://127.0.0.1:{server.port}", compression=None, max_size=None)
    gone.recv()
    gone.send(msgpack_numpy.packb(observation(6)))
    gone.close()  # vanishes before its reply
    assert client(server).infer(observation(7))["actions"].shape == (4, 5)
    silent.close()

"""recap-serve against idle and hostile clients (idle timeout, keep-alive pings, per-address
limit), the policy checked before its weights are read, the image-size policy, and the π0.5
stand-in served as ``recap.standins`` writes it."""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from openpi_client import msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.exceptions import ConnectionClosedOK, InvalidStatus
from websockets.sync.client import connect

from recap.errors import RecapError
from recap.serve.load import load_served
from recap.serve.policy import ServedPolicy, ServeSpec
from recap.serve.server import BackgroundServer, ServerConfig
from tests.serve.conftest import observation, wait_until

IDLE = "idle for 2 s with no request (--idle-timeout)"


def test_100_idle_connections_and_one_working_client(served):
    config = ServerConfig(port=0, max_connections=128, max_connections_per_address=128,
                          idle_timeout_s=2.0)  # fmt: skip
    with BackgroundServer(served, config) as server:
        idle = [WebsocketClientPolicy("127.0.0.1", server.port) for _ in range(100)]
        working = WebsocketClientPolicy("127.0.0.1", server.port)
        opened = len(server.server._connections)
        replies = 0
        # the working client keeps asking; the idle ones are closed around it
        while any(c._ws.protocol.close_rcvd is None for c in idle):
            assert working.infer(observation(replies))["actions"].shape == (4, 5)
            replies += 1
            assert replies < 10_000
        assert wait_until(lambda: len(server.server._connections) == 1)
        assert working.infer(observation(1))["actions"].shape == (4, 5)  # still open
        closes = {(c._ws.protocol.close_rcvd.code, c._ws.protocol.close_rcvd.reason) for c in idle}
        assert closes == {(1000, IDLE)}
        with pytest.raises(ConnectionClosedOK):
            idle[0].infer(observation(2))
        working._ws.close()
    assert opened >= 2 and replies >= 1


def test_idle_clients_no_longer_lock_everyone_out(served):
    config = ServerConfig(port=0, max_connections=16, max_connections_per_address=16,
                          idle_timeout_s=2.0)  # fmt: skip
    with BackgroundServer(served, config) as server:
        idle = [WebsocketClientPolicy("127.0.0.1", server.port) for _ in range(16)]
        if len(server.server._connections) == 16:  # all 16 still open: the 17th is refused
            with pytest.raises(InvalidStatus) as exc:
                WebsocketClientPolicy("127.0.0.1", server.port)
            assert exc.value.response.status_code == 503
            assert exc.value.response.body == b"server: 16 connections open (--max-connections)\n"
        assert wait_until(lambda: not server.server._connections)  # closed by the idle timeout
        policy = WebsocketClientPolicy("127.0.0.1", server.port)
        assert policy.infer(observation(3))["actions"].shape == (4, 5)
        policy._ws.close()
        assert {c._ws.protocol.close_rcvd.reason for c in idle} == {IDLE}


def test_the_per_address_limit_leaves_room_for_other_hosts(served):
    config = ServerConfig(port=0, max_connections=8, max_connections_per_address=2)
    with BackgroundServer(served, config) as server:
        url = f"ws://127.0.0.1:{server.port}"
        mine = [connect(url, compression=None, max_size=None) for _ in range(2)]
        with pytest.raises(InvalidStatus) as exc:
            connect(url, compression=None, max_size=None)
        assert exc.value.response.status_code == 503
        assert exc.value.response.body == (
            b"server: 2 connections open from 127.0.0.1 (--max-connections-per-address)\n"
        )
        other = connect(url, compression=None, max_size=None, source_address=("127.0.0.2", 0))
        other.recv()  # metadata
        other.send(msgpack_numpy.packb(observation(4)))
        assert msgpack_numpy.unpackb(other.recv())["actions"].shape == (4, 5)
        assert server.server.metadata["max_connections_per_address"] == 2
        mine[0].close()
        assert wait_until(lambda: server.server._per_address["127.0.0.1"] == 1)
        again = connect(url, compression=None, max_size=None)  # a slot of this address freed
        for ws in [*mine[1:], again, other]:
            ws.close()


def handshake(port: int) -> socket.socket:
    """A raw TCP client that completes the websocket handshake, then never reads again (it
    answers no ping)."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.sendall(
        b"GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
    )
    reply = b""
    while b"\r\n\r\n" not in reply:
        reply += sock.recv(1)
    assert reply.startswith(b"HTTP/1.1 101")
    return sock


def test_keepalive_pings_close_a_peer_that_stopped_answering(served, caplog):
    caplog.set_level(logging.INFO, logger="recap.serve")
    config = ServerConfig(port=0, idle_timeout_s=0, ping_interval_s=0.3, ping_timeout_s=0.3,
                          close_timeout_s=0.5)  # fmt: skip
    with BackgroundServer(served, config) as server:
        deaf = handshake(server.port)
        assert wait_until(lambda: len(server.server._connections) == 1)
        assert wait_until(lambda: not server.server._connections)  # no pong: closed
        deaf.close()
        policy = WebsocketClientPolicy("127.0.0.1", server.port)  # answers pings: stays
        time.sleep(1.0)
        assert policy.infer(observation(5))["actions"].shape == (4, 5)
        policy._ws.close()
    closed = [r.getMessage() for r in caplog.records if r.getMessage().startswith("closed")]
    assert closed[0].endswith("(code 1011: keepalive ping timeout)")


def test_a_silent_and_a_vanished_client_block_nobody_under_the_idle_timeout(served):
    config = ServerConfig(port=0, idle_timeout_s=2.0, close_timeout_s=0.5)
    with BackgroundServer(served, config) as server:
        silent = handshake(server.port)  # sends requests, never reads a reply
        frame = msgpack_numpy.packb(observation(6))
        for _ in range(3):
            silent.sendall(_masked_frame(frame))
        gone = connect(f"ws://127.0.0.1:{server.port}", compression=None, max_size=None)
        gone.recv()
        gone.send(frame)
        gone.close()  # vanishes before its reply
        policy = WebsocketClientPolicy("127.0.0.1", server.port)
        assert policy.infer(observation(7))["actions"].shape == (4, 5)
        policy._ws.close()
        assert wait_until(lambda: not server.server._connections)  # the silent one too
        silent.close()


def _masked_frame(payload: bytes) -> bytes:
    """One binary websocket frame from a client (masked with a zero key)."""
    n = len(payload)
    if n < 126:
        head = bytes([0x82, 0x80 | n])
    elif n < 2**16:
        head = bytes([0x82, 0x80 | 126]) + n.to_bytes(2, "big")
    else:
        head = bytes([0x82, 0x80 | 127]) + n.to_bytes(8, "big")
    return head + b"\0\0\0\0" + payload


def test_strict_shapes_refuse_other_sizes_with_one_line(served):
    strict = ServedPolicy(served.model, served.processor, spec=ServeSpec(strict_shapes=True),
                          device="cpu")  # fmt: skip
    assert strict.metadata()["images"] == "must be image_size x image_size (--strict-shapes)"
    assert served.metadata()["images"] == "resized with padding to image_size (aspect ratio kept)"
    with BackgroundServer(strict, ServerConfig(port=0)) as server:
        policy = WebsocketClientPolicy("127.0.0.1", server.port)
        obs = observation(8) | {"observation/image": np.zeros((17, 5, 3), np.uint8)}
        with pytest.raises(RuntimeError) as exc:
            policy.infer(obs)
        assert str(exc.value) == (
            "Error in inference server:\nobservation/image: 17x5 image refused "
            "(--strict-shapes): send 28x28, the model's image_size"
        )
        square = observation(8) | {"observation/image": np.zeros((28, 28, 3), np.uint8)}
        assert policy.infer(square)["actions"].shape == (4, 5)
        policy._ws.close()
    lenient = served.infer(observation(8) | {"observation/image": np.zeros((17, 5, 3), np.uint8)})
    assert lenient["actions"].shape == (4, 5)  # the default: resized


def test_the_limits_and_their_defaults_are_in_the_help():
    from recap.commands.serve import build_parser

    text = " ".join(build_parser().format_help().split())
    for flag, default in (
        ("--max-connections-per-address", "default 8"),
        ("--idle-timeout", "default 300"),
        ("--ping-interval", "default 20"),
        ("--ping-timeout", "default 20"),
        ("--max-connections", "default 16"),
    ):
        assert default in text[text.rindex(flag + " "):][:160], flag  # fmt: skip
    assert "--strict-shapes" in text


# ---- checks before the weights ------------------------------------------------------------


@pytest.fixture
def no_weights(monkeypatch):
    """Fail the test if anything reads a policy's weights."""
    import recap.loading
    import recap.models.checkpoints
    import recap.models.pi05

    def refuse(*args, **kwargs):
        raise AssertionError("the model was loaded before the inputs were checked")

    monkeypatch.setattr(recap.loading, "load_policy", refuse)
    monkeypatch.setattr(recap.models.checkpoints, "load_pi05", refuse)
    monkeypatch.setattr(recap.models.pi05, "load_pi05", refuse)  # pi05_policy's


def test_a_missing_tokenizer_is_reported_before_the_model_loads(tmp_path, policy_dir, no_weights):
    bare = tmp_path / "bare"
    shutil.copytree(policy_dir, bare, ignore=shutil.ignore_patterns("tokenizer*"))
    with pytest.raises(RecapError) as exc:
        load_served(bare, device="cpu")
    assert str(exc.value) == (
        f"--tokenizer: {bare} carries no tokenizer; pass --tokenizer PATH (PaliGemma's "
        "paligemma_tokenizer.model for π0.5)"
    )
    with pytest.raises(RecapError) as exc:
        load_served(bare, tokenizer=str(tmp_path / "tok.model"), device="cpu")
    assert str(exc.value) == (
        f"--tokenizer: {tmp_path / 'tok.model'} not found; pass PaliGemma's "
        "paligemma_tokenizer.model or a directory of tokenizer files"
    )


def test_a_processor_naming_a_missing_tokenizer_is_one_line(tmp_path, policy_dir, served,
                                                            no_weights):  # fmt: skip
    run = tmp_path / "run"
    shutil.copytree(policy_dir, run, ignore=shutil.ignore_patterns("tokenizer*"))
    served.processor.replace(tokenizer=str(tmp_path / "gone")).save(run)
    with pytest.raises(RecapError) as exc:
        load_served(run, device="cpu")
    assert str(exc.value) == (
        f"{run / 'processor.json'}: tokenizer {tmp_path / 'gone'} not found; pass --tokenizer "
        "PATH (the policy's own tokenizer)"
    )
    (run / "processor.json").write_text("{not json")
    with pytest.raises(RecapError) as exc:
        load_served(run, device="cpu")
    assert str(exc.value).startswith(f"{run / 'processor.json'}: not valid JSON (")


@pytest.mark.parametrize("case", ["path", "tokenizer"])
def test_recap_serve_reports_a_bad_policy_without_importing_torch(tmp_path, policy_dir, case):
    """The command's error comes before torch is imported (ordering, not wall time)."""
    bare = tmp_path / "bare"
    shutil.copytree(policy_dir, bare, ignore=shutil.ignore_patterns("tokenizer*"))
    policy = tmp_path / "missing" if case == "path" else bare
    code = (
        "import sys; from recap.commands.serve import main; "
        f"rc = main(['--policy', {str(policy)!r}]); print(rc, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout == "2 False\n"
    line = (f"error: --policy: {policy / 'model.safetensors'} not found; point it at an "
            "exported policy directory (recap run, openpi or LeRobot layout)\n"
            if case == "path" else
            f"error: --tokenizer: {bare} carries no tokenizer; pass --tokenizer PATH (PaliGemma's "
            "paligemma_tokenizer.model for π0.5)\n")  # fmt: skip
    assert out.stderr == line


def test_a_record_path_that_is_a_file_is_one_line_before_loading(tmp_path, policy_dir, capsys,
                                                                 no_weights):  # fmt: skip
    from recap.commands.serve import main

    (tmp_path / "file").write_text("x")
    assert main(["--policy", str(policy_dir), "--record", str(tmp_path / "file")]) == 2
    assert capsys.readouterr().err == (
        f"error: --record: {tmp_path / 'file'} is not a directory; pass a directory\n"
    )


def test_a_record_directory_another_server_holds_is_one_line_before_loading(
    tmp_path, policy_dir, capsys, no_weights
):
    import fcntl

    from recap.commands.serve import main

    (tmp_path / "rec").mkdir()
    with open(tmp_path / "rec" / ".lock", "a") as held:  # what a recording server holds
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert main(["--policy", str(policy_dir), "--record", str(tmp_path / "rec")]) == 2
    assert capsys.readouterr().err == (
        f"error: --record: {tmp_path / 'rec'} is being recorded into by another recap-serve "
        f"({tmp_path / 'rec' / '.lock'}); pass another directory\n"
    )
    assert sorted(p.name for p in (tmp_path / "rec").iterdir()) == [".lock"]


# ---- the stand-in π0.5 as written ---------------------------------------------------------


@pytest.fixture(scope="module")
def standin(tmp_path_factory):
    from recap.standins import (
        NORM_STATS_DATASET,
        StandIns,
        _write_pi05,
        make_episodes,
        norm_stats,
        sentencepiece_model,
    )

    standins = StandIns.at(tmp_path_factory.mktemp("standins"))
    standins.tokenizer.parent.mkdir(parents=True)
    standins.tokenizer.write_bytes(sentencepiece_model(0))
    _write_pi05(standins, 2, norm_stats(make_episodes(0)[NORM_STATS_DATASET]), False)
    return standins


def test_the_standin_pi05_is_served_as_written(standin, clean_gin):
    from recap.models.checkpoints import load_pi05
    from recap.standins import PI05_SIZES

    # without its gin file: the sizes of its tensors, heads by π0.5's convention (the stand-in's
    # 16 vision heads are in no tensor), the same model as with the gin file
    bare = load_served(standin.pi05_base, tokenizer=str(standin.tokenizer), device="cpu")
    sizes = bare.model.config
    assert sizes.vision == PI05_SIZES["vision"] | {
        "hidden_act": "gelu_pytorch_tanh", "layer_norm_eps": 1e-6}  # fmt: skip
    assert sizes.vision["num_attention_heads"] == 16
    assert {k: sizes.text[k] for k in PI05_SIZES["text"]} == PI05_SIZES["text"] | {
        "max_position_embeddings": 8192}  # fmt: skip
    assert sizes.expert == PI05_SIZES["expert"]
    policy = load_served(standin.pi05_base, tokenizer=str(standin.tokenizer),
                         gin_files=("rehearsal/tiny.gin",), device="cpu")  # fmt: skip
    expected = load_pi05(standin.pi05_base, **PI05_SIZES).state_dict()
    got = policy.model.state_dict()
    assert sorted(got) == sorted(expected)
    assert all(np.array_equal(got[k].numpy(), expected[k].numpy()) for k in expected)
    meta = policy.metadata()
    assert (meta["image_size"], meta["state_dim"], meta["action_dim"]) == (32, 8, 7)
    assert meta["action_horizon"] == 10
    obs = {"observation/image": np.zeros((256, 256, 3), np.uint8),
           "observation/wrist_image": np.zeros((256, 256, 3), np.uint8),
           "observation/state": np.zeros(8, np.float32), "prompt": "put both",
           "noise_seed": 1}  # fmt: skip
    actions = policy.infer(dict(obs))["actions"]
    assert actions.shape == (10, 7) and np.isfinite(actions).all()
    np.testing.assert_array_equal(bare.infer(dict(obs))["actions"], actions)  # as written


@pytest.fixture
def clean_gin():
    import gin

    yield
    gin.clear_config()

"""recap-serve as a door: API key at the handshake, loopback by default, frame and array limits,
connection limit, graceful shutdown on SIGTERM."""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time

import pytest
from openpi_client import msgpack_numpy
from openpi_client.websocket_client_policy import WebsocketClientPolicy
from websockets.exceptions import ConnectionClosedError, InvalidStatus
from websockets.sync.client import connect

from recap.commands.serve import API_KEY_ENV, main
from recap.serve.server import BackgroundServer, ServerConfig
from tests.serve.conftest import observation

KEY = "k3y-Not-In-Logs"


def raw(port: int):
    ws = connect(f"ws://127.0.0.1:{port}", compression=None, max_size=None)
    ws.recv()  # metadata
    return ws


def array_frame(**fields) -> bytes:
    """A frame of ``observation(8)`` with some fields replaced by raw msgpack values."""
    import msgpack

    obs = msgpack_numpy.unpackb(msgpack_numpy.packb(observation(8)), raw=False)
    packed = {k: msgpack_numpy.pack_array(v) for k, v in obs.items()}
    return msgpack.packb(packed | fields, use_bin_type=True)


def test_a_wrong_or_missing_key_is_refused_at_the_handshake(served, caplog):
    caplog.set_level(logging.WARNING, logger="recap.serve")
    with BackgroundServer(served, ServerConfig(port=0, api_key=KEY)) as server:
        for key in (None, "wrong", KEY + "x"):
            with pytest.raises(InvalidStatus) as exc:
                WebsocketClientPolicy("127.0.0.1", server.port, api_key=key)
            assert exc.value.response.status_code == 401
        policy = WebsocketClientPolicy("127.0.0.1", server.port, api_key=KEY)
        assert policy.get_server_metadata()["api_key_required"] is True
        assert policy.infer(observation(1))["actions"].shape == (4, 5)
        policy._ws.close()
    refusals = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert [re.sub(r":\d+:", ":PORT:", m) for m in refusals] == [
        "refused 127.0.0.1:PORT: missing API key",
        "refused 127.0.0.1:PORT: wrong API key",
        "refused 127.0.0.1:PORT: wrong API key",
    ]
    assert KEY not in caplog.text


def test_a_non_loopback_bind_needs_a_key_or_insecure(policy_dir, capsys, monkeypatch):
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    assert main(["--policy", str(policy_dir), "--host", "0.0.0.0"]) == 2
    err = capsys.readouterr().err
    assert err == (
        "error: --host 0.0.0.0 is not a loopback address: set an API key (RECAP_SERVE_API_KEY "
        "or --api-key) or pass --insecure to serve without one\n"
    )
    monkeypatch.setenv(API_KEY_ENV, " ")
    assert main(["--policy", str(policy_dir), "--host", "10.1.2.3"]) == 2
    assert capsys.readouterr().err == (
        "error: --api-key / RECAP_SERVE_API_KEY: empty; set a key or leave both unset\n"
    )


@pytest.fixture(scope="module")
def small_frames(served):
    config = ServerConfig(port=0, max_frame_bytes=64 * 1024, max_connections=3)
    with BackgroundServer(served, config) as server:
        yield server


def test_an_oversize_frame_is_refused_and_the_server_keeps_serving(small_frames):
    ws = raw(small_frames.port)
    ws.send(b"\x00" * (64 * 1024 + 1))
    with pytest.raises(ConnectionClosedError) as exc:
        ws.recv()
    assert exc.value.rcvd.code == 1009
    assert exc.value.rcvd.reason.endswith("exceeds limit of 65536 bytes")
    ok = raw(small_frames.port)
    ok.send(msgpack_numpy.packb(observation(2)))
    assert msgpack_numpy.unpackb(ok.recv())["actions"].shape == (4, 5)
    ok.close()


@pytest.mark.parametrize(
    ("fields", "line"),
    [
        ({"observation/state": {b"__ndarray__": True, b"data": b"\0" * 24, b"dtype": "|O",
                                b"shape": [3]}},
         "observation/state: dtype '|O' is not allowed (bool, integer or float arrays only)"),
        ({"observation/image": {b"__ndarray__": True, b"data": b"\0" * 12, b"dtype": "|u1",
                                b"shape": [4096, 4096, 3]}},
         "observation/image: declared shape [4096, 4096, 3] of |u1 needs 50331648 bytes but the "
         "buffer holds 12"),
        ({"observation/image": {b"__ndarray__": True, b"data": b"\0" * 12, b"dtype": "|u1",
                                b"shape": [2**40, 2**40, 3]}},
         "observation/image: declared shape [1099511627776, 1099511627776, 3] of |u1 needs "
         "3626777458843887524118528 bytes but the buffer holds 12"),
        ({"extra": {b"__npgeneric__": True, b"data": 1, b"dtype": "|O"}},
         "extra: dtype '|O' is not allowed (bool, integer or float scalars only)"),
    ],
)  # fmt: skip
def test_hostile_arrays_get_an_error_reply_and_the_server_keeps_serving(small_frames, fields, line):
    ws = raw(small_frames.port)
    ws.send(array_frame(**fields))
    assert ws.recv() == line
    ws.send(msgpack_numpy.packb(observation(3)))
    assert msgpack_numpy.unpackb(ws.recv())["actions"].shape == (4, 5)
    ws.close()


def test_open_connections_are_bounded(small_frames):
    open_ = [raw(small_frames.port) for _ in range(3)]
    with pytest.raises(InvalidStatus) as exc:
        raw(small_frames.port)
    assert exc.value.response.status_code == 503
    open_[0].close()
    deadline = time.monotonic() + 10
    while len(small_frames.server._connections) > 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    again = raw(small_frames.port)  # a slot freed
    for ws in [*open_[1:], again]:
        ws.close()


class SlowPolicy:
    """The served policy whose forward waits for ``release`` (a request held in flight)."""

    def __init__(self, policy):
        self.policy, self.entered, self.release = policy, threading.Event(), threading.Event()

    def __getattr__(self, name):
        return getattr(self.policy, name)

    def infer_batch(self, requests):
        self.entered.set()
        assert self.release.wait(60)
        return self.policy.infer_batch(requests)


def test_shutdown_answers_the_requests_in_flight(served):
    slow = SlowPolicy(served)
    background = BackgroundServer(slow, ServerConfig(port=0))
    background.__enter__()
    policy = WebsocketClientPolicy("127.0.0.1", background.port)
    replies = []
    worker = threading.Thread(target=lambda: replies.append(policy.infer(observation(9))))
    worker.start()
    assert slow.entered.wait(60)
    background.server.shutdown()  # while the request is in the model
    time.sleep(0.05)
    try:  # no new connections once shutting down: the listening socket is closed
        with pytest.raises(ConnectionRefusedError):
            WebsocketClientPolicy("127.0.0.1", background.port)
    finally:
        slow.release.set()
    worker.join(60)
    assert replies[0]["actions"].shape == (4, 5)
    background._thread.join(60)
    assert not background._thread.is_alive()


def test_sigterm_stops_recap_serve_cleanly(policy_dir, caplog, monkeypatch):
    """``recap-serve``'s main in this process (signal handlers need the main thread); a robot
    thread infers once, then sends SIGTERM."""
    monkeypatch.delenv(API_KEY_ENV, raising=False)
    caplog.set_level(logging.INFO, logger="recap.serve")
    shapes = []

    def robot():
        try:
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                found = [r.getMessage() for r in list(caplog.records) if "listening" in r.msg]
                if found:
                    break
                time.sleep(0.05)
            policy = WebsocketClientPolicy("127.0.0.1", int(found[0].rsplit(":", 1)[1]))
            shapes.append(policy.infer(observation(1))["actions"].shape)
            policy._ws.close()
        finally:
            os.kill(os.getpid(), signal.SIGTERM)

    thread = threading.Thread(target=robot, daemon=True)
    thread.start()
    assert main(["--policy", str(policy_dir), "--port", "0"]) == 0
    thread.join(30)
    assert shapes == [(4, 5)]
    messages = [r.getMessage() for r in caplog.records if r.name == "recap.serve"]
    assert messages[-1] == "stopped"  # the robot's close may be logged before or after this:
    assert "shutting down (0 requests in flight left)" in messages[-3:-1]  # it races SIGTERM

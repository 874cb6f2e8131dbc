"""openpi's websocket policy protocol, served with request batching, limits and an API key.

Protocol (what ``openpi_client.WebsocketClientPolicy`` speaks): on connect the server sends the
policy's metadata (one msgpack map); then every binary frame is one msgpack-numpy observation and
gets one reply: ``{"actions": float32[H, A], "server_timing": {"infer_ms", "prev_total_ms"},
"policy_timing": {"infer_ms", "queue_ms", "batch_size"}}`` (``prev_total_ms``, from the second
request of a connection on, is the previous request's receive-to-send time, as openpi's server
reports it). A request the server refuses gets a text frame instead, one line naming the field
(``observation/state: non-finite value nan at index 2``); openpi-client raises
``RuntimeError("Error in inference server:\\n" + line)`` on a text frame, and the connection
stays open for the next request. Unlike openpi's server, nothing is sent as a traceback: the
detail goes to the server log only.

Batching: requests that arrive together (within ``batch_wait_ms`` of the first, at most
``max_batch``) run as one forward of the single model (one thread owns it); decoding and
validation run in worker threads, each connection in its own task, so a slow or vanished client
delays only itself (a reply to a closed connection is dropped).

Security: an API key, when set, is required at the handshake (``Authorization: Api-Key KEY``,
what openpi-client sends with ``api_key=KEY``), compared in constant time; a refusal is logged
with the peer address and never the key. ``max_frame_bytes`` bounds a frame before it is read
(a larger one closes that connection with code 1009, "message too big", whose reason names the
limit; the server keeps serving); ``max_connections`` bounds open connections and
``max_connections_per_address`` those of one client address (HTTP 503 at the handshake beyond
either, the body naming the limit), so one host cannot take every slot.

Idle clients: the server pings every connection every ``ping_interval_s`` and closes one whose
pong does not come within ``ping_timeout_s`` (a vanished peer, code 1011); a connection that
sends no request for ``idle_timeout_s`` is closed with code 1000 and the reason
``idle for N s with no request (--idle-timeout)`` (openpi-client raises ``ConnectionClosed`` on
its next ``infer``: reconnect). The time a request spends in the model does not count as idle;
an idle connection's slot is free as soon as it is closed, and a peer that does not answer the
close is dropped after ``close_timeout_s``.

``GET /healthz`` answers the metadata as JSON (with the key when one is
set). ``shutdown()`` (SIGTERM / SIGINT under ``recap-serve``) stops accepting, lets requests in
flight finish and be answered, then closes every connection with 1001 (going away).
"""

from __future__ import annotations

import asyncio
import collections
import hmac
import json
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from http import HTTPStatus

import numpy as np
from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed

from recap.serve.policy import Prepared, RequestError, ServedPolicy
from recap.serve.record import (
    EPISODE_END,
    EXECUTED,
    SUCCESS,
    EpisodeBuffer,
    RecordConfig,
    Recorder,
    RecordError,
    flag,
)
from recap.serve.wire import WireError, find_bad, pack, unpack

log = logging.getLogger("recap.serve")
MIB = 2**20
HEALTH_PATH = "/healthz"


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    max_frame_bytes: int = 32 * MIB
    max_connections: int = 16
    max_connections_per_address: int = 8
    idle_timeout_s: float = 300.0
    ping_interval_s: float = 20.0
    ping_timeout_s: float = 20.0
    close_timeout_s: float = 5.0
    record: RecordConfig | None = None  # --record DIR: each connection's episode (record.py)
    max_batch: int = 8
    batch_wait_ms: float = 5.0
    shutdown_timeout_s: float = 60.0


@dataclass
class _Job:
    request: Prepared
    future: asyncio.Future
    queued: float


class PolicyServer:
    """Serves ``policy`` (a ``ServedPolicy``, or anything with ``prepare``, ``infer_batch`` and
    ``metadata``) over openpi's protocol; ``run()`` until ``shutdown()``."""

    def __init__(self, policy: ServedPolicy, config: ServerConfig | None = None):
        self.policy, self.config = policy, config or ServerConfig()
        self.metadata = policy.metadata() | {
            "max_frame_bytes": self.config.max_frame_bytes,
            "max_connections": self.config.max_connections,
            "max_connections_per_address": self.config.max_connections_per_address,
            "idle_timeout_s": self.config.idle_timeout_s,
            "max_batch": self.config.max_batch,
            "batch_wait_ms": self.config.batch_wait_ms,
            "api_key_required": self.config.api_key is not None,
            "recording": self.config.record is not None,
        }
        self.recorder: Recorder | None = None
        if self.config.record is not None:
            keep = ("checkpoint", "beta", "guidance", "num_steps", "action_horizon")
            self.metadata["record_max_frames"] = self.config.record.max_frames
            self.recorder = Recorder(self.config.record, policy.spec,
                                     {k: self.metadata.get(k) for k in keep})  # fmt: skip
        self._record_thread = ThreadPoolExecutor(
            1, thread_name_prefix="recap-serve-record", initializer=Recorder.lower_priority
        )
        self._expected = (
            None if self.config.api_key is None else f"Api-Key {self.config.api_key}".encode()
        )
        self._model_thread = ThreadPoolExecutor(1, thread_name_prefix="recap-serve-model")
        self._connections: set[ServerConnection] = set()
        self._per_address: collections.Counter[str] = collections.Counter()
        self._in_flight = 0
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self.port: int | None = None  # the bound port (``config.port`` 0 picks a free one)
        self.ready = threading.Event()
        self.batches: list[int] = []  # size of every forward, for tests and the benchmark

    # ---- handshake ------------------------------------------------------------------------

    def _peer(self, connection: ServerConnection) -> str:
        address = connection.remote_address
        return f"{address[0]}:{address[1]}" if address else "?"

    def _process_request(self, connection: ServerConnection, request):
        peer = self._peer(connection)
        if self._stopping:
            return connection.respond(HTTPStatus.SERVICE_UNAVAILABLE, "server: shutting down\n")
        if self._expected is not None:
            given = request.headers.get("Authorization")
            if given is None or not hmac.compare_digest(given.encode(), self._expected):
                log.warning("refused %s: %s API key", peer, "missing" if given is None else "wrong")
                return connection.respond(HTTPStatus.UNAUTHORIZED, "server: API key refused\n")
        if request.path == HEALTH_PATH:
            body = self.metadata | {"connections": len(self._connections)}
            return connection.respond(HTTPStatus.OK, json.dumps(body) + "\n")
        if len(self._connections) >= self.config.max_connections:
            log.warning("refused %s: %d connections open", peer, len(self._connections))
            return connection.respond(
                HTTPStatus.SERVICE_UNAVAILABLE,
                f"server: {self.config.max_connections} connections open (--max-connections)\n",
            )
        address = self._address(connection)
        if self._per_address[address] >= self.config.max_connections_per_address:
            log.warning("refused %s: %d connections open from %s", peer,
                        self._per_address[address], address)  # fmt: skip
            return connection.respond(
                HTTPStatus.SERVICE_UNAVAILABLE,
                f"server: {self.config.max_connections_per_address} connections open from "
                f"{address} (--max-connections-per-address)\n",
            )
        return None

    @staticmethod
    def _address(connection: ServerConnection) -> str:
        address = connection.remote_address
        return str(address[0]) if address else "?"

    # ---- connections ----------------------------------------------------------------------

    async def _handler(self, connection: ServerConnection) -> None:
        peer, address = self._peer(connection), self._address(connection)
        self._connections.add(connection)
        self._per_address[address] += 1
        log.info("connected %s (%d open)", peer, len(self._connections))
        idle = self.config.idle_timeout_s or None
        episode = self.recorder.start(peer) if self.recorder is not None else None
        try:
            await connection.send(pack(self.metadata))
            prev_total_ms = None
            while True:
                try:  # recv is cancellation-safe: a timeout loses no frame
                    frame = await asyncio.wait_for(connection.recv(), idle)
                except asyncio.TimeoutError:
                    reason = f"idle for {idle:g} s with no request (--idle-timeout)"
                    log.info("closing %s: %s", peer, reason)
                    self._release(connection, address)  # its slot is free while it closes
                    await connection.close(1000, reason)
                    break
                start = time.monotonic()
                self._in_flight += 1
                try:
                    reply, obs, actions = await self._answer(frame, peer, prev_total_ms, episode)
                    if episode is not None and actions is not None:
                        episode.add(obs, actions)
                    await connection.send(reply)
                finally:
                    self._in_flight -= 1
                prev_total_ms = (time.monotonic() - start) * 1000.0
        except ConnectionClosed as exc:
            code = exc.rcvd.code if exc.rcvd else exc.sent.code if exc.sent else None
            reason = exc.sent.reason if exc.sent and exc.sent.reason else ""
            log.info("closed %s (code %s%s)", peer, code, f": {reason}" if reason else "")
        finally:
            self._release(connection, address)
            if episode is not None and len(episode):  # closed without episode_end
                loop = asyncio.get_running_loop()
                await loop.run_in_executor(self._record_thread, episode.end, None)

    def _release(self, connection: ServerConnection, address: str) -> None:
        if connection in self._connections:
            self._connections.discard(connection)
            self._per_address[address] -= 1
            if self._per_address[address] <= 0:
                del self._per_address[address]

    async def _answer(
        self, frame: bytes | str, peer: str, prev_total_ms: float | None,
        episode: EpisodeBuffer | None = None,
    ) -> tuple[bytes | str, dict | None, np.ndarray | None]:  # fmt: skip
        """``(reply frame, decoded request, actions)``: packed actions and timings, or one line
        of text for a refusal (no actions), or the reply to an ``episode_end``."""
        if self._stopping:
            return "server: shutting down", None, None
        if isinstance(frame, str):
            return self._refuse(peer, "frame: expected a binary msgpack frame, got text")
        try:
            obs, request = await asyncio.to_thread(self._prepare, frame, episode)
        except (WireError, RequestError, RecordError) as exc:
            return self._refuse(peer, str(exc))
        except Exception:
            log.exception("request from %s failed validation unexpectedly", peer)
            return "server: the request could not be read (see the server log)", None, None
        if request is None:  # episode_end (recording servers only)
            frames = len(episode)
            executed = obs.get(EXECUTED)
            executed = None if executed is None else np.asarray(executed, np.float32)
            name = await asyncio.get_running_loop().run_in_executor(
                self._record_thread, episode.end, bool(obs.get(SUCCESS, False)), executed
            )
            return pack({"episode_end": True, "episode": name, "frames": frames}), obs, None
        job = _Job(request, asyncio.get_running_loop().create_future(), time.monotonic())
        self._pending.append(job)
        self._wakeup.set()
        try:
            actions, infer_ms, batch_size, started = await job.future
        except Exception:
            log.exception("inference failed for %s", peer)
            return "server: inference failed (see the server log)", None, None
        server_timing = {"infer_ms": infer_ms}
        if prev_total_ms is not None:
            server_timing["prev_total_ms"] = prev_total_ms
        policy_timing = {
            "infer_ms": infer_ms,
            "queue_ms": (started - job.queued) * 1000.0,
            "batch_size": batch_size,
        }
        reply = {"actions": actions, "server_timing": server_timing, "policy_timing": policy_timing}
        return pack(reply), obs, actions

    def _prepare(self, frame: bytes, episode: EpisodeBuffer | None) -> tuple[dict, Prepared | None]:
        obs = unpack(frame)
        if episode is not None:  # the recording keys; an episode_end carries no observation
            bad = find_bad(obs)
            if bad is not None:
                raise RequestError(bad[0] or "frame", bad[1].reason)
            episode.check(obs, self.policy.action_dim)
            if flag(obs, EPISODE_END):
                return obs, None
        return obs, self.policy.prepare(obs)

    @staticmethod
    def _refuse(peer: str, line: str) -> tuple[str, None, None]:
        log.warning("refused request from %s: %s", peer, line)
        return line, None, None

    # ---- batching -------------------------------------------------------------------------

    async def _batcher(self) -> None:
        """Forever: wait for a job, give others ``batch_wait_ms`` to join (up to ``max_batch``),
        run them as one forward on the model thread, resolve their futures."""
        loop = asyncio.get_running_loop()
        wait, limit = self.config.batch_wait_ms / 1000.0, self.config.max_batch
        while True:
            await self._wakeup.wait()
            deadline = loop.time() + wait
            while len(self._pending) < limit and (remaining := deadline - loop.time()) > 0:
                self._wakeup.clear()
                try:  # an Event (not a queue) is waited on: a timeout never loses a job
                    await asyncio.wait_for(self._wakeup.wait(), remaining)
                except asyncio.TimeoutError:
                    break
            jobs = [self._pending.popleft() for _ in range(min(limit, len(self._pending)))]
            if not self._pending:
                self._wakeup.clear()
            jobs = [j for j in jobs if not j.future.done()]
            if not jobs:
                continue
            started = time.monotonic()
            try:
                outputs = await loop.run_in_executor(
                    self._model_thread, self.policy.infer_batch, [j.request for j in jobs]
                )
            except Exception as exc:
                for job in jobs:
                    if not job.future.done():
                        job.future.set_exception(exc)
                continue
            infer_ms = (time.monotonic() - started) * 1000.0
            self.batches.append(len(jobs))
            for job, actions in zip(jobs, outputs):
                if not job.future.done():
                    job.future.set_result(
                        (np.asarray(actions, np.float32), infer_ms, len(jobs), started)
                    )

    # ---- lifecycle ------------------------------------------------------------------------

    async def run(self) -> None:
        """Serve until ``shutdown()``; returns after the in-flight requests were answered."""
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        self._pending: collections.deque[_Job] = collections.deque()
        self._wakeup = asyncio.Event()
        batcher = asyncio.create_task(self._batcher())
        try:
            server = await serve(
                self._handler,
                self.config.host,
                self.config.port,
                compression=None,
                max_size=self.config.max_frame_bytes,
                process_request=self._process_request,
                ping_interval=self.config.ping_interval_s or None,
                ping_timeout=self.config.ping_timeout_s or None,
                close_timeout=self.config.close_timeout_s,
            )
        except BaseException:  # e.g. the port is taken: release the threads and the recording
            batcher.cancel()
            self._model_thread.shutdown(wait=False)
            self._record_thread.shutdown(wait=True)
            if self.recorder is not None:
                self.recorder.close()
            raise
        self.port = next(iter(server.sockets)).getsockname()[1]
        log.info("listening on ws://%s:%d", self.config.host, self.port)
        self.ready.set()
        try:
            await self._stop.wait()
        finally:
            self._stopping = True
            server.close(close_connections=False)  # stop accepting; keep open connections
            deadline = time.monotonic() + self.config.shutdown_timeout_s
            while self._in_flight and time.monotonic() < deadline:
                await asyncio.sleep(0.01)
            log.info("shutting down (%d requests in flight left)", self._in_flight)
            # all at once: a peer that never answers the close costs its close_timeout once
            await asyncio.gather(*(connection.close(1001, "server shutting down")
                                   for connection in list(self._connections)))  # fmt: skip
            await server.wait_closed()
            batcher.cancel()
            self._model_thread.shutdown(wait=True)
            self._record_thread.shutdown(wait=True)  # episodes of closed connections written
            if self.recorder is not None:
                self.recorder.close()

    def shutdown(self) -> None:
        """Stop (thread-safe): finish the requests in flight, then close."""
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)


class BackgroundServer:
    """``PolicyServer`` on an event loop in a daemon thread (tests, benchmarks)::

    with BackgroundServer(policy, ServerConfig(port=0)) as server:
        WebsocketClientPolicy("127.0.0.1", server.port).infer(obs)
    """

    def __init__(self, policy, config: ServerConfig | None = None):
        self.server = PolicyServer(policy, config)
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self.server.run()), name="recap-serve", daemon=True
        )

    @property
    def port(self) -> int:
        return int(self.server.port)

    def __enter__(self) -> BackgroundServer:
        self._thread.start()
        if not self.server.ready.wait(30):
            raise RuntimeError("recap-serve did not start within 30 s")
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self._thread.join(30)

"""A robot loop's client of ``recap-serve``, over ``openpi-client`` (no recap model code)::

    from recap.serve.client import RobotClient

    robot = RobotClient("127.0.0.1", 8000)               # api_key=... when the server needs one
    obs = env.reset()
    while not done:
        if human_has_control:
            robot.intervene(obs, human_action)           # recorded as is_correction
            action = human_action
        else:
            action = robot.infer(obs)["actions"][0]
        obs, done, success = env.step(action)
    robot.end_episode(success)                           # the episode is written (--record)

``obs`` is what ``openpi_client.WebsocketClientPolicy.infer`` takes (camera images, state,
``prompt``). The recording keys (``recap.serve.record``) ride along with it: against a server
that does not record, ``intervene`` is a plain ``infer`` (the keys are ignored) and
``end_episode`` sends nothing and returns None.
"""

from __future__ import annotations

import numpy as np


class RobotClient:
    """``infer`` / ``intervene`` / ``end_episode`` on one connection (``policy``: an already
    open ``WebsocketClientPolicy``, else one is opened to ``host``:``port``)."""

    def __init__(self, host: str = "127.0.0.1", port: int | None = 8000,
                 api_key: str | None = None, policy=None):  # fmt: skip
        if policy is None:
            from openpi_client.websocket_client_policy import WebsocketClientPolicy

            policy = WebsocketClientPolicy(host, port, api_key=api_key)
        self.policy = policy
        self.metadata = policy.get_server_metadata()
        self.recording = bool(self.metadata.get("recording"))

    def infer(self, obs: dict, executed_action=None) -> dict:
        """The server's reply (``actions`` float32[H, A], timings). ``executed_action``: what
        the robot actually executed after the previous request, when that was not the first
        action of its chunk (recorded in its place)."""
        if executed_action is not None:
            obs = {**obs, "executed_action": np.asarray(executed_action, np.float32)}
        return self.policy.infer(obs)

    def intervene(self, obs: dict, human_action) -> dict:
        """A step a human controlled: ``human_action`` (float[A], what was executed) is recorded
        as this frame's action with ``is_correction`` true; the policy's reply comes back as
        for ``infer``."""
        action = np.asarray(human_action, np.float32)
        return self.policy.infer({**obs, "intervention": True, "action": action})

    def end_episode(self, success: bool, executed_action=None) -> dict | None:
        """End the episode with its outcome: ``{"episode_end": True, "episode": its dataset
        name or None (dropped or empty), "frames": N}``; None against a server that does not
        record."""
        if not self.recording:
            return None
        message: dict = {"episode_end": True, "success": bool(success)}
        if executed_action is not None:
            message["executed_action"] = np.asarray(executed_action, np.float32)
        return self.policy.infer(message)

    def close(self) -> None:
        self.policy._ws.close()

    def __enter__(self) -> RobotClient:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

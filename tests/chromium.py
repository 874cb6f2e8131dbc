"""Headless Chromium for the browser tests, over the DevTools protocol (no extra Python package:
``websockets`` is already a recap dependency).

``browser()`` yields a ``Page``: ``goto(url)``, ``text()``, ``evaluate(js)``,
``wait_for(js, timeout)`` and ``screenshot(path)``. The binary is Debian's ``chromium``
(``.ci/run`` installs it when missing); ``CHROMIUM_MISSING`` is the one skip reason.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import http.server
import itertools
import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from websockets.sync.client import connect

CHROMIUM_MISSING = "chromium is not installed (Debian package `chromium`; .ci/run installs it)"


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


class Page:
    """One browser tab driven through a flattened DevTools session."""

    def __init__(self, ws, session_id: str) -> None:
        self._ws = ws
        self._session = session_id
        self._ids = itertools.count(1000)
        self.exceptions: list[str] = []  # uncaught page exceptions (Runtime.exceptionThrown)

    def send(self, method: str, params: dict | None = None, timeout: float = 60.0) -> dict:
        mid = next(self._ids)
        msg = {"id": mid, "method": method, "params": params or {}, "sessionId": self._session}
        self._ws.send(json.dumps(msg))
        deadline = time.monotonic() + timeout
        while True:
            reply = json.loads(self._ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if reply.get("method") == "Runtime.exceptionThrown":
                details = reply["params"]["exceptionDetails"]
                thrown = details.get("exception", {})
                self.exceptions.append(thrown.get("description", str(details)))
            if reply.get("id") == mid:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def evaluate(self, expression: str):
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True})
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, expression: str, timeout: float = 30.0):
        """Poll ``expression`` until truthy; its value, or TimeoutError naming it."""
        deadline = time.monotonic() + timeout
        while True:
            value = self.evaluate(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"not true after {timeout} s: {expression}")
            time.sleep(0.2)

    def goto(self, url: str, timeout: float = 30.0) -> None:
        self.send("Page.navigate", {"url": url})
        prefix = json.dumps(url[:40])
        self.wait_for(
            f"document.readyState === 'complete' && location.href.startsWith({prefix})", timeout
        )

    def text(self) -> str:
        return self.evaluate("document.body ? document.body.innerText : ''") or ""

    def screenshot(self, path: Path) -> None:
        data = self.send("Page.captureScreenshot", {"format": "png"})["data"]
        Path(path).write_bytes(base64.b64decode(data))


@contextlib.contextmanager
def browser(width: int = 1400, height: int = 900) -> Iterator[Page]:
    exe = chromium_path()
    if exe is None:
        raise RuntimeError(CHROMIUM_MISSING)
    # ignore_cleanup_errors: a renderer may still be writing its profile as the browser exits
    profiles = tempfile.TemporaryDirectory(prefix="recap-chromium-", ignore_cleanup_errors=True)
    with profiles as profile:
        args = [
            exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--no-first-run", "--no-default-browser-check", "--disable-extensions",
            f"--user-data-dir={profile}", "--remote-debugging-port=0",
            f"--window-size={width},{height}", "about:blank",
        ]  # fmt: skip
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        try:
            ws_url = _devtools_url(proc)
            with connect(ws_url, max_size=None, open_timeout=30) as ws:
                ws.send(json.dumps({"id": 1, "method": "Target.createTarget",
                                    "params": {"url": "about:blank"}}))  # fmt: skip
                target = _reply(ws, 1)["targetId"]
                ws.send(json.dumps({"id": 2, "method": "Target.attachToTarget",
                                    "params": {"targetId": target, "flatten": True}}))  # fmt: skip
                page = Page(ws, _reply(ws, 2)["sessionId"])
                page.send("Page.enable")
                page.send("Runtime.enable")
                page.send(
                    "Emulation.setDeviceMetricsOverride",
                    {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
                )
                yield page
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _devtools_url(proc: subprocess.Popen) -> str:
    lines = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        if not line:
            if proc.poll() is not None:
                break
            continue
        lines.append(line.strip())
        match = re.search(r"DevTools listening on (ws://\S+)", line)
        if match:
            threading.Thread(target=proc.stderr.read, daemon=True).start()  # drain the pipe
            return match.group(1)
    raise RuntimeError("chromium did not start: " + " | ".join(lines[-5:]))


def _reply(ws, mid: int) -> dict:
    while True:
        reply = json.loads(ws.recv(timeout=30))
        if reply.get("id") == mid:
            if "error" in reply:
                raise RuntimeError(str(reply["error"]))
            return reply["result"]


@contextlib.contextmanager
def serve_directory(root: Path) -> Iterator[str]:
    """A static HTTP server of ``root`` on a free loopback port; yields its base URL."""
    handler = functools.partial(_QuietHandler, directory=os.fspath(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        pass

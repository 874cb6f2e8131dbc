"""Free TCP ports on this host, for launchers (``deepspeed --master_port``) and process groups
(``MASTER_PORT``). Imports nothing but the standard library: the pipeline, the sweeps and
recap-iterate pick ports without loading torch or selecting an accelerator."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port free on this host now (for MASTER_PORT / ``deepspeed --master_port``)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])

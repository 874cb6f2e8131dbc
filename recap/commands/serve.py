"""Serve an exported π0.5 policy to robots over openpi's websocket protocol, with guidance.

    recap-serve --policy runs/libero_policy --tokenizer /models/paligemma_tokenizer.model
    recap-serve --policy runs/demo_policy --gin_file demo/policy.gin --beta 2
    RECAP_SERVE_API_KEY=... recap-serve --policy DIR --host 0.0.0.0     # any non-loopback address
    recap-serve --policy DIR --record runs/robot_episodes   # each episode a LeRobot v3.0 dataset

Robot code connects with ``openpi_client.websocket_client_policy.WebsocketClientPolicy(host,
port, api_key=KEY)`` and calls ``infer(obs)``. Binds 127.0.0.1 by default; any other address
needs an API key (``RECAP_SERVE_API_KEY``, or ``--api-key``, which ``ps`` shows) unless
``--insecure``. SIGTERM / Ctrl-C: the requests in flight are answered, then the server exits 0.
The flags, their checks and the launch are ``recap.serve.launch`` (``recap-iterate --serve`` too).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from recap.errors import RecapError, one_line
from recap.serve.launch import (  # noqa: F401  (API_KEY_ENV, build_parser: the command's own)
    API_KEY_ENV,
    build_parser,
    parse_options,
    serve,
)


def main(argv: Sequence[str] | None = None) -> int:
    options = parse_options(sys.argv[1:] if argv is None else argv)
    try:
        return serve(options)
    except RecapError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())

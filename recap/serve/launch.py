"""Launching ``recap-serve``: its flags, their checks, and the server run until SIGTERM / Ctrl-C.

``ServeOptions``: every setting of a served policy, typed, with the command's defaults;
``parse_options(argv)``: ``recap-serve``'s flags to it (``build_parser``); ``serve(options)``: the
checks (``check_options``: API key, limits; then ``recap.serve.load.preflight`` before torch is
imported), the policy loaded, the server run, 0 once it stopped; a bad setting or a port that
cannot be bound is a ``RecapError`` (one line). ``recap.commands.serve`` (the console entry point)
and ``recap-iterate --serve`` both launch through here.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import ipaddress
import logging
import os
import signal
from collections.abc import Sequence

from recap.errors import RecapError

API_KEY_ENV = "RECAP_SERVE_API_KEY"
DESCRIPTION = (
    "Serve an exported π0.5 policy to robots over openpi's websocket protocol, with guidance."
)


@dataclasses.dataclass(frozen=True)
class ServeOptions:
    """``recap-serve``'s settings (field = flag with ``_`` for ``-``; ``build_parser`` says what
    each is)."""

    policy: str
    beta: float = 1.5
    host: str = "127.0.0.1"
    port: int = 8000
    api_key: str | None = None
    insecure: bool = False
    tokenizer: str | None = None
    gin_file: tuple[str, ...] = ()
    gin_param: tuple[str, ...] = ()
    asset_id: str | None = None
    prompt_style: str | None = None
    state_in_prompt: bool | None = None
    label_position: str | None = None
    conditioning: str | None = None
    guidance: str = "positive"
    num_steps: int | None = None
    dtype: str = "float32"
    seed: int = 0
    image_keys: str = "observation/image,observation/wrist_image"
    state_key: str = "observation/state"
    prompt_key: str = "prompt"
    max_frame_mib: float = 32.0
    max_connections: int = 16
    max_connections_per_address: int = 8
    idle_timeout: float = 300.0
    ping_interval: float = 20.0
    ping_timeout: float = 20.0
    strict_shapes: bool = False
    record: str | None = None
    record_max_gib: float = 10.0
    record_max_frames: int = 5000
    record_fps: int = 10
    max_prompt_chars: int = 512
    max_tokens: int = 200
    max_batch: int = 8
    batch_wait_ms: float = 5.0
    log_level: str = "INFO"


def build_parser() -> argparse.ArgumentParser:
    """The command's flags; ``--help`` says what each is, its default and its choices."""
    from recap.cli import HelpFormatter

    parser = argparse.ArgumentParser(
        prog="recap-serve", description=DESCRIPTION, allow_abbrev=False,
        formatter_class=HelpFormatter,
    )  # fmt: skip
    add = parser.add_argument
    add("--policy", required=True, help="exported policy directory (recap run, openpi, LeRobot)")
    add("--beta", type=float, default=1.5, help="guidance strength (per request: obs['beta'])")
    add("--host", default="127.0.0.1", help="address to bind (default loopback only)")
    add("--port", type=int, default=8000, help="TCP port to listen on")
    add("--api-key", default=None, help=f"required client key (prefer the {API_KEY_ENV} env var)")
    add("--insecure", action="store_true", help="allow a non-loopback bind without an API key")
    add("--tokenizer", default=None, help="tokenizer file/dir (default: the run's or DIR's own)")
    add("--gin_file", action="append", default=[], help="the run's gin files (recap run dirs)")
    add("--gin_param", action="append", default=[], help="gin binding (repeatable)")
    add("--asset-id", default=None, help="assets/<asset_id>/norm_stats.json to use")
    add("--prompt-style", choices=("openpi", "lerobot"), default=None,
        help="prompt text style (default: the policy's processor)")  # fmt: skip
    add("--state-in-prompt", action=argparse.BooleanOptionalAction, default=None,
        help="binned state in the prompt (default: the policy's processor)")  # fmt: skip
    add("--label-position", choices=("task", "action"), default=None,
        help="where the advantage text goes (default: the policy's processor)")  # fmt: skip
    add("--conditioning", choices=("paper", "positive_only_conditional", "none"), default=None,
        help="how the policy was trained on labels (default: the policy's processor)")  # fmt: skip
    add("--guidance", choices=("positive", "negative", "no_guide"), default="positive",
        help="the prompt whose velocity is contrasted with the plain one")  # fmt: skip
    add("--num-steps", type=int, default=None, help="flow-matching steps (default: the model's)")
    add("--dtype", choices=("float32", "bfloat16", "float16"), default="float32",
        help="weights' precision on the device")  # fmt: skip
    add("--seed", type=int, default=0, help="seed of the noise of requests without noise_seed")
    add("--image-keys", default="observation/image,observation/wrist_image",
        help="camera keys in slot order (base first), comma-separated")  # fmt: skip
    add("--state-key", default="observation/state", help="request key of the robot state")
    add("--prompt-key", default="prompt", help="request key of the task text")
    add("--max-frame-mib", type=float, default=32.0, help="largest request frame (MiB)")
    add("--max-connections", type=int, default=16, help="open connections in all (default 16)")
    add("--max-connections-per-address", type=int, default=8,
        help="open connections from one client address (default 8)")  # fmt: skip
    add(
        "--idle-timeout",
        type=float,
        default=300.0,
        help="seconds without a request before a connection is closed (default 300; 0: never)",
    )
    add("--ping-interval", type=float, default=20.0,
        help="keep-alive ping every N seconds (default 20; 0: no pings)")  # fmt: skip
    add("--ping-timeout", type=float, default=20.0,
        help="close a connection whose pong is N seconds late (default 20)")  # fmt: skip
    add(
        "--strict-shapes",
        action="store_true",
        help="refuse images that are not image_size x image_size (default: resized with padding)",
    )
    add("--record", default=None, metavar="DIR",
        help="write each connection's episode as a LeRobot v3.0 dataset DIR/episode_NNNNNN "
        "(appends on restart; see recap.serve.record)")  # fmt: skip
    add(
        "--record-max-gib",
        type=float,
        default=10.0,
        help="recording cap: episodes that would take DIR past it are dropped (default 10)",
    )
    add("--record-max-frames", type=int, default=5000,
        help="longest recorded episode; a longer one is dropped (default 5000)")  # fmt: skip
    add("--record-fps", type=int, default=10, help="fps written to the recorded datasets")
    add("--max-prompt-chars", type=int, default=512, help="longest task text in characters")
    add("--max-tokens", type=int, default=200, help="longest built prompt in tokens")
    add("--max-batch", type=int, default=8, help="requests per forward (1: no batching)")
    add("--batch-wait-ms", type=float, default=5.0, help="how long a batch waits to fill")
    add("--log-level", default="INFO", help="Python logging level")
    return parser


def parse_options(argv: Sequence[str]) -> ServeOptions:
    """``recap-serve``'s flags (``argv``) as ``ServeOptions``; argparse's usage error exits 2."""
    args = vars(build_parser().parse_args(list(argv)))
    return ServeOptions(**args | {"gin_file": tuple(args["gin_file"]),
                                  "gin_param": tuple(args["gin_param"])})  # fmt: skip


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to any interface


def check_options(args: ServeOptions) -> str | None:
    """The API key to require (None: none); ``RecapError`` for an unsafe or bad setting."""
    key = args.api_key if args.api_key is not None else os.environ.get(API_KEY_ENV)
    if key is not None and not key.strip():
        raise RecapError(f"--api-key / {API_KEY_ENV}: empty; set a key or leave both unset")
    if not is_loopback(args.host) and key is None and not args.insecure:
        raise RecapError(
            f"--host {args.host} is not a loopback address: set an API key ({API_KEY_ENV} or "
            "--api-key) or pass --insecure to serve without one"
        )
    limits = {
        "--port": (args.port, 0),
        "--max-connections": (args.max_connections, 1),
        "--max-connections-per-address": (args.max_connections_per_address, 1),
        "--idle-timeout": (args.idle_timeout, 0),
        "--ping-interval": (args.ping_interval, 0),
        "--ping-timeout": (args.ping_timeout, 0),
        "--max-prompt-chars": (args.max_prompt_chars, 1),
        "--max-tokens": (args.max_tokens, 2),
        "--max-batch": (args.max_batch, 1),
        "--record-max-frames": (args.record_max_frames, 1),
        "--record-fps": (args.record_fps, 1),
    }
    for flag, (value, low) in limits.items():
        if value < low:
            raise RecapError(f"{flag}: {value:g} must be >= {low}")
    if not 0 < args.max_frame_mib <= 1024:
        raise RecapError(f"--max-frame-mib: {args.max_frame_mib:g} must be in (0, 1024]")
    if not args.record_max_gib > 0:
        raise RecapError(f"--record-max-gib: {args.record_max_gib:g} must be > 0")
    if args.record is not None and os.path.exists(args.record) and not os.path.isdir(args.record):
        raise RecapError(f"--record: {args.record} is not a directory; pass a directory")
    if args.batch_wait_ms < 0:
        raise RecapError(f"--batch-wait-ms: {args.batch_wait_ms:g} must be >= 0")
    return key


async def _serve(server) -> None:
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, server.shutdown)
    await server.run()


def serve(args: ServeOptions) -> int:
    """Serve ``args.policy`` until SIGTERM / Ctrl-C (the requests in flight answered), then 0.
    Every setting is checked before the model loads; a bad one, or a host and port that cannot
    be bound, is a one-line ``RecapError``."""
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("websockets").setLevel(logging.WARNING)
    try:
        key = check_options(args)
        from recap.serve.load import describe, load_served, preflight

        # the directory, processor, statistics and tokenizer paths before torch is imported
        preflight(args.policy, tokenizer=args.tokenizer, dtype=args.dtype, asset_id=args.asset_id,
                  gin=bool(args.gin_file or args.gin_param))  # fmt: skip
        if args.record is not None:  # another server's recording, before the model loads
            from recap.serve.record import check_free

            check_free(args.record)
        from recap.serve.policy import ServeSpec
        from recap.serve.server import MIB, PolicyServer, ServerConfig

        spec = ServeSpec(
            image_keys=tuple(k.strip() for k in args.image_keys.split(",") if k.strip()),
            state_key=args.state_key,
            prompt_key=args.prompt_key,
            max_prompt_chars=args.max_prompt_chars,
            max_tokens=args.max_tokens,
            strict_shapes=args.strict_shapes,
        )
        policy = load_served(
            args.policy, tokenizer=args.tokenizer, gin_files=args.gin_file,
            gin_params=args.gin_param, asset_id=args.asset_id,
            prompt_style=args.prompt_style, state_in_prompt=args.state_in_prompt,
            label_position=args.label_position,
            conditioning=args.conditioning, dtype=args.dtype, beta=args.beta,
            guidance=args.guidance, num_steps=args.num_steps, spec=spec, seed=args.seed,
        )  # fmt: skip
        record = None
        if args.record is not None:
            from pathlib import Path

            from recap.serve.record import GIB, RecordConfig

            record = RecordConfig(
                Path(args.record), max_bytes=int(args.record_max_gib * GIB),
                max_frames=args.record_max_frames, fps=args.record_fps,
            )  # fmt: skip
        config = ServerConfig(
            host=args.host, port=args.port, api_key=key,
            max_frame_bytes=int(args.max_frame_mib * MIB), max_connections=args.max_connections,
            max_connections_per_address=args.max_connections_per_address,
            idle_timeout_s=args.idle_timeout, ping_interval_s=args.ping_interval,
            ping_timeout_s=args.ping_timeout, max_batch=args.max_batch,
            batch_wait_ms=args.batch_wait_ms, record=record,
        )  # fmt: skip
        logging.getLogger("recap.serve").info("%s", describe(policy))
        if key is None and not is_loopback(args.host):
            logging.getLogger("recap.serve").warning(
                "--insecure: anyone who reaches %s:%d can move the robot", args.host, args.port
            )
        server = PolicyServer(policy, config)
        asyncio.run(_serve(server))
    except OSError as exc:  # e.g. the port is taken
        raise RecapError(f"--host {args.host} --port {args.port}: {exc.strerror or exc}") from None
    logging.getLogger("recap.serve").info("stopped")
    return 0

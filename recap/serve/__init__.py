"""Serving a policy to robots over openpi's websocket protocol (``recap-serve``).

``wire``: openpi's msgpack-numpy format, decoded defensively; ``policy``: observation checks,
prompts, guided sampling and unnormalization; ``load``: an exported policy directory to a
``ServedPolicy``; ``server``: the websocket server (batching, limits, API key, shutdown).
"""

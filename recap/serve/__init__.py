"""Serving a policy to robots over openpi's websocket protocol (``recap-serve``).

``wire``: openpi's msgpack-numpy format, decoded defensively; ``policy``: observation checks,
prompts, guided sampling and unnormalization; ``load``: an exported policy directory to a
``ServedPolicy`` (checked before its weights are read); ``server``: the websocket server
(batching, limits, idle timeout, API key, shutdown); ``record``: ``--record DIR``, each
connection's episode as a LeRobot v3.0 dataset with its interventions; ``client``: the robot
loop's helper over openpi-client (``infer``, ``intervene``, ``end_episode``); ``launch``:
``recap-serve``'s flags as ``ServeOptions`` and ``serve(options)`` (the command and
``recap-iterate --serve`` both launch through it).
"""

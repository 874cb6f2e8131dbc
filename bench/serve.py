"""recap-serve under load on loopback: 8 openpi clients x 50 requests, with and without batching.

One tiny π0.5 (the demo's widths: 64 px images, 2 cameras, horizon 5, 5 Euler steps, beta 1.5 so
both guidance branches run) is exported the way ``recap-serve --policy`` reads it and served by
the real server twice in one run: ``max_batch=1`` (every request its own forward, the baseline)
and ``max_batch=8`` (requests that arrive within 5 ms share a forward). Each of the 8 clients
(``openpi_client.WebsocketClientPolicy``, one thread each) sends 50 requests back to back, each
with its own observation and ``noise_seed``, so every reply can be checked against the policy
called in-process on the same observation (atol 1e-5; batched rows are padded, which moves
float32 results by rounding only). One torch intra-op thread (see ``main``). Reported:
per-request latency p50 / p99 as the client sees it, actions/s (replies x horizon / wall time),
dropped and wrong replies, and the batched / unbatched throughput ratio.

Recording overhead: the batched run again with ``--record`` (``ServerConfig.record``), each
client ending an episode every ``--episode-length`` requests (``RobotClient.end_episode``: the
server writes it as a LeRobot v3.0 dataset, mp4 cameras, while serving); the latency of the
``infer`` requests with / without recording is the overhead (the ``end_episode`` round trips,
which wait for the write, are reported apart as the write time per episode).
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import torch

TARGET = (
    "8 clients x 50 requests on loopback, none dropped or wrong; batching >= 1.5x "
    "actions/s; --record adds <= 25% to the p50 latency"
)
VISION = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 2, "image_size": 64, "patch_size": 8}  # fmt: skip
TEXT = {"vocab_size": 32, "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
        "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
        "max_position_embeddings": 256}  # fmt: skip
EXPERT = {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
          "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32}  # fmt: skip
TASK = "put the cube in the bowl"


def export_policy(directory: Path) -> Path:
    from recap.data.conditioning import QuantileStats
    from recap.data.transforms import write_word_tokenizer
    from recap.models.checkpoints import write_norm_stats
    from recap.models.pi05 import Pi05Config, build_pi05

    torch.manual_seed(0)
    config = Pi05Config(vision=VISION, text=TEXT, expert=EXPERT, action_dim=32, action_horizon=5,
                        num_steps=5)  # fmt: skip
    build_pi05(config).save_pretrained(directory)
    stats = {"state": QuantileStats(-np.ones(8), np.ones(8)),
             "action": QuantileStats(-np.ones(7), np.ones(7))}  # fmt: skip
    write_norm_stats(directory, "libero", stats)
    write_word_tokenizer(directory, [f"Task: {TASK}, State: ;\nAction: Advantage: positive"])
    return directory


def observation(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {
        "observation/image": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8),
        "observation/wrist_image": rng.integers(0, 256, (64, 64, 3), dtype=np.uint8),
        "observation/state": rng.uniform(-1, 1, 8).astype(np.float32),
        "prompt": TASK,
        "noise_seed": seed,
    }


def load(served, expected: dict, clients: int, requests: int, max_batch: int,
         record: Path | None = None, episode_length: int = 10) -> dict:  # fmt: skip
    from recap.serve.client import RobotClient
    from recap.serve.record import RecordConfig, recorded_episodes
    from recap.serve.server import BackgroundServer, ServerConfig

    latencies, wrong, errors, writes = [], [], [], []
    config = ServerConfig(port=0, max_batch=max_batch, batch_wait_ms=5.0, max_connections=64,
                          max_connections_per_address=64,
                          record=RecordConfig(record) if record is not None else None)  # fmt: skip
    with BackgroundServer(served, config) as server:
        policies = [RobotClient("127.0.0.1", server.port) for _ in range(clients)]
        barrier = threading.Barrier(clients + 1)

        def run(c: int) -> None:
            barrier.wait()
            for i in range(requests):
                seed = c * requests + i
                start = time.perf_counter()
                try:
                    actions = policies[c].infer(observation(seed))["actions"]
                except Exception as exc:  # counted as dropped
                    errors.append(f"{type(exc).__name__}: {exc}")
                    continue
                latencies.append(time.perf_counter() - start)
                if not np.allclose(actions, expected[seed], rtol=0, atol=1e-5):
                    wrong.append(seed)
                if record is not None and (i + 1) % episode_length == 0:
                    start = time.perf_counter()
                    if policies[c].end_episode(True)["episode"] is None:
                        errors.append(f"client {c}: episode not recorded")
                    writes.append(time.perf_counter() - start)

        threads = [threading.Thread(target=run, args=(c,)) for c in range(clients)]
        for t in threads:
            t.start()
        barrier.wait()
        start = time.perf_counter()
        for t in threads:
            t.join()
        wall = time.perf_counter() - start
        batches = list(server.server.batches)
        for policy in policies:
            policy.close()
    recorded = len(recorded_episodes(record)) if record is not None else 0
    ms = np.array(latencies) * 1e3
    return {
        "replies": len(latencies), "dropped": clients * requests - len(latencies),
        "wrong": len(wrong), "errors": errors[:3], "wall": wall,
        "p50": float(np.percentile(ms, 50)) if len(ms) else float("nan"),
        "p99": float(np.percentile(ms, 99)) if len(ms) else float("nan"),
        "actions_s": len(latencies) * served.horizon / wall,
        "mean_batch": float(np.mean(batches)) if batches else 0.0, "recorded": recorded,
        "write_ms": float(np.mean(writes) * 1e3) if writes else 0.0,
    }  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=50)
    parser.add_argument("--episode-length", type=int, default=10)
    args = parser.parse_args()
    from recap.serve.load import load_served

    # one intra-op thread: with two on 2 shared cores, every small matmul waited for the other
    # thread (0.4-0.9 s per single request in-process instead of ~0.05 s)
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        served = load_served(export_policy(Path(tmp)), beta=1.5, device="cpu")
        total = args.clients * args.requests
        start = time.perf_counter()
        expected = {s: served.infer(observation(s))["actions"] for s in range(total)}
        print(f"reference: {total} in-process calls in {time.perf_counter() - start:.1f} s")
        results = {}
        runs = (("unbatched", 1, None), ("batched", 8, None),
                ("recorded", 8, Path(tmp) / "recorded"))  # fmt: skip
        for name, max_batch, record in runs:
            r = load(served, expected, args.clients, args.requests, max_batch, record,
                     args.episode_length)  # fmt: skip
            results[name] = r
            print(f"{name:>9} (max_batch {max_batch}): {r['replies']}/{total} replies, "
                  f"{r['dropped']} dropped, {r['wrong']} wrong, p50 {r['p50']:.1f} ms, "
                  f"p99 {r['p99']:.1f} ms, {r['actions_s']:.0f} actions/s, mean batch "
                  f"{r['mean_batch']:.2f}, {r['wall']:.1f} s {r['errors'] or ''}")  # fmt: skip
        rec = results["recorded"]
        episodes = args.clients * (args.requests // args.episode_length)
        print(f"recorded {rec['recorded']}/{episodes} episodes, {rec['write_ms']:.0f} ms per "
              "end_episode (the write)")  # fmt: skip
    u, b = results["unbatched"], results["batched"]
    ratio = b["actions_s"] / u["actions_s"]
    overhead = rec["p50"] / b["p50"]
    clean = all(r["dropped"] == 0 and r["wrong"] == 0 for r in results.values())
    ok = clean and ratio >= 1.5 and overhead <= 1.25 and rec["recorded"] == episodes
    met = "yes" if ok else "no"
    print(
        f"RESULT: clients={args.clients} requests={total} "
        f"dropped={u['dropped'] + b['dropped']} wrong={u['wrong'] + b['wrong']} "
        f"p50_ms_unbatched={u['p50']:.1f} p99_ms_unbatched={u['p99']:.1f} "
        f"actions_s_unbatched={u['actions_s']:.0f} p50_ms_batched={b['p50']:.1f} "
        f"p99_ms_batched={b['p99']:.1f} actions_s_batched={b['actions_s']:.0f} "
        f"mean_batch={b['mean_batch']:.2f} batching_ratio={ratio:.2f} "
        f"p50_ms_recorded={rec['p50']:.1f} p99_ms_recorded={rec['p99']:.1f} "
        f"record_overhead_p50={overhead:.2f} episodes_recorded={rec['recorded']} "
        f"write_ms_per_episode={rec['write_ms']:.0f} "
        f'target="{TARGET}" met={met}'
    )


if __name__ == "__main__":
    main()

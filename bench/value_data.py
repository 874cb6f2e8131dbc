"""Value-model data loading vs training consumption on the demo config, in one run.

Loader: samples/s of ``ValueDataConfig.build()`` batches (demo sizes: micro batch 16) fetched
the way the engine fetches them (``__getitems__`` per micro-batch), in the main process and with
2 workers.
Training: samples/s of forward + backward + AdamW steps of the demo value model on batches
fetched beforehand (so loading is not in its time). The loader keeps up when its rate is above
the training rate. Needs the demo data: ``python scripts/make_demo_data.py --out demo_data &&
python scripts/compute_returns.py --gin_file demo/returns.gin``.
"""

from __future__ import annotations

import argparse
import time

import torch

import recap.steps.train  # noqa: F401  (registers the gin configurables)
from recap.cli import parse_gin
from recap.configurable import configured
from recap.data.datasets import ValueDataConfig
from recap.engine.loader import batch_loader
from recap.models.value import value_model

TARGET = "the loader is not the bottleneck (loader samples/s > training samples/s)"


def loader_rate(dataset, batch: int, workers: int, batches: int) -> float:
    order = torch.randperm(len(dataset), generator=torch.Generator().manual_seed(0)).tolist()
    chunks = [order[i * batch : (i + 1) * batch] for i in range(batches)]
    it = iter(batch_loader(dataset, chunks, workers))  # training's loader
    next(it)  # worker start-up is not throughput
    t0 = time.perf_counter()
    n = sum(b["target"].shape[0] for b in it)
    return n / (time.perf_counter() - t0)


def training_rate(dataset, batch: int, steps: int) -> float:
    torch.manual_seed(0)
    model = configured(value_model)().train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    batches = [dataset.__getitems__(list(range(i * batch, (i + 1) * batch))) for i in range(4)]
    for b in batches[:1]:  # warm-up
        model(b)[0].mean().backward()
    t0 = time.perf_counter()
    for step in range(steps):
        loss, _ = model(batches[step % len(batches)])
        loss.mean().backward()
        opt.step()
        opt.zero_grad()
    return steps * batch / (time.perf_counter() - t0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gin_file", default="demo/value.gin")
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--batches", type=int, default=60)
    args = parser.parse_args()
    parse_gin([args.gin_file], [])
    dataset = configured(ValueDataConfig)().build()
    main_process = loader_rate(dataset, args.batch, 0, args.batches)
    workers = loader_rate(dataset, args.batch, 2, args.batches)
    training = training_rate(dataset, args.batch, 30)
    print(f"loader, main process: {main_process:.0f} samples/s")
    print(f"loader, 2 workers:    {workers:.0f} samples/s")
    print(f"training consumes:    {training:.0f} samples/s (1 process, forward+backward+AdamW)")
    print(
        f"RESULT: loader_main_samples_s={main_process:.0f} loader_2workers_samples_s={workers:.0f} "
        f"training_samples_s={training:.0f} headroom_2workers={workers / training:.2f} "
        f"headroom_main_process={main_process / training:.2f} "
        f'target="{TARGET}" met={"yes" if workers > training else "no"}'
    )


if __name__ == "__main__":
    main()

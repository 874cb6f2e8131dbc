"""The one loader (issue #17): training, inference and the frame-loader benchmark build only their
batch order and call ``recap.engine.loader.batch_loader``; in-order passes hand each DataLoader
worker its own contiguous block of batches."""

from __future__ import annotations

import re

import pytest
import torch

from recap.engine import distributed, inference, loader
from recap.engine.loader import ShardedSequentialBatches, batch_loader, worker_order
from recap.models.toy import ToyRegressionData
from tests.helpers import REPO


class WhoFetches(torch.utils.data.Dataset):
    """Items that name the DataLoader worker that fetched them (-1: the main process)."""

    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        info = torch.utils.data.get_worker_info()
        return {
            "index": torch.tensor(index),
            "worker": torch.tensor(-1 if info is None else info.id),
        }


def test_the_interleave_gives_each_worker_its_contiguous_block():
    # 7 batches over 3 workers: blocks 0-1, 2-3, 4-6; the DataLoader hands turn i to worker i % 3
    order = worker_order(7, 3)
    assert order == [0, 2, 4, 1, 3, 5, None, None, 6]
    assert [order[w::3] for w in range(3)] == [[0, 1, None], [2, 3, None], [4, 5, 6]]
    assert worker_order(4, 0) == [0, 1, 2, 3]  # main process: plain order
    # the frame loader's in-order pass is the same interleave over blocks of items
    assert list(ShardedSequentialBatches(7, 1, 3)) == [[0], [2], [4], [1], [3], [5], [], [], [6]]
    assert list(ShardedSequentialBatches(7, 2, 3)) == [[0, 1], [2, 3], [4, 5], [], [], [6]]


@pytest.mark.filterwarnings("ignore:This DataLoader will create")  # 3 workers on a 2-core host
def test_inference_workers_walk_their_blocks_and_outputs_come_back_in_dataset_order():
    def fn(model, batch):
        return {"index": batch["index"], "worker": batch["worker"]}

    out = inference.predict(torch.nn.Identity(), WhoFetches(7), 1, fn, num_workers=3)
    assert out["index"].tolist() == list(range(7))
    assert out["worker"].tolist() == [0, 0, 1, 1, 2, 2, 2]
    rng = torch.get_rng_state()
    out = inference.predict(torch.nn.Identity(), WhoFetches(7), 3, fn, num_workers=0)
    assert out["index"].tolist() == list(range(7)) and set(out["worker"].tolist()) == {-1}
    assert torch.equal(torch.get_rng_state(), rng)  # the main-process pass draws no global seed


def test_training_batches_are_the_step_sampler_batches():
    config = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 2}
    data = ToyRegressionData(10, seed=1)
    got = [b["index"].tolist() for b in distributed.train_batches(data, config, 7, 1, 4)]
    assert got == list(distributed.StepBatchSampler(10, 4, 2, 7, 1, 4))


def test_training_inference_and_the_benchmark_use_the_one_loader(monkeypatch):
    built = []

    class Recording(torch.utils.data.DataLoader):
        def __init__(self, *args, **kwargs):
            built.append(kwargs)
            super().__init__(*args, **kwargs)

    monkeypatch.setattr(loader, "DataLoader", Recording)
    data = ToyRegressionData(8, seed=0)
    config = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 4}
    next(distributed.train_batches(data, config, 0, 0, 1))
    assert built[-1]["generator"].initial_seed() == 0 and len(built) == 1
    inference.predict(torch.nn.Identity(), data, 4, lambda m, b: {"index": b["index"]})
    assert len(built) == 2
    next(iter(loader.make_loader(data, 4, num_workers=0)))
    assert len(built) == 3
    assert all(kw["collate_fn"] is loader._as_is for kw in built)  # whole batches per call

    # and nothing else builds one: the only DataLoader construction in recap/ is batch_loader's
    calls = {
        str(path.relative_to(REPO)): len(re.findall(r"\bDataLoader\(", path.read_text()))
        for path in sorted((REPO / "recap").rglob("*.py"))
    }
    assert {p: n for p, n in calls.items() if n} == {"recap/engine/loader.py": 1}
    for bench in ("bench/frame_loader.py", "bench/value_data.py"):
        text = (REPO / bench).read_text()
        assert "from recap.engine.loader import" in text and "DataLoader(" not in text
    assert batch_loader.__module__ == "recap.engine.loader"

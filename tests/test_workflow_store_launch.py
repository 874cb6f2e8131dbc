"""``recap.workflow.store`` (markers of finished stages) and ``recap.workflow.launch`` (the argv
of a step module, shared by the pipeline and recap-sweep)."""

from __future__ import annotations

import os
import sys

from recap.workflow import store
from recap.workflow.launch import gin_flags, module_argv


def test_a_marker_counts_while_its_outputs_are_as_stamped(tmp_path):
    out = tmp_path / "model.safetensors"
    out.write_bytes(b"12345")
    os.utime(out, ns=(1_000_000_000, 2_000_000_000))
    stamps = store.stamp([out])
    assert stamps == {str(out): [5, 2_000_000_000]}
    assert store.finished(tmp_path, "value", "f" * 64) is None  # no marker yet
    store.record(tmp_path, "value", "f" * 64, {"stage": "value", "outputs": stamps})
    assert (
        store.marker(tmp_path, "value", "f" * 64)
        == tmp_path / ".pipeline" / f"value-{'f' * 64}.json"
    )
    assert store.finished(tmp_path, "value", "f" * 64) == {"stage": "value", "outputs": stamps}
    os.utime(out, ns=(1_000_000_000, 3_000_000_000))  # touched: no longer as it was
    assert store.finished(tmp_path, "value", "f" * 64) is None
    out.unlink()
    assert store.unchanged(stamps) is False


def test_each_launcher_runs_the_module_its_own_way(monkeypatch):
    import recap.workflow.launch as launch

    monkeypatch.setattr(launch, "free_port", lambda: 29511)
    module = "recap.commands.train"
    assert module_argv(["python"], module) == [sys.executable, "-m", module]
    assert module_argv(["python", "-X", "dev"], module) == [
        sys.executable,
        "-X",
        "dev",
        "-m",
        module,
    ]
    assert module_argv(["deepspeed", "--num_gpus", "8"], module) == [
        "deepspeed", "--num_gpus", "8", "--master_port", "29511", "--module", module]  # fmt: skip
    given = ["/opt/bin/deepspeed", "--master_port", "4000"]
    assert module_argv(given, module) == [*given, "--module", module]
    assert module_argv(["torchrun", "--nproc_per_node", "2"], module) == [
        "torchrun", "--nproc_per_node", "2", "-m", module]  # fmt: skip
    assert gin_flags(["a.gin", "b.gin"], ["x.y = 1"]) == [
        "--gin_file", "a.gin", "--gin_file", "b.gin", "--gin_param", "x.y = 1"]  # fmt: skip

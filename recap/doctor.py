"""``scripts/doctor.py``: one report on whether this machine can run recap, and what to fix.

Every check returns a ``Check`` (OK / WARN / FAIL, what was found, what to do). FAIL is blocking
(the report exits non-zero); WARN is worth reading. Checks never import what they inspect when
the import itself is the risk: TensorFlow and torch-npu are found with ``importlib.util.find_spec``
before anything loads them.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
from dataclasses import dataclass
from pathlib import Path

OK, WARN, FAIL = "OK", "WARN", "FAIL"
CANN_VERSION_FILES = ("version.cfg", "ascend_toolkit_install.info", "compiler/version.info")


@dataclass
class Check:
    status: str
    name: str
    found: str
    fix: str = ""

    def line(self) -> str:
        tail = f" -> {self.fix}" if self.fix and self.status != OK else ""
        return f"[{self.status:4}] {self.name}: {self.found}{tail}"


def version_of(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def major_minor(version: str) -> tuple[int, ...]:
    parts = version.split("+")[0].split(".")[:2]
    return tuple(int("".join(ch for ch in p if ch.isdigit()) or 0) for p in parts)


def cann_version(home: str | None = None) -> str | None:
    """The CANN toolkit version from ``$ASCEND_TOOLKIT_HOME`` (or the default install path)."""
    roots = [home or os.environ.get("ASCEND_TOOLKIT_HOME", ""),
             "/usr/local/Ascend/ascend-toolkit/latest"]  # fmt: skip
    for root in filter(None, roots):
        for name in CANN_VERSION_FILES:
            path = Path(root) / name
            if path.is_file():
                for line in path.read_text(errors="replace").splitlines():
                    key, _, value = line.partition("=")
                    if "version" in key.lower() and value.strip():
                        return value.strip().strip('"')
    return None


def check_torch_npu(torch_version: str, npu_version: str | None, cann: str | None) -> Check:
    """torch-npu must match torch's major.minor, and needs CANN (else ``import torch`` breaks)."""
    name = "torch / torch-npu / CANN"
    found = f"torch {torch_version}, torch-npu {npu_version or 'absent'}, CANN {cann or 'absent'}"
    if npu_version is None:
        return Check(OK, name, found + " (no Ascend stack: CUDA or CPU)")
    if cann is None:
        fix = "install CANN and `source set_env.sh`, or uninstall torch-npu (without CANN it "
        return Check(FAIL, name, found, fix + "breaks `import torch`)")
    if major_minor(npu_version) != major_minor(torch_version):
        wanted = ".".join(map(str, major_minor(torch_version)))
        fix = f"install the torch-npu of torch {wanted}: pip install 'torch-npu=={wanted}.*'"
        return Check(FAIL, name, found, fix)
    return Check(OK, name, found)


# The combinations recap's test suite passes on: the CPU stack (constraints-cpu.txt, `make test`,
# CI) and the field stack (constraints-field.txt, `make test-field`); tests/test_doctor.py keeps
# these equal to the files. The Ascend pair is the field's image (/work/shared/ASCEND.md: the
# rlinf CANN 9.0 image, torch 2.6.0+cpu + torch-npu 2.6.0), which runs the field stack's torch.
TESTED_STACKS = {
    "the CPU stack, constraints-cpu.txt": {
        "torch": "2.13.0", "deepspeed": "0.19.8", "transformers": "5.24.0"},
    "the field stack, constraints-field.txt": {
        "torch": "2.6.0", "deepspeed": "0.19.8", "transformers": "5.24.0"},
}  # fmt: skip
ASCEND_PAIR = {"torch": "2.6.0", "torch-npu": "2.6.0"}
FIELD = "the field stack, constraints-field.txt"


def _release(version: str) -> str:
    """``2.6.0`` of ``2.6.0+cpu`` and of ``2.6.0.post3`` (a local build, a packaging fix)."""
    return version.split("+")[0].split(".post")[0]


def _matches(versions: dict[str, str | None], pins: dict[str, str]) -> bool:
    return all(versions.get(k) and _release(versions[k]) == v for k, v in pins.items())


def _pins(pins: dict[str, str]) -> str:
    return " + ".join(f"{k} {v}" for k, v in pins.items())


def check_tested_versions(versions: dict[str, str | None]) -> Check:
    """torch / torch-npu / DeepSpeed / transformers against the combinations recap is tested
    with (``TESTED_STACKS``, ``ASCEND_PAIR``); an untested one is a warning, never blocking."""
    name = "tested versions"
    keys = ("torch", "torch-npu", "deepspeed", "transformers")
    found = ", ".join(f"{k} {versions.get(k) or 'absent'}" for k in keys)
    tested = "; ".join(f"{_pins(pins)} ({where})" for where, pins in TESTED_STACKS.items())
    tested += f"; {_pins(ASCEND_PAIR)} (the Ascend pair, with the field stack)"
    if versions.get("torch-npu"):
        if not _matches(versions, ASCEND_PAIR):
            return Check(WARN, name, found, f"untested combination; tested: {tested}")
        field = {k: v for k, v in TESTED_STACKS[FIELD].items() if k != "torch"}
        if not _matches(versions, field):
            return Check(WARN, name, found + " (the Ascend pair, other libraries untested)",
                         f"install {_pins(field)} ({FIELD})")  # fmt: skip
        return Check(OK, name, found + f" (the Ascend pair with {FIELD})")
    for where, pins in TESTED_STACKS.items():
        if _matches(versions, pins):
            return Check(OK, name, f"{found} ({where})")
    return Check(WARN, name, found, f"untested combination; tested: {tested}")


def check_tensorflow(tf_installed: bool, numpy_version: str) -> Check:
    name = "TensorFlow beside NumPy"
    found = f"tensorflow {'installed' if tf_installed else 'absent'}, numpy {numpy_version}"
    if tf_installed and major_minor(numpy_version)[0] >= 2:
        return Check(WARN, name, found, "uninstall tensorflow (recap never needs it): through "
                     "transformers' lazy imports it segfaulted under NumPy 2 in the earlier "
                     "Ascend port; recap sets USE_TF=0, other code may not")  # fmt: skip
    return Check(OK, name, found)


def check_offline(env: dict[str, str]) -> Check:
    name = "hub access"
    flags = {k: env.get(k, "") for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    found = ", ".join(f"{k}={v or 'unset'}" for k, v in flags.items())
    if all(v == "1" for v in flags.values()):
        return Check(OK, name, found + " (offline)")
    return Check(WARN, name, found, "export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 (recap "
                 "loads local paths only; this keeps other libraries offline too)")  # fmt: skip


def check_accelerator() -> list[Check]:
    """Accelerator, communication backend and free device memory, through DeepSpeed."""
    from recap.engine import accelerator

    try:
        acc = accelerator.get()
        kind, backend = acc.device_name(), acc.communication_backend_name()
        count = acc.device_count() if kind != "cpu" else os.cpu_count()
    except Exception as exc:  # noqa: BLE001  (report, never crash)
        return [Check(FAIL, "accelerator", f"DeepSpeed could not set it up ({exc})",
                      "set DS_ACCELERATOR=npu|cuda|cpu and check the device driver")]  # fmt: skip
    visible = os.environ.get("ASCEND_RT_VISIBLE_DEVICES") or os.environ.get("CUDA_VISIBLE_DEVICES")
    found = f"{kind} x {count} ({'cores' if kind == 'cpu' else 'devices'})"
    found += f", DS_ACCELERATOR={os.environ.get('DS_ACCELERATOR', 'unset')}"
    found += f", visible devices {visible}" if visible else ""
    checks = [Check(OK if kind != "cpu" else WARN, "accelerator", found,
                    "no NPU/GPU found: training runs on the CPU (fine for the demo)")]  # fmt: skip
    checks.append(Check(OK, "communication backend", backend))
    free = accelerator.free_memory_gib()
    checks.append(Check(OK if free is not None else WARN, "free device memory",
                        f"{free:.1f} GiB" if free is not None else "unknown",
                        "the accelerator reports no memory figures"))  # fmt: skip
    return checks


def check_nvme_offload() -> Check:
    """ZeRO-3 parameter offload to NVMe needs DeepSpeed's async_io op (libaio); a warning, since
    only ``deepspeed_config.offload_param = "nvme"`` uses it."""
    from recap.engine.deepspeed_config import AIO_FIX, async_io_missing

    name = "NVMe parameter offload"
    try:
        missing = async_io_missing()
    except Exception as exc:  # noqa: BLE001  (report, never crash)
        return Check(WARN, name, f"DeepSpeed's async_io op could not be checked ({exc})", AIO_FIX)
    if missing is None:
        return Check(OK, name, "DeepSpeed's async_io op is available")
    return Check(WARN, name, f'{missing}: deepspeed_config.offload_param = "nvme" fails here',
                 AIO_FIX)  # fmt: skip


def run_checks() -> list[Check]:
    import numpy
    import torch

    checks = [
        check_torch_npu(
            torch.__version__, version_of("torch-npu") or version_of("torch_npu"), cann_version()
        ),
        check_tested_versions(
            {
                "torch": torch.__version__,
                "torch-npu": version_of("torch-npu") or version_of("torch_npu"),
                "deepspeed": version_of("deepspeed"),
                "transformers": version_of("transformers"),
            }
        ),
        check_tensorflow(importlib.util.find_spec("tensorflow") is not None, numpy.__version__),
        check_offline(dict(os.environ)),
    ]
    ds = version_of("deepspeed")
    checks.append(Check(OK if ds else FAIL, "deepspeed", ds or "absent", "pip install deepspeed"))
    return checks + check_accelerator() + [check_nvme_offload()]


def report(checks: list[Check]) -> int:
    """Print the report; 1 when any check is blocking."""
    for check in checks:
        print(check.line())
    blocking = [c for c in checks if c.status == FAIL]
    print(f"{len(blocking)} blocking problem(s)" if blocking else "ready")
    return 1 if blocking else 0

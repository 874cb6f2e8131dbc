import os
import subprocess
import sys

import pytest

from recap.doctor import (
    ASCEND_PAIR,
    FAIL,
    OK,
    TESTED_STACKS,
    WARN,
    Check,
    cann_version,
    check_offline,
    check_tensorflow,
    check_tested_versions,
    check_torch_npu,
    report,
)
from tests.helpers import REPO


def test_torch_npu_pairing():
    assert check_torch_npu("2.6.0", None, None).status == OK
    good = check_torch_npu("2.6.0+cpu", "2.6.0.post3", "8.1.RC1")
    assert good.status == OK and "CANN 8.1.RC1" in good.found
    bad = check_torch_npu("2.13.0", "2.6.0", "8.1.RC1")
    assert bad.status == FAIL and "pip install 'torch-npu==2.13.*'" in bad.fix
    no_cann = check_torch_npu("2.6.0", "2.6.0", None)
    assert no_cann.status == FAIL and "install CANN" in no_cann.fix


def test_tensorflow_beside_numpy2_is_a_warning():
    assert check_tensorflow(True, "2.1.0").status == WARN
    assert check_tensorflow(True, "1.26.4").status == OK
    assert check_tensorflow(False, "2.1.0").status == OK


def test_offline_flags():
    assert check_offline({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}).status == OK
    warn = check_offline({"HF_HUB_OFFLINE": "1"})
    assert warn.status == WARN and "TRANSFORMERS_OFFLINE=unset" in warn.found


def test_cann_version_from_the_toolkit(tmp_path):
    (tmp_path / "version.cfg").write_text("# CANN\nversion=8.0.0\n")
    assert cann_version(str(tmp_path)) == "8.0.0"


def test_report_exit_code_and_lines(capsys):
    assert report([Check(OK, "a", "fine")]) == 0
    assert report([Check(FAIL, "b", "broken", "do this")]) == 1
    out = capsys.readouterr().out
    assert "[FAIL] b: broken -> do this" in out and "1 blocking problem(s)" in out


def test_script_on_this_machine():
    env = {
        **os.environ,
        "DS_ACCELERATOR": "cpu",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "doctor.py")], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert "[OK  ] communication backend: gloo" in done.stdout
    assert "[OK  ] tested versions: torch " in done.stdout  # make test and make test-field
    assert "[OK  ] hub access" in done.stdout and done.stdout.strip().endswith("ready")


def test_nvme_offload_line_on_this_machine():
    """A warning naming DeepSpeed's async_io op and the fix where libaio is missing (this CI
    machine), OK where the op loads; only ``offload_param = "nvme"`` needs it."""
    from recap.doctor import check_nvme_offload
    from recap.engine import accelerator
    from recap.engine.deepspeed_config import async_io_missing

    line = check_nvme_offload().line()
    if async_io_missing() is None:
        assert line == "[OK  ] NVMe parameter offload: DeepSpeed's async_io op is available"
        return
    assert line == (
        "[WARN] NVMe parameter offload: DeepSpeed's async_io op cannot be built on this machine "
        f"({accelerator.name()} accelerator; libaio's headers and library not found): "
        'deepspeed_config.offload_param = "nvme" fails here -> install libaio on every node '
        "(apt-get install libaio-dev, or yum install libaio-devel), or offload to the host: "
        'deepspeed_config.offload_param = "cpu"'
    )


TESTED = (
    "tested: torch 2.13.0 + deepspeed 0.19.8 + transformers 5.24.0 (the CPU stack, "
    "constraints-cpu.txt); torch 2.6.0 + deepspeed 0.19.8 + transformers 5.24.0 (the field "
    "stack, constraints-field.txt); torch 2.6.0 + torch-npu 2.6.0 (the Ascend pair, with the "
    "field stack)"
)


@pytest.mark.parametrize(
    "versions, line",
    [
        (
            ("2.13.0+cpu", None, "0.19.8", "5.24.0"),
            "[OK  ] tested versions: torch 2.13.0+cpu, torch-npu absent, deepspeed 0.19.8, "
            "transformers 5.24.0 (the CPU stack, constraints-cpu.txt)",
        ),
        (
            ("2.6.0", None, "0.19.8", "5.24.0"),
            "[OK  ] tested versions: torch 2.6.0, torch-npu absent, deepspeed 0.19.8, "
            "transformers 5.24.0 (the field stack, constraints-field.txt)",
        ),
        (
            ("2.6.0+cpu", "2.6.0.post3", "0.19.8", "5.24.0"),
            "[OK  ] tested versions: torch 2.6.0+cpu, torch-npu 2.6.0.post3, deepspeed 0.19.8, "
            "transformers 5.24.0 (the Ascend pair with the field stack, constraints-field.txt)",
        ),
        (
            ("2.6.0+cpu", "2.6.0", "0.16.4", "5.20.2"),
            "[WARN] tested versions: torch 2.6.0+cpu, torch-npu 2.6.0, deepspeed 0.16.4, "
            "transformers 5.20.2 (the Ascend pair, other libraries untested) -> install "
            "deepspeed 0.19.8 + transformers 5.24.0 (the field stack, constraints-field.txt)",
        ),
        (
            ("2.7.1", "2.7.1", "0.19.8", "5.24.0"),
            "[WARN] tested versions: torch 2.7.1, torch-npu 2.7.1, deepspeed 0.19.8, "
            f"transformers 5.24.0 -> untested combination; {TESTED}",
        ),
        (
            ("2.13.0+cpu", None, "0.19.8", "5.25.0"),
            "[WARN] tested versions: torch 2.13.0+cpu, torch-npu absent, deepspeed 0.19.8, "
            f"transformers 5.25.0 -> untested combination; {TESTED}",
        ),
    ],
)
def test_tested_versions_line(versions, line):
    keys = ("torch", "torch-npu", "deepspeed", "transformers")
    assert check_tested_versions(dict(zip(keys, versions, strict=True))).line() == line


def pins(path) -> dict[str, str]:
    lines = (line.split("#")[0].strip() for line in path.read_text().splitlines())
    return dict(line.split("==") for line in lines if line)


def test_tested_stacks_are_the_constraint_files():
    for where, stack in TESTED_STACKS.items():
        pinned = pins(REPO / where.split(", ")[1])
        assert stack == {k: pinned[k] for k in ("torch", "deepspeed", "transformers")}, where
    assert TESTED_STACKS["the field stack, constraints-field.txt"]["torch"] == ASCEND_PAIR["torch"]


def test_the_field_stack_differs_from_the_cpu_stack_in_torch_only():
    cpu, field = pins(REPO / "constraints-cpu.txt"), pins(REPO / "constraints-field.txt")
    assert set(field) == set(cpu)  # a pin added to one file goes into the other too
    assert {k for k in cpu if cpu[k] != field[k]} == {"torch"}

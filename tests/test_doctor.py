import os
import subprocess
import sys

from recap.doctor import (
    FAIL,
    OK,
    WARN,
    Check,
    cann_version,
    check_offline,
    check_tensorflow,
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
    assert "[OK  ] hub access" in done.stdout and done.stdout.strip().endswith("ready")

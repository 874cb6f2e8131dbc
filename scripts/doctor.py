"""Can this machine run recap? Accelerator, torch / torch-npu / CANN pairing, DeepSpeed backend,
TensorFlow next to NumPy 2, hub access, free device memory; each problem says what to do.

    python scripts/doctor.py        # exit 1 when a problem is blocking
"""

import sys

from recap.doctor import report, run_checks

if __name__ == "__main__":
    sys.exit(report(run_checks()))

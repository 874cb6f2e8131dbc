"""Can this machine run recap? Accelerator, torch / torch-npu / CANN pairing, torch / torch-npu /
DeepSpeed / transformers against the tested combinations, DeepSpeed backend, TensorFlow next to
NumPy 2, hub access, free device memory, NVMe parameter offload (DeepSpeed's async_io op); each
problem says what to do.

    recap-doctor        # exit 1 when a problem is blocking
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.splitlines()[0]).parse_args(argv)
    from recap.doctor import report, run_checks

    return report(run_checks())


if __name__ == "__main__":
    sys.exit(main())

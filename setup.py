from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="recap",
    version="0.1.0",
    description="RECAP offline RL for vision-language-action policies on Ascend NPUs, GPUs, CPUs",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["recap", "recap.*"]),
    python_requires=">=3.10",
    # Open ranges: the Ascend stack in the field is torch 2.6 + torch-npu 2.6; the CPU dev/CI
    # install pins torch==2.13.0 in the Makefile (constraints-cpu.txt).
    install_requires=[
        "torch>=2.4",
        "deepspeed>=0.15",
        "transformers>=5.0",  # the value model calls decoder layers with 5.x signatures
        "accelerate>=0.34",
        "pyarrow>=14",
        "numpy>=1.24",
        "gin-config>=0.5",
        "mlflow>=2.10",
        "safetensors>=0.4",
        "av>=12",
        "tqdm>=4.60",
        "pyyaml>=6",
    ],
    extras_require={
        # torch-npu must match the installed torch (2.6 -> torch-npu 2.6.x); never install it
        # without CANN: torch auto-loads it and `import torch` then fails.
        "npu": ["torch-npu"],
        "lerobot": ["lerobot"],
        "viz": ["matplotlib>=3.7"],
        "dev": ["pytest>=7", "hypothesis>=6", "ruff>=0.5", "matplotlib>=3.7"],
    },
)

from pathlib import Path

from setuptools import find_packages, setup

setup(
    name="recap",
    version="0.1.0",
    description="RECAP offline RL for vision-language-action policies on Ascend NPUs, GPUs, CPUs",
    long_description=Path(__file__).with_name("README.md").read_text(encoding="utf-8"),
    long_description_content_type="text/markdown",
    packages=find_packages(include=["recap", "recap.*"]),
    # The gin files ship inside the package (recap/gin; the checkout's gin/ links to it). `**`
    # picks up every subdirectory, present and future. workflow/code_versions.json: the steps'
    # code-version lock, which planning reads.
    package_data={
        "recap": ["gin/*.gin", "gin/**/*.gin", "gin/**/*.yaml", "gin/**/*.yml", "workflow/*.json"]
    },
    entry_points={
        "console_scripts": [
            "recap-pipeline = recap.commands.pipeline:main",
            "recap-train = recap.commands.train:main",
            "recap-returns = recap.commands.compute_returns:main",
            "recap-advantages = recap.commands.compute_advantages:main",
            "recap-relabel = recap.commands.relabel:main",
            "recap-evaluate = recap.commands.evaluate_policy:main",
            "recap-doctor = recap.commands.doctor:main",
            "recap-plan-memory = recap.commands.plan_memory:main",
            "recap-sweep = recap.commands.sweep:main",
            "recap-demo-data = recap.commands.make_demo_data:main",
            "recap-import = recap.commands.import_rlinf:main",
            "recap-serve = recap.commands.serve:main",
            "recap-collect = recap.commands.collect:main",
            "recap-iterate = recap.commands.iterate:main",
            "recap-init = recap.commands.init:main",
        ]
    },
    python_requires=">=3.10",
    # Open ranges: the Ascend stack in the field is torch 2.6 + torch-npu 2.6; the CPU dev/CI
    # install pins torch==2.13.0 in the Makefile (constraints-cpu.txt).
    install_requires=[
        "torch>=2.6",  # transformers 5 disables its torch models below 2.6
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
        "sentencepiece>=0.2",  # PaliGemma's tokenizer is a SentencePiece .model file
        "websockets>=13",  # recap-serve: openpi's websocket policy protocol (asyncio server API)
        "msgpack>=1.0",  # recap-serve: openpi's msgpack-numpy frames
        "peft>=0.17",  # LoRA adapters (recap.models.adapters)
    ],
    extras_require={
        # torch-npu must match the installed torch (2.6 -> torch-npu 2.6.x); never install it
        # without CANN: torch auto-loads it and `import torch` then fails.
        "npu": ["torch-npu"],
        # No `lerobot` extra: no recap code imports it (recap reads and writes its formats itself);
        # `make test-lerobot` installs lerobot[pi,dataset]==0.6.1 beside recap to prove them equal.
        "viz": ["matplotlib>=3.7"],
        # Meta-World MT1 (recap.envs.metaworld): every scene asset and a scripted expert per task;
        # MuJoCo renders on a CPU through OSMesa (apt-get install -y libosmesa6). metaworld
        # imports `packaging` without declaring it. `make test-metaworld`.
        "metaworld": ["metaworld>=3.1.1", "mujoco>=3.3.0", "packaging"],
        # The documentation site (mkdocs.yml; `make docs`, tests/test_docs.py builds it strictly).
        "docs": [
            "mkdocs>=1.6",
            "mkdocs-material>=9.5",
            "mkdocstrings[python]>=0.26",
        ],
        # openpi-client (tests/serve) declares numpy<2 but runs on numpy 2: the Makefile installs
        # it with --no-deps; typing_extensions is the import it forgets to declare.
        "dev": [
            "pytest>=7",
            "pytest-xdist>=3.6",  # make test: -n, --dist loadfile, --no-loadscope-reorder
            "hypothesis>=6",
            "ruff>=0.5",
            "import-linter>=2.1",  # lint-imports: the layering contracts in .importlinter
            "matplotlib>=3.7",
            "typing_extensions>=4.0",
        ],
    },
)

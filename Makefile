# Two commands on a fresh machine: `make demo` and `make test`. Both bootstrap .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.recap-installed
# The field's stack (torch 2.6, constraints-field.txt) in a venv of its own: `make test-field`.
FIELD_VENV := .venv-field
FIELD_PY := $(FIELD_VENV)/bin/python
FIELD_STAMP := $(FIELD_VENV)/.recap-installed
# LeRobot 0.6.1 itself (Python >= 3.12, torch < 2.12) beside recap, in a venv of its own:
# `make test-lerobot` (tests/lerobot, not part of `make test` / CI).
LEROBOT_VENV := .venv-lerobot
LEROBOT_PY := $(LEROBOT_VENV)/bin/python
LEROBOT_STAMP := $(LEROBOT_VENV)/.recap-installed
LEROBOT_PYTHON ?= $(or $(wildcard $(HOME)/.pyenv/versions/3.12.1/bin/python),python3.12)
# make demo's data: the reaching task with the targets in the state (demo/state.gin), 1,000 expert
# demonstrations and 600 rollouts (the benchmark's 3,000 + 3,000 cut to fit 15 minutes; Step 3
# labels every frame, so rollouts cost time there, demonstrations teach the base policy)
DEMO_DATA := demo_state
DEMO_SFT_EPISODES := 1000
DEMO_ROLLOUT_EPISODES := 600
# pytest-xdist workers for `make test` (a test file is one unit; tests/conftest.py starts the
# multi-process ones first). 2: the CI machine's cores.
TEST_WORKERS ?= 2
export DS_ACCELERATOR ?= cpu
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export MLFLOW_TRACKING_URI ?= sqlite:///mlflow.db

.PHONY: demo test test-slow test-field test-lerobot lint bench docs clean

$(STAMP): setup.py constraints-cpu.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints-cpu.txt -e '.[dev,viz,docs]'
	$(PY) -m pip install -q --no-deps -c constraints-cpu.txt openpi-client  # tests/serve; see setup.py
	touch $(STAMP)

demo: $(STAMP)
	$(PY) scripts/make_demo_data.py --out $(DEMO_DATA) --state-targets \
		--sft-episodes $(DEMO_SFT_EPISODES) --rollout-episodes $(DEMO_ROLLOUT_EPISODES)
	$(PY) scripts/pipeline.py --gin_file demo/pipeline.gin

test: $(STAMP)
	$(VENV)/bin/lint-imports
	$(PY) -m pytest -q --durations=30 -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

# Not part of `make test` / CI: PyPI's torch 2.6.0 for x86_64 is the CUDA build (3 GB of
# wheels, 6.4 GB installed; it runs on the CPU), and the suite runs as long as `make test`.
$(FIELD_STAMP): setup.py constraints-field.txt
	test -x $(FIELD_PY) || $(PYTHON) -m venv $(FIELD_VENV)
	$(FIELD_PY) -m pip install -q --upgrade pip setuptools  # bdist_wheel: tests/test_install.py
	$(FIELD_PY) -m pip install -q -c constraints-field.txt torch
	$(FIELD_PY) -m pip install -q -c constraints-field.txt -e '.[dev,viz]'
	$(FIELD_PY) -m pip install -q --no-deps -c constraints-field.txt openpi-client
	touch $(FIELD_STAMP)

test-field: $(FIELD_STAMP)
	$(FIELD_PY) -m pytest -q tests

# Not part of `make test` / CI: lerobot[pi,dataset]==0.6.1 resolves PyPI's torch 2.11 (the CUDA
# build, ~2.5 GB of wheels; it runs on the CPU) and transformers 5.5.4; recap installs beside it.
$(LEROBOT_STAMP): setup.py
	test -x $(LEROBOT_PY) || $(LEROBOT_PYTHON) -m venv $(LEROBOT_VENV)
	$(LEROBOT_PY) -m pip install -q --upgrade pip
	$(LEROBOT_PY) -m pip install -q 'lerobot[pi,dataset]==0.6.1' -e '.[dev]'
	touch $(LEROBOT_STAMP)

test-lerobot: $(LEROBOT_STAMP)
	$(LEROBOT_PY) -m pytest -q tests/lerobot

# Meta-World (recap.envs.metaworld: the `metaworld` extra, ~45 MB of wheels) into .venv, then its
# tests; rendering on a CPU needs OSMesa (apt-get install -y libosmesa6; MUJOCO_GL=egl on a GPU).
# Without them the tests skip in `make test`; .ci/run installs both, so CI runs them.
METAWORLD_STAMP := $(VENV)/.recap-metaworld
.PHONY: test-metaworld
$(METAWORLD_STAMP): $(STAMP)
	$(PY) -m pip install -q -c constraints-cpu.txt -e '.[metaworld]'
	touch $(METAWORLD_STAMP)

test-metaworld: $(METAWORLD_STAMP)
	$(PY) -m pytest -q tests/envs/test_metaworld.py

# The documentation site into site/ (tests/test_docs.py builds it strictly in `make test`).
docs: $(STAMP)
	$(VENV)/bin/mkdocs build --strict --site-dir site

test-slow: $(STAMP)
	RECAP_SLOW=1 $(PY) -m pytest -q -s -m slow tests/slow

lint: $(STAMP)
	$(VENV)/bin/lint-imports
	$(VENV)/bin/ruff check recap scripts tests bench
	$(VENV)/bin/ruff format --check recap scripts tests bench

bench: $(STAMP)
	$(PY) bench/returns.py
	$(PY) bench/advantages.py
	$(PY) bench/frame_loader.py
	$(PY) bench/engine.py
	$(PY) bench/value_layers.py
	$(PY) bench/policy_sampling.py
	$(PY) bench/value_data.py
	$(PY) bench/value_inference.py
	$(PY) bench/real_size.py
	$(PY) bench/serve.py

clean:
	rm -rf $(VENV) $(FIELD_VENV) $(LEROBOT_VENV) $(DEMO_DATA) demo_data mlflow.db mlruns runs site .pytest_cache

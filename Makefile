# Two commands on a fresh machine: `make demo` and `make test`. Both bootstrap .venv.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.recap-installed
DEMO_DATA := demo_data
export DS_ACCELERATOR ?= cpu
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export MLFLOW_TRACKING_URI ?= sqlite:///mlflow.db

.PHONY: demo test test-slow lint bench clean

$(STAMP): setup.py constraints-cpu.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints-cpu.txt -e '.[dev,viz]'
	touch $(STAMP)

demo: $(STAMP)
	$(PY) scripts/make_demo_data.py --out $(DEMO_DATA)
	$(PY) scripts/pipeline.py --gin_file demo/pipeline.gin

test: $(STAMP)
	$(PY) -m pytest -q tests

test-slow: $(STAMP)
	RECAP_SLOW=1 $(PY) -m pytest -q -s -m slow tests/slow

lint: $(STAMP)
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

clean:
	rm -rf $(VENV) $(DEMO_DATA) mlflow.db mlruns runs .pytest_cache

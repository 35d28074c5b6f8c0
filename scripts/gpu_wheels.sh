#!/usr/bin/env bash
# Downloads, into .whl/, the wheels scripts/gpu_check.sh installs on a GPU machine that has Python with PyTorch,
# transformers and peft but no internet: the project's other runtime dependencies (pure Python, or manylinux
# wheels for x86-64), at the versions installed in this checkout's .venv (the ones the tests ran with).
#
#   bash scripts/gpu_wheels.sh [PYTHON_VERSION]      # default 3.12; needs `make venv` first and PyPI access
#
# Carry .whl/ with the tree (about 15 MB; .gitignore keeps it out of git).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON_VERSION=${1:-3.12}
VENV_PY=${VENV_PY:-.venv/bin/python}
# What such a machine lacks of `pip install -e .[local]` plus what the check imports (tests/e2e_scenario.py):
# pydantic and its settings, the proxy's ASGI stack, the openai SDK, jsonschema, gguf and llguidance.
PACKAGES=(
  pydantic pydantic-core pydantic-settings annotated-types typing-inspection python-dotenv
  starlette uvicorn sse-starlette httptools
  openai jiter distro sniffio
  jsonschema jsonschema-specifications referencing rpds-py attrs
  gguf llguidance
)
rm -rf .whl && mkdir -p .whl
for name in "${PACKAGES[@]}"; do
  version=$("$VENV_PY" -c "import importlib.metadata as m, sys; print(m.version(sys.argv[1]))" "$name")
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$PYTHON_VERSION" --implementation cp \
    --platform manylinux_2_35_x86_64 --platform manylinux_2_34_x86_64 --platform manylinux_2_31_x86_64 \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl "$name==$version"
done
ls .whl | wc -l | xargs echo "wheels:"
du -sh .whl

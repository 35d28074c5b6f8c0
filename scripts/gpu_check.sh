#!/usr/bin/env bash
# The local backend's CUDA path end to end, in one command, on a single-GPU machine with Python, PyTorch,
# transformers and peft but no internet and no vLLM (what scripts/gpu_check.py checks: its docstring).
#
#   bash scripts/gpu_wheels.sh        # beforehand, where PyPI is reachable: the other dependencies, into .whl/
#   bash scripts/gpu_check.sh [--device cpu] [--out DIR]
#
# The wheels in .whl/ are installed into a private folder (nothing on the machine changes); the project runs from
# this tree (no install). One summary line per stage; exit 0 when every stage passes. Under 10 minutes: the slowest
# stage, the launch loop, takes about a minute on a 2-core CPU.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
SITE=${GPU_CHECK_SITE:-/tmp/openclaw-gpu-check-site}
if compgen -G ".whl/*.whl" > /dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl \
    || { echo "STAGE wheels: FAIL (pip could not install .whl/)"; exit 1; }
  echo "STAGE wheels: PASS $(ls .whl/*.whl | wc -l) wheels installed into $SITE"
  export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
else
  echo "STAGE wheels: none in .whl/ (run scripts/gpu_wheels.sh where PyPI is reachable if imports fail)"
  export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
fi
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
exec timeout "${GPU_CHECK_TIMEOUT_S:-570}" "$PY" scripts/gpu_check.py "$@"

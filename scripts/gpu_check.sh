#!/usr/bin/env bash
# One short GPU run (H100/H200: about 3-5 minutes, under 8): the CUDA tests of the Triton
# backend, then the full benchmark, whose JSON, table and chart land in docs/.
#   bash scripts/gpu_check.sh            # from anywhere; PYTHON=... to pick the interpreter
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-}"
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python; fi
fi

"$PY" - <<'PYEOF'
import torch, triton
assert torch.cuda.is_available(), "no CUDA device: nothing to check here"
print(f"{torch.cuda.get_device_name()} | torch {torch.__version__} | triton {triton.__version__}")
PYEOF

status=0
echo "== GPU tests (tests/test_triton.py -m gpu)"
timeout 240 "$PY" -m pytest -q -p no:cacheprovider -m gpu tests/test_triton.py -rfE || status=$?

echo "== benchmark (all shapes, modes and providers) -> docs/benchmarks.md"
timeout 300 "$PY" -m scripts.bench --out docs --repeat 30 || status=$?

exit "$status"

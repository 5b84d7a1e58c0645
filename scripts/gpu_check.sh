#!/usr/bin/env bash
# One short GPU run (H100/H200) that records everything into one folder, in about 8 minutes:
#
#   bash scripts/gpu_check.sh OUT_DIR        # or OUT=OUT_DIR bash scripts/gpu_check.sh
#   bash scripts/gpu_check.sh --dry-run DIR  # the same steps on CPU stand-ins (checks this script)
#
# Run from anywhere; it works in the repository root with `python3` (PYTHON=... to pick another)
# and installs nothing. Steps, each under its own time limit (their limits add up to 11 min):
#   1. environment: GPU, driver, torch/triton versions, nvidia-smi            -> log.txt
#   2. the CUDA tests (Triton backend, packed attention), stopping at the first failure -> tests.txt
#   3. copy ceiling and kernel-only tile sweep (programs, heads per program,
#      warps; registers and spills of every compiled tile)                    -> sweep.json, sweep.md
#   4. the full benchmark tables (every shape, mode and provider)             -> bench/<gpu>.json,
#                                                                                img/bench_<gpu>.png, benchmarks.md
#   5. a FLUX.1-sized Flux block (bf16, 64 x 64 tokens), stock vs set_rope_processors, eager and
#      torch.compile'd (inductor): ms and the compiled ratio                  -> compile.json
#   6. a rolling KV cache's roll (32k tokens, 8 heads of 128, bf16): the kept keys re-rotated in place
#      through the Triton backend, against recomputing them; GB/s against the HBM roofline -> cache.json
#   7. transformers: a Qwen3-8B-sized attention layer stock vs apply_axial_rope (fused QK-norm + rope),
#      Qwen2.5-VL's M-RoPE rotation stock vs axial_rope vs Liger, bf16                -> transformers.json
#   8. training smoke on 1 GPU under torchrun: the tiny video DiT with --fsdp --compile --checkpointing
#      (inductor, bf16 autocast), 10 steps; its log (losses, samples/s)              -> train_smoke/
#   9. QK-norm + RoPE from tables at Flux-dev's attention shape (bf16): ours fused (Triton) vs ours unfused vs
#      diffusers' norm + apply_rotary_emb vs comfy-kitchen's rms_rope (cuda, triton), forward and
#      forward+backward, GB/s and % of the HBM roofline (scripts/bench_norm_tables.py)  -> norm_tables.json
#  10. issue 44's rotations against the shared-rotation kernel at the same shapes (bf16, Flux-like DiT and a GQA
#      LM, forward and forward+backward): keys at other positions and keys with a per-token amplitude
#      (QKRotation), a per-head F over grouped heads, per-head tables vs shared tables (scripts/bench_qk_rotation.py)
#                                                                                -> qk_rotation.json, qk_rotation.md
# Peers (Liger, flash-attn, comfy-kitchen) come from the package archives in .peers/ (git-ignored; fetched
# with pip on a machine with internet, see scripts/peers.py; `pip download comfy-kitchen --no-deps -d .peers`
# for the Python of the GPU machine) and are unpacked into .peers/site here.
# With the device tool: run `bash scripts/gpu_check.sh "$OUT"` with carry [".peers"].
# Afterwards, on the development machine, put the figures into the docs:
#   cp OUT/bench/<gpu>.json docs/bench/ && python -m scripts.bench --report --out docs
# and compare OUT/sweep.md with the roofline table of docs/kernels.md (python -m scripts.roofline).
set -uo pipefail
cd "$(dirname "$0")/.."

DRY=0
if [ "${1:-}" = "--dry-run" ]; then DRY=1; shift; fi
OUT="${1:-${OUT:-gpu-check-$(date +%Y%m%d-%H%M%S)}}"
mkdir -p "$OUT"
PY="${PYTHON:-python3}"
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec > >(tee "$OUT/log.txt") 2>&1
start=$SECONDS
status=0
step() { echo; echo "== [$((SECONDS - start)) s] $*"; }
run() {  # run LIMIT_SECONDS CMD...: a step's command under its time limit; a failure is recorded, the run goes on
  local limit=$1; shift
  timeout --kill-after=10 "$limit" "$@"
  local rc=$?
  if [ $rc -ne 0 ]; then echo "!! exit $rc (124: over its ${limit} s limit): $*"; status=1; fi
}

step "environment"
"$PY" - <<'EOF'
import platform, torch, triton
print(f"python {platform.python_version()} | torch {torch.__version__} | triton {triton.__version__}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"{p.name} | {p.multi_processor_count} SMs | {p.total_memory / 2**30:.0f} GiB | capability {p.major}.{p.minor}")
else:
    print("no CUDA device")
EOF
if [ $DRY -eq 0 ]; then nvidia-smi || true; fi
"$PY" -c "from scripts import peers; print('peers:', peers.unpack(), peers.versions())" || status=1

if [ $DRY -eq 1 ]; then  # CPU stand-ins: the gpu tests skip, the sweep only compiles, the bench is small
  TESTS=(-m gpu tests/test_triton_gpu.py tests/test_varlen_gpu.py)
  SWEEP=(--dry-run --shapes dit --kernels rope --limit 2 --workers 1)
  BENCH=(--small --shapes dit --modes forward --repeat 1 --tag dry-run)
else
  TESTS=(-m gpu -n 6 tests/test_triton_gpu.py tests/test_varlen_gpu.py)  # pytest-xdist: the kernel compiles run in parallel
  SWEEP=(--repeat 20)
  TAG=$("$PY" -c "import torch; print(torch.cuda.get_device_name().split()[-1].lower())")
  BENCH=(--repeat 20 --tag "$TAG")
fi

step "CUDA tests (tests/test_triton_gpu.py, tests/test_varlen_gpu.py; stop at the first failure) -> $OUT/tests.txt"
run 90 "$PY" -m pytest -x -q -rfEs -p no:cacheprovider "${TESTS[@]}" > "$OUT/tests.txt" 2>&1
tail -n 15 "$OUT/tests.txt"

step "copy ceiling and kernel sweep -> $OUT/sweep.md"
run 80 "$PY" -m scripts.kernel_sweep --out "$OUT" "${SWEEP[@]}"

step "benchmark tables -> $OUT/benchmarks.md"
run 100 "$PY" -m scripts.bench --out "$OUT" "${BENCH[@]}"

step "compiled Flux block, stock vs axial_rope -> $OUT/compile.json"
if [ $DRY -eq 1 ]; then FLUX=(--repeat 1); else FLUX=(--repeat 10); fi
run 80 "$PY" -m scripts.compile_report --flux-only --out "$OUT/compile.json" "${FLUX[@]}"

step "rolling KV cache: one roll re-rotating 32k cached keys in place -> $OUT/cache.json"
if [ $DRY -eq 1 ]; then CACHE=(--tokens 256 --shift 16 --repeat 1 --device cpu); else CACHE=(--tokens 32768 --repeat 20 --dtype bfloat16); fi
run 40 "$PY" -m scripts.bench --cache --roll-only --heads 8 --head-dim 128 "${CACHE[@]}" --json "$OUT/cache.json"

step "transformers: a Qwen3-8B-sized attention layer stock vs patched, Qwen2.5-VL M-RoPE vs stock and Liger -> $OUT/transformers.json"
if [ $DRY -eq 1 ]; then TRANSFORMERS=(--small --repeat 2); else TRANSFORMERS=(); fi
run 60 "$PY" -m scripts.gpu_transformers --out "$OUT/transformers.json" "${TRANSFORMERS[@]}"

step "training smoke: torchrun 1 GPU, video DiT, --fsdp --compile --checkpointing -> $OUT/train_smoke/"
if [ $DRY -eq 1 ]; then SMOKE=(--steps 2 --compile-backend aot_eager); else SMOKE=(--steps 10); fi
run 100 "$PY" -m torch.distributed.run --standalone --nproc-per-node 1 -m scripts.train --model video_dit \
  --fsdp --compile --checkpointing --batch-size 4 --resolution 32 --frames 8 --log-every 5 --no-report \
  --no-progress --overwrite --out "$OUT/train_smoke" "${SMOKE[@]}"
tail -n 4 "$OUT/train_smoke/log.jsonl" 2>/dev/null || true

step "QK-norm + RoPE from tables: ours vs comfy-kitchen vs unfused -> $OUT/norm_tables.json"
if [ $DRY -eq 1 ]; then NORM=(--small --dtypes float32 --modes forward --repeat 1 --no-compile); else NORM=(--dtypes bfloat16 --repeat 20); fi
run 50 "$PY" -m scripts.bench --norm-tables --json "$OUT/norm_tables.json" "${NORM[@]}"

step "per-head and asymmetric rotations vs the shared kernel -> $OUT/qk_rotation.md"
if [ $DRY -eq 1 ]; then QK=(--small --device cpu --dtype float32 --repeat 1); else QK=(--repeat 10); fi
run 40 "$PY" -m scripts.bench_qk_rotation --json "$OUT/qk_rotation.json" "${QK[@]}" > "$OUT/qk_rotation.md"
cat "$OUT/qk_rotation.md"

step "done (exit $status); files:"
find "$OUT" -type f | sort
exit $status

#!/usr/bin/env bash
# One prepared GPU check for a session that has a CUDA machine (under 8 minutes in all), writing one
# JSON file, $OUT/gpu_check.json (else runs/gpu_check.json; merged by benchmarks/gpu_report.py):
#   1. environment: GPU, torch/CUDA/Triton/DALI versions                        -> environment
#   2. pytest -m gpu: Triton parity + memory, compiled FlexAttention vs the dense mask, compile
#      with the Triton kernels, DALI mixed decoder                                -> pytest
#   3. bench_mfu.py: ~125M Llama (GPT-2 small sizes) at T=2048, bf16, compiled, FSDP2 at world
#      size 1, FlexAttention vs the dense mask                                    -> mfu_125m
#   4. the same for ~1B (Llama 3.2 1B sizes; goal MFU >= 45 %)                     -> mfu_1b
#   5. bench_kernels.py --skip-cpu: Triton vs torch, speed and parity              -> kernels
#   6. bench_memory.py: peak memory per ZeRO stage and memory mode, 125M, T=2048    -> memory
#   7. bench_images.py: DALI mixed decode images/s (beside CPU DALI and PIL)       -> images
#   8. bench_attention.py --skip-cpu: flex vs dense, T=1k..8k, 2-16 documents      -> attention
# Every step has its own time limit and a failure does not stop the later steps; the exit status is
# the number of failed steps. Output goes to stdout and to $OUT/gpu_check.log when $OUT is set
# (else runs/gpu_check.log); each step's JSON and steps.jsonl to $OUT/gpu_check/.
#
# Python: $PY if set, else .venv/bin/python when its torch sees CUDA (a `make install` venv on the
# GPU machine), else python3 when its torch does (a machine image with a CUDA torch), else (no
# CUDA: a CPU smoke run where GPU tests skip) .venv/bin/python. Packages that python lacks and that
# `make install` would have installed (zstandard, webdataset, nvidia-dali-cuda130, ...) are taken
# offline from wheels in .whl/ when that folder exists (pip --no-index --target /tmp/site); nothing
# is downloaded. A step whose imports are missing fails with the ImportError in the log.
#
# Usage: bash benchmarks/gpu_check.sh [--dry-run]
#   --dry-run: print every step's command and run none of them, then write the JSON (the steps
#   listed, every result missing); the test suite runs it on the CPU.
set -u -o pipefail
cd "$(dirname "$0")/.."
DRY_RUN=0
[ "${1:-}" = "--dry-run" ] && DRY_RUN=1
LOG="${OUT:-runs}/gpu_check.log"
RESULTS="${OUT:-runs}/gpu_check"
REPORT="${OUT:-runs}/gpu_check.json"
mkdir -p "$(dirname "$LOG")" "$RESULTS"
: >"$LOG"
: >"$RESULTS/steps.jsonl"
exec > >(tee -a "$LOG") 2>&1
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8

has_cuda() { "$1" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; }
if [ -z "${PY:-}" ] && [ $DRY_RUN -eq 0 ]; then
  for cand in .venv/bin/python python3; do
    if command -v "$cand" >/dev/null && has_cuda "$cand"; then PY=$cand; break; fi
  done
fi
if [ -z "${PY:-}" ]; then  # no CUDA anywhere (or a dry run): GPU tests skip, benchmarks say so
  PY=python3; [ -x .venv/bin/python ] && PY=.venv/bin/python
fi
if [ $DRY_RUN -eq 0 ] && [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

failed=0
step() {  # step NAME SECONDS CMD...   (one line per step into steps.jsonl)
  local name=$1 limit=$2; shift 2
  echo; echo "== $name (limit ${limit}s): $*"
  local t0=$SECONDS rc=0 dry=false
  if [ $DRY_RUN -eq 1 ]; then
    dry=true
    echo "== $name: dry run, not run"
  else
    timeout --signal=TERM --kill-after=10 "$limit" "$@"
    rc=$?
    echo "== $name: exit $rc after $((SECONDS - t0)) s"
  fi
  printf '{"name": "%s", "rc": %d, "seconds": %d, "limit_s": %d, "dry_run": %s}\n' \
    "$name" "$rc" "$((SECONDS - t0))" "$limit" "$dry" >>"$RESULTS/steps.jsonl"
  [ $rc -eq 0 ] || failed=$((failed + 1))
}

step environment 20 $PY benchmarks/gpu_report.py --environment "$RESULTS/environment.json"
step "pytest -m gpu" 90 $PY -m pytest -m gpu -q -ra -p no:cacheprovider --continue-on-collection-errors \
  --junitxml="$RESULTS/pytest_gpu.xml" tests/unit/trainer/test_kernels.py tests/unit/trainer/test_attention.py \
  tests/unit/trainer/test_kernel_wiring.py tests/unit/trainer/test_memory.py tests/unit/loaders/test_images.py
MFU="--seq-len 2048 --docs 4 --attention flex,dense --kernels auto --compile --warmup 3 --steps 10"
step "bench_mfu 125m" 80 $PY benchmarks/bench_mfu.py --size 125m --micro-batch 8 $MFU --json "$RESULTS/mfu_125m.json"
step "bench_mfu 1b" 130 $PY benchmarks/bench_mfu.py --size 1b --micro-batch 8 $MFU --json "$RESULTS/mfu_1b.json"
step "bench_kernels (CUDA)" 40 $PY benchmarks/bench_kernels.py --skip-cpu --iters 10 --json "$RESULTS/kernels.json"
step "bench_memory" 40 $PY benchmarks/bench_memory.py --size 125m --seq-len 2048 --micro-batch 4 \
  --json "$RESULTS/memory.json"
step "bench_images (DALI mixed)" 30 $PY benchmarks/bench_images.py --images 512 --rounds 2 --threads 4 \
  --json "$RESULTS/images.json"
step "bench_attention (CUDA)" 40 $PY benchmarks/bench_attention.py --skip-cpu --batch 4 --heads 16 \
  --json "$RESULTS/attention.json"

echo
$PY benchmarks/gpu_report.py "$RESULTS" "$REPORT" || failed=$((failed + 1))
echo "== gpu_check: $failed step(s) failed; log in $LOG, results in $REPORT"
exit $failed

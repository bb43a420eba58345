#!/usr/bin/env bash
# One prepared GPU check for a session that has a CUDA machine (about 6-8 minutes in all):
#   1. environment: GPU, torch/CUDA/Triton/DALI versions
#   2. pytest -m gpu (tests/unit/trainer/test_kernels.py, tests/unit/loaders/test_images.py: Triton parity + memory, DALI mixed decoder)
#   3. benchmarks/bench_kernels.py --skip-cpu (Triton vs eager, Liger-like size)
#   4. benchmarks/bench_mfu.py (125M GPT, bf16, FSDP2 at world size 1: MFU fused vs eager kernels)
#   5. benchmarks/bench_images.py (DALI CPU vs PIL, plus the "DALI mixed/gpu" line)
#   6. benchmarks/bench_mfu.py --compile (same, torch.compile per block)
# Every step has its own time limit and a failure does not stop the later steps; the exit status is
# the number of failed steps. Output goes to stdout and to $OUT/gpu_check.log when $OUT is set
# (else runs/gpu_check.log).
#
# Python: $PY if set, else .venv/bin/python when its torch sees CUDA (a `make install` venv on the
# GPU machine), else python3 when its torch does (a machine image with a CUDA torch), else (no
# CUDA: a CPU smoke run where GPU tests skip) .venv/bin/python. Packages that python lacks and that
# `make install` would have installed (zstandard, webdataset, nvidia-dali-cuda130, ...) are taken
# offline from wheels in .whl/ when that folder exists (pip --no-index --target /tmp/site); nothing
# is downloaded. A step whose imports are missing fails with the ImportError in the log.
#
# Usage: bash benchmarks/gpu_check.sh
set -u -o pipefail
cd "$(dirname "$0")/.."
LOG="${OUT:-runs}/gpu_check.log"
mkdir -p "$(dirname "$LOG")"
: >"$LOG"
exec > >(tee -a "$LOG") 2>&1
export PYTHONUNBUFFERED=1 OMP_NUM_THREADS=8

has_cuda() { "$1" -c "import torch, sys; sys.exit(not torch.cuda.is_available())" 2>/dev/null; }
if [ -z "${PY:-}" ]; then
  for cand in .venv/bin/python python3; do
    if command -v "$cand" >/dev/null && has_cuda "$cand"; then PY=$cand; break; fi
  done
fi
if [ -z "${PY:-}" ]; then  # no CUDA anywhere: a CPU smoke run (GPU tests skip, benchmarks say so)
  PY=python3; [ -x .venv/bin/python ] && PY=.venv/bin/python
fi
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH="/tmp/site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"

failed=0
step() {  # step NAME SECONDS CMD...
  local name=$1 limit=$2; shift 2
  echo; echo "== $name (limit ${limit}s): $*"
  local t0=$SECONDS
  timeout --signal=TERM --kill-after=10 "$limit" "$@"
  local rc=$?
  echo "== $name: exit $rc after $((SECONDS - t0)) s"
  [ $rc -eq 0 ] || failed=$((failed + 1))
}

step environment 60 $PY - <<'EOF'
import importlib, shutil, subprocess, torch
if shutil.which("nvidia-smi"):
    print(subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True).stdout.strip())
print("torch", torch.__version__, "cuda", torch.version.cuda, "available", torch.cuda.is_available(),
      torch.cuda.get_device_name() if torch.cuda.is_available() else "")
for mod in ("triton", "nvidia.dali", "zstandard", "webdataset", "hypothesis", "apache_beam"):
    try:
        m = importlib.import_module(mod)
        print(f"{mod} {getattr(m, '__version__', 'ok')}")
    except ImportError as e:
        print(f"{mod} MISSING ({e})")
EOF
step "pytest -m gpu" 180 $PY -m pytest -m gpu -q -ra -p no:cacheprovider --continue-on-collection-errors \
  tests/unit/trainer/test_kernels.py tests/unit/loaders/test_images.py
step "bench_kernels (CUDA)" 90 $PY benchmarks/bench_kernels.py --skip-cpu --iters 10
step "bench_mfu" 120 $PY benchmarks/bench_mfu.py --steps 20
step "bench_images (DALI GPU line)" 90 $PY benchmarks/bench_images.py --images 512 --rounds 2 --threads 4
step "bench_mfu --compile" 150 $PY benchmarks/bench_mfu.py --steps 20 --compile

echo; echo "== gpu_check: $failed step(s) failed; log in $LOG"
exit $failed

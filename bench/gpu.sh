#!/usr/bin/env bash
# GPU check and benchmark (../shared/GPU.md): correctness of every Triton kernel at full size against a
# float64 reference, then medians (triton.testing.do_bench) of every public op and its peers.
# Trains a few steps on the GPU through the Triton backends (OUT/train.log), prints every loaded kernel's n_regs and
# n_spills, writes OUT/gpu.json and OUT/gpu.md and prints the table last. Must finish in < 8 minutes on an H200.
#   bash bench/gpu.sh OUT_DIR            (peers: wheels in .whl/, installed with --no-deps if present)
#   bash bench/gpu.sh OUT_DIR --smoke    (tiny shapes, CPU interpreter: checks the script's plumbing)
set -euo pipefail
out=${1:?usage: bench/gpu.sh OUT_DIR [--smoke]}
shift || true
mkdir -p "$out"
cd "$(dirname "$0")/.."
if [ -d .whl ] && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD:${PYTHONPATH:-}
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ "${1:-}" = "--smoke" ] && PY=.venv/bin/python
# A few training steps through the Triton backends (Mamba: the selective scan; S4D: ssm_kernel_diag), with bf16 autocast.
# (--smoke: the same command line on the CPU, which checks only its plumbing.)
dev="cuda --amp bf16 --steps 20"; layers="mamba s4d"
[ "${1:-}" = "--smoke" ] && dev="cpu --steps 2" && layers=mamba
: > "$out/train.log"
for layer in $layers; do
  if timeout 300 $PY -m ssm_course.train --device $dev --layer $layer --task selective_copying >> "$out/train.log" 2>&1; then
    echo "TRAIN OK ($layer)" | tee -a "$out/train.log"
  else echo "TRAIN FAILED ($layer)" | tee -a "$out/train.log"; fi
done
exec $PY bench/gpu.py --out "$out" "$@"

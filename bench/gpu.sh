#!/usr/bin/env bash
# GPU check and benchmark (../shared/GPU.md): correctness of every Triton kernel at full size against a float64
# reference, medians (triton.testing.do_bench) of every public op and its peers, a few training steps through the
# Triton backends, the scan kernels at other configurations, and every loaded kernel's n_regs and n_spills.
# Writes OUT/gpu.json, OUT/gpu.md and OUT/train.log after every section (a run stopped early keeps what it measured)
# and prints the table last. Sections that would start after the time budget (BENCH_SECONDS, default 450 s from the
# start of this script) are skipped and listed, so the whole run stays under 8 minutes on an H200.
#
#   bash bench/gpu.sh --wheels           on a machine with PyPI: download into .whl/ (gitignored, about 1.8 MB) the
#                                        pure-Python packages the GPU image lacks: fastcore and tqdm (needed
#                                        by ssm_course.train and ssm_course.bench), the peers accelerated-scan,
#                                        fla-core (+ einops), mambapy, and mamba-ssm, built here into a wheel without its
#                                        CUDA extension (MAMBA_SKIP_CUDA_BUILD=TRUE: its Triton kernels only; the build
#                                        imports torch, so it uses .venv/bin/python or $PYTHON), with packaging
#   bash bench/gpu.sh OUT_DIR            on the GPU machine (torch, Triton, numpy, pytest); .whl/*.whl, when present,
#                                        are unpacked into a temporary folder put on PYTHONPATH (no pip, no network).
#                                        Through the device tool: carry [".whl"] and give an absolute OUT_DIR ($OUT/...)
#   bash bench/gpu.sh OUT_DIR --smoke    tiny shapes in the CPU interpreter: checks the script's plumbing
# A GPU run is committed as bench/results/h200-YYYY-MM-DD.json and .md (copies of OUT/gpu.json and OUT/gpu.md), which
# notebook 14 renders.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
WHEELS="fastcore==2.2.41 tqdm==4.70.1 accelerated-scan==0.3.1 fla-core==0.6.0 einops==0.8.2 mambapy==1.2.0 packaging==26.4"
MAMBA_SSM="mamba-ssm==2.3.2.post1"
if [ "${1:-}" = "--wheels" ]; then
  mkdir -p "$root/.whl"
  BUILD_PY=${PYTHON:-python3}
  [ -x "$root/.venv/bin/python" ] && BUILD_PY=${PYTHON:-$root/.venv/bin/python}
  $BUILD_PY -m pip download -q --no-deps -d "$root/.whl" $WHEELS
  # mamba-ssm has no pure-Python wheel on PyPI: build one from its sdist without compiling CUDA (its setup.py would
  # otherwise fetch a prebuilt binary wheel matching this machine's torch and CUDA, or compile selective_scan_cuda)
  MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE $BUILD_PY -m pip wheel -q --no-deps --no-build-isolation -w "$root/.whl" $MAMBA_SSM
  ls -l "$root/.whl"
  exit 0
fi
out=${1:?usage: bench/gpu.sh OUT_DIR [--smoke] | bench/gpu.sh --wheels}
shift || true
mkdir -p "$out"
out=$(cd "$out" && pwd)  # absolute: the rest runs from the repository root
cd "$root"
export BENCH_DEADLINE=$(( $(date +%s) + ${BENCH_SECONDS:-450} ))
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] && [ "${1:-}" = "--smoke" ] && PY=.venv/bin/python
if ls .whl/*.whl >/dev/null 2>&1; then
  site=$(mktemp -d)
  trap 'rm -rf "$site"' EXIT
  $PY -c 'import glob, sys, zipfile; [zipfile.ZipFile(w).extractall(sys.argv[1]) for w in sorted(glob.glob(".whl/*.whl"))]' "$site"
  export PYTHONPATH=$site:${PYTHONPATH:-}
fi
export PYTHONPATH=$root:${PYTHONPATH:-}
$PY bench/gpu.py --out "$out" "$@"

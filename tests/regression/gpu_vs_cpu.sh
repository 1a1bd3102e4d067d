#!/usr/bin/env bash
# The GPU training path on a real GPU: 10 steps with hardware.device = cuda against the same
# steps on the CPU (per-step losses to RTOL, default 1e-5, gradient norms to GRAD_RTOL, default
# RTOL). Exits 77
# (skipped) when no GPU is visible, 1 when TESSERA_REQUIRE_GPU=1.
# usage: [RTOL=...] [GRAD_RTOL=...] gpu_vs_cpu.sh WORKDIR PYTHON TESSERA DECK [overrides...]
set -euo pipefail
work=$1 python=$2 tessera=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
if ! nvidia-smi -L > /dev/null 2>&1; then
  # TESSERA_REQUIRE_GPU=1 (bench/gpu-check): no GPU is a failure, not a skip.
  if [ "${TESSERA_REQUIRE_GPU:-0}" = 1 ]; then
    echo "gpu_vs_cpu: FAIL: TESSERA_REQUIRE_GPU=1 but no GPU visible"
    exit 1
  fi
  echo "gpu_vs_cpu: no GPU visible, skipped"
  exit 77
fi
rm -rf "$work" && mkdir -p "$work"
common=(--train.steps=10 --hardware.peak_flops=1e9 --output.echo_deck=false)
OMP_NUM_THREADS=1 "$tessera" "$@" "${common[@]}" --hardware.device=cpu \
  --output.dir="$work/cpu" > "$work/cpu.log"
"$tessera" "$@" "${common[@]}" --hardware.device=cuda --output.dir="$work/gpu" > "$work/gpu.log"
"$python" "$here/compare_runs.py" --rtol "${RTOL:-1e-5}" --grad-rtol "${GRAD_RTOL:-${RTOL:-1e-5}}" \
  "$work/cpu" "$work/gpu"

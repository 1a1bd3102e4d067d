#!/usr/bin/env bash
# Layout invariance: a run on NP ranks ran the layout it was asked for (check_layout.py) and
# reproduces the serial run's per-step losses and gradient norms (1e-5 relative) and its final
# weights (|W_np - W_serial| / |W_serial| <= 1e-5).
# usage: same_as_serial.sh WORKDIR SERIAL_DIR "MPIEXEC..." NP PYTHON TESSERA DECK [overrides...]
# SERIAL_DIR is the serial reference (serial_reference.sh): the same deck and overrides but for
# the parallel.* ones, micro-batches accumulated on one rank. SAME_RTOL (default 1e-5),
# SAME_GRAD_RTOL and SAME_WEIGHTS_RTOL (default SAME_RTOL) are the tolerances of the per-step
# losses, gradient norms and of the final weights for runs that round to 16 bits
# (train.precision = bf16 / fp16; doc/precision.md says why and by how much). SAME_FLOPS_RATIO,
# when set, bounds the GEMM FLOPs of all ranks together (gemm.json) over the serial run's: work
# that a layout splits must not be repeated on its ranks. SAME_MOE_STATS, when set, compares
# the experts' statistics of every step too (loads, drops, balancing and z-loss sums, the
# selection bias's range; compare_runs.py --moe-stats), at the losses' tolerance.
set -euo pipefail
work=$1 serial=$2 mpiexec=$3 np=$4 python=$5 tessera=$6
shift 6
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
OMP_NUM_THREADS=1 $mpiexec "$np" "$tessera" "$@" --output.dir="$work/np$np" \
  --hardware.peak_flops=1e9 --output.echo_deck=false > "$work/np$np.log"
grep -E "^gradient buckets" "$work/np$np.log" || true
"$python" "$here/check_layout.py" "$work/np$np" "$np" "$@"
if [ -n "${SAME_FLOPS_RATIO:-}" ]; then
  "$python" - "$work/np$np/gemm.json" "$serial/run/gemm.json" "$SAME_FLOPS_RATIO" <<'EOF'
import json, sys
ran, serial = (sum(json.load(open(p))["flops"].values()) for p in sys.argv[1:3])
bound = float(sys.argv[3])
print(f"gemm flops: {ran:.6g} over the ranks, {serial:.6g} serially, ratio {ran / serial:.4f} "
      f"(bound {bound}): {'WITHIN BOUND' if ran <= bound * serial else 'REPEATED WORK'}")
sys.exit(0 if ran <= bound * serial else 1)
EOF
fi
rtol=${SAME_RTOL:-1e-5}
stats=()
if [ -n "${SAME_MOE_STATS:-}" ]; then stats=(--moe-stats); fi
"$python" "$here/compare_runs.py" --rtol "$rtol" --grad-rtol "${SAME_GRAD_RTOL:-$rtol}" \
  ${stats[@]+"${stats[@]}"} "$serial/run" "$work/np$np"
final=$(cd "$serial/run/checkpoints" && ls ckpt-*.h5 | tail -1)
"$python" "$here/../../tools/tessera-ckpt" diff --prefix params/ --norm-rtol "${SAME_WEIGHTS_RTOL:-$rtol}" \
  "$work/np$np/checkpoints/$final" "$serial/run/checkpoints/$final" | sed 's/^diff:/weights:/'

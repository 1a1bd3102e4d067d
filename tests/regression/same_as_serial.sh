#!/usr/bin/env bash
# Layout invariance: a run on NP ranks reproduces the serial run's per-step losses (1e-5
# relative) and gradient norms, and its final weights (|W_np - W_serial| / |W_serial| <= 1e-5).
# usage: same_as_serial.sh WORKDIR "MPIEXEC..." NP PYTHON TESSERA DECK [overrides...]
# The serial run uses the same deck and overrides with micro-batches accumulated on one rank.
# SAME_RTOL (default 1e-5) and SAME_WEIGHTS_RTOL (default SAME_RTOL) loosen the tolerances of
# the per-step values and of the final weights for runs that round to 16 bits
# (train.precision = bf16 / fp16; doc/precision.md says why and by how much).
set -euo pipefail
work=$1 mpiexec=$2 np=$3 python=$4 tessera=$5
shift 5
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
# The serial reference is the plain run: parallel.* settings apply to the NP-rank run only,
# but for the two that define the model's routing (node-limited routing, doc/moe.md).
serial_args=()
for a in "$@"; do
  [[ $a == --parallel.* && $a != --parallel.ep_max_nodes=* && $a != --parallel.ep_nodes=* ]] ||
    serial_args+=("$a")
done
OMP_NUM_THREADS=1 "$tessera" "${serial_args[@]}" --output.dir="$work/serial" --hardware.peak_flops=1e9 \
  --output.echo_deck=false > "$work/serial.log"
OMP_NUM_THREADS=1 $mpiexec "$np" "$tessera" "$@" --output.dir="$work/np$np" \
  --hardware.peak_flops=1e9 --output.echo_deck=false > "$work/np$np.log"
grep -E "^gradient buckets" "$work/np$np.log" || true
rtol=${SAME_RTOL:-1e-5}
"$python" "$here/compare_runs.py" --rtol "$rtol" "$work/serial" "$work/np$np"
final=$(cd "$work/serial/checkpoints" && ls ckpt-*.h5 | tail -1)
"$python" "$here/../../tools/tessera-ckpt" diff --prefix params/ --norm-rtol "${SAME_WEIGHTS_RTOL:-$rtol}" \
  "$work/np$np/checkpoints/$final" "$work/serial/checkpoints/$final" | sed 's/^diff:/weights:/'

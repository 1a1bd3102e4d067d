#!/usr/bin/env bash
# The same run twice gives the same bits (doc/kokkos.md, "Determinism"): with 2 OpenMP threads
# per rank, so that the kernels' parallel reductions are in play, every step's loss and
# gradient norm and every tensor of the final checkpoint (parameters and Adam moments) agree
# exactly between two runs of one deck and layout.
# usage: repeat_same.sh WORKDIR "MPIEXEC..." NP PYTHON TESSERA DECK [overrides...]
set -euo pipefail
work=$1 mpiexec=$2 np=$3 python=$4 tessera=$5
shift 5
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
for name in first second; do
  # Passive waits: 2 threads per rank oversubscribe the machine when several ranks share it,
  # and spinning threads would stall each other (the bits do not depend on it).
  OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive $mpiexec "$np" "$tessera" "$@" --hardware.threads=2 \
    --output.dir="$work/$name" --hardware.peak_flops=1e9 --output.echo_deck=false \
    > "$work/$name.log"
done
"$python" "$here/compare_runs.py" --rtol 0 "$work/first" "$work/second" | tail -1
final=$(cd "$work/first/checkpoints" && ls ckpt-*.h5 | tail -1)
"$python" "$here/../../tools/tessera-ckpt" diff "$work/first/checkpoints/$final" \
  "$work/second/checkpoints/$final" | tail -1

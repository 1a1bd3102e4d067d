#!/usr/bin/env bash
# DualPipe's paired overlap changes when the experts' all-to-alls travel, never results
# (doc/pipeline.md, "Paired overlap"): on one dualpipev layout with experts, the run whose
# pairs run interleaved (parallel.pp_pair_overlap = true) reproduces the run whose pairs run one
# pass after the other exactly: every step's loss, gradient norm and experts' statistics, and
# every tensor of the final checkpoint, bit for bit. The interleaved run must have interleaved
# (its summary's paired-overlap line, with transfers that travelled while the other
# micro-batch computed), or the comparison would be of the sequential run with itself.
# usage: pair_overlap_same.sh WORKDIR "MPIEXEC..." NP PYTHON TESSERA DECK [overrides...]
set -euo pipefail
work=$1 mpiexec=$2 np=$3 python=$4 tessera=$5
shift 5
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
run() {  # NAME overrides...
  local name=$1
  shift
  OMP_NUM_THREADS=1 $mpiexec "$np" "$tessera" "$@" --output.dir="$work/$name" \
    --hardware.peak_flops=1e9 --output.echo_deck=false > "$work/$name.log"
}
run sequential "$@" --parallel.pp_pair_overlap=false
run interleaved "$@" --parallel.pp_pair_overlap=true
grep -h "paired overlap: off" "$work/sequential.log"
line=$(grep -h "paired overlap: on" "$work/interleaved.log" || true)
echo "$line"
crossed=$(sed -n 's/.* \([0-9][0-9]*\) expert transfers travelled.*/\1/p' <<< "$line")
echo "interleaved: $([[ -n $crossed && $crossed -gt 0 ]] && echo RAN || echo 'DID NOT RUN')"
final=$(cd "$work/sequential/checkpoints" && ls ckpt-*.h5 | tail -1)
echo "== interleaved vs sequential"
"$python" "$here/compare_runs.py" --rtol 0 --moe-stats "$work/sequential" "$work/interleaved" |
  tail -1
"$python" "$here/../../tools/tessera-ckpt" diff "$work/sequential/checkpoints/$final" \
  "$work/interleaved/checkpoints/$final" | tail -1

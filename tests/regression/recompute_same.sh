#!/usr/bin/env bash
# Activation recompute changes memory, never results: on one layout, runs with
# train.recompute = selective, full and full with train.recompute_layers = 2 reproduce the
# run without recompute exactly (every step's loss and gradient norm, with experts their
# statistics, and every tensor of the final checkpoint, parameters and Adam moments, bit for
# bit), while keeping fewer activation bytes; without a pipeline the measured activations equal tessera's formula to the byte
# (perf/memory.hpp; pipelines are checked by plan_validate_tessera). With tensor parallelism,
# selective adds no collective and full adds its rerun forwards' collectives.
# usage: recompute_same.sh WORKDIR "MPIEXEC..." NP PYTHON TESSERA DECK [overrides...]
set -euo pipefail
work=$1 mpiexec=$2 np=$3 python=$4 tessera=$5
shift 5
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
pipeline=0
for a in "$@"; do [[ $a == --parallel.pp=1 || $a != --parallel.pp=* ]] || pipeline=1; done
run() {  # NAME overrides...
  local name=$1
  shift
  OMP_NUM_THREADS=1 $mpiexec "$np" "$tessera" "$@" --output.dir="$work/$name" \
    --hardware.peak_flops=1e9 --output.echo_deck=false > "$work/$name.log"
}
activations() {  # DIR -> "measured formula"
  "$python" -c 'import json,sys; m=json.load(open(sys.argv[1]+"/memory.json"))
print(int(m["peak"]["activations"]), int(m["activations_formula"]))' "$1"
}
tp_calls() {  # LOG -> calls of the tensor-parallel group on rank 0 (0 without one)
  awk '$1 == "group" && $2 == "calls" {table = 1}
       table && $1 == "tp" {print $2; found = 1; exit} END {if (!found) print 0}' "$1"
}
run none "$@" --train.recompute=none
# With experts, their statistics too: a rerun forward must not count its tokens again.
stats=()
if grep -q '"moe"' "$work/none/metrics.jsonl"; then stats=(--moe-stats); fi
read -r base base_formula < <(activations "$work/none")
bad=0
final=$(cd "$work/none/checkpoints" && ls ckpt-*.h5 | tail -1)
for mode in selective full full_layers2; do
  case $mode in
    full_layers2) args=(--train.recompute=full --train.recompute_layers=2) ;;
    *) args=(--train.recompute=$mode) ;;
  esac
  run "$mode" "$@" "${args[@]}"
  echo "== $mode vs none"
  "$python" "$here/compare_runs.py" --rtol 0 ${stats[@]+"${stats[@]}"} "$work/none" "$work/$mode" | tail -1
  "$python" "$here/../../tools/tessera-ckpt" diff "$work/none/checkpoints/$final" \
    "$work/$mode/checkpoints/$final" | tail -1
  read -r got formula < <(activations "$work/$mode")
  verdict=ok
  if (( got >= base )); then verdict="NOT LOWER"; bad=1; fi
  if (( ! pipeline && got != formula )); then verdict="FORMULA $formula"; bad=1; fi
  echo "activations $mode: $got B vs none $base B ($(( 100 * got / base ))%): $verdict"
  # Selective reruns no collective; full reruns each recomputed block's forward collectives.
  calls=$(tp_calls "$work/$mode.log") base_calls=$(tp_calls "$work/none.log")
  verdict=ok
  if [[ $mode == selective ]] && (( calls != base_calls )); then verdict=WRONG; bad=1; fi
  if [[ $mode != selective ]] && (( base_calls > 0 && calls <= base_calls )); then verdict=WRONG; bad=1; fi
  echo "tensor-parallel calls $mode: $calls vs none $base_calls: $verdict"
done
if (( ! pipeline && base != base_formula )); then echo "none: formula $base_formula"; bad=1; fi
echo "recompute memory: $([[ $bad == 0 ]] && echo LOWER || echo WRONG)"

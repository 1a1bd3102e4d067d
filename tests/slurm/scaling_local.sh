#!/usr/bin/env bash
# tools/scaling-study over 1, 2 and 4 ranks here (mpirun, two rounds), then its report
# checked against the runs' own metrics (scaling_check.py); then over 2 and 4 ranks with
# pipeline parallelism (pp 2), where the bubble is measured.
# usage: scaling_local.sh WORKDIR "MPIEXEC PREFLAGS" TESSERA DECK [--section.key=value ...]
set -euo pipefail
work=$1 mpiexec=$2 tessera=$3 deck=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work"
"$here/../../tools/scaling-study" "$deck" --ranks 1,2,4 --steps 10 --warmup 3 --repeats 2 \
  --tessera "$tessera" --mpirun "$mpiexec" --out "$work" -- "$@"
"$here/scaling_check.py" "$work" 1,2,4
# With pipeline parallelism (pp 2 at 2 and 4 ranks, 4 micro-batches): the bubble column.
"$here/../../tools/scaling-study" "$deck" --ranks 2,4 --steps 8 --warmup 3 --weak-accum 4 \
  --global-batch 32 --tessera "$tessera" --mpirun "$mpiexec" --out "$work/pp2" -- "$@" \
  --parallel.pp=2 --train.micro_batch=4
"$here/scaling_check.py" "$work/pp2" 2,4 | sed 's/^/pp 2: /'

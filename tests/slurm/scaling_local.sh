#!/usr/bin/env bash
# tools/scaling-study over 1, 2 and 4 ranks here (mpirun, two rounds), then its report
# checked against the runs' own metrics (scaling_check.py).
# usage: scaling_local.sh WORKDIR "MPIEXEC PREFLAGS" TESSERA DECK [--section.key=value ...]
set -euo pipefail
work=$1 mpiexec=$2 tessera=$3 deck=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work"
"$here/../../tools/scaling-study" "$deck" --ranks 1,2,4 --steps 10 --warmup 3 --repeats 2 \
  --tessera "$tessera" --mpirun "$mpiexec" --out "$work" -- "$@"
"$here/scaling_check.py" "$work" 1,2,4

#!/usr/bin/env bash
# 20 steps straight vs 10 steps + resume + 10: identical per-step losses bit for bit and
# identical final checkpoints. usage: restart_exact.sh WORKDIR "LAUNCH" TESSERA DECK [overrides]
# LAUNCH is empty for a serial run or e.g. "mpiexec ... -n 2".
set -euo pipefail
work=$1 launch=$2 tessera=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
tools=$here/../../tools
rm -rf "$work" && mkdir -p "$work"
run() { OMP_NUM_THREADS=1 $launch "$tessera" "$@" --train.steps=20 --checkpoint.every=5 \
          --hardware.peak_flops=1e9 --output.echo_deck=false; }
run "$@" --output.dir="$work/straight" > "$work/straight.log"
run "$@" --output.dir="$work/split" --train.exit_after=10 > "$work/split1.log"
run "$@" --output.dir="$work/split" --checkpoint.resume=latest > "$work/split2.log"
grep -q "resumed from .*ckpt-00000010.h5" "$work/split2.log"
"$here/compare_runs.py" --rtol 0 "$work/straight" "$work/split" | tail -1
"$tools/tessera-ckpt" diff "$work/straight/checkpoints/ckpt-00000020.h5" \
  "$work/split/checkpoints/ckpt-00000020.h5" | tail -1

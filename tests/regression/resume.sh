#!/usr/bin/env bash
# Saved on layout A, resumed on layout B, continues like the uninterrupted run on layout A:
# 20 steps straight vs 10 steps on A + resume + 10 steps on B. With RTOL 0 (same layout) the
# per-step losses and the final checkpoints must be identical bit for bit; otherwise losses
# agree to RTOL and final tensors to TENSOR_TOL (absolute + relative).
# usage: [ARGS_B="..."] resume.sh WORKDIR "LAUNCH_A" "LAUNCH_B" RTOL TESSERA DECK [overrides]
# A launch is empty for a serial run or e.g. "mpiexec ... -n 2". ARGS_B adds overrides for
# layout B only (e.g. another ZeRO stage).
set -euo pipefail
work=$1 launch_a=$2 launch_b=$3 rtol=$4 tessera=$5
shift 5
here=$(cd "$(dirname "$0")" && pwd)
tools=$here/../../tools
rm -rf "$work" && mkdir -p "$work"
run() { local launch=$1; shift; OMP_NUM_THREADS=1 $launch "$tessera" "$@" --train.steps=20 \
          --checkpoint.every=5 --hardware.peak_flops=1e9 --output.echo_deck=false; }
run "$launch_a" "$@" --output.dir="$work/straight" > "$work/straight.log"
run "$launch_a" "$@" --output.dir="$work/split" --train.exit_after=10 > "$work/split1.log"
# shellcheck disable=SC2086  # ARGS_B is a list of words
run "$launch_b" "$@" ${ARGS_B:-} --output.dir="$work/split" --checkpoint.resume=latest > "$work/split2.log"
grep -q "resumed from .*ckpt-00000010.h5" "$work/split2.log"
"$here/compare_runs.py" --rtol "$rtol" "$work/straight" "$work/split" | tail -1
a=$work/straight/checkpoints/ckpt-00000020.h5 b=$work/split/checkpoints/ckpt-00000020.h5
if [ "$rtol" = 0 ]; then
  "$tools/tessera-ckpt" diff "$a" "$b" | tail -1
else
  "$tools/tessera-ckpt" diff --atol 1e-6 --rtol 1e-3 "$a" "$b" | tail -1
fi

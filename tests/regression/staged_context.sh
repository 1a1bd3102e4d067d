#!/usr/bin/env bash
# Staged long-context training (doc/parallelism.md, "Long context in stages"): a llama run
# trained at a short sequence on one rank resumes at a 4x longer sequence with cp = 4 (and a
# larger rope_theta); the long stage reproduces the same resume on one rank (losses to 1e-5,
# final weights to 1e-5) and keeps learning (its loss falls below the first long step's).
# usage: staged_context.sh WORKDIR "MPIEXEC... -np" PYTHON TESSERA DECK [overrides...]
set -euo pipefail
work=$1 mpiexec=$2 python=$3 tessera=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
common=(--hardware.peak_flops=1e9 --output.echo_deck=false --checkpoint.every=10)
# Stage 1: 64 tokens, one rank, 10 steps.
OMP_NUM_THREADS=1 "$tessera" "$@" "${common[@]}" --model.seq_len=64 --train.steps=10 \
  --output.dir="$work/short" > "$work/short.log"
# Stage 2: 256 tokens, rope_theta 40000, from the stage-1 checkpoint: on 1 rank and on cp 4.
long=(--model.seq_len=256 --model.rope_theta=40000 --train.steps=16 --checkpoint.resume=latest)
for run in serial cp4; do
  mkdir -p "$work/$run/checkpoints"
  cp "$work/short/checkpoints/"ckpt-00000010.h5 "$work/$run/checkpoints/"
  echo ckpt-00000010.h5 > "$work/$run/checkpoints/latest"
done
OMP_NUM_THREADS=1 "$tessera" "$@" "${common[@]}" "${long[@]}" --output.dir="$work/serial" \
  > "$work/serial.log"
OMP_NUM_THREADS=1 $mpiexec 4 "$tessera" "$@" "${common[@]}" "${long[@]}" --parallel.cp=4 \
  --output.dir="$work/cp4" > "$work/cp4.log"
grep -q "resumed from .*ckpt-00000010.h5" "$work/cp4.log"
"$python" "$here/compare_runs.py" --rtol 1e-5 "$work/serial" "$work/cp4" | tail -1
"$python" "$here/../../tools/tessera-ckpt" diff --prefix params/ --norm-rtol 1e-5 \
  "$work/cp4/checkpoints/ckpt-00000016.h5" "$work/serial/checkpoints/ckpt-00000016.h5" | tail -1
"$python" - "$work/cp4/metrics.jsonl" <<'PY'
import json, sys
losses = [json.loads(l)["loss"] for l in open(sys.argv[1]) if l.strip()]
print(f"long stage: steps 11..16, loss {losses[0]:.4f} -> {losses[-1]:.4f}: "
      + ("LEARNS" if losses[-1] < losses[0] else "DOES NOT LEARN"))
PY

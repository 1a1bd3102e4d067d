#!/usr/bin/env bash
# A dataset truncated while a run reads it: the run notices at its next step (the file's size
# and modification time), drops that step, writes a checkpoint of the last good one and stops
# with one error line; that checkpoint is intact.
# usage: data_changed.sh WORKDIR BASE TESSERA DECK CKPT_TOOL
set -uo pipefail
work=$1 base=$2 tessera=$3 deck=$4 tool=$5
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
cp "$base/data.h5" data.h5
OMP_NUM_THREADS=1 timeout 120 "$tessera" "$deck" --data.path=data.h5 --output.dir=out \
  --hardware.peak_flops=1e9 --train.steps=100000000 --checkpoint.every=0 > run.log 2>&1 &
pid=$!
for _ in $(seq 1 600); do  # until the run has logged a few steps
  [ "$(cat out/metrics.jsonl 2>/dev/null | wc -l)" -ge 3 ] && break
  sleep 0.1
done
truncate -s -4096 data.h5
wait $pid
status=$?
grep "error" run.log
echo "exit status $status"
[ "$status" -ne 0 ] && [ "$status" -ne 124 ] || { tail run.log; echo "changed: FAIL"; exit 1; }
[ "$(grep -c error run.log)" -eq 1 ] || { echo "changed: FAIL (not one error line)"; exit 1; }
step=$(sed -n 's/.*stopped with the checkpoint of step \([0-9]*\).*/\1/p' run.log)
[ -n "$step" ] || { echo "changed: FAIL (no checkpoint named)"; exit 1; }
/usr/bin/python3 "$tool" verify "out/checkpoints/$(printf 'ckpt-%08d.h5' "$step")" | tail -n 1

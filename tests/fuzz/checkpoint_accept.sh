#!/usr/bin/env bash
# What the checkpoint checks must still accept, each on copies of fuzz_base's run:
#  overwrite  checkpoint.overwrite = true replaces another run's checkpoints once this run has
#             written one, and keeps them all when it fails before that;
#  sample     tessera-sample loads a checkpoint written with another global batch;
#  done       resuming a run that already reached train.steps says so and exits 0;
#  skip       train.on_nonfinite = skip drops one NaN step and the run finishes, its last
#             checkpoint finite and intact, metrics.jsonl still JSON (null for its loss).
# usage: checkpoint_accept.sh WORKDIR BASE TESSERA TESSERA_SAMPLE DECK CKPT_TOOL
set -uo pipefail
work=$1 base=$2 tessera=$3 sample=$4 deck=$5 tool=$6
export OMP_NUM_THREADS=1
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
fail() { echo "accept: FAIL: $*"; exit 1; }
fresh() { rm -rf ck out && cp -a "$base/run/checkpoints" ck; }
run() { timeout 120 "$tessera" "$deck" --data.path="$base/data.h5" --output.dir=out \
          --checkpoint.dir=ck --hardware.peak_flops=1e9 "$@"; }

fresh
run --checkpoint.overwrite=true --train.steps=2 > overwrite.log 2>&1 || fail "overwrite run"
[ "$(ls ck)" = "$(printf 'ckpt-00000002.h5\nlatest')" ] || fail "overwrite left: $(ls ck | tr '\n' ' ')"
[ "$(cat ck/latest)" = ckpt-00000002.h5 ] || fail "latest names $(cat ck/latest)"
echo "overwrite: replaced by ckpt-00000002.h5"
fresh
sums=$(sha256sum ck/*)
TESSERA_FAULT_INJECT=nonfinite-at-step-1 run --checkpoint.overwrite=true --train.steps=2 \
  > overwrite-fails.log 2>&1 && fail "overwrite run with a NaN step exited 0"
[ "$(sha256sum ck/*)" = "$sums" ] || fail "a failed overwrite run changed the checkpoints"
echo "overwrite: failed run kept all of them"

fresh
timeout 60 "$sample" "$deck" --data.path="$base/data.h5" --checkpoint.dir=ck \
  --checkpoint.resume=latest --train.global_batch=4 --sample.length=8 --sample.prompt=line \
  > sample.log 2>&1 || { cat sample.log; fail "tessera-sample with another global batch"; }
grep -q -- "--- sample (step 6" sample.log || fail "no sample"
echo "sample: a checkpoint of another global batch accepted"

run --checkpoint.resume=latest --train.steps=3 > done.log 2>&1 || { cat done.log; fail "resume past train.steps"; }
grep -q "the checkpoint is at step 6 and train.steps = 3: nothing to train" done.log || fail "no 'nothing to train'"
! grep -q "over steps" done.log || fail "a summary of no steps"
echo "done: nothing to train"

fresh
TESSERA_FAULT_INJECT=nonfinite-at-step-8 run --checkpoint.resume=latest --train.steps=12 \
  --train.on_nonfinite=skip > skip.log 2>&1 || { tail skip.log; fail "skip run"; }
grep -q "step 8: the loss is -\?nan .*update skipped (1 in a row, 1 in all" skip.log || fail "step 8 not skipped"
grep -q "step     12/12" skip.log || fail "did not reach step 12"
/usr/bin/python3 "$tool" verify ck/ckpt-00000012.h5 | tail -n 1
# metrics.jsonl stays JSON: the skipped step's loss is null (JSON has no NaN)
/usr/bin/python3 -c "import json; rows = [json.loads(l) for l in open('out/metrics.jsonl')]; print('metrics: step 8 loss', [r['loss'] for r in rows if r['step'] == 8][0])" || fail "metrics.jsonl is not JSON"
echo "skip: one step dropped, run finished"

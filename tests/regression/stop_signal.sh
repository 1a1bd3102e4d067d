#!/usr/bin/env bash
# A signal to one rank stops every rank after the same step with a checkpoint and exit status
# 75; the resumed run completes (OUTPUT_DIR/COMPLETED) with the losses and final weights of an
# uninterrupted run. First SIGTERM to the last rank only (the ranks must agree), then SIGUSR1
# to the launcher (mpiexec passes it to every rank). The model is big enough that a signal
# can land inside oneDNN's AVX-512 GEMM, which corrupts the heap when the signal is taken on
# that thread (oneDNN issue 4845; tessera takes it on a helper thread).
# usage: stop_signal.sh WORKDIR "MPIEXEC ... -n" TESSERA DECK [overrides]
set -euo pipefail
work=$1 mpiexec=$2 tessera=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$work" && mkdir -p "$work"
steps=120
fail() { echo "FAIL: $*"; exit 1; }
run() {  # run OUT_DIR [more overrides]: 2 ranks in the background; sets $pid (the launcher)
  local out=$1
  shift
  # shellcheck disable=SC2086  # mpiexec is a command line
  OMP_NUM_THREADS=1 $mpiexec 2 "$tessera" "$@" --train.steps=$steps --checkpoint.every=50 \
    --hardware.peak_flops=1e9 --output.echo_deck=false --output.log_every=20 \
    --output.dir="$out" --checkpoint.resume=latest > "$out.log" 2>&1 &
  pid=$!
}
last_step() { { tail -1 "$1/metrics.jsonl" 2>/dev/null || true; } | sed -n 's/^{"step": \([0-9]*\),.*/\1/p'; }
wait_step() {  # wait_step OUT_DIR N: until the run's metrics reach step N
  local t=0
  until [ "$(last_step "$1")" -ge "$2" ] 2>/dev/null; do
    kill -0 "$pid" 2>/dev/null || fail "run ended before step $2"
    sleep 0.1
    t=$((t + 1))
    [ $t -lt 1800 ] || fail "no step $2 within 180 s"
  done
}
finish() {  # finish EXPECTED_STATUS
  local rc=0
  wait "$pid" || rc=$?
  [ "$rc" = "$1" ] || fail "exit status $rc, expected $1"
}

run "$work/straight" "$@"
finish 0

# 1. SIGTERM to one rank (the last child of the launcher)
run "$work/split" "$@"
wait_step "$work/split" 20
rank=$(pgrep -P "$pid" | tail -1)
[ -n "$rank" ] || fail "no rank process under the launcher"
kill -TERM "$rank"
finish 75
k1=$(sed -n 's/^stopped by SIGTERM after step \([0-9]*\):.*/\1/p' "$work/split.log")
[ -n "$k1" ] || fail "no 'stopped by SIGTERM' line"
[ -f "$work/split/checkpoints/ckpt-$(printf %08d "$k1").h5" ] || fail "no checkpoint at step $k1"
[ ! -e "$work/split/COMPLETED" ] || fail "a stopped run is marked complete"
echo "SIGTERM to one rank: all stopped after step $k1, exit status 75, checkpoint written"

# 2. SIGUSR1 to the launcher
mv "$work/split.log" "$work/split-1.log"
run "$work/split" "$@"
wait_step "$work/split" $((k1 + 20))
kill -USR1 "$pid"
finish 75
k2=$(sed -n 's/^stopped by SIGUSR1 after step \([0-9]*\):.*/\1/p' "$work/split.log")
[ -n "$k2" ] || fail "no 'stopped by SIGUSR1' line"
grep -q "resumed from .*ckpt-$(printf %08d "$k1").h5" "$work/split.log" || fail "not resumed from $k1"
echo "SIGUSR1 to the launcher: stopped after step $k2, exit status 75"

# 3. to the end
mv "$work/split.log" "$work/split-2.log"
run "$work/split" "$@"
finish 0
grep -q "resumed from .*ckpt-$(printf %08d "$k2").h5" "$work/split.log" || fail "not resumed from $k2"
grep -qx "step $steps" "$work/split/COMPLETED" || fail "no completion marker"
echo "resumed to step $steps: COMPLETED"
"$here/compare_runs.py" --rtol 0 "$work/straight" "$work/split" | tail -1
final=checkpoints/ckpt-$(printf %08d $steps).h5
"$here/../../tools/tessera-ckpt" diff "$work/straight/$final" "$work/split/$final" | tail -1

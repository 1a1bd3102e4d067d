#!/usr/bin/env bash
# The communication monitor (output.comm_warn_share): 2 data-parallel ranks of the tiny deck (one
# thread each: every step ends in a gradient all-reduce that also waits for the slower rank)
# with the threshold at 1% must warn, on the progress line and in the summary, naming the dp
# group; at 100% (never exceeded: collectives are part of the step) and on one rank (no
# collectives) it must not.
# usage: comm_monitor.sh WORKDIR BASE TESSERA DECK MPIEXEC [FLAGS...] (everything before the program)
set -uo pipefail
work=$1 base=$2 tessera=$3 deck=$4
shift 4
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
cp "$base/data.h5" data.h5
export OMP_NUM_THREADS=1
fail() { echo "comm: FAIL: $*"; tail -n 30 run.log; exit 1; }
train() {  # train OUT ARGS...
  local out=$1
  shift
  timeout -k 5 120 "$@" "$deck" --data.path=data.h5 --output.dir="$out" --hardware.peak_flops=1e9 \
    --train.steps=12 --checkpoint.every=0 --checkpoint.at_end=false > run.log 2>&1 ||
    fail "exit status $?"
}
train warn "$@" "$tessera" --output.comm_warn_share=0.01
grep -qE "^step +12/12 .*\| comm [0-9]+% > 1% \(dp\)$" run.log || fail "no warning on the progress line"
grep -qE "^communication: WARNING: [0-9.]+% of the steady-state step time in collectives .*above output.comm_warn_share = 1%; the dp group dominates .* over 11 steady steps\): the gradient reduction" run.log ||
  fail "no warning in the summary"
echo "comm: warned: $(grep '^communication' run.log)"
train quiet "$@" "$tessera" --output.comm_warn_share=1
grep -q "| comm\|WARNING" run.log && fail "a warning at output.comm_warn_share = 1"
grep -qE "^communication: [0-9.]+% of the steady-state step time in collectives .* the warning is above 100%" run.log ||
  fail "no communication line in the summary"
echo "comm: quiet at 1: $(grep '^communication' run.log)"
train serial "$tessera"
grep -q "| comm\|WARNING" run.log && fail "a warning on one rank"
echo "comm: quiet serial: $(grep '^communication' run.log)"
cd / && rm -rf "$work"

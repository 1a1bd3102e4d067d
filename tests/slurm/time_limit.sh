#!/usr/bin/env bash
# The real pre-time-limit signal: a train.sbatch job submitted with --time=1 and
# --signal=B:USR1@45 (the signal comes 15-45 s after the start: Slurm checks time limits
# periodically) is stopped with a checkpoint, requeues itself and resumes from that
# checkpoint; the test then cancels it (the run is endless).
# usage: time_limit.sh WORKDIR TESSERA DECK [--section.key=value ...]
set -euo pipefail
mkdir -p "$1"
work=$(cd "$1" && pwd) tessera=$2 deck=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
. "$here/cluster.sh"
fail() { echo "FAIL: $*"; [ -n "${log:-}" ] && [ -f "$log" ] && tail -30 "$log"; exit 1; }

cluster_start "$work/cluster" 4
run=$work/run
rm -rf "$run" && mkdir -p "$run"
cd "$run"
id=$(sbatch --parsable -n 4 --time=1 --signal=B:USR1@45 --output="$run/job-%j.out" \
       --export=ALL,TESSERA_BIN="$tessera",OMPI_MCA_mpi_yield_when_idle=1 \
       "$here/../../jobscripts/train.sbatch" "$deck" "$@" --train.steps=100000000 \
       --hardware.peak_flops=1e9 --output.echo_deck=false --output.log_every=1000 \
       --output.dir="$run/out")
log=$run/job-$id.out
echo "submitted job $id (time limit 1 min, SIGUSR1 to the batch shell 45 s before it)"
t=0
until grep -q "^resumed from" "$log" 2>/dev/null && [ "$(job_state "$id")" = RUNNING ]; do
  sleep 1
  t=$((t + 1))
  [ $t -lt 200 ] || fail "no stop and resume within 200 s (state $(job_state "$id"))"
done
scancel "$id"
job_wait "$id" 60 >/dev/null || true
k=$(sed -n 's/^stopped by SIGUSR1 after step \([0-9]*\):.*/\1/p' "$log" | head -1)
[ -n "$k" ] || fail "no 'stopped by SIGUSR1'"
grep -q "received SIGUSR1" "$log" || fail "the batch shell did not get SIGUSR1"
grep -q "requeueing job $id" "$log" || fail "no self-requeue"
grep -q "(restart 1)" "$log" || fail "no restart"
grep -q "resumed from .*ckpt-$(printf %08d "$k").h5: $k steps done" "$log" || fail "not resumed from step $k"
echo "time limit: SIGUSR1 before the limit, stopped after step $k with a checkpoint," \
     "requeued itself, resumed from ckpt-$(printf %08d "$k").h5"
echo "slurm time limit: PASS"

#!/usr/bin/env bash
# A train.sbatch job interrupted twice finishes with the losses of an uninterrupted run:
#   1. `scontrol requeue` mid-run: Slurm sends SIGTERM to the ranks (which checkpoint the
#      step in progress and stop) and to srun (which asks for SIGKILL of the ranks), then
#      SIGKILL after KillWait; so the run is stopped with a checkpoint at its step, or killed
#      before it; the requeued job must resume from the newest checkpoint written (at the
#      stop, or the periodic one before);
#   2. SIGUSR1 to the batch shell, as `#SBATCH --signal=B:USR1@T` sends it before the time
#      limit (here sent at once with `scancel --batch --signal=USR1`): tessera checkpoints the
#      step and exits 75, the script requeues the job itself, it resumes from exactly that
#      checkpoint and completes.
# The reference is the same run (4 ranks, same deck) launched straight with mpiexec; a step
# that ran twice (after a kill) counts with its last record.
# usage: requeue.sh WORKDIR "MPIEXEC ... -n" TESSERA DECK [--section.key=value ...]
set -euo pipefail
mkdir -p "$1"
work=$(cd "$1" && pwd) mpiexec=$2 tessera=$3 deck=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)
script=$here/../../jobscripts/train.sbatch
. "$here/cluster.sh"

fail() { echo "FAIL: $*"; [ -n "${log:-}" ] && [ -f "$log" ] && tail -40 "$log"; exit 1; }
steps=400
common=(--train.steps=$steps --checkpoint.every=50 --hardware.peak_flops=1e9
        --output.echo_deck=false --output.log_every=100)

rm -rf "$work/run" && mkdir -p "$work/run"
run=$work/run
cd "$run"

cluster_start "$work/cluster" 4
id=$(sbatch --parsable -n 4 --output="$run/job-%j.out" \
       --export=ALL,TESSERA_BIN="$tessera",OMPI_MCA_mpi_yield_when_idle=1 \
       "$script" "$deck" "$@" "${common[@]}" --output.dir="$run/out")
log=$run/job-$id.out
echo "submitted job $id"

last_step() { { tail -1 "$run/out/metrics.jsonl" 2>/dev/null || true; } | sed -n 's/^{"step": \([0-9]*\),.*/\1/p'; }
restarts() { job_field "$id" Restarts; }
# Waits until the job has run (restart $1) and its metrics reach step $2.
wait_progress() {
  local t=0 s
  while :; do
    s=$(last_step)
    if [ "$(restarts)" = "$1" ] && [ "$(job_state "$id")" = RUNNING ] && [ "${s:-0}" -ge "$2" ]; then
      return 0
    fi
    [ "$(job_state "$id")" = COMPLETED ] && fail "job completed before it could be interrupted (restart $1, step ${s:-0})"
    sleep 0.2
    t=$((t + 1))
    [ $t -lt 900 ] || fail "no progress to step $2 (restart $1, state $(job_state "$id"), step ${s:-0})"
  done
}

# 1. scontrol requeue at step >= 60
wait_progress 0 60
echo "at step $(last_step): scontrol requeue $id"
scontrol requeue "$id"
# 2. the pre-time-limit signal, at 60 steps past the first stop
wait_progress 1 $(( $(last_step) + 60 ))
echo "restart 1 at step $(last_step): scancel --batch --signal=USR1 $id"
scancel --batch --signal=USR1 "$id"

state=$(job_wait "$id" 170) || fail "job $id: $state"
[ "$state" = COMPLETED ] || fail "job $id ended $state"
[ "$(restarts)" = 2 ] || fail "job $id restarted $(restarts) times, not 2"
echo "job $id: $state after $(restarts) restarts"

# Stop 1: a checkpoint at the stop, or killed; either way the resume is from the newest
# checkpoint there was (the stop's, or the last periodic one: steps are multiples of 50).
part1=$(awk '/\(restart 1\)/ {exit} {print}' "$log")
part2=$(awk '/\(restart 1\)/ {p = 1} /\(restart 2\)/ {exit} p' "$log")
r1=$(sed -n 's/^resumed from .*ckpt-0*\([0-9]*\)\.h5:.*/\1/p' <<< "$part2")
[ -n "$r1" ] || fail "restart 1 did not resume from a checkpoint"
k1=$(sed -n 's/^stopped by SIGTERM after step \([0-9]*\):.*/\1/p' <<< "$part1")
if [ -n "$k1" ]; then
  [ "$r1" = "$k1" ] || fail "stopped with a checkpoint at step $k1 but resumed from $r1"
  echo "stop 1: SIGTERM after step $k1 with a checkpoint, resumed from ckpt-$(printf %08d "$k1").h5"
else
  # the last step run before the kill: where the step numbers in metrics.jsonl first go back
  # (no such place: the stop's checkpoint was written, only its message was lost)
  last1=$(/usr/bin/python3 -c '
import json, sys
steps = [json.loads(l)["step"] for l in open(sys.argv[1]) if l.strip()]
print(next((a for a, b in zip(steps, steps[1:]) if b != a + 1), sys.argv[2]))' \
    "$run/out/metrics.jsonl" "$r1")
  if [ "$r1" != "$last1" ]; then
    [ $((r1 % 50)) = 0 ] && [ "$r1" -ge 50 ] && [ "$r1" -le "$last1" ] &&
      [ $((last1 - r1)) -le 50 ] || fail "killed after step $last1, resumed from $r1"
  fi
  echo "stop 1: SIGTERM, killed after step $last1 before its checkpoint, resumed from the newest" \
       "checkpoint, ckpt-$(printf %08d "$r1").h5"
fi
# Stop 2: SIGUSR1, always a checkpoint at the stop and a resume from exactly it.
k2=$(sed -n 's/^stopped by SIGUSR1 after step \([0-9]*\):.*/\1/p' "$log")
[ -n "$k2" ] || fail "no 'stopped by SIGUSR1' line"
grep -q "resumed from .*ckpt-$(printf %08d "$k2").h5" "$log" || fail "no resume from step $k2"
echo "stop 2: SIGUSR1 after step $k2 with a checkpoint, resumed from ckpt-$(printf %08d "$k2").h5"
grep -q "received SIGTERM" "$log" || fail "the script did not see SIGTERM"
grep -q "received SIGUSR1" "$log" || fail "the script did not see SIGUSR1"
grep -q "requeueing job $id" "$log" || fail "the script did not requeue itself after SIGUSR1"
grep -q "run complete: .*COMPLETED (step $steps)" "$log" || fail "no completion"
# The run lock (doc/checkpoints.md, "One run per directory"): a requeue is never refused as
# another run, a lock file its killed earlier run left is taken over as this job's own (not a
# stranger's), and the completed run leaves no lock file.
! grep -q "is in use by another run" "$log" || fail "a requeue was refused by the run lock"
! grep -q "was locked by a run that is gone" "$log" || fail "the requeue took its own lock as a stranger's"
[ ! -e "$run/out/tessera.lock" ] && [ ! -e "$run/out/checkpoints/tessera.lock" ] || fail "a lock file left"
if grep -q "was locked by an earlier run of this Slurm job" "$log"; then
  echo "lock: the killed run's lock taken over by its requeue"
fi

# The uninterrupted reference: the same 4 ranks launched straight.
# shellcheck disable=SC2086  # mpiexec is a command line
OMP_NUM_THREADS=1 OMPI_MCA_mpi_yield_when_idle=1 $mpiexec 4 "$tessera" "$deck" "$@" \
  "${common[@]}" --output.dir="$run/ref" > "$run/ref.log" 2>&1 || fail "reference run"

# Same losses as the uninterrupted run, step for step (the last record of a step counts, in
# case a step ran twice), and the same final weights.
/usr/bin/python3 - "$run/ref" "$run/out" "$steps" <<'EOF'
import json, sys
def losses(d):
    out = {}
    for line in open(d + "/metrics.jsonl"):
        if line.strip():
            r = json.loads(line)
            out[r["step"]] = (r["loss"], r["grad_norm"])
    return out
ref, got, steps = losses(sys.argv[1]), losses(sys.argv[2]), int(sys.argv[3])
assert sorted(ref) == list(range(1, steps + 1)), "reference steps"
assert sorted(got) == sorted(ref), f"steps differ: {len(got)} vs {len(ref)}"
bad = [s for s in ref if ref[s] != got[s]]
for s in bad[:5]:
    print(f"step {s}: {got[s]} vs reference {ref[s]}")
print(f"losses: {steps - len(bad)}/{steps} steps identical to the uninterrupted run")
sys.exit(1 if bad else 0)
EOF
final=checkpoints/ckpt-$(printf '%08d' $steps).h5
"$here/../../tools/tessera-ckpt" diff "$run/ref/$final" "$run/out/$final" | tail -1
echo "slurm requeue: PASS"

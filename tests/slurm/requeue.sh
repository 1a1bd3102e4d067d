#!/usr/bin/env bash
# A train.sbatch job interrupted twice finishes with the losses of an uninterrupted run:
#   1. `scontrol requeue` mid-run (Slurm sends SIGTERM): tessera checkpoints and stops, Slurm
#      requeues the job, it resumes from that checkpoint;
#   2. SIGUSR1 to the batch shell, as `#SBATCH --signal=B:USR1@T` sends it before the time
#      limit (here sent at once with `scancel --batch --signal=USR1`): tessera checkpoints and
#      exits 75, the script requeues the job itself, it resumes again and completes.
# The reference is the same run (4 ranks, same deck) launched straight with mpiexec.
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
common=(--train.steps=$steps --checkpoint.every=100 --hardware.peak_flops=1e9
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

# Each stop wrote a checkpoint at its step and the next start resumed from exactly it.
mapfile -t stops < <(sed -n 's/^stopped by \(SIG[A-Z0-9]*\) after step \([0-9]*\):.*/\1 \2/p' "$log")
[ ${#stops[@]} = 2 ] || fail "expected 2 stops, log shows ${#stops[@]}"
[[ ${stops[0]} == SIGTERM* ]] && [[ ${stops[1]} == SIGUSR1* ]] || fail "stops: ${stops[*]}"
for i in 0 1; do
  k=$(printf '%08d' "${stops[i]#* }")
  grep -q "resumed from .*ckpt-$k.h5" "$log" || fail "no resume from ckpt-$k.h5"
  echo "stop $((i + 1)): ${stops[i]% *} after step ${stops[i]#* }, resumed from ckpt-$k.h5"
done
grep -q "received SIGTERM" "$log" || fail "the script did not see SIGTERM"
grep -q "received SIGUSR1" "$log" || fail "the script did not see SIGUSR1"
grep -q "requeueing job $id" "$log" || fail "the script did not requeue itself after SIGUSR1"
grep -q "run complete: .*COMPLETED (step $steps)" "$log" || fail "no completion"

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

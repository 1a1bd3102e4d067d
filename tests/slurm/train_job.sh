#!/usr/bin/env bash
# jobscripts/train.sbatch on a private one-node Slurm: 4 tasks on a tiny deck run to the end
# and leave the run's outputs; submitting the finished run again does nothing (completion
# marker); the script refuses to run outside a job.
# usage: train_job.sh WORKDIR TESSERA DECK [--section.key=value ...]
set -euo pipefail
mkdir -p "$1"
work=$(cd "$1" && pwd) tessera=$2 deck=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
script=$here/../../jobscripts/train.sbatch
. "$here/cluster.sh"

fail() { echo "FAIL: $*"; exit 1; }
steps=30

# Outside Slurm the script says how to submit it and exits 2.
set +e
msg=$(env -u SLURM_JOB_ID bash "$script" "$deck" 2>&1)
rc=$?
set -e
[ $rc -eq 2 ] && [[ $msg == *"submit it"* ]] || fail "outside a job: rc $rc, '$msg'"
echo "outside a job: refused (exit 2)"

cluster_start "$work/cluster" 4
run=$work/run
rm -rf "$run" && mkdir -p "$run"
cd "$run"
# The node declares 4 CPUs on a smaller machine: Open MPI must yield when it waits.
submit() {
  sbatch --parsable -n 4 --output="$run/job-%j.out" \
    --export=ALL,TESSERA_BIN="$tessera",OMPI_MCA_mpi_yield_when_idle=1 \
    "$script" "$deck" "$@" --train.steps=$steps --checkpoint.every=10 \
    --hardware.peak_flops=1e9 --output.echo_deck=false --output.dir="$run/out"
}

id=$(submit "$@")
echo "submitted job $id"
log=$run/job-$id.out
state=$(job_wait "$id" 150) || { cat "$log" || true; fail "job $id: $state"; }
[ "$state" = COMPLETED ] || { cat "$log"; fail "job $id ended $state"; }
echo "job $id: $state"
grep -q "on 1 node(s): 4 rank(s) x 1 thread(s), cpu nodes" "$log" || { cat "$log"; fail "allocation not derived"; }
grep -q "train.sbatch: srun --ntasks=4 " "$log" || fail "not launched with srun"
grep -q "dp (1 x 4)" "$log" || fail "tessera did not run on 4 ranks"
grep -q "run complete: .*COMPLETED (step $steps)" "$log" || fail "no completion message"
grep -qx "step $steps" "$run/out/COMPLETED" || fail "completion marker"
for f in run.json memory.json metrics.jsonl checkpoints/ckpt-000000$steps.h5; do
  [ -s "$run/out/$f" ] || fail "missing output $f"
done
/usr/bin/python3 - "$run/out" "$steps" <<'EOF'
import json, sys
out, steps = sys.argv[1], int(sys.argv[2])
recs = [json.loads(l) for l in open(out + "/metrics.jsonl") if l.strip()]
assert [r["step"] for r in recs] == list(range(1, steps + 1)), "metrics steps"
assert all(r["loss"] > 0 and r["step_time"] > 0 for r in recs)
assert recs[-1]["loss"] < recs[0]["loss"], "loss did not fall"
run = json.load(open(out + "/run.json"))
assert run["layout"]["dp"] == 4, run["layout"]
print(f"outputs: {steps} steps, loss {recs[0]['loss']:.4f} -> {recs[-1]['loss']:.4f}, dp 4")
EOF
echo "srun job: PASS"

# The same submission again: the marker says the run is complete; nothing is trained.
lines=$(wc -l < "$run/out/metrics.jsonl")
id2=$(submit "$@")
state=$(job_wait "$id2" 60) || fail "job $id2: $state"
[ "$state" = COMPLETED ] || fail "job $id2 ended $state"
grep -q "the run is complete, nothing to do" "$run/job-$id2.out" || { cat "$run/job-$id2.out"; fail "finished run redone"; }
[ "$(wc -l < "$run/out/metrics.jsonl")" = "$lines" ] || fail "metrics changed"
echo "resubmitted finished run: nothing done: PASS"
# The mpirun alternative (the node declares more CPUs than the machine has: no binding).
id3=$(sbatch --parsable -n 4 --output="$run/job-%j.out" \
        --export=ALL,TESSERA_BIN="$tessera",TESSERA_LAUNCHER=mpirun,TESSERA_MPIRUN_BIND=none,TESSERA_MPIRUN_FLAGS=--oversubscribe \
        "$script" "$deck" "$@" --train.steps=10 --hardware.peak_flops=1e9 \
        --output.echo_deck=false --output.dir="$run/out-mpirun")
log=$run/job-$id3.out
state=$(job_wait "$id3" 150) || { cat "$log" || true; fail "job $id3: $state"; }
[ "$state" = COMPLETED ] || { cat "$log"; fail "job $id3 ended $state"; }
grep -q "train.sbatch: mpirun -np 4 --map-by ppr:4:node:PE=1 " "$log" || fail "not launched with mpirun"
grep -q "dp (1 x 4)" "$log" || fail "tessera did not run on 4 ranks under mpirun"
grep -qx "step 10" "$run/out-mpirun/COMPLETED" || fail "mpirun run not complete"
echo "mpirun job: PASS"
# A GPU-node job (TESSERA_NODE_KIND=gpu; this node has no GPU, so no --gpu-bind): the script
# asks tessera for the GPUs, which stops before any work with one line from rank 0, and the job
# fails without a requeue or a checkpoint.
id4=$(sbatch --parsable -n 2 --output="$run/job-%j.out" \
        --export=ALL,TESSERA_BIN="$tessera",TESSERA_NODE_KIND=gpu,TESSERA_GPU_BIND=none \
        "$script" "$deck" "$@" --train.steps=4 --hardware.peak_flops=1e9 \
        --output.echo_deck=false --output.dir="$run/out-gpu")
log=$run/job-$id4.out
state=$(job_wait "$id4" 120) || { cat "$log" || true; fail "job $id4: $state"; }
[ "$state" = FAILED ] || { cat "$log"; fail "gpu-node job $id4 ended $state, expected FAILED"; }
grep -q -- "--hardware.device=cuda" "$log" || { cat "$log"; fail "gpu-node job not given hardware.device=cuda"; }
[ "$(grep -c "error: hardware.device = cuda" "$log")" = 1 ] || { cat "$log"; fail "gpu-node job: not one device error"; }
[ ! -e "$run/out-gpu/checkpoints" ] || fail "gpu-node job wrote checkpoints"
echo "gpu-node job without a GPU: one error, FAILED: PASS"
echo "slurm train job: PASS"

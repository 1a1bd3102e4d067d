#!/usr/bin/env bash
# tools/scaling-study on a private one-node Slurm, both ways: one job per point (--launcher
# sbatch) and one allocation stepping through the points (jobscripts/scaling-study.sbatch,
# srun steps); each report is checked against the runs' own metrics (scaling_check.py).
# usage: scaling_slurm.sh WORKDIR TESSERA DECK [--section.key=value ...]
set -euo pipefail
mkdir -p "$1"
work=$(cd "$1" && pwd) tessera=$2 deck=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
. "$here/cluster.sh"
fail() { echo "FAIL: $*"; exit 1; }

cluster_start "$work/cluster" 4
# The node declares 4 CPUs on a smaller machine: Open MPI must yield when it waits.
export OMPI_MCA_mpi_yield_when_idle=1
study=(--ranks 1,2,4 --steps 10 --warmup 3 --tessera "$tessera")

rm -rf "$work/per-job"
"$root/tools/scaling-study" "$deck" "${study[@]}" --launcher sbatch --out "$work/per-job" \
  -- "$@" || fail "scaling-study --launcher sbatch"
grep -q "^#SBATCH --exclusive" "$work/per-job/strong/np4/job.sbatch" || fail "not exclusive"
"$here/scaling_check.py" "$work/per-job" 1,2,4 | sed 's/^/per job: /' || fail "per-job report"

rm -rf "$work/one-alloc"
id=$(cd "$work" && TESSERA_ROOT=$root sbatch --parsable -n 4 --output="$work/one-alloc.out" \
       "$root/jobscripts/scaling-study.sbatch" "$deck" "${study[@]}" --out "$work/one-alloc" -- "$@")
state=$(job_wait "$id" 170) || fail "job $id: $state"
[ "$state" = COMPLETED ] || { cat "$work/one-alloc.out"; fail "job $id ended $state"; }
grep -q "srun --ntasks=4 --cpus-per-task=1 --exact" "$work/one-alloc/strong/np4/command" || fail "not srun steps"
"$here/scaling_check.py" "$work/one-alloc" 1,2,4 | sed 's/^/one allocation: /' ||
  fail "one-allocation report"
echo "slurm scaling study: PASS"

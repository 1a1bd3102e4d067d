#!/usr/bin/env bash
# Checkpoints at a path of 280+ characters, written and read with MPI-IO on 2 ranks: Open
# MPI 4.1's sharedfp/lockedfile component aborts MPI_File_open ("buffer overflow detected")
# for paths of about 240 characters unless tessera leaves it out (src/comm/mpi_env.cpp).
# usage: long_path.sh WORKDIR "MPIEXEC -n 2" TESSERA DECK DATA
set -uo pipefail
work=$1 launch=$2 tessera=$3 deck=$4 data=$5
unset OMPI_MCA_sharedfp
rm -rf "$work" && mkdir -p "$work" || exit 1
dir=$work
while [ ${#dir} -lt 250 ]; do dir=$dir/$(printf 'long%.0s' $(seq 1 12)); done
ckpt=$dir/checkpoints/ckpt-00000006.h5
echo "checkpoint path: ${#ckpt} characters"
run() { OMP_NUM_THREADS=1 timeout 120 $launch "$tessera" "$deck" --data.path="$data" \
          --output.dir="$dir" --hardware.peak_flops=1e9 "$@"; }
run --train.exit_after=3 > "$work/first.log" 2>&1 || { tail -n 20 "$work/first.log"; echo "long path: FAIL (first run)"; exit 1; }
run --checkpoint.resume=latest > "$work/second.log" 2>&1 || { tail -n 20 "$work/second.log"; echo "long path: FAIL (resumed run)"; exit 1; }
grep -o "resumed from .*ckpt-00000003.h5" "$work/second.log" | sed 's/from .*\//from ...\//'
[ -e "$ckpt" ] || { echo "long path: FAIL ($ckpt missing)"; exit 1; }
echo "long path: written and resumed"
rm -rf "$work"

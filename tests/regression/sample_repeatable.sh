#!/usr/bin/env bash
# tessera-sample loads a checkpoint written on 2 ranks and generates text; the same seed gives
# the same text. usage: sample_repeatable.sh WORKDIR "MPI2" TESSERA SAMPLE DECK [overrides]
set -euo pipefail
work=$1 mpi2=$2 tessera=$3 sample=$4
shift 4
rm -rf "$work" && mkdir -p "$work"
OMP_NUM_THREADS=1 $mpi2 "$tessera" "$@" --output.dir="$work/run" \
  --hardware.peak_flops=1e9 --output.echo_deck=false > "$work/train.log"
s() { OMP_NUM_THREADS=1 "$sample" "$@" --output.dir="$work/run" --checkpoint.resume=latest \
        --sample.length=40 --sample.prompt="And God said"; }
a=$(s "$@" --sample.seed=3) b=$(s "$@" --sample.seed=3)
echo "$a"
[ "$a" = "$b" ] && [ "$(echo "$a" | tail -1 | wc -c)" -gt 20 ] && echo "sample: repeatable"

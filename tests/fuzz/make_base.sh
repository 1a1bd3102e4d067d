#!/usr/bin/env bash
# Makes what the checkpoint and dataset fuzz cases start from, in BASE: a small corpus and its
# dataset (data.h5), the same as a sharded dataset (shards/data.h5, its index, and shards of
# 3000 tokens shards/data-0000N.h5), and two finished runs of tests/fuzz/data/tiny.in: run/ (one block,
# checkpoints of steps 3 and 6, `latest`), run2/ (the same with two blocks) and run_moe/ (a
# mixture of experts: 4 experts, top-2, softmax router; 3 steps).
# usage: make_base.sh BASE TESSERA TESSERA_PREP DECK
set -euo pipefail
base=$1 tessera=$2 prep=$3 deck=$4
rm -rf "$base" && mkdir -p "$base" && cd "$base"
for i in $(seq 1 400); do
  echo "line $i: $(( i * 7919 % 1000 )) and the quick brown fox $(( i % 13 )) jumps over $(( i * i % 97 ))"
done > corpus.txt
"$prep" --tokenizer byte --split-lines --out data.h5 corpus.txt
mkdir shards
"$prep" --tokenizer byte --split-lines --shard-tokens 3000 --out shards/data.h5 corpus.txt
export OMP_NUM_THREADS=1
"$tessera" "$deck" --data.path=data.h5 --output.dir=run --hardware.peak_flops=1e9
"$tessera" "$deck" --data.path=data.h5 --output.dir=run2 --model.layers=2 --hardware.peak_flops=1e9
"$tessera" "$deck" --data.path=data.h5 --output.dir=run_moe --model.experts=4 --train.steps=3 \
  --hardware.peak_flops=1e9
ls run/checkpoints run2/checkpoints run_moe/checkpoints
echo "base: ready"

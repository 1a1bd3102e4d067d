#!/usr/bin/env bash
# The GPU path on an emulated GPU (TESSERA_EMULATE_CUDA, doc/testing.md): hardware.device =
# cuda keeps every tensor in (emulated) device memory and stages every host access, and must
# give the CPU run bit for bit: per-step losses and gradient norms, and the final checkpoint.
# Then a checkpoint written on the device resumes on the CPU, and one written on the CPU
# resumes on the device, both continuing the straight run bit for bit.
# Sampling from the final checkpoint gives the same text on both.
# usage: [LAUNCH="mpiexec ... -n 2"] device_same.sh WORKDIR PYTHON TESSERA SAMPLE DECK [overrides...]
# LAUNCH runs the training on several ranks (every emulated rank has its own device; the
# collectives get the emulated device memory as host pointers); sampling is serial.
set -euo pipefail
work=$1 python=$2 tessera=$3 sample=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)
tools=$here/../../tools
rm -rf "$work" && mkdir -p "$work"
launch=${LAUNCH:-}
# shellcheck disable=SC2086  # LAUNCH is a list of words
cpu() { OMP_NUM_THREADS=1 $launch "$tessera" "$@" --hardware.device=cpu; }
# shellcheck disable=SC2086
gpu() { OMP_NUM_THREADS=1 TESSERA_EMULATE_CUDA=4 $launch "$tessera" "$@" --hardware.device=cuda; }
common=(--train.steps=8 --checkpoint.every=4 --hardware.peak_flops=1e9 --output.echo_deck=false)
same() {  # same RUN_A RUN_B: identical per-step values and final checkpoints
  "$python" "$here/compare_runs.py" --rtol 0 "$work/$1" "$work/$2" | tail -1
  "$tools/tessera-ckpt" diff "$work/$1/checkpoints/ckpt-00000008.h5" \
    "$work/$2/checkpoints/ckpt-00000008.h5" | tail -1
}
cpu "$@" "${common[@]}" --output.dir="$work/cpu" > "$work/cpu.log"
gpu "$@" "${common[@]}" --output.dir="$work/gpu" > "$work/gpu.log"
echo "device vs cpu:" && same cpu gpu
gpu "$@" "${common[@]}" --output.dir="$work/gpu_cpu" --train.exit_after=4 > "$work/gpu_cpu1.log"
cpu "$@" "${common[@]}" --output.dir="$work/gpu_cpu" --checkpoint.resume=latest > "$work/gpu_cpu2.log"
grep -q "resumed from .*ckpt-00000004.h5" "$work/gpu_cpu2.log"
echo "device checkpoint resumed on cpu:" && same cpu gpu_cpu
cpu "$@" "${common[@]}" --output.dir="$work/cpu_gpu" --train.exit_after=4 > "$work/cpu_gpu1.log"
gpu "$@" "${common[@]}" --output.dir="$work/cpu_gpu" --checkpoint.resume=latest > "$work/cpu_gpu2.log"
grep -q "resumed from .*ckpt-00000004.h5" "$work/cpu_gpu2.log"
echo "cpu checkpoint resumed on device:" && same cpu cpu_gpu
s() { OMP_NUM_THREADS=1 TESSERA_EMULATE_CUDA=1 "$sample" "$@" --output.dir="$work/gpu" --checkpoint.resume=latest \
        --sample.length=30 --sample.prompt="And God said" --sample.seed=3; }
a=$(s "$@" --hardware.device=cpu) b=$(s "$@" --hardware.device=cuda)
echo "$b" | tail -1
# The text after the sample header (the prompt and 30 tokens; it may hold newlines).
[ "$a" = "$b" ] && [ "$(echo "$b" | sed -n '/^--- sample/,$p' | tail -n +2 | wc -c)" -gt 20 ] &&
  echo "device sample: same"
echo "device_same: pass"

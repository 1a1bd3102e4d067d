#!/usr/bin/env bash
# bf16 where oneDNN has no native bf16 GEMM, as on a CPU without AVX512-BF16:
# ONEDNN_MAX_CPU_ISA=AVX512_CORE caps oneDNN below it on any CPU, so oneDNN really emulates.
# The run must warn once (rank 0), naming the cost, train, and reach the losses and gradient
# norms of the run with oneDNN uncapped (doc/precision.md, "Errors and warnings") at tensor
# parallelism's bf16 bar (loss 5e-5, gradient norm 5e-4 relative): both multiply the same bf16
# operands exactly in fp32 but sum the products in another order (AMX tiles, AVX512-BF16 pairs,
# AVX-512 emulation) in every GEMM, so an activation now and then rounds to the other bf16
# neighbour, as a row-parallel GEMM's split sum does (measured: identical on Zen 5; on an AMX
# Xeon loss 7.3e-6 and gradient norm 5.3e-5 by step 3, over data parallelism's 1e-5).
# usage: bf16_emulated.sh OUTDIR PYTHON COMMAND...   (COMMAND: a tessera run; --output.dir is added)
set -u
out=$1 python=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
rm -rf "$out" && mkdir -p "$out" || exit 1
fail() { echo "bf16_emulated: FAIL: $*"; exit 1; }
ONEDNN_MAX_CPU_ISA=AVX512_CORE "$@" --output.dir="$out/emulated" >"$out/emulated.log" 2>&1 ||
  { cat "$out/emulated.log"; fail "the emulated run exited non-zero"; }
"$@" --output.dir="$out/native" >"$out/native.log" 2>&1 ||
  { cat "$out/native.log"; fail "the native run exited non-zero"; }
warning="warning: train.precision = bf16 where oneDNN has no native bf16 GEMM"
count=$(grep -c "$warning" "$out/emulated.log")
[ "$count" -eq 1 ] || { cat "$out/emulated.log"; fail "the warning printed $count times, expected once"; }
grep "$warning" "$out/emulated.log"
steps=$(grep -c . "$out/emulated/metrics.jsonl")
[ "$steps" -ge 2 ] || fail "$steps steps in metrics.jsonl"
"$python" "$here/../regression/compare_runs.py" --rtol 5e-5 --grad-rtol 5e-4 "$out/native" "$out/emulated" ||
  fail "losses or gradient norms differ"
echo "bf16_emulated: pass: $steps steps, the same losses (5e-5) and gradient norms (5e-4)"

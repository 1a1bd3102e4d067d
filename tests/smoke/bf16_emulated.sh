#!/usr/bin/env bash
# bf16 where oneDNN has no native bf16 GEMM, as on a CPU without AVX512-BF16:
# ONEDNN_MAX_CPU_ISA=AVX512_CORE caps oneDNN below it on any CPU, so oneDNN really emulates.
# The run must warn once (rank 0), naming the cost, train, and reach the losses and gradient
# norms of the run with oneDNN uncapped (doc/precision.md, "Errors and warnings") to 1e-5
# relative: both multiply the same bf16 operands exactly in fp32 but sum the products in
# another order (AMX tiles, AVX512-BF16 pairs, AVX-512 emulation), which now and then moves an
# activation across a bf16 rounding boundary, as data parallelism's reduction order does
# (measured: identical on Zen 5; 2e-8 at step 1 on an AMX Xeon).
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
"$python" "$here/../regression/compare_runs.py" --rtol 1e-5 "$out/native" "$out/emulated" ||
  fail "losses or gradient norms differ"
echo "bf16_emulated: pass: $steps steps, the same losses and gradient norms to 1e-5"

#!/usr/bin/env bash
# bf16 where oneDNN has no native bf16 GEMM, as on a CPU without AVX512-BF16:
# ONEDNN_MAX_CPU_ISA=AVX512_CORE caps oneDNN below it on any CPU, so oneDNN really emulates.
# The run must warn once (rank 0), naming the cost, train, and reach the same losses and
# gradient norms as the run with oneDNN uncapped (doc/precision.md, "Errors and warnings").
# usage: bf16_emulated.sh OUTDIR COMMAND...   (COMMAND: a tessera run; --output.dir is added)
set -u
out=$1
shift
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
# loss and grad_norm of every step, as metrics.jsonl prints them (9 significant digits)
columns() { sed -E 's/.*"loss": ([^,]*),.*"grad_norm": ([^,]*),.*/\1 \2/' "$1/metrics.jsonl"; }
emulated=$(columns "$out/emulated") native=$(columns "$out/native")
steps=$(printf '%s\n' "$emulated" | grep -c .)
[ "$steps" -ge 2 ] || fail "$steps steps in metrics.jsonl"
[ "$emulated" = "$native" ] || { diff <(echo "$emulated") <(echo "$native"); fail "losses differ"; }
echo "bf16_emulated: pass: $steps steps, the same losses and gradient norms (last: $(printf '%s\n' "$emulated" | tail -n 1))"

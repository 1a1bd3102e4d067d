#!/usr/bin/env bash
# Greedy decoding of a tessera checkpoint by tessera-sample and, from its GGUF export, by
# llama.cpp (node-llama-cpp): the prompt's token ids and N generated ids must be equal, and
# llama.cpp's probability of each chosen token must equal tessera's (its logits of the same
# ids, tessera-logitsdump) within PROB_TOL.
# usage: gguf_decode.sh WORK DTYPE N MIN_GAP PROB_TOL PROMPT -- EXPORT CKPT [EXPORT OPTIONS...]
#                       -- SAMPLE DECK [OVERRIDES...]
# Environment: NODE_DIR (node_modules of node-llama-cpp), DECODE (tools/llamacpp-generate.mjs),
# COMPARE (compare_decode.py), LOGITSDUMP (tessera-logitsdump), PYTHON.
set -euo pipefail
work=$1 dtype=$2 n=$3 gap=$4 tol=$5 prompt=$6
shift 6
[ "$1" = -- ] && shift
export_cmd=()
while [ "$1" != -- ]; do export_cmd+=("$1"); shift; done
shift
rm -rf "$work" && mkdir -p "$work"
"${export_cmd[@]}" "$work/model.gguf" --dtype "$dtype"
"$@" --sample.prompt="$prompt" --sample.temperature=0 --sample.length="$n" \
  --sample.print_ids=true > "$work/tessera.txt"
TESSERA_NODE_DIR="$NODE_DIR" node "$DECODE" "$work/model.gguf" "$prompt" "$n" > "$work/llamacpp.txt"
sed -n 's/^\(prompt\|sample\) ids://p' "$work/tessera.txt" > "$work/ids.txt"
"$LOGITSDUMP" "$work/logits.h5" --ids "$work/ids.txt" "${@:2}"
"$PYTHON" "$COMPARE" "$work/tessera.txt" "$work/llamacpp.txt" "$n" "$gap" "$work/logits.h5" "$tol"

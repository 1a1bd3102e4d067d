#!/usr/bin/env bash
# A sharded dataset trains exactly as the one file holding the same tokens (doc/data.md,
# "Sharded datasets"): `tessera-prep --shard-tokens N` of the corpus text (the same bytes with 1
# and 2 tokenizer threads; the shards' tokens, concatenated, are the one file's), then runs on 2
# ranks with a validation split, named by the index and by a pattern, and a serial blend whose
# first part is sharded, each against its own run on the one file: every step's printed loss,
# gradient norm and validation loss are the same text, byte for byte.
# usage: shards_same.sh WORKDIR "MPIEXEC..." PREP TESSERA PYTHON CORPUS_TEXT CORPUS_H5 OTHER_H5
#        DECK [overrides...]
set -euo pipefail
work=$1 mpiexec=$2 prep=$3 tessera=$4 python=$5 text=$6 one=$7 other=$8
shift 8
rm -rf "$work" && mkdir -p "$work/sh" "$work/sh2"
cd "$work"
"$prep" --tokenizer byte --split-lines --shard-tokens 300000 --out sh/kjv.h5 "$text"
"$prep" --tokenizer byte --split-lines --shard-tokens 300000 --threads 2 --out sh2/kjv.h5 \
  "$text" > /dev/null
same=SAME
for f in sh/*; do cmp -s "$f" "sh2/${f#sh/}" || { echo "prep: $f differs with 2 threads"; same=DIFFER; }; done
echo "prep with 2 threads: $same ($(ls sh | wc -l) files)"
"$python" - "$one" sh/kjv.h5 <<'EOF'
import sys, os, h5py, numpy as np
one, index = sys.argv[1:3]
with h5py.File(one) as f, h5py.File(index) as i:
    names = i.attrs["shards"]
    names = (names.decode() if isinstance(names, bytes) else names).split()
    parts = [h5py.File(os.path.join(os.path.dirname(index), n))["tokens"][()] for n in names]
    same = np.array_equal(np.concatenate(parts), f["tokens"][()]) and \
        np.array_equal(i["doc_offsets"][()], f["doc_offsets"][()])
    print(f"tokens: {len(names)} shards, {sum(map(len, parts))} tokens:",
          "SAME AS ONE FILE" if same else "DIFFER")
EOF

run() {  # NAME LAUNCH DATA_PATH overrides...
  local name=$1 launch=$2 data=$3
  shift 3
  OMP_NUM_THREADS=1 $launch "$tessera" "$@" "--data.path=$data" --output.dir="$name" \
    --hardware.peak_flops=1e9 --output.echo_deck=false --checkpoint.at_end=false > "$name.log"
}
# Every step's values as tessera printed them.
printed() { grep -o -E '"(step|loss|grad_norm|val_loss)": [^,}]*' "$1/metrics.jsonl"; }
verdict=SAME
compare() {  # REFERENCE RUN
  if [ "$(printed "$1")" == "$(printed "$2")" ] && [ -n "$(printed "$1")" ]; then
    echo "$2 vs $1: $(printed "$2" | grep -c '"loss"') steps, the same text"
  else
    echo "$2 vs $1: DIFFER"
    diff <(printed "$1") <(printed "$2") | head -n 10 || true
    verdict=DIFFER
  fi
}
np2="$mpiexec 2"
val=(--data.val_fraction=0.02 --train.eval_every=4 --train.eval_samples=8)
run one "$np2" "$one" "$@" "${val[@]}"
run index "$np2" sh/kjv.h5 "$@" "${val[@]}"
run pattern "$np2" 'sh/kjv-*.h5' "$@" "${val[@]}"
run blend_one "" "0.7 $one 0.3 $other" "$@"
run blend_sharded "" "0.7 sh/kjv.h5 0.3 $other" "$@"
grep -q val_loss one/metrics.jsonl || { echo "no validation loss printed"; verdict=DIFFER; }
grep -a "^data: 'sh/kjv.h5' is" index.log || { echo "no shard summary"; verdict=DIFFER; }
compare one index
compare one pattern
compare blend_one blend_sharded
echo "shards: $([[ $verdict == SAME && $same == SAME ]] && echo SAME AS ONE FILE || echo DIFFER)"

#!/usr/bin/env bash
# Encodes FILE with tessera (as one string) and with the reference JavaScript encoder, and
# passes when the ids are equal, id for id; prints how many tokens were compared.
# usage: compare_ids.sh TESSERA_ENCODE VOCAB_DIR FILE [--chunked|--both]
#   --chunked: the JavaScript side encodes in chunks cut where no pre-token can span (see
#   encode.js); --both: encodes it whole and chunked and requires both to agree too.
set -euo pipefail
encoder=$1 vocab=$2 file=$3 mode=${4:-}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

start=$(date +%s.%N)
"$encoder" gpt2 "$vocab" "$file" > "$tmp/tessera"
mid=$(date +%s.%N)
js_mode=${mode/--both/}
node "$here/encode.js" "$vocab" "$file" $js_mode > "$tmp/js"
end=$(date +%s.%N)
if [ "$mode" = --both ]; then
  node "$here/encode.js" "$vocab" "$file" --chunked > "$tmp/js-chunked"
  cmp -s "$tmp/js" "$tmp/js-chunked" ||
    { echo "compare: FAIL: encode.js whole and --chunked differ on $file"; exit 1; }
  echo "compare: encode.js whole == --chunked on $file"
fi
n=$(wc -l < "$tmp/js")
if ! cmp -s "$tmp/tessera" "$tmp/js"; then
  line=$(cmp "$tmp/tessera" "$tmp/js" | sed -n 's/.* line \([0-9]*\).*/\1/p')
  echo "compare: FAIL on $file: $(wc -l < "$tmp/tessera") tessera ids, $n JavaScript ids;" \
       "first difference at token index $((line - 1))"
  lo=$((line > 5 ? line - 5 : 1))
  paste <(sed -n "${lo},$((line + 5))p" "$tmp/tessera") <(sed -n "${lo},$((line + 5))p" "$tmp/js") |
    awk -v lo="$lo" '{printf "  token %d: tessera %s  js %s\n", lo + NR - 2, $1, $2}'
  exit 1
fi
awk -v n="$n" -v f="$file" -v a="$start" -v b="$mid" -v c="$end" 'BEGIN {
  printf "compare: pass: %d tokens identical on %s (tessera %.2f s, node %.2f s)\n", n, f, b - a, c - b }'

#!/bin/sh
# make_short_docs.sh TEXT OUT: the corpus's lines cut into pieces of about six words, one piece a
# line (tessera-prep --split-lines makes each a document), so that a sample of 32 tokens holds
# several documents and some documents cross samples (data.document_mask's tests). A piece ends
# after word i of line NR when (i + NR) % 6 == 0, or at the end of its line.
set -e
awk '{
  n = split($0, w, " "); piece = ""
  for (i = 1; i <= n; i++) {
    piece = piece == "" ? w[i] : piece " " w[i]
    if ((i + NR) % 6 == 0) { print piece; piece = "" }
  }
  if (piece != "") print piece
}' "$1" > "$2"

#!/usr/bin/env python3
"""tessera-prep on the whole KJV corpus, one document per verse (--split-lines): the
documents decode back to the verses, the file is the same bytes with one tokenizer thread as
with two (--threads), and the throughput is printed.
usage: prep_kjv.py PREP byte|gpt2 GPT2_VOCAB_DIR CORPUS OUT.h5"""
import os
import re
import subprocess
import sys

import h5_dataset

prep, kind, vocab_dir, corpus, out = sys.argv[1:6]
cmd = [prep, "--tokenizer", kind, "--vocab-dir", vocab_dir, "--split-lines", corpus]
one = out + ".one-thread.h5"
for threads, path in ((2, out), (1, one)):
    run = subprocess.run(cmd + ["--threads", str(threads), "--out", path], capture_output=True, text=True)
    print(run.stdout + run.stderr, end="")
    if run.returncode != 0:
        print("prep: FAIL: exit status", run.returncode)
        sys.exit(1)
with open(out, "rb") as a, open(one, "rb") as b:
    same_bytes = a.read() == b.read()
os.remove(one)
if not same_bytes:
    print("prep: FAIL: the file written with 2 threads differs from the one written with 1")
    sys.exit(1)
attrs, tokens, offsets, _ = h5_dataset.read(out)
verses = [l.rstrip(b"\r") for l in open(corpus, "rb").read().split(b"\n") if l.strip()]
vocab = h5_dataset.Gpt2Vocab(vocab_dir) if kind == "gpt2" else None
decode = vocab.decode if vocab else (lambda ids: ids.astype("uint8").tobytes())
docs = h5_dataset.documents(tokens, offsets)
eos = attrs["eos_id"]
ok = len(docs) == len(verses) == attrs["n_docs"] and all(
    d[-1] == eos and decode(d[:-1]) == v for d, v in zip(docs, verses))
rate = re.search(r"\(([0-9.]+) MB/s\)", run.stdout)
os.remove(out)
if not ok or not rate:
    print("prep: FAIL: the documents do not decode to the verses")
    sys.exit(1)
print(f"prep: pass: KJV with {kind}: {len(docs)} verses, {len(tokens)} tokens, the same bytes "
      f"with 1 and 2 threads, {rate.group(1)} MB/s")

#!/usr/bin/env python3
"""tessera-prep --loss-mask (doc/data.md, "Loss masks") on a small JSONL file of prompt/response
records, byte tokenizer: each record is its prompt's bytes (mask 0), its response's bytes and
EOS (mask 1); the file is version 2 with /loss_mask; the same bytes with 1 and 2 threads;
renamed fields (--prompt-field, --response-field) give the same tokens; a sharded preparation
concatenates to the one file, masks included. usage: prep_mask_check.py PREP WORKDIR"""
import filecmp
import glob
import json
import os
import shutil
import subprocess
import sys

import h5py
import numpy as np

prep, work = sys.argv[1], sys.argv[2]
shutil.rmtree(work, ignore_errors=True)
os.makedirs(work)
EOS = 256


def fail(what):
    print("prep-mask: FAIL:", what)
    sys.exit(1)


# Escapes, raw UTF-8, an empty prompt, an empty response, extra members, a blank line.
records = [("Say hello. ", "Hello!"), ("", "no prompt"), ("caf\u00e9 \U0001F600\n", "\u4e2d\u6587"),
           ("no response", ""), ("q" * 50, "a" * 70)]
lines = [json.dumps({"id": i, "prompt": p, "response": r, "meta": [1, None]})
         for i, (p, r) in enumerate(records)]
lines.insert(2, "")
with open(os.path.join(work, "sft.jsonl"), "w") as f:
    f.write("\n".join(lines) + "\n")
with open(os.path.join(work, "renamed.jsonl"), "w") as f:
    f.write("\n".join(json.dumps({"q": p, "a": r}) for p, r in records) + "\n")


def run(*args):
    out = subprocess.run([prep, "--tokenizer", "byte", "--loss-mask", *args],
                         capture_output=True, text=True)
    if out.returncode != 0:
        fail(f"{args}: exit {out.returncode}: {out.stderr.strip()}")
    print(out.stdout.strip())
    return out.stdout


def read(path):
    with h5py.File(path, "r") as f:
        return (f.attrs["version"], f["tokens"][()].astype(np.int64), f["loss_mask"][()],
                f["doc_offsets"][()])


want_tokens, want_mask, offsets = [], [], [0]
for p, r in records:
    pb, rb = list(p.encode()), list(r.encode())
    want_tokens += pb + rb + [EOS]
    want_mask += [0] * len(pb) + [1] * (len(rb) + 1)
    offsets.append(len(want_tokens))

one, two = os.path.join(work, "t1.h5"), os.path.join(work, "t2.h5")
text = run("--threads", "1", "--out", one, os.path.join(work, "sft.jsonl"))
run("--threads", "2", "--out", two, os.path.join(work, "sft.jsonl"))
targets = sum(want_mask)
if f"loss mask: {targets} of the {len(want_tokens)} tokens are targets" not in text:
    fail(f"the summary line does not say {targets} of {len(want_tokens)}: {text}")
version, tokens, mask, offs = read(one)
if version != 2:
    fail(f"version {version}, expected 2 with a loss mask")
if tokens.tolist() != want_tokens:
    fail("tokens differ from prompt + response + EOS")
if mask.dtype != np.uint8 or mask.tolist() != want_mask:
    fail(f"loss mask {mask.tolist()} differs from {want_mask}")
if offs.tolist() != offsets:
    fail(f"doc_offsets {offs.tolist()} differ from {offsets}")
if not filecmp.cmp(one, two, shallow=False):
    fail("1 and 2 threads wrote different bytes")
print(f"prep-mask: {len(records)} records, {len(want_tokens)} tokens, {targets} targets; "
      "1 and 2 threads the same bytes")

renamed = os.path.join(work, "renamed.h5")
run("--prompt-field", "q", "--response-field", "a", "--out", renamed,
    os.path.join(work, "renamed.jsonl"))
r = read(renamed)
if r[1].tolist() != want_tokens or r[2].tolist() != want_mask:
    fail("renamed fields give other tokens or masks")

index = os.path.join(work, "shards.h5")
run("--shard-tokens", "40", "--out", index, os.path.join(work, "sft.jsonl"))
shards = sorted(glob.glob(os.path.join(work, "shards-*.h5")))
cat_tokens, cat_mask = [], []
for s in shards:
    v, t, m, _ = read(s)
    if v != 2:
        fail(f"shard {s} is version {v}")
    cat_tokens += t.tolist()
    cat_mask += m.tolist()
if len(shards) < 2 or cat_tokens != want_tokens or cat_mask != want_mask:
    fail(f"{len(shards)} shards do not concatenate to the one file's tokens and mask")
print(f"prep-mask: renamed fields the same; {len(shards)} shards concatenate to the one file")
print("prep-mask: pass")

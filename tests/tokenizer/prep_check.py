#!/usr/bin/env python3
"""tessera-prep on a small JSONL file and a text directory (with and without --split-lines):
documents, token counts, the tokens themselves, the attributes and the manifest; and a bad
JSONL line leaves no output behind. usage: prep_check.py PREP WORKDIR [GPT2_VOCAB_DIR]
Without a vocabulary directory the byte tokenizer is checked, with one the gpt2 tokenizer."""
import json
import os
import shutil
import subprocess
import sys

import h5_dataset

prep, work = sys.argv[1], sys.argv[2]
vocab_dir = sys.argv[3] if len(sys.argv) > 3 else None
shutil.rmtree(work, ignore_errors=True)
os.makedirs(os.path.join(work, "texts", "sub"))


def write(name, data):
    with open(os.path.join(work, name), "wb") as f:
        f.write(data.encode() if isinstance(data, str) else data)


# JSONL: escapes (\uXXXX, a surrogate pair, \n, \t, \"), raw UTF-8, extra members, an empty
# text, a blank line.
records = ["plain record", "caf\u00e9 \U0001F600 \"quoted\"\nnew line\ttab", "", "raw \u4e2d\u6587 ok"]
lines = [json.dumps({"id": 0, "text": records[0], "meta": {"a": [1, 2.5e3, None, True]}}),
         json.dumps({"text": records[1]}),  # ensure_ascii: \u00e9, \ud83d\ude00
         "",
         json.dumps({"text": records[2], "text_len": 0}),
         json.dumps({"text": records[3]}, ensure_ascii=False)]
write("corpus.jsonl", "\n".join(lines) + "\n")
write("texts/a.txt", "doc one line 1\ndoc one line 2\n\n\n  \t\ndoc two")  # no final newline
write("texts/sub/b.txt", "\ufeff\r\nonly doc\r\nsecond line\r\n")  # BOM dropped, CRLF
write("texts/c.jsonl", '{"text": "in dir"}\n')
inputs = [os.path.join(work, "corpus.jsonl"), os.path.join(work, "texts")]
files = ["corpus.jsonl", "texts/a.txt", "texts/c.jsonl", "texts/sub/b.txt"]  # sorted by path
expected = {
    False: [records, ["doc one line 1\ndoc one line 2", "doc two"], ["in dir"],
            ["only doc\r\nsecond line"]],
    True: [records, ["doc one line 1", "doc one line 2", "doc two"], ["in dir"],
           ["only doc", "second line"]],
}

tokenizer = ["--tokenizer", "gpt2", "--vocab-dir", vocab_dir] if vocab_dir else ["--tokenizer", "byte"]
vocab = h5_dataset.Gpt2Vocab(vocab_dir) if vocab_dir else None
eos = 50256 if vocab else 256


def decode(ids):
    return vocab.decode(ids) if vocab else bytes(int(i) for i in ids)


def fail(what):
    print("prep: FAIL:", what)
    sys.exit(1)


for split in (False, True):
    out = os.path.join(work, "split.h5" if split else "docs.h5")
    cmd = [prep] + tokenizer + ["--out", out] + (["--split-lines"] if split else []) + inputs
    run = subprocess.run(cmd, capture_output=True, text=True)
    print(run.stdout + run.stderr, end="")
    if run.returncode != 0:
        fail(f"{cmd} exited with {run.returncode}")
    attrs, tokens, offsets, manifest = h5_dataset.read(out)
    docs = [d for per_file in expected[split] for d in per_file]
    want_tokens = sum(len(d) for d in h5_dataset.documents(tokens, offsets))
    checks = {
        "format": attrs["format"] == "tessera-dataset" and attrs["version"] == 1,
        "tokenizer": attrs["tokenizer"] == ("gpt2" if vocab else "byte"),
        "vocab": (attrs["vocab_size"], attrs["eos_id"]) == ((50257, 50256) if vocab else (257, 256)),
        "vocab_hash": attrs["vocab_hash"] == (vocab.sha256 if vocab else ""),
        "dtype": tokens.dtype.name == "uint16" and offsets.dtype.name == "uint64",
        "n_docs": attrs["n_docs"] == len(docs) == len(offsets) - 1,
        "n_tokens": attrs["n_tokens"] == len(tokens) == offsets[-1] == want_tokens,
        "documents": all(decode(d[:-1]) == text.encode() and d[-1] == eos and eos not in d[:-1]
                         for d, text in zip(h5_dataset.documents(tokens, offsets), docs)),
        "manifest files": [os.path.relpath(i["path"], work) for i in manifest["inputs"]] == files,
        "manifest counts": [i["documents"] for i in manifest["inputs"]] == [len(e) for e in expected[split]]
        and sum(i["tokens"] for i in manifest["inputs"]) == len(tokens)
        and all(i["bytes"] == os.path.getsize(i["path"]) for i in manifest["inputs"])
        and manifest["split_lines"] == split,
        "no temporary file": not os.path.exists(out + ".tmp"),
    }
    if not all(checks.values()):
        fail(f"split_lines={split}: " + ", ".join(k for k, ok in checks.items() if not ok))
    print(f"prep: split_lines={split}: {len(docs)} documents, {len(tokens)} tokens as expected")

# A bad line stops the run with the file and line named, and leaves no output.
write("bad.jsonl", '{"text": "fine"}\n{"text": "broken\n')
out = os.path.join(work, "bad.h5")
run = subprocess.run([prep] + tokenizer + ["--out", out, os.path.join(work, "bad.jsonl")],
                     capture_output=True, text=True)
if run.returncode == 0 or "bad.jsonl' line 2 is not valid JSON" not in run.stderr:
    fail(f"bad JSONL: exit {run.returncode}, stderr {run.stderr!r}")
if os.path.exists(out) or os.path.exists(out + ".tmp"):
    fail("bad JSONL left an output file behind")
print("prep: pass")

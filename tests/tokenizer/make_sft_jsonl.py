#!/usr/bin/env python3
"""Fine-tuning records from the KJV text (one verse a line) for the loss-mask tests
(doc/data.md, "Loss masks"): each of the first N verses gives one JSONL record whose
"instruction" is its first words (at most 12 bytes, so that no sample of 16 or more targets
lies inside one prompt) and whose "output" is the words after them (at most 40 bytes).
With --long-prompts the "instruction" is three whole verses and the "output" one word: most
samples then lie inside a prompt and have no unmasked target (the error case).
usage: make_sft_jsonl.py KJV.txt OUT.jsonl [N] [--long-prompts]"""
import json
import sys

args = [a for a in sys.argv[1:] if not a.startswith("--")]
long_prompts = "--long-prompts" in sys.argv
kjv, out = args[0], args[1]
n = int(args[2]) if len(args) > 2 else 3000
with open(kjv, encoding="utf-8") as f:
    verses = [line.strip() for line in f if line.strip()][: n + 3]


def take(words, limit):
    """The leading words of `words` within `limit` bytes (at least one word, cut to limit)."""
    kept, size = [], 0
    for w in words:
        extra = len(w.encode()) + (1 if kept else 0)
        if kept and size + extra > limit:
            break
        kept.append(w)
        size += extra
    text = " ".join(kept)
    return text.encode()[:limit].decode("utf-8", "ignore"), len(kept)


with open(out, "w", encoding="utf-8") as f:
    for i in range(n):
        if long_prompts:
            record = {"instruction": " ".join(verses[i:i + 3]), "output": "Amen."}
        else:
            words = verses[i].split()
            prompt, used = take(words, 12)
            response, _ = take(words[used:] or ["Amen."], 40)
            record = {"id": i, "instruction": prompt + " ", "output": response}
        f.write(json.dumps(record) + "\n")
print(f"sft records: {n} written to {out}")

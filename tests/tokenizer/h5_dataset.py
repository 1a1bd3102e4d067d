"""Reads a tessera-dataset file (format version 1) with h5py, and decodes GPT-2 ids with
the vocabulary's own files: shared by the tessera-prep checks."""
import hashlib
import json
import os

import h5py
import numpy as np


def _plain(v):
    if isinstance(v, bytes):  # fixed-length strings come back as numpy.bytes_
        return v.decode()
    return int(v) if isinstance(v, np.integer) else v


def read(path):
    """Returns (attrs as str/int, tokens, doc_offsets, manifest)."""
    with h5py.File(path, "r") as f:
        attrs = {k: _plain(v) for k, v in f.attrs.items()}
        tokens = f["tokens"][...]
        offsets = f["doc_offsets"][...]
    return attrs, tokens, offsets, json.loads(attrs["manifest"])


def documents(tokens, offsets):
    return [tokens[offsets[i]:offsets[i + 1]] for i in range(len(offsets) - 1)]


def byte_decoder():
    """GPT-2's bytes_to_unicode, inverted: character -> byte."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(bs, cs)}


class Gpt2Vocab:
    def __init__(self, vocab_dir):
        raw = [open(os.path.join(vocab_dir, n), "rb").read() for n in ("encoder.json", "vocab.bpe")]
        self.sha256 = hashlib.sha256(raw[0] + raw[1]).hexdigest()
        dec = byte_decoder()
        self.bytes_of = {i: bytes(dec[c] for c in t) for t, i in json.loads(raw[0]).items()}

    def decode(self, ids):
        return b"".join(self.bytes_of[int(i)] for i in ids)

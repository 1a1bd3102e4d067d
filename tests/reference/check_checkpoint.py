#!/usr/bin/python3
"""A tessera checkpoint read with h5py, loaded into the independent PyTorch reference model,
reproduces the validation loss tessera reported for the same weights.

usage: check_checkpoint.py CKPT.h5 DATASET.h5 METRICS.jsonl [--tol 1e-5]

The validation samples are rebuilt here from the dataset file alone, following the rules in
doc/data.md (document split by a Philox hash of the document index, windows of seq_len + 1
tokens at multiples of seq_len in the stream of validation documents), so this also checks
that tessera's split is the documented one.
"""
import argparse
import json
import os
import sys

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_model import Reference  # noqa: E402

M32 = np.uint64(0xFFFFFFFF)


def philox(c0, c1, c2, c3, k0, k1):
    """Philox-4x32-10 on arrays of uint64 holding 32-bit values."""
    c = [np.asarray(x, dtype=np.uint64) for x in (c0, c1, c2, c3)]
    k0, k1 = np.uint64(k0), np.uint64(k1)
    for _ in range(10):
        p0 = np.uint64(0xD2511F53) * c[0]
        p1 = np.uint64(0xCD9E8D57) * c[2]
        c = [(p1 >> np.uint64(32)) ^ c[1] ^ k0, p1 & M32, (p0 >> np.uint64(32)) ^ c[3] ^ k1, p0 & M32]
        k0 = (k0 + np.uint64(0x9E3779B9)) & M32
        k1 = (k1 + np.uint64(0xBB67AE85)) & M32
    return c


def stream_key(seed, name):
    h = 14695981039346656037
    for ch in name.encode():
        h = ((h ^ ch) * 1099511628211) & ((1 << 64) - 1)
    h ^= (seed * 0x9E3779B97F4A7C15) & ((1 << 64) - 1)
    return h & 0xFFFFFFFF, h >> 32


def uniform(seed, name, index):
    k0, k1 = stream_key(seed, name)
    idx = np.asarray(index, dtype=np.uint64)
    r = philox(idx & M32, idx >> np.uint64(32), np.ones_like(idx), np.zeros_like(idx), k0, k1)
    bits = (r[0] << np.uint64(32)) | r[1]
    return (bits >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def model_config(deck):
    m = deck["model"]
    C, arch = m["d_model"], m["arch"]
    ffn = m["ffn_hidden"] or (4 * C if arch == "gpt2" else (8 * C // 3 + 63) // 64 * 64)
    mult = m["vocab_multiple"]
    tie = m["tie_embeddings"]
    return dict(arch=arch, layers=m["layers"], d_model=C, heads=m["heads"],
                kv_heads=m["kv_heads"] or m["heads"], ffn_hidden=ffn, vocab=m["vocab"],
                vocab_padded=(m["vocab"] + mult - 1) // mult * mult, seq_len=m["seq_len"],
                norm_eps=m["norm_eps"], rope_theta=m["rope_theta"],
                tie_embeddings=int(arch == "gpt2" if tie == "auto" else tie == "true"),
                init_std=m["init_std"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ckpt")
    ap.add_argument("dataset")
    ap.add_argument("metrics")
    ap.add_argument("--tol", type=float, default=1e-5)
    a = ap.parse_args()
    with h5py.File(a.ckpt, "r") as f:
        deck = json.loads(f.attrs["deck"])
        step = int(f.attrs["step"])
        weights = {k[len("params/"):]: f[k][()] for k in
                   [n for n in _datasets(f) if n.startswith("params/")]}
    cfg = model_config(deck)
    T = cfg["seq_len"]
    with h5py.File(a.dataset, "r") as f:
        tokens = f["tokens"][()].astype(np.int64)
        off = f["doc_offsets"][()].astype(np.int64)
        # A loss mask (doc/data.md, "Loss masks"): the mean over the unmasked targets only.
        mask = f["loss_mask"][()] if "loss_mask" in f else np.ones(len(tokens), np.uint8)
    val = uniform(0, "data.split", np.arange(len(off) - 1)) < deck["data"]["val_fraction"]
    stream = np.concatenate([tokens[off[d]:off[d + 1]] for d in np.nonzero(val)[0]])
    stream_mask = np.concatenate([mask[off[d]:off[d + 1]] for d in np.nonzero(val)[0]])
    per = deck["train"]["micro_batch"] * json.loads(f_layout(a.ckpt))["dp"]
    n = (deck["train"]["eval_samples"] + per - 1) // per * per
    starts = [(k % ((len(stream) - 1) // T)) * T for k in range(n)]
    windows = np.stack([stream[s:s + T + 1] for s in starts])
    masks = np.stack([stream_mask[s:s + T + 1] for s in starts])
    model = Reference(cfg)
    model.load(weights)
    with torch.no_grad():
        ids = torch.from_numpy(windows)
        targets = ids[:, 1:].clone()
        targets[torch.from_numpy(masks[:, 1:] == 0)] = -100  # F.cross_entropy's ignore_index
        loss = float(model.loss(ids[:, :-1], targets))
    reported = [json.loads(l) for l in open(a.metrics) if '"val_loss"' in l]
    reported = {r["step"]: r["val_loss"] for r in reported}[step]
    rel = abs(loss - reported) / abs(loss)
    print(f"checkpoint step {step}: {len(weights)} tensors via h5py; {int(val.sum())} validation "
          f"documents, {n} samples, {int(masks[:, 1:].sum())} of {n * T} targets unmasked")
    print(f"validation loss: PyTorch {loss:.9f}, tessera {reported:.9f}, rel {rel:.2e} (tol {a.tol:.0e})")
    print("checkpoint-reference: " + ("PASS" if rel <= a.tol else "FAIL"))
    return 0 if rel <= a.tol else 1


def _datasets(f):
    out = []
    f.visititems(lambda name, obj: out.append(name) if isinstance(obj, h5py.Dataset) else None)
    return out


def f_layout(path):
    with h5py.File(path, "r") as f:
        v = f.attrs["layout"]
        return v.decode() if isinstance(v, bytes) else v


if __name__ == "__main__":
    sys.exit(main())

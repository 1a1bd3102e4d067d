#!/usr/bin/python3
"""Write a dump in tessera's reference-dump format from the reference model itself.

Numbers are computed in float32 (as tessera would) with a small config; used to
self-test check_reference.py.
usage: /usr/bin/python3 make_fake_dump.py OUT.h5 [--arch llama|gpt2] [--steps S] [--batch B] [--seed N]
"""
import argparse
import math
import os
import sys

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_model import Reference, lr_at, param_shapes  # noqa: E402


def small_config(arch, steps):
    llama = arch == "llama"
    return dict(arch=arch, layers=2, d_model=32, heads=4, kv_heads=2 if llama else 4,
                ffn_hidden=96 if llama else 128, vocab=50, vocab_padded=64, seq_len=16,
                norm_eps=1e-5, rope_theta=10000.0, tie_embeddings=0 if llama else 1,
                init_std=0.02, lr=3e-3, min_lr=3e-4, warmup=2, total_steps=steps,
                beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.1, grad_clip=1.0,
                decay_embeddings=0)


def init_weights(cfg, rng):
    """Initialisation of doc/model.md, with numpy's generator instead of Philox."""
    out = {}
    for name, shape in param_shapes(cfg).items():
        if name.endswith(".bias"):
            w = np.zeros(shape)
        elif name.endswith("norm.weight"):
            w = np.ones(shape)
        else:
            w = rng.normal(0.0, cfg["init_std"], shape)
            if name.endswith("attn.o.weight") or name.endswith("mlp.down.weight"):
                w /= math.sqrt(2 * cfg["layers"])
            if name in ("embed.tok.weight", "head.weight"):
                w[cfg["vocab"]:] = 0.0
        out[name] = w.astype(np.float32)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--arch", default="llama", choices=("llama", "gpt2"))
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--batch", type=int, default=3)
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    torch.manual_seed(args.seed)
    rng = np.random.default_rng(args.seed)
    cfg = small_config(args.arch, args.steps)
    V, T, B, S = cfg["vocab"], cfg["seq_len"], args.batch, args.steps
    init = init_weights(cfg, rng)

    with h5py.File(args.out, "w") as f:
        for k, v in cfg.items():
            f.attrs[k] = v if isinstance(v, str) else (np.float64(v) if isinstance(v, float) else np.int64(v))
        for name, w in init.items():
            f["init/" + name] = w

        model = Reference(cfg, torch.float32)
        model.load(init)
        tokens = rng.integers(0, V, (B, T + 1)).astype(np.int32)
        ids = torch.as_tensor(tokens.astype(np.int64))
        loss = model.loss(ids[:, :-1], ids[:, 1:])
        loss.backward()
        f["check/tokens"] = tokens
        f["check/logits"] = model(ids[:, :-1]).detach().numpy().astype(np.float32)
        f["check/loss"] = np.float64(loss.item())
        for name, p in model.named().items():
            f["check/grad/" + name] = p.grad.numpy().astype(np.float32)

        model = Reference(cfg, torch.float32)
        model.load(init)
        opt = model.optimizer(cfg["lr"], cfg["beta1"], cfg["beta2"], cfg["eps"],
                              cfg["weight_decay"], cfg["decay_embeddings"])
        train_tokens = rng.integers(0, V, (S, B, T + 1)).astype(np.int32)
        losses, lrs, norms = [], [], []
        for s in range(S):
            lr = lr_at(s + 1, cfg["lr"], cfg["min_lr"], cfg["warmup"], cfg["total_steps"])
            loss, norm = model.train_step(opt, train_tokens[s], lr, cfg["grad_clip"])
            losses.append(loss), lrs.append(lr), norms.append(norm)
        f["train/tokens"] = train_tokens
        f["train/loss"] = np.array(losses, dtype=np.float64)
        f["train/lr"] = np.array(lrs, dtype=np.float64)
        f["train/grad_norm"] = np.array(norms, dtype=np.float64)
        for name, w in model.weights().items():
            f["train/final/" + name] = w.astype(np.float32)
    print(f"wrote {args.out}: {args.arch}, {S} steps, batch {B}, T {T}")


if __name__ == "__main__":
    main()

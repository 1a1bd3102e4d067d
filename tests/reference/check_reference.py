#!/usr/bin/python3
"""Check a tessera reference dump against the independent PyTorch model (float64).

usage: /usr/bin/python3 check_reference.py DUMP.h5 [--tol 1e-5] [--precision bf16]
Exit status 0 only if every check passes.

--precision bf16 checks a dump of a bf16 run (train.precision = bf16): there is no exact
answer to compare with, so tessera must be as close to the float64 reference as PyTorch's own
bf16 autocast of the same model is (relative L2 error at most LOWP_FACTOR times autocast's, or
below LOWP_FLOOR, and never above LOWP_CAP), for the logits, the loss, every gradient, and the
loss of every training step (doc/precision.md).
"""
import argparse
import os
import sys

import h5py
import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reference_model import Reference, lr_at  # noqa: E402

TINY = 1e-30


def read_config(f):
    cfg = {}
    for k, v in f.attrs.items():
        if isinstance(v, bytes):
            v = v.decode()
        elif isinstance(v, np.ndarray) and v.size == 1:
            v = v.reshape(()).item()
        if isinstance(v, np.generic):
            v = v.item()
        if isinstance(v, bytes):
            v = v.decode()
        cfg[k] = v
    return cfg


def read_group(g):
    return {name: g[name][()] for name in g.keys()}


class Checker:
    def __init__(self):
        self.failed = 0
        self.total = 0

    def tensor(self, name, got, ref, tol, scale=None):
        """Relative L2 error of got (tessera) against ref (reference), or against scale if given."""
        got = np.asarray(got, dtype=np.float64)
        ref = np.asarray(ref, dtype=np.float64)
        if got.shape != ref.shape:
            return self.result(False, f"{name:44s} shape {got.shape} != reference {ref.shape}")
        diff = got - ref
        err = np.linalg.norm(diff) / max(np.linalg.norm(ref) if scale is None else scale, TINY)
        maxabs = np.abs(diff).max() if diff.size else 0.0
        ok = bool(err <= tol)  # NaN fails
        kind = "rel" if scale is None else "err/global"
        return self.result(ok, f"{name:44s} {str(got.shape):18s} {kind} {err:.3e} maxabs {maxabs:.3e} (tol {tol:.0e})")

    def result(self, ok, text):
        self.total += 1
        self.failed += not ok
        print(("PASS " if ok else "FAIL ") + text)
        return ok


def grad_of(p):
    """p's gradient; zeros for a tensor the loss does not differentiate (the selection bias)."""
    return torch.zeros_like(p) if p.grad is None else p.grad


def grad_norms(model):
    """({name: ||grad||}, global norm) of the current gradients."""
    norms = {n: float(torch.linalg.vector_norm(grad_of(p))) for n, p in model.named().items()}
    return norms, float(np.sqrt(sum(v * v for v in norms.values())))


# A tensor whose reference gradient is below this fraction of the global norm has an
# identically zero gradient (gpt2's attn.k.bias: softmax ignores a shift shared by all keys).
# Its gradient in float32 is pure rounding noise, so it is judged relative to the global
# norm, and its trained weights (noise amplified by Adam's normalisation) by a bound.
ZERO_GRAD = 1e-9


def masked_targets(tokens, mask, docs=None):
    """tokens[:, 1:] as targets, -100 (F.cross_entropy's ignore_index: mean over the others)
    where a loss mask is 0 (doc/data.md, "Loss masks"); mask None: every target counts. With
    document starts docs [B, T+1] (doc/data.md, "Document masks") also where the next token
    starts a document: a document's last token does not predict the next document."""
    targets = torch.as_tensor(np.asarray(tokens), dtype=torch.long)[..., 1:].clone()
    if mask is not None:
        targets[torch.as_tensor(np.asarray(mask)[..., 1:] == 0)] = -100
    if docs is not None:
        docs = np.asarray(docs)
        T = docs.shape[-1] - 1
        targets[torch.as_tensor(docs[..., 1:] == np.arange(1, T + 1))] = -100
    return targets


def document_starts(docs):
    """The model's document starts of the input tokens (the window's first T), or None."""
    return None if docs is None else torch.as_tensor(np.asarray(docs)[..., :-1].astype(np.int64))


def check_batch(f, cfg, ck, tol):
    """(a) logits, loss and gradients on /check/tokens at the /init weights."""
    model = Reference(cfg, torch.float64)
    model.load(read_group(f["init"]))
    tokens = torch.as_tensor(f["check/tokens"][()].astype(np.int64))
    mask = f["check/mask"][()] if "check/mask" in f else None
    docs = f["check/docs"][()] if "check/docs" in f else None
    model.docs = document_starts(docs)
    targets = masked_targets(tokens, mask, docs)
    loss = model.loss(tokens[:, :-1], targets)
    (loss + model.extra).backward()
    with torch.no_grad():
        logits = model(tokens[:, :-1])
    model.routed = {}
    print(f"-- check batch: tokens {tuple(tokens.shape)}"
          + ("" if mask is None else f", {int(mask[:, 1:].sum())} unmasked targets")
          + ("" if docs is None else f", {int((docs[:, :-1] == np.arange(docs.shape[1] - 1)).sum())}"
             f" document starts, {int((targets >= 0).sum())} targets predicted"))
    ck.tensor("logits", f["check/logits"][()], logits.numpy(), tol)
    ck.tensor("loss", f["check/loss"][()], loss.item(), tol)
    grads = f["check/grad"]
    norms, total = grad_norms(model)
    for name, p in model.named().items():
        if name not in grads:
            ck.result(False, f"grad/{name}: missing from dump")
            continue
        scale = total if norms[name] <= ZERO_GRAD * total else None
        ck.tensor("grad/" + name, grads[name][()], grad_of(p).numpy(), tol, scale)
    for name in sorted(set(grads.keys()) - set(model.named())):
        ck.result(False, f"grad/{name}: not a parameter of the reference model")


def check_training(f, cfg, ck, tol):
    """(b) S AdamW steps from /init on /train/tokens, compared step by step."""
    model = Reference(cfg, torch.float64)
    model.load(read_group(f["init"]))
    opt = model.optimizer(cfg["lr"], cfg["beta1"], cfg["beta2"], cfg["eps"],
                          cfg["weight_decay"], cfg["decay_embeddings"])
    tokens = f["train/tokens"][()].astype(np.int64)
    masks = f["train/mask"][()] if "train/mask" in f else None
    docs = f["train/docs"][()] if "train/docs" in f else None
    want_loss, want_lr, want_norm = (f["train/" + k][()] for k in ("loss", "lr", "grad_norm"))
    steps = tokens.shape[0]
    print(f"-- training: {steps} steps, tokens {tokens.shape[1:]}"
          + ("" if masks is None else f", {int(masks[:, :, 1:].sum())} unmasked targets"))
    init = {n: p.detach().clone().numpy() for n, p in model.named().items()}
    max_ratio = dict.fromkeys(init, 0.0)  # largest ||grad|| / global norm over the steps
    lr_sum = 0.0
    for s in range(steps):
        lr = lr_at(s + 1, cfg["lr"], cfg["min_lr"], cfg["warmup"], cfg["total_steps"])
        lr_sum += lr
        model.docs = None if docs is None else document_starts(docs[s])
        targets = None
        if masks is not None or docs is not None:
            targets = masked_targets(tokens[s], None if masks is None else masks[s],
                                     None if docs is None else docs[s])
        loss, norm = model.train_step(opt, tokens[s], lr, cfg["grad_clip"], targets)
        norms, total = grad_norms(model)
        for n, v in norms.items():
            max_ratio[n] = max(max_ratio[n], v / max(total, TINY))
        ck.tensor(f"step {s} lr", want_lr[s], lr, 1e-12)
        ck.tensor(f"step {s} loss", want_loss[s], loss, tol)
        ck.tensor(f"step {s} grad_norm", want_norm[s], norm, 10 * tol)
    final = f["train/final"]
    for name, p in model.named().items():
        if name not in final:
            ck.result(False, f"final/{name}: missing from dump")
            continue
        got = final[name][()]
        if max_ratio[name] <= ZERO_GRAD and not name.endswith("selection_bias"):
            # moved by rounding noise only: at most ~lr a step
            drift = np.abs(got.astype(np.float64) - init[name]).max() if got.shape == init[name].shape else np.inf
            ck.result(bool(drift <= 2 * lr_sum), f"{'final/' + name:44s} {str(got.shape):18s} "
                      f"zero-gradient tensor: max drift {drift:.3e} <= 2*sum(lr) {2 * lr_sum:.3e}")
            continue
        ck.tensor("final/" + name, got, p.detach().numpy(), 10 * tol)


# bf16 tolerances: within twice PyTorch autocast's error against float64, or under about two bf16
# units of roundoff (2^-8) when autocast happens to be more accurate than that, never above 5%.
LOWP_FACTOR, LOWP_FLOOR, LOWP_CAP = 2.0, 2.0 ** -8, 5e-2
TRAJECTORY_BAND = 2e-2


def rel(a, b, scale=None):
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return np.linalg.norm(a - b) / max(np.linalg.norm(b) if scale is None else scale, TINY)


def lowp(ck, name, got, torch_bf16, exact, scale=None):
    """tessera's error against float64 beside autocast's."""
    if np.shape(got) != np.shape(exact):
        return ck.result(False, f"{name:44s} shape {np.shape(got)} != reference {np.shape(exact)}")
    et, ep = rel(got, exact, scale), rel(torch_bf16, exact, scale)
    bound = min(max(LOWP_FACTOR * ep, LOWP_FLOOR), LOWP_CAP)
    return ck.result(bool(et <= bound), f"{name:44s} {str(np.shape(got)):18s} tessera {et:.3e} "
                     f"autocast {ep:.3e} vs float64 (bound {bound:.2e})")


def bf16_model(cfg, weights):
    model = Reference(cfg, torch.float32)
    model.load(weights)
    return model


def autocast():
    return torch.autocast("cpu", dtype=torch.bfloat16)


def check_batch_lowp(f, cfg, ck):
    """(a) bf16: logits, loss and gradients at the /init weights."""
    init = read_group(f["init"])
    tokens = torch.as_tensor(f["check/tokens"][()].astype(np.int64))
    exact, auto = Reference(cfg, torch.float64), bf16_model(cfg, init)
    exact.load(init)
    loss64 = exact.loss(tokens[:, :-1], tokens[:, 1:])
    loss64.backward()
    with autocast():
        loss_a = auto.loss(tokens[:, :-1], tokens[:, 1:])
    loss_a.backward()
    with torch.no_grad():
        logits64 = exact(tokens[:, :-1])
        with autocast():
            logits_a = auto(tokens[:, :-1]).float()
    print(f"-- check batch (bf16): tokens {tuple(tokens.shape)}")
    lowp(ck, "logits", f["check/logits"][()], logits_a.numpy(), logits64.numpy())
    # An fp32 run would pass the bounds above too: the dump must show bf16 rounding.
    err = rel(f["check/logits"][()], logits64.numpy())
    ck.result(bool(err > 1e-4), f"{'logits computed in bf16':44s} error {err:.3e} > 1e-4")
    lowp(ck, "loss", f["check/loss"][()], loss_a.item(), loss64.item())
    norms, total = grad_norms(exact)
    auto_grads = {n: p.grad for n, p in auto.named().items()}
    for name, p in exact.named().items():
        if name not in f["check/grad"]:
            ck.result(False, f"grad/{name}: missing from dump")
            continue
        scale = total if norms[name] <= ZERO_GRAD * total else None
        lowp(ck, "grad/" + name, f["check/grad"][name][()], auto_grads[name].numpy(),
             p.grad.numpy(), scale)


def check_training_lowp(f, cfg, ck):
    """(b) bf16: the loss of every step against float64 training on the same batches."""
    init = read_group(f["init"])
    exact, auto = Reference(cfg, torch.float64), bf16_model(cfg, init)
    exact.load(init)
    args = (cfg["lr"], cfg["beta1"], cfg["beta2"], cfg["eps"], cfg["weight_decay"],
            cfg["decay_embeddings"])
    opt64, opt_a = exact.optimizer(*args), auto.optimizer(*args)
    tokens = f["train/tokens"][()].astype(np.int64)
    want = f["train/loss"][()]
    steps = tokens.shape[0]
    print(f"-- training (bf16): {steps} steps, tokens {tokens.shape[1:]}")
    worst_t = worst_a = 0.0
    for s in range(steps):
        lr = lr_at(s + 1, cfg["lr"], cfg["min_lr"], cfg["warmup"], cfg["total_steps"])
        l64, _ = exact.train_step(opt64, tokens[s], lr, cfg["grad_clip"])
        with autocast():
            la, _ = auto.train_step(opt_a, tokens[s], lr, cfg["grad_clip"])
        worst_t = max(worst_t, abs(want[s] - l64) / l64)
        worst_a = max(worst_a, abs(la - l64) / l64)
        if s % 10 == 0 or s == steps - 1:
            print(f"   step {s + 1:3d}: loss float64 {l64:.6f} tessera bf16 {want[s]:.6f} "
                  f"autocast {la:.6f}")
    # Training amplifies rounding differences (the trajectories of any two precisions drift
    # apart), so the band is twice autocast's drift or 2%, whichever is larger.
    bound = min(max(LOWP_FACTOR * worst_a, TRAJECTORY_BAND), LOWP_CAP)
    ck.result(bool(worst_t <= bound), f"{'loss trajectory':44s} worst step: tessera {worst_t:.3e} "
              f"autocast {worst_a:.3e} vs float64 (bound {bound:.2e})")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dump")
    ap.add_argument("--tol", type=float, default=1e-5)
    ap.add_argument("--precision", choices=("fp32", "bf16"), default="fp32")
    args = ap.parse_args()
    torch.set_num_threads(max(1, min(8, os.cpu_count() or 1)))
    ck = Checker()
    with h5py.File(args.dump, "r") as f:
        cfg = read_config(f)
        print("config: " + " ".join(f"{k}={cfg[k]}" for k in sorted(cfg)))
        try:
            if args.precision == "bf16":
                check_batch_lowp(f, cfg, ck)
                check_training_lowp(f, cfg, ck)
            else:
                check_batch(f, cfg, ck, args.tol)
                check_training(f, cfg, ck, args.tol)
        except (KeyError, ValueError) as e:  # malformed dump: missing group, wrong shapes
            ck.result(False, f"dump unreadable: {type(e).__name__}: {e}")
    print(f"{ck.total - ck.failed} of {ck.total} checks passed")
    if ck.failed:
        print(f"reference: FAIL ({ck.failed} checks failed)")
        return 1
    print("reference: PASS")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Independent PyTorch reference of the model defined in doc/model.md.

Written plainly (explicit attention, explicit norms) for checking tessera's numbers,
not for speed. Parameters are kept under tessera's global names.
"""
import math

import numpy as np
import torch
import torch.nn.functional as F

CONFIG_KEYS = ("arch", "layers", "d_model", "heads", "kv_heads", "ffn_hidden", "vocab",
               "vocab_padded", "seq_len", "norm_eps", "rope_theta", "tie_embeddings")


def param_shapes(cfg):
    """Ordered {global name: shape} for the config (doc/model.md, 'Parameters')."""
    gpt2 = cfg["arch"] == "gpt2"
    C, Hq, Hkv = cfg["d_model"], cfg["heads"], cfg["kv_heads"]
    D, Fh, Vp = C // Hq, cfg["ffn_hidden"], cfg["vocab_padded"]
    s = {"embed.tok.weight": (Vp, C)}
    if gpt2:
        s["embed.pos.weight"] = (cfg["seq_len"], C)
    for i in range(cfg["layers"]):
        p = f"layers.{i}."
        s[p + "attn_norm.weight"] = (C,)
        if gpt2:
            s[p + "attn_norm.bias"] = (C,)
        for n, rows in (("q", Hq * D), ("k", Hkv * D), ("v", Hkv * D)):
            s[p + f"attn.{n}.weight"] = (rows, C)
            if gpt2:
                s[p + f"attn.{n}.bias"] = (rows,)
        s[p + "attn.o.weight"] = (C, Hq * D)
        if gpt2:
            s[p + "attn.o.bias"] = (C,)
        s[p + "mlp_norm.weight"] = (C,)
        if gpt2:
            s[p + "mlp_norm.bias"] = (C,)
        else:
            s[p + "mlp.gate.weight"] = (Fh, C)
        s[p + "mlp.up.weight"] = (Fh, C)
        if gpt2:
            s[p + "mlp.up.bias"] = (Fh,)
        s[p + "mlp.down.weight"] = (C, Fh)
        if gpt2:
            s[p + "mlp.down.bias"] = (C,)
    s["final_norm.weight"] = (C,)
    if gpt2:
        s["final_norm.bias"] = (C,)
    if not tied(cfg):
        s["head.weight"] = (Vp, C)
    return s


def tied(cfg):
    return cfg["arch"] == "gpt2" or bool(cfg["tie_embeddings"])


def decays(name, decay_embeddings=False):
    """Whether AdamW weight decay applies to this parameter (doc/model.md, 'Optimizer')."""
    if name.startswith("embed."):
        return bool(decay_embeddings)
    if name == "head.weight":
        return True
    return (".attn." in name or ".mlp." in name) and name.endswith(".weight")


def lr_at(s, lr, min_lr, warmup, total_steps):
    """Learning rate of 1-based step s: linear warmup, then cosine from lr to min_lr."""
    if s <= warmup:
        return lr * s / warmup
    progress = min(1.0, (s - warmup) / max(1, total_steps - warmup))
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


class Reference(torch.nn.Module):
    def __init__(self, cfg, dtype=torch.float64):
        super().__init__()
        self.cfg = {k: cfg[k] for k in CONFIG_KEYS}
        self.gpt2 = cfg["arch"] == "gpt2"
        assert cfg["arch"] in ("llama", "gpt2"), cfg["arch"]
        assert cfg["heads"] % cfg["kv_heads"] == 0 and cfg["d_model"] % cfg["heads"] == 0
        self.shapes = param_shapes(cfg)
        self.p = torch.nn.ParameterDict({
            n.replace(".", "__"): torch.nn.Parameter(torch.zeros(s, dtype=dtype))
            for n, s in self.shapes.items()})

    # -- parameters under tessera's names
    def named(self):
        return {n: self.p[n.replace(".", "__")] for n in self.shapes}

    def w(self, name):
        return self.p[name.replace(".", "__")]

    def load(self, weights):
        missing = set(self.shapes) - set(weights)
        extra = set(weights) - set(self.shapes)
        if missing or extra:
            raise ValueError(f"weights mismatch: missing {sorted(missing)} extra {sorted(extra)}")
        with torch.no_grad():
            for n, t in self.named().items():
                a = np.asarray(weights[n])
                if tuple(a.shape) != tuple(t.shape):
                    raise ValueError(f"{n}: shape {a.shape} != {tuple(t.shape)}")
                t.copy_(torch.from_numpy(a.astype(np.float64)))

    def weights(self):
        return {n: t.detach().cpu().numpy() for n, t in self.named().items()}

    # -- building blocks
    def linear(self, x, name):
        y = x @ self.w(name + ".weight").T
        return y + self.w(name + ".bias") if self.gpt2 else y

    def norm(self, x, name):
        eps = self.cfg["norm_eps"]
        if self.gpt2:
            mu = x.mean(-1, keepdim=True)
            var = ((x - mu) ** 2).mean(-1, keepdim=True)
            return (x - mu) / torch.sqrt(var + eps) * self.w(name + ".weight") + self.w(name + ".bias")
        return x / torch.sqrt((x * x).mean(-1, keepdim=True) + eps) * self.w(name + ".weight")

    def rope(self, x):  # x: [B, H, T, D]; rotate interleaved pairs (2j, 2j+1)
        T, D = x.shape[-2], x.shape[-1]
        j = torch.arange(D // 2, dtype=torch.float64)
        t = torch.arange(T, dtype=torch.float64)
        ang = t[:, None] * self.cfg["rope_theta"] ** (-2.0 * j / D)[None, :]
        cos, sin = torch.cos(ang).to(x.dtype), torch.sin(ang).to(x.dtype)
        xe, xo = x[..., 0::2], x[..., 1::2]
        return torch.stack((xe * cos - xo * sin, xe * sin + xo * cos), dim=-1).flatten(-2)

    def attn(self, x, pre):
        B, T, C = x.shape
        Hq, Hkv = self.cfg["heads"], self.cfg["kv_heads"]
        D = C // Hq
        q = self.linear(x, pre + "q").view(B, T, Hq, D).transpose(1, 2)
        k = self.linear(x, pre + "k").view(B, T, Hkv, D).transpose(1, 2)
        v = self.linear(x, pre + "v").view(B, T, Hkv, D).transpose(1, 2)
        if not self.gpt2:
            q, k = self.rope(q), self.rope(k)
        k = k.repeat_interleave(Hq // Hkv, dim=1)  # query head h -> kv head h // (Hq/Hkv)
        v = v.repeat_interleave(Hq // Hkv, dim=1)
        scores = q @ k.transpose(-1, -2) / math.sqrt(D)
        future = torch.ones(T, T, dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v  # [B, Hq, T, D]
        return self.linear(y.transpose(1, 2).reshape(B, T, Hq * D), pre + "o")

    def mlp(self, x, pre):
        if self.gpt2:
            h = self.linear(x, pre + "up")
            h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h ** 3)))
            return self.linear(h, pre + "down")
        return self.linear(F.silu(self.linear(x, pre + "gate")) * self.linear(x, pre + "up"), pre + "down")

    # -- model
    def forward(self, ids):
        ids = torch.as_tensor(ids, dtype=torch.long)
        T = ids.shape[1]
        x = self.w("embed.tok.weight")[ids]
        if self.gpt2:
            x = x + self.w("embed.pos.weight")[:T]
        for i in range(self.cfg["layers"]):
            x = x + self.attn(self.norm(x, f"layers.{i}.attn_norm"), f"layers.{i}.attn.")
            x = x + self.mlp(self.norm(x, f"layers.{i}.mlp_norm"), f"layers.{i}.mlp.")
        x = self.norm(x, "final_norm")
        head = self.w("embed.tok.weight" if tied(self.cfg) else "head.weight")
        return x @ head[: self.cfg["vocab"]].T  # padding rows never reach the softmax

    def loss(self, ids, targets):
        logits = self.forward(ids)
        targets = torch.as_tensor(targets, dtype=torch.long)
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def optimizer(self, lr, beta1, beta2, eps, weight_decay, decay_embeddings=False):
        named = self.named()
        dec = [t for n, t in named.items() if decays(n, decay_embeddings)]
        nodec = [t for n, t in named.items() if not decays(n, decay_embeddings)]
        return torch.optim.AdamW([{"params": dec, "weight_decay": weight_decay},
                                  {"params": nodec, "weight_decay": 0.0}],
                                 lr=lr, betas=(beta1, beta2), eps=eps)

    def train_step(self, opt, tokens, lr, grad_clip):
        """One step on tokens [B, T+1]; returns (loss, pre-clip global grad norm)."""
        tokens = torch.as_tensor(np.asarray(tokens), dtype=torch.long)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        loss = self.loss(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        params = list(self.named().values())
        if grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
        else:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
        opt.step()
        return float(loss), float(norm)

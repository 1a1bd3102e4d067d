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
# Mixture of experts (doc/moe.md); absent from a dense model's dump.
MOE_DEFAULTS = {"experts": 0, "experts_top_k": 2, "shared_experts": 0, "expert_ffn": 0,
                "moe_every": 1, "moe_after": 0, "router": "softmax", "aux_loss": 0.0,
                "router_bias_step": 0.0, "z_loss": 0.0, "capacity_factor": 0.0,
                "moe_nodes": 1, "moe_max_nodes": 0}


def is_moe(cfg, layer):
    """Whether block `layer` is a mixture-of-experts block (model.moe_layers)."""
    after, every = cfg.get("moe_after", 0), cfg.get("moe_every", 1)
    return cfg.get("experts", 0) > 0 and layer >= after and (layer - after) % every == every - 1


def mlp_shapes(s, p, C, Fh, gpt2):
    if not gpt2:
        s[p + "gate.weight"] = (Fh, C)
    s[p + "up.weight"] = (Fh, C)
    if gpt2:
        s[p + "up.bias"] = (Fh,)
    s[p + "down.weight"] = (C, Fh)
    if gpt2:
        s[p + "down.bias"] = (C,)


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
        if not is_moe(cfg, i):
            mlp_shapes(s, p + "mlp.", C, Fh, gpt2)
            continue
        E, Fe = cfg["experts"], cfg["expert_ffn"]
        s[p + "moe.router.weight"] = (E, C)
        s[p + "moe.router.selection_bias"] = (E,)
        if cfg["shared_experts"] > 0:
            mlp_shapes(s, p + "moe.shared.", C, cfg["shared_experts"] * Fe, gpt2)
        for e in range(E):
            mlp_shapes(s, p + f"moe.experts.{e}.", C, Fe, gpt2)
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
    return (".attn." in name or ".mlp." in name or ".moe." in name) and name.endswith(".weight")


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
        self.cfg.update({k: cfg.get(k, v) for k, v in MOE_DEFAULTS.items()})
        self.extra = 0.0  # the balancing and z-loss terms of the last forward
        self.routed = {}  # tokens routed to each expert per MoE block, since the last step
        self.gpt2 = cfg["arch"] == "gpt2"
        # Document masking (doc/data.md, "Document masks"): [B, T] start of each input token's
        # document within its sample, or None (plain causal attention, positions from 0).
        self.docs = None
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

    def positions(self, B, T):
        """[B, T] position of each token: from the sample's start, or, with documents, from its
        document's start."""
        t = torch.arange(T).expand(B, T)
        return t if self.docs is None else t - self.docs

    def rope(self, x):  # x: [B, H, T, D]; rotate interleaved pairs (2j, 2j+1)
        B, T, D = x.shape[0], x.shape[-2], x.shape[-1]
        j = torch.arange(D // 2, dtype=torch.float64)
        t = self.positions(B, T).to(torch.float64)[:, None, :, None]  # [B, 1, T, 1]
        ang = t * self.cfg["rope_theta"] ** (-2.0 * j / D)
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
        if self.docs is not None:  # explicit block-diagonal causal mask [B, 1, T, T]
            key = torch.arange(T)[None, None, :]
            earlier_doc = key < self.docs[:, :, None]  # key before the query's document
            future = (future[None] | earlier_doc)[:, None]
        scores = scores.masked_fill(future, float("-inf"))
        y = torch.softmax(scores, dim=-1) @ v  # [B, Hq, T, D]
        return self.linear(y.transpose(1, 2).reshape(B, T, Hq * D), pre + "o")

    def mlp(self, x, pre):
        if self.gpt2:
            h = self.linear(x, pre + "up")
            h = 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * h ** 3)))
            return self.linear(h, pre + "down")
        return self.linear(F.silu(self.linear(x, pre + "gate")) * self.linear(x, pre + "up"), pre + "down")

    def moe(self, x, i):
        """Mixture of experts of block i (doc/moe.md): y = sum_j w_j E_j(x) + shared(x)."""
        c, pre = self.cfg, f"layers.{i}.moe."
        B, T, C = x.shape
        E, K = c["experts"], c["experts_top_k"]
        sigmoid = c["router"] == "sigmoid"
        logits = x @ self.w(pre + "router.weight").T  # [B, T, E]
        s = torch.sigmoid(logits) if sigmoid else torch.softmax(logits, dim=-1)
        key = (s + self.w(pre + "router.selection_bias")).detach()
        # Node-limited routing (parallel.ep_max_nodes): node g holds experts [g E/G, (g+1) E/G);
        # its score is the sum of its ceil(K/M) highest keys (at most E/G); the M best nodes are
        # kept (equal scores to the lower node), the other experts cannot be chosen.
        G, M = c.get("moe_nodes", 1), c.get("moe_max_nodes", 0)
        if 0 < M < G:
            per = E // G
            q = min(-(-K // M), per)
            node_score = key.view(B, T, G, per).topk(q, dim=-1).values.sum(-1)  # [B, T, G]
            best = torch.argsort(-node_score, dim=-1, stable=True)[..., :M]
            chosen = torch.zeros(B, T, G, dtype=torch.bool).scatter_(-1, best, True)
            key = key.masked_fill(~chosen.repeat_interleave(per, dim=-1), float("-inf"))
        # Top-k by score + bias, ties to the lower expert index (a stable sort).
        order = torch.argsort(-key, dim=-1, stable=True)[..., :K]  # [B, T, K]
        w = torch.gather(s, -1, order)
        if sigmoid:
            w = w / w.sum(-1, keepdim=True)
        # Capacity: per sequence, tokens in order, a token's experts in rank order.
        keep = torch.ones(B, T, K, dtype=torch.bool)
        cnt = torch.zeros(B, E, dtype=torch.float64)
        cap = math.ceil(c["capacity_factor"] * T * K / E) if c["capacity_factor"] > 0 else B * T * K
        sel = order.tolist()
        for b in range(B):
            used = [0] * E
            for t in range(T):
                for j in range(K):
                    e = sel[b][t][j]
                    keep[b, t, j] = used[e] < cap
                    used[e] += 1
            cnt[b] = torch.tensor(used, dtype=torch.float64)
        y = torch.zeros_like(x)
        for e in range(E):
            we = (w * ((order == e) & keep).to(w.dtype)).sum(-1)  # [B, T]
            y = y + we[..., None] * self.mlp(x, pre + f"experts.{e}.")
        if c["shared_experts"] > 0:
            y = y + self.mlp(x, pre + "shared.")
        # Balancing loss per sequence, averaged over sequences; z-loss averaged over tokens.
        f = E / (K * T) * cnt  # [B, E]
        sn = s / s.sum(-1, keepdim=True) if sigmoid else s
        P = sn.mean(1)  # [B, E]
        self.extra = self.extra + c["aux_loss"] * (f * P).sum(-1).mean()
        z = torch.logsumexp(logits, dim=-1)
        self.extra = self.extra + c["z_loss"] * (z * z).mean()
        self.routed[i] = self.routed.get(i, 0) + cnt.sum(0)
        return y

    def update_bias(self):
        """Auxiliary-loss-free balancing after a step: each bias moves towards the mean load."""
        step = self.cfg["router_bias_step"]
        with torch.no_grad():
            for i, load in self.routed.items():
                if step > 0:
                    self.w(f"layers.{i}.moe.router.selection_bias").add_(step * torch.sign(load.mean() - load))
        self.routed = {}

    # -- model
    def forward(self, ids):
        ids = torch.as_tensor(ids, dtype=torch.long)
        T = ids.shape[1]
        x = self.w("embed.tok.weight")[ids]
        if self.gpt2:
            x = x + self.w("embed.pos.weight")[self.positions(ids.shape[0], T)]
        self.extra = 0.0
        for i in range(self.cfg["layers"]):
            x = x + self.attn(self.norm(x, f"layers.{i}.attn_norm"), f"layers.{i}.attn.")
            h = self.norm(x, f"layers.{i}.mlp_norm")
            x = x + (self.moe(h, i) if is_moe(self.cfg, i) else self.mlp(h, f"layers.{i}.mlp."))
        x = self.norm(x, "final_norm")
        head = self.w("embed.tok.weight" if tied(self.cfg) else "head.weight")
        return x @ head[: self.cfg["vocab"]].T  # padding rows never reach the softmax

    def loss(self, ids, targets):
        """The token loss; self.extra holds the balancing and z-loss terms added to it."""
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

    def train_step(self, opt, tokens, lr, grad_clip, targets=None):
        """One step on tokens [B, T+1] (targets: tokens[:, 1:] unless given, -100 where
        masked); returns (loss, pre-clip global grad norm)."""
        tokens = torch.as_tensor(np.asarray(tokens), dtype=torch.long)
        for g in opt.param_groups:
            g["lr"] = lr
        opt.zero_grad(set_to_none=True)
        loss = self.loss(tokens[:, :-1], tokens[:, 1:] if targets is None else targets)
        (loss + self.extra).backward()
        params = [p for p in self.named().values() if p.grad is not None]
        if grad_clip > 0:
            norm = torch.nn.utils.clip_grad_norm_(params, grad_clip)
        else:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(p.grad) for p in params]))
        opt.step()
        self.update_bias()
        return float(loss), float(norm)

#!/usr/bin/python3
"""A plain GPT-2 or llama trained in PyTorch, timed step by step: the PyTorch side of
bench/run-gpt2-small. Run it with Debian's /usr/bin/python3 (the python3 on PATH has no
torch).

Model (same shapes and work as tessera's gpt2, doc/model.md): token embedding [Vp, C]
with Vp = vocab padded up to --vocab-multiple (50257 -> 50304, the padding rows zero),
learned positions [T, C], L pre-LayerNorm blocks (fused q/k/v nn.Linear C -> 3C,
causal softmax attention with scale 1/sqrt(D), output nn.Linear C -> C, MLP
nn.Linear C -> 4C, GELU tanh, nn.Linear 4C -> C), final LayerNorm, output head tied to
the token embedding. The head GEMM runs over all Vp rows, as tessera's does, and the
cross-entropy is taken over the first V (real) logits only (--head real: GEMM over the
first V rows only). Attention uses F.scaled_dot_product_attention when this torch has it
(2.0+), else explicit matmul / masked softmax / matmul (torch 1.13 on Debian 12).

--arch llama: the model of tests/reference/reference_model.py (doc/model.md) written for
speed: token embedding [Vp, C] (padding rows zero), L pre-RMSNorm blocks
(x * rsqrt(mean(x^2) + eps) * w), q/k/v as one bias-free nn.Linear C -> (Hq + 2 Hkv) D
(the same function as three), RoPE on q and k rotating interleaved pairs (2j, 2j+1) by
t * theta^(-2j/D), grouped-query attention (query head h uses key/value head h / (Hq/Hkv)),
causal softmax with scale 1/sqrt(D), bias-free output C -> C, SwiGLU MLP
down(silu(gate(x)) * up(x)) with gate and up as one nn.Linear C -> 2F, F = --ffn-hidden or
tessera's rule (8C/3 rounded up to 64), final RMSNorm, untied output head [Vp, C] (llama's
default, model.tie_embeddings = auto), padding rows zero. Initialisation as tessera's: weights
normal(0, 0.02), attention output and MLP down / sqrt(2L), norm weights 1.

Optimizer: AdamW(lr 3e-4, betas (0.9, 0.95), eps 1e-8, foreach=True (the multi-tensor
kernels; torch 1.13 defaults to the per-tensor loop on CPU), weight decay 0.1 on the weights
of linear layers (and llama's untied head) only, as tessera), clip_grad_norm_(1.0). Data: random windows of T+1
bytes of the byte-level KJV corpus (ids < 256 of the 50257 vocab).
--precision bf16 runs forward and loss under torch.autocast("cpu", torch.bfloat16) (fp32
parameters and optimizer, as tessera's train.precision = bf16), and calibrates GEMM with bf16
operands.

Output: '# ...' info lines, then one line per measured item, machine-readable:
  GEMM <flop/s>                      best of 5 1536^3 sgemm (torch.mm), after one warm-up
  FLOPS_PER_TOKEN <flops>            tessera's formula (src/perf/flops.cpp)
  PARAMETERS <n>                     parameter count (padding rows included, as tessera's)
  STEP <i> <seconds> <tokens/s> <loss>
"""
import argparse
import ctypes
import math
import os
import sys
import time


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--data", default="data/kjv.txt")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--arch", choices=["gpt2", "llama"], default="gpt2")
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--kv-heads", type=int, default=0, help="llama: key/value heads (0: --heads)")
    p.add_argument("--ffn-hidden", type=int, default=0,
                   help="MLP width; 0: 4C (gpt2) or 8C/3 rounded up to 64 (llama), as tessera")
    p.add_argument("--norm-eps", type=float, default=1e-5)
    p.add_argument("--rope-theta", type=float, default=10000.0)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--vocab-multiple", type=int, default=64)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--micro-batch", type=int, default=4)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--head", choices=["padded", "real"], default="padded",
                   help="output GEMM over all Vp padded rows (as tessera) or the first V")
    p.add_argument("--attention", choices=["auto", "sdpa", "explicit"], default="auto")
    p.add_argument("--foreach", choices=["auto", "true", "false"], default="true",
                   help="AdamW foreach (multi-tensor) implementation")
    p.add_argument("--no-gemm", action="store_true", help="skip the sgemm calibration")
    p.add_argument("--precision", choices=["fp32", "bf16"], default="fp32",
                   help="bf16: autocast the forward pass and loss to bfloat16")
    p.add_argument("--show-config", action="store_true",
                   help="print torch.__config__.show() and the BLAS library mapped in")
    return p.parse_args()


args = parse_args()

import torch  # noqa: E402  (after argparse so --help is quick)
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

torch.set_num_threads(args.threads)


def info(*a):
    print("#", *a, flush=True)


def mapped_libraries(words):
    """Shared objects of this process whose path contains one of words."""
    found = []
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 6 and any(w in parts[5] for w in words) and parts[5] not in found:
                found.append(parts[5])
    return found


def measure_gemm():
    n = 1536
    dtype = torch.bfloat16 if args.precision == "bf16" else torch.float32
    a = torch.full((n, n), 0.5, dtype=dtype)
    b = torch.full((n, n), 0.25, dtype=dtype)
    c = torch.empty(n, n, dtype=dtype)
    best = 1e30
    for rep in range(6):
        t0 = time.perf_counter()
        torch.mm(a, b, out=c)
        s = time.perf_counter() - t0
        if rep > 0:
            best = min(best, s)
    return 2.0 * n * n * n / best


class Block(nn.Module):
    def __init__(self, C, H, attention):
        super().__init__()
        self.H = H
        self.attention = attention
        self.ln1 = nn.LayerNorm(C, eps=1e-5)
        self.qkv = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C, eps=1e-5)
        self.up = nn.Linear(C, 4 * C)
        self.act = nn.GELU(approximate="tanh")
        self.down = nn.Linear(4 * C, C)

    def attn(self, x, mask):
        B, T, C = x.shape
        D = C // self.H
        q, k, v = self.qkv(x).split(C, dim=2)
        q = q.view(B, T, self.H, D).transpose(1, 2)
        k = k.view(B, T, self.H, D).transpose(1, 2)
        v = v.view(B, T, self.H, D).transpose(1, 2)
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
            att = att.masked_fill(mask, float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, C))

    def forward(self, x, mask):
        x = x + self.attn(self.ln1(x), mask)
        return x + self.down(self.act(self.up(self.ln2(x))))


class GPT2(nn.Module):
    def __init__(self, L, C, H, V, Vp, T, attention, head):
        super().__init__()
        self.V, self.head = V, head
        self.wte = nn.Embedding(Vp, C)
        self.wpe = nn.Embedding(T, C)
        self.blocks = nn.ModuleList([Block(C, H, attention) for _ in range(L)])
        self.ln_f = nn.LayerNorm(C, eps=1e-5)
        self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1))
        with torch.no_grad():  # GPT-2 init as doc/model.md: std 0.02, residual outs / sqrt(2L)
            for name, p in self.named_parameters():
                if p.dim() == 2:
                    std = 0.02 / math.sqrt(2 * L) if name.endswith(("proj.weight", "down.weight")) else 0.02
                    p.normal_(0.0, std)
                elif name.endswith("bias"):
                    p.zero_()
            self.wte.weight[V:].zero_()

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.wte(idx) + self.wpe.weight[:T]
        for blk in self.blocks:
            x = blk(x, self.mask)
        x = self.ln_f(x)
        if self.head == "padded":  # tied head over all Vp rows, loss over the first V logits
            logits = F.linear(x, self.wte.weight)[..., : self.V]
        else:                      # GEMM over the first V rows only
            logits = F.linear(x, self.wte.weight[: self.V])
        return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1))


class RMSNorm(nn.Module):
    def __init__(self, C, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(C))

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class LlamaBlock(nn.Module):
    def __init__(self, C, H, Hkv, Fh, eps, attention):
        super().__init__()
        self.H, self.Hkv, self.D, self.Fh, self.attention = H, Hkv, C // H, Fh, attention
        self.attn_norm = RMSNorm(C, eps)
        self.qkv = nn.Linear(C, (H + 2 * Hkv) * self.D, bias=False)
        self.proj = nn.Linear(H * self.D, C, bias=False)
        self.mlp_norm = RMSNorm(C, eps)
        self.gate_up = nn.Linear(C, 2 * Fh, bias=False)
        self.down = nn.Linear(Fh, C, bias=False)

    @staticmethod
    def rope(x, cos, sin):  # x [B, H, T, D]; rotate interleaved pairs (2j, 2j+1)
        xe, xo = x[..., 0::2], x[..., 1::2]
        return torch.stack((xe * cos - xo * sin, xe * sin + xo * cos), dim=-1).flatten(-2)

    def attn(self, x, mask, cos, sin):
        B, T, C = x.shape
        H, Hkv, D = self.H, self.Hkv, self.D
        q, k, v = self.qkv(x).split([H * D, Hkv * D, Hkv * D], dim=2)
        q = self.rope(q.view(B, T, H, D).transpose(1, 2), cos, sin)
        k = self.rope(k.view(B, T, Hkv, D).transpose(1, 2), cos, sin)
        v = v.view(B, T, Hkv, D).transpose(1, 2)
        if Hkv != H:  # query head h -> key/value head h // (H / Hkv)
            k = k.repeat_interleave(H // Hkv, dim=1)
            v = v.repeat_interleave(H // Hkv, dim=1)
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
            att = att.masked_fill(mask, float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        return self.proj(y.transpose(1, 2).reshape(B, T, H * D))

    def forward(self, x, mask, cos, sin):
        x = x + self.attn(self.attn_norm(x), mask, cos, sin)
        gate, up = self.gate_up(self.mlp_norm(x)).split(self.Fh, dim=2)
        return x + self.down(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, L, C, H, Hkv, Fh, V, Vp, T, eps, theta, attention, head):
        super().__init__()
        self.V, self.head_mode = V, head
        D = C // H
        self.embed = nn.Embedding(Vp, C)
        self.blocks = nn.ModuleList([LlamaBlock(C, H, Hkv, Fh, eps, attention) for _ in range(L)])
        self.final_norm = RMSNorm(C, eps)
        self.head = nn.Linear(C, Vp, bias=False)  # untied (model.tie_embeddings = auto)
        self.register_buffer("mask", torch.triu(torch.ones(T, T, dtype=torch.bool), 1))
        j = torch.arange(D // 2, dtype=torch.float64)
        ang = torch.arange(T, dtype=torch.float64)[:, None] * theta ** (-2.0 * j / D)[None, :]
        self.register_buffer("cos", torch.cos(ang).float())
        self.register_buffer("sin", torch.sin(ang).float())
        with torch.no_grad():  # tessera's init (doc/model.md)
            for name, p in self.named_parameters():
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                else:
                    std = 0.02 / math.sqrt(2 * L) if name.endswith(("proj.weight", "down.weight")) else 0.02
                    p.normal_(0.0, std)
            self.embed.weight[V:].zero_()
            self.head.weight[V:].zero_()

    def forward(self, idx, targets):
        B, T = idx.shape
        x = self.embed(idx)
        for blk in self.blocks:
            x = blk(x, self.mask, self.cos, self.sin)
        x = self.final_norm(x)
        if self.head_mode == "padded":  # head GEMM over all Vp rows, loss over the first V
            logits = self.head(x)[..., : self.V]
        else:
            logits = F.linear(x, self.head.weight[: self.V])
        return F.cross_entropy(logits.reshape(B * T, -1), targets.reshape(-1))


def flops_per_token(arch, L, C, H, Hkv, Fh, V, T):
    """tessera's model_flops_per_token (src/perf/flops.cpp)."""
    D = C // H
    qd, kvd = H * D, Hkv * D
    per_layer = C * qd + 2 * C * kvd + qd * C + (3 if arch == "llama" else 2) * C * Fh
    return 6.0 * (L * per_layer + V * C) + 12.0 * L * T * qd


def main():
    L, C, H, V, T, B = args.layers, args.d_model, args.heads, args.vocab, args.seq_len, args.micro_batch
    Hkv = args.kv_heads or H
    Fh = args.ffn_hidden or (4 * C if args.arch == "gpt2" else (8 * C // 3 + 63) // 64 * 64)
    assert args.arch == "llama" or (Hkv == H and Fh == 4 * C), "gpt2 here has Hkv = H and F = 4C"
    Vp = (V + args.vocab_multiple - 1) // args.vocab_multiple * args.vocab_multiple
    attention = args.attention
    if attention == "auto":
        attention = "sdpa" if hasattr(F, "scaled_dot_product_attention") else "explicit"
    foreach = {"auto": None, "true": True, "false": False}[args.foreach]

    info(f"torch {torch.__version__}, threads {torch.get_num_threads()} "
         f"(OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', 'unset')}), "
         f"LD_PRELOAD={os.environ.get('LD_PRELOAD', '')} MALLOC_CONF={os.environ.get('MALLOC_CONF', '')}")
    # torch is built with BLAS_INFO=generic: its sgemm comes from whatever libblas.so.3 the
    # loader finds; LD_LIBRARY_PATH=.../openblas-openmp picks the OpenMP OpenBLAS.
    torch.mm(torch.ones(64, 64), torch.ones(64, 64))
    blas = mapped_libraries(["blas", "mkl"])
    info("BLAS mapped:", ", ".join(blas) if blas else "none found")
    for lib in blas:
        if "openblas" in os.path.basename(lib):
            try:
                ob = ctypes.CDLL(lib)
                ob.openblas_get_corename.restype = ctypes.c_char_p
                ob.openblas_get_config.restype = ctypes.c_char_p
                info(f"OpenBLAS kernel core {ob.openblas_get_corename().decode()} "
                     f"(OPENBLAS_CORETYPE={os.environ.get('OPENBLAS_CORETYPE', 'unset')}), "
                     f"{ob.openblas_get_num_threads()} thread(s); {ob.openblas_get_config().decode()}")
            except (OSError, AttributeError) as e:
                info(f"OpenBLAS query failed: {e}")
            break
    info("allocator mapped:", ", ".join(mapped_libraries(["jemalloc", "tcmalloc"])) or "glibc malloc")
    if args.show_config:
        for line in torch.__config__.show().splitlines():
            info(line)
        for line in torch.__config__.parallel_info().splitlines():
            info(line)

    if not args.no_gemm:
        print(f"GEMM {measure_gemm():.6g}", flush=True)
    fpt = flops_per_token(args.arch, L, C, H, Hkv, Fh, V, T)
    print(f"FLOPS_PER_TOKEN {fpt:.10g}", flush=True)

    torch.manual_seed(args.seed)
    if args.arch == "gpt2":
        model = GPT2(L, C, H, V, Vp, T, attention, args.head)
    else:
        model = Llama(L, C, H, Hkv, Fh, V, Vp, T, args.norm_eps, args.rope_theta, attention, args.head)
    embeddings = ("wte", "wpe", "embed")
    decay = [p for n, p in model.named_parameters() if p.dim() == 2 and not n.startswith(embeddings)]
    no_decay = [p for n, p in model.named_parameters() if not (p.dim() == 2 and not n.startswith(embeddings))]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}],
                            lr=3e-4, betas=(0.9, 0.95), eps=1e-8, foreach=foreach)
    nparams = sum(p.numel() for p in model.parameters())
    print(f"PARAMETERS {nparams}", flush=True)
    info(f"model: {args.arch} L={L} C={C} H={H} Hkv={Hkv} F={Fh} V={V} (Vp {Vp}) T={T} B={B}, "
         f"{nparams / 1e6:.3f}M parameters, "
         f"attention {attention}, head GEMM over {'Vp' if args.head == 'padded' else 'V'} rows, "
         f"AdamW foreach={args.foreach}")

    with open(args.data, "rb") as f:
        corpus = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8)
    gen = torch.Generator().manual_seed(args.seed)

    model.train()
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        starts = torch.randint(0, corpus.numel() - T - 1, (B,), generator=gen)
        rows = torch.stack([corpus[s: s + T + 1] for s in starts.tolist()]).long()
        x, y = rows[:, :T], rows[:, 1:]
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=args.precision == "bf16"):
            loss = model(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        lv = loss.item()
        s = time.perf_counter() - t0
        print(f"STEP {step} {s:.6f} {B * T / s:.3f} {lv:.5f}", flush=True)


if __name__ == "__main__":
    main()

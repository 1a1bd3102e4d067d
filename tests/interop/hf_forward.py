"""An independent forward of Hugging Face's LlamaForCausalLM and GPT2LMHeadModel in PyTorch,
from their published definitions: their parameter names, rotate-half RoPE, Conv1D weights
stored [in, out]. It reads only config.json and model.safetensors (parsed here, not by
tessera's exporter) and computes in float64.

  hf_forward.py HF_DIR LOGITS.h5      compares with tessera's logits of the same tokens
                                      (tests/interop/logitsdump.cpp), 1e-5 relative
"""
import json
import math
import struct
import sys

import h5py
import numpy as np
import torch

TOL = 1e-5


def load_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        assert info["dtype"] == "F32", (name, info["dtype"])
        b, e = info["data_offsets"]
        a = np.frombuffer(blob[8 + n + b:8 + n + e], dtype="<f4").reshape(info["shape"])
        out[name] = torch.from_numpy(a.astype(np.float64))
    return out


def rotate_half(x):
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


def attention(q, k, v, n_rep):
    """q [B, Hq, T, D], k and v [B, Hkv, T, D]: causal softmax attention."""
    k = k.repeat_interleave(n_rep, dim=1)
    v = v.repeat_interleave(n_rep, dim=1)
    T, D = q.shape[2], q.shape[3]
    scores = q @ k.transpose(-1, -2) / math.sqrt(D)
    mask = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    scores = scores.masked_fill(mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v


def llama(cfg, w, ids):
    C, Hq = cfg["hidden_size"], cfg["num_attention_heads"]
    Hkv = cfg.get("num_key_value_heads") or Hq
    D = cfg.get("head_dim") or C // Hq
    eps, theta = cfg["rms_norm_eps"], cfg.get("rope_theta", 10000.0)
    B, T = ids.shape
    inv_freq = 1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float64) / D)
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos(), emb.sin()

    def rms(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g

    x = w["model.embed_tokens.weight"][ids]
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        h = rms(x, w[p + "input_layernorm.weight"])
        q = (h @ w[p + "self_attn.q_proj.weight"].T).view(B, T, Hq, D).transpose(1, 2)
        k = (h @ w[p + "self_attn.k_proj.weight"].T).view(B, T, Hkv, D).transpose(1, 2)
        v = (h @ w[p + "self_attn.v_proj.weight"].T).view(B, T, Hkv, D).transpose(1, 2)
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        a = attention(q, k, v, Hq // Hkv).transpose(1, 2).reshape(B, T, Hq * D)
        x = x + a @ w[p + "self_attn.o_proj.weight"].T
        h = rms(x, w[p + "post_attention_layernorm.weight"])
        gate = torch.nn.functional.silu(h @ w[p + "mlp.gate_proj.weight"].T)
        x = x + (gate * (h @ w[p + "mlp.up_proj.weight"].T)) @ w[p + "mlp.down_proj.weight"].T
    x = rms(x, w["model.norm.weight"])
    head = w["model.embed_tokens.weight"] if cfg.get("tie_word_embeddings") else w["lm_head.weight"]
    return x @ head.T


def gpt2(cfg, w, ids):
    C, H, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    D = C // H
    B, T = ids.shape
    assert cfg["activation_function"] in ("gelu_new", "gelu_pytorch_tanh")

    def ln(x, p):
        return torch.nn.functional.layer_norm(x, (C,), w[p + ".weight"], w[p + ".bias"], eps)

    def conv1d(x, p):  # Hugging Face's Conv1D: weight [in, out]
        return x @ w[p + ".weight"] + w[p + ".bias"]

    x = w["transformer.wte.weight"][ids] + w["transformer.wpe.weight"][:T]
    for i in range(cfg["n_layer"]):
        p = f"transformer.h.{i}."
        qkv = conv1d(ln(x, p + "ln_1"), p + "attn.c_attn")
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in qkv.split(C, dim=-1))
        a = attention(q, k, v, 1).transpose(1, 2).reshape(B, T, C)
        x = x + conv1d(a, p + "attn.c_proj")
        h = conv1d(ln(x, p + "ln_2"), p + "mlp.c_fc")
        h = 0.5 * h * (1 + torch.tanh(math.sqrt(2 / math.pi) * (h + 0.044715 * h.pow(3))))
        x = x + conv1d(h, p + "mlp.c_proj")
    x = ln(x, "transformer.ln_f")
    return x @ w["transformer.wte.weight"].T


def main():
    hf_dir, dump = sys.argv[1], sys.argv[2]
    with open(f"{hf_dir}/config.json") as f:
        cfg = json.load(f)
    w = load_safetensors(f"{hf_dir}/model.safetensors")
    with h5py.File(dump, "r") as f:
        ids = torch.from_numpy(f["tokens"][()].astype(np.int64))
        ref = f["logits"][()].astype(np.float64)
    forward = {"llama": llama, "gpt2": gpt2}[cfg["model_type"]]
    with torch.no_grad():
        logits = forward(cfg, w, ids).numpy()
    if logits.shape != ref.shape:
        print(f"hf-logits: FAIL: shapes {logits.shape} (Hugging Face) vs {ref.shape} (tessera)")
        return 1
    rel = float(np.linalg.norm(logits - ref) / np.linalg.norm(logits))
    worst = float(np.max(np.abs(logits - ref)) / np.max(np.abs(logits)))
    ok = rel <= TOL and worst <= TOL
    print(f"hf-logits: {cfg['model_type']} {tuple(ref.shape)}: |hf - tessera| / |hf| = {rel:.2e}, "
          f"max |diff| / max |hf| = {worst:.2e} (bar {TOL:.0e}): {'PASS' if ok else 'FAIL'}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

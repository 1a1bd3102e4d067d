"""A tessera model as llama.cpp's GGUF: its tensor names and metadata (doc/interop.md).

llama.cpp's llama architecture rotates adjacent pairs (its "normal" RoPE), as tessera does,
so q and k are stored unpermuted. gpt2 in llama.cpp reads one fused attn_qkv tensor.
"""
import numpy as np

from . import gguf

FILE_TYPE = {"f32": 0, "f16": 1, "bf16": 32}  # general.file_type: all F32, mostly F16, mostly BF16

LLAMA = {"attn_norm.weight": "attn_norm.weight", "attn.q.weight": "attn_q.weight",
         "attn.k.weight": "attn_k.weight", "attn.v.weight": "attn_v.weight",
         "attn.o.weight": "attn_output.weight", "mlp_norm.weight": "ffn_norm.weight",
         "mlp.gate.weight": "ffn_gate.weight", "mlp.up.weight": "ffn_up.weight",
         "mlp.down.weight": "ffn_down.weight"}
GPT2 = {"attn_norm.weight": "attn_norm.weight", "attn_norm.bias": "attn_norm.bias",
        "attn.o.weight": "attn_output.weight", "attn.o.bias": "attn_output.bias",
        "mlp_norm.weight": "ffn_norm.weight", "mlp_norm.bias": "ffn_norm.bias",
        "mlp.up.weight": "ffn_up.weight", "mlp.up.bias": "ffn_up.bias",
        "mlp.down.weight": "ffn_down.weight", "mlp.down.bias": "ffn_down.bias"}


def tensors(model, params):
    """[(llama.cpp name, array)] with the real vocabulary's rows only."""
    V, p = model.vocab, params
    out = [("token_embd.weight", p["embed.tok.weight"][:V])]
    if model.arch == "gpt2":
        out.append(("position_embd.weight", p["embed.pos.weight"]))
    table = LLAMA if model.arch == "llama" else GPT2
    for i in range(model.layers):
        L = f"layers.{i}."
        if model.arch == "gpt2":
            out.append((f"blk.{i}.attn_qkv.weight",
                        np.concatenate([p[L + f"attn.{n}.weight"] for n in "qkv"], axis=0)))
            out.append((f"blk.{i}.attn_qkv.bias",
                        np.concatenate([p[L + f"attn.{n}.bias"] for n in "qkv"])))
        for t, g in table.items():
            out.append((f"blk.{i}.{g}", p[L + t]))
    out.append(("output_norm.weight", p["final_norm.weight"]))
    if model.arch == "gpt2":
        out.append(("output_norm.bias", p["final_norm.bias"]))
    if not model.tied:
        out.append(("output.weight", p["head.weight"][:V]))
    return out


def build(model, params, vocab, dtype, name):
    w = gguf.Writer()
    a = model.arch
    w.add("general.architecture", gguf.STRING, a)
    w.add("general.name", gguf.STRING, name)
    w.add("general.file_type", gguf.U32, FILE_TYPE[dtype])
    w.add("general.alignment", gguf.U32, gguf.ALIGN)
    w.add(f"{a}.context_length", gguf.U32, model.seq_len)
    w.add(f"{a}.embedding_length", gguf.U32, model.d_model)
    w.add(f"{a}.block_count", gguf.U32, model.layers)
    w.add(f"{a}.feed_forward_length", gguf.U32, model.ffn)
    w.add(f"{a}.attention.head_count", gguf.U32, model.heads)
    w.add(f"{a}.attention.head_count_kv", gguf.U32, model.kv_heads)
    w.add(f"{a}.vocab_size", gguf.U32, model.vocab)
    if a == "llama":
        w.add("llama.rope.dimension_count", gguf.U32, model.head_dim)
        w.add("llama.rope.freq_base", gguf.F32, model.rope_theta)
        w.add("llama.attention.layer_norm_rms_epsilon", gguf.F32, model.norm_eps)
    else:
        w.add("gpt2.attention.layer_norm_epsilon", gguf.F32, model.norm_eps)
    # The tokenizer: byte-level BPE (tokenizer.py explains why both of tessera's fit).
    w.add("tokenizer.ggml.model", gguf.STRING, "gpt2")
    w.add("tokenizer.ggml.pre", gguf.STRING, "gpt-2")
    w.add_array("tokenizer.ggml.tokens", gguf.STRING, vocab.tokens)
    w.add_array("tokenizer.ggml.token_type", gguf.I32,
                [3 if i == vocab.eos else 1 for i in range(len(vocab.tokens))])  # 3: control
    w.add_array("tokenizer.ggml.merges", gguf.STRING, vocab.merges)
    w.add("tokenizer.ggml.bos_token_id", gguf.U32, vocab.eos)
    w.add("tokenizer.ggml.eos_token_id", gguf.U32, vocab.eos)
    w.add("tokenizer.ggml.add_bos_token", gguf.BOOL, False)
    w.add("tokenizer.ggml.add_eos_token", gguf.BOOL, False)
    for tname, array in tensors(model, params):
        # Norm weights and biases stay f32, as llama.cpp's own converters keep them.
        w.add_tensor(tname, array, dtype if array.ndim == 2 else "f32")
    return w

"""tessera <-> the Hugging Face layout of LlamaForCausalLM and GPT2LMHeadModel (doc/interop.md).

tessera's RoPE rotates adjacent pairs (x[2j], x[2j+1]) of a head; Hugging Face's Llama
rotates halves (x[j], x[j + D/2]). Both use the frequency theta^(-2j/D) for pair j, so the
rows of each head of W_q and W_k are reordered: Hugging Face's row j is tessera's row 2j and
its row D/2 + j is tessera's row 2j + 1. Attention scores are dot products of q and k, which
a permutation applied to both leaves unchanged; v and o are not permuted.
"""
import json

import numpy as np

from .common import Refusal


def rope_to_half(w, heads, head_dim):
    """Rows of each head from adjacent pairs (tessera) to halves (Hugging Face)."""
    cols = w.shape[1]
    return np.ascontiguousarray(
        w.reshape(heads, head_dim // 2, 2, cols).transpose(0, 2, 1, 3).reshape(heads * head_dim, cols))


def rope_to_pairs(w, heads, head_dim):
    """The inverse of rope_to_half."""
    cols = w.shape[1]
    return np.ascontiguousarray(
        w.reshape(heads, 2, head_dim // 2, cols).transpose(0, 2, 1, 3).reshape(heads * head_dim, cols))


# ---- names -------------------------------------------------------------------------------
LLAMA_LAYER = {  # tessera name after "layers.{i}." -> Hugging Face name after "model.layers.{i}."
    "attn_norm.weight": "input_layernorm.weight",
    "attn.q.weight": "self_attn.q_proj.weight",
    "attn.k.weight": "self_attn.k_proj.weight",
    "attn.v.weight": "self_attn.v_proj.weight",
    "attn.o.weight": "self_attn.o_proj.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "mlp.gate.weight": "mlp.gate_proj.weight",
    "mlp.up.weight": "mlp.up_proj.weight",
    "mlp.down.weight": "mlp.down_proj.weight",
}
GPT2_LAYER = {  # tessera -> "transformer.h.{i}." + name; Conv1D weights are stored [in, out]
    "attn_norm.weight": "ln_1.weight", "attn_norm.bias": "ln_1.bias",
    "attn.o.weight": "attn.c_proj.weight", "attn.o.bias": "attn.c_proj.bias",
    "mlp_norm.weight": "ln_2.weight", "mlp_norm.bias": "ln_2.bias",
    "mlp.up.weight": "mlp.c_fc.weight", "mlp.up.bias": "mlp.c_fc.bias",
    "mlp.down.weight": "mlp.c_proj.weight", "mlp.down.bias": "mlp.c_proj.bias",
}


def _eos(model):
    return model.vocab - 1


def to_hf(model, params):
    """({Hugging Face name: array}, config.json dict) of a tessera model; only the real
    vocabulary's rows of the embedding and head (tessera pads them)."""
    V = model.vocab
    p = {k: v for k, v in params.items()}
    out = {}
    if model.arch == "llama":
        out["model.embed_tokens.weight"] = p["embed.tok.weight"][:V]
        for i in range(model.layers):
            for t, h in LLAMA_LAYER.items():
                w = p[f"layers.{i}.{t}"]
                if t == "attn.q.weight":
                    w = rope_to_half(w, model.heads, model.head_dim)
                elif t == "attn.k.weight":
                    w = rope_to_half(w, model.kv_heads, model.head_dim)
                out[f"model.layers.{i}.{h}"] = w
        out["model.norm.weight"] = p["final_norm.weight"]
        if not model.tied:
            out["lm_head.weight"] = p["head.weight"][:V]
        config = {
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": V, "hidden_size": model.d_model, "intermediate_size": model.ffn,
            "num_hidden_layers": model.layers, "num_attention_heads": model.heads,
            "num_key_value_heads": model.kv_heads, "head_dim": model.head_dim,
            "max_position_embeddings": model.seq_len, "rms_norm_eps": model.norm_eps,
            "rope_theta": model.rope_theta, "rope_scaling": None, "hidden_act": "silu",
            "attention_bias": False, "attention_dropout": 0.0, "mlp_bias": False,
            "pretraining_tp": 1, "tie_word_embeddings": model.tied,
            "bos_token_id": _eos(model), "eos_token_id": _eos(model),
            "initializer_range": 0.02, "use_cache": True, "torch_dtype": "float32",
        }
        return out, config
    out["transformer.wte.weight"] = p["embed.tok.weight"][:V]
    out["transformer.wpe.weight"] = p["embed.pos.weight"]
    for i in range(model.layers):
        L = f"layers.{i}."
        H = f"transformer.h.{i}."
        out[H + "attn.c_attn.weight"] = np.ascontiguousarray(np.concatenate(
            [p[L + f"attn.{n}.weight"] for n in "qkv"], axis=0).T)
        out[H + "attn.c_attn.bias"] = np.concatenate([p[L + f"attn.{n}.bias"] for n in "qkv"])
        for t, h in GPT2_LAYER.items():
            w = p[L + t]
            out[H + h] = np.ascontiguousarray(w.T) if w.ndim == 2 else w
    out["transformer.ln_f.weight"] = p["final_norm.weight"]
    out["transformer.ln_f.bias"] = p["final_norm.bias"]
    config = {
        "architectures": ["GPT2LMHeadModel"], "model_type": "gpt2",
        "vocab_size": V, "n_positions": model.seq_len, "n_ctx": model.seq_len,
        "n_embd": model.d_model, "n_layer": model.layers, "n_head": model.heads,
        "n_inner": model.ffn, "activation_function": "gelu_new",
        "layer_norm_epsilon": model.norm_eps, "tie_word_embeddings": True,
        "scale_attn_weights": True, "scale_attn_by_inverse_layer_idx": False,
        "reorder_and_upcast_attn": False, "add_cross_attention": False,
        "resid_pdrop": 0.0, "embd_pdrop": 0.0, "attn_pdrop": 0.0,
        "bos_token_id": _eos(model), "eos_token_id": _eos(model),
        "initializer_range": 0.02, "use_cache": True, "torch_dtype": "float32",
    }
    return out, config


# ---- import ------------------------------------------------------------------------------
def _need(config, key, where="config.json"):
    if key not in config or config[key] is None:
        raise Refusal(f"{where} has no '{key}'")
    return config[key]


def _refuse_unless(config, key, allowed, why):
    value = config.get(key, allowed[0])
    if value not in allowed:
        raise Refusal(f"config.json: {key} = {json.dumps(value)}: {why}")


def _take(tensors, name, shape):
    if name not in tensors:
        raise Refusal(f"model.safetensors has no tensor '{name}'")
    w = tensors.pop(name)
    if tuple(w.shape) != tuple(shape):
        raise Refusal(f"model.safetensors: tensor '{name}' has shape {list(w.shape)}, "
                      f"config.json implies {list(shape)}")
    return w


def _pad(w, rows):
    out = np.zeros((rows,) + w.shape[1:], dtype=np.float32)
    out[:w.shape[0]] = w
    return out


def _tied_head(tensors, embedding):
    """A tied model may still store its head: it must be the embedding."""
    head = tensors.pop("lm_head.weight", None)
    if head is not None and not np.array_equal(head, embedding):
        raise Refusal("model.safetensors: 'lm_head.weight' differs from the token embedding, "
                      "but config.json says tie_word_embeddings = true")


def padded(vocab, multiple):
    return (vocab + multiple - 1) // multiple * multiple


def from_hf(config, tensors, vocab_multiple, seq_len=None):
    """(ordered tessera params, deck sections) of a Hugging Face llama or gpt2 model.
    Anything tessera's model cannot represent is refused, naming the field."""
    kind = config.get("model_type")
    tensors = dict(tensors)
    if kind == "llama":
        params, model = _from_llama(config, tensors, vocab_multiple, seq_len)
    elif kind == "gpt2":
        params, model = _from_gpt2(config, tensors, vocab_multiple)
    else:
        raise Refusal(f"config.json: model_type = {kind!r}: tessera imports 'llama' and 'gpt2'")
    for name in list(tensors):
        if name.endswith(".attn.bias") or name.endswith(".attn.masked_bias") or \
                name.endswith("rotary_emb.inv_freq"):
            tensors.pop(name)  # buffers (the causal mask, RoPE frequencies), not weights
    if tensors:
        extra = sorted(tensors)[0]
        raise Refusal(f"model.safetensors holds '{extra}' ({len(tensors)} tensor(s) in all), "
                      "which tessera's model has no place for")
    return params, model


def _from_llama(config, tensors, vocab_multiple, seq_len):
    _refuse_unless(config, "hidden_act", ["silu"], "tessera's llama MLP is SwiGLU (silu)")
    _refuse_unless(config, "attention_bias", [False], "tessera's llama has no attention biases")
    _refuse_unless(config, "mlp_bias", [False], "tessera's llama has no MLP biases")
    _refuse_unless(config, "rope_scaling", [None], "tessera's RoPE has no scaling")
    _refuse_unless(config, "pretraining_tp", [1], "only pretraining_tp = 1 is plain llama")
    C, L = int(_need(config, "hidden_size")), int(_need(config, "num_hidden_layers"))
    Hq = int(_need(config, "num_attention_heads"))
    Hkv = int(config.get("num_key_value_heads") or Hq)
    V, Fh = int(_need(config, "vocab_size")), int(_need(config, "intermediate_size"))
    if C % Hq:
        raise Refusal(f"config.json: hidden_size = {C} is not a multiple of num_attention_heads = {Hq}")
    D = C // Hq
    if config.get("head_dim") not in (None, D):
        raise Refusal(f"config.json: head_dim = {config['head_dim']}: tessera's head size is "
                      f"hidden_size / num_attention_heads = {D}")
    tied = bool(config.get("tie_word_embeddings", False))
    Vp = padded(V, vocab_multiple)
    p = {"embed.tok.weight": _pad(_take(tensors, "model.embed_tokens.weight", (V, C)), Vp)}
    shapes = {"attn_norm.weight": (C,), "attn.q.weight": (Hq * D, C), "attn.k.weight": (Hkv * D, C),
              "attn.v.weight": (Hkv * D, C), "attn.o.weight": (C, Hq * D), "mlp_norm.weight": (C,),
              "mlp.gate.weight": (Fh, C), "mlp.up.weight": (Fh, C), "mlp.down.weight": (C, Fh)}
    for i in range(L):
        for t, h in LLAMA_LAYER.items():
            w = _take(tensors, f"model.layers.{i}.{h}", shapes[t])
            if t == "attn.q.weight":
                w = rope_to_pairs(w, Hq, D)
            elif t == "attn.k.weight":
                w = rope_to_pairs(w, Hkv, D)
            p[f"layers.{i}.{t}"] = w
    p["final_norm.weight"] = _take(tensors, "model.norm.weight", (C,))
    if tied:
        _tied_head(tensors, p["embed.tok.weight"][:V])
    else:
        p["head.weight"] = _pad(_take(tensors, "lm_head.weight", (V, C)), Vp)
    T = int(seq_len or _need(config, "max_position_embeddings"))
    model = {"arch": "llama", "layers": L, "d_model": C, "heads": Hq, "kv_heads": Hkv,
             "ffn_hidden": Fh, "vocab": V, "vocab_multiple": vocab_multiple, "seq_len": T,
             "norm_eps": float(config.get("rms_norm_eps", 1e-6)),
             "rope_theta": float(config.get("rope_theta", 10000.0)),
             "tie_embeddings": "true" if tied else "false"}
    return p, model


def _from_gpt2(config, tensors, vocab_multiple):
    _refuse_unless(config, "activation_function", ["gelu_new", "gelu_pytorch_tanh"],
                   "tessera's gpt2 MLP uses the tanh approximation of GELU")
    _refuse_unless(config, "scale_attn_weights", [True], "tessera scales attention by 1/sqrt(D)")
    _refuse_unless(config, "scale_attn_by_inverse_layer_idx", [False],
                   "tessera's attention scale does not depend on the layer")
    _refuse_unless(config, "add_cross_attention", [False], "tessera is decoder-only")
    _refuse_unless(config, "tie_word_embeddings", [True], "tessera's gpt2 ties its head")
    C, L = int(_need(config, "n_embd")), int(_need(config, "n_layer"))
    H, V, T = int(_need(config, "n_head")), int(_need(config, "vocab_size")), int(_need(config, "n_positions"))
    Fh = int(config.get("n_inner") or 4 * C)
    Vp = padded(V, vocab_multiple)
    prefix = "transformer." if "transformer.wte.weight" in tensors else ""
    p = {"embed.tok.weight": _pad(_take(tensors, prefix + "wte.weight", (V, C)), Vp),
         "embed.pos.weight": _take(tensors, prefix + "wpe.weight", (T, C))}
    shapes = {"attn_norm.weight": (C,), "attn_norm.bias": (C,), "attn.o.weight": (C, C),
              "attn.o.bias": (C,), "mlp_norm.weight": (C,), "mlp_norm.bias": (C,),
              "mlp.up.weight": (C, Fh), "mlp.up.bias": (Fh,), "mlp.down.weight": (Fh, C),
              "mlp.down.bias": (C,)}
    for i in range(L):
        H_ = f"{prefix}h.{i}."
        qkv = _take(tensors, H_ + "attn.c_attn.weight", (C, 3 * C)).T
        qkv_b = _take(tensors, H_ + "attn.c_attn.bias", (3 * C,))
        for j, n in enumerate("qkv"):
            p[f"layers.{i}.attn.{n}.weight"] = np.ascontiguousarray(qkv[j * C:(j + 1) * C])
            p[f"layers.{i}.attn.{n}.bias"] = np.ascontiguousarray(qkv_b[j * C:(j + 1) * C])
        for t, h in GPT2_LAYER.items():
            w = _take(tensors, H_ + h, shapes[t])
            p[f"layers.{i}.{t}"] = np.ascontiguousarray(w.T) if w.ndim == 2 else w
    p["final_norm.weight"] = _take(tensors, prefix + "ln_f.weight", (C,))
    p["final_norm.bias"] = _take(tensors, prefix + "ln_f.bias", (C,))
    _tied_head(tensors, p["embed.tok.weight"][:V])
    model = {"arch": "gpt2", "layers": L, "d_model": C, "heads": H, "kv_heads": H,
             "ffn_hidden": Fh, "vocab": V, "vocab_multiple": vocab_multiple, "seq_len": T,
             "norm_eps": float(config.get("layer_norm_epsilon", 1e-5)), "tie_embeddings": "true"}
    return p, model

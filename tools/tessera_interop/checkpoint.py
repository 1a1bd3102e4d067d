"""Reading and writing tessera checkpoints (doc/checkpoints.md) as whole numpy tensors."""
import importlib.machinery
import importlib.util
import json
import os

import h5py
import numpy as np

from .common import Progress, Refusal


def _ckpt_tool():
    """tools/tessera-ckpt as a module: its checksum and meta_checksum are the format's."""
    path = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tessera-ckpt")
    loader = importlib.machinery.SourceFileLoader("tessera_ckpt", path)
    spec = importlib.util.spec_from_loader("tessera_ckpt", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _text(v):
    return v.decode() if isinstance(v, bytes) else str(v)


class Model:
    """The model definition of a checkpoint, in the terms of doc/model.md."""

    def __init__(self, deck, params):
        m = deck.get("model", {})
        self.deck = deck
        self.arch = str(m.get("arch", ""))
        if self.arch not in ("llama", "gpt2"):
            raise Refusal(f"model.arch = {self.arch!r}: only llama and gpt2 convert")
        experts = int(m.get("experts", 0) or 0)
        if experts > 0:
            raise Refusal(f"model.experts = {experts}: mixture-of-experts models do not convert "
                          "(GGUF's and Hugging Face's llama and gpt2 have no routed experts in "
                          "tessera's form: shared experts, a per-expert selection bias, and "
                          "model.moe_every / moe_after mixing dense and MoE blocks)")
        self.layers = int(m["layers"])
        self.d_model = int(m["d_model"])
        self.heads = int(m["heads"])
        self.kv_heads = int(m.get("kv_heads", 0) or 0) or self.heads
        self.head_dim = self.d_model // self.heads
        self.vocab = int(m["vocab"])
        self.seq_len = int(m["seq_len"])
        self.norm_eps = float(m.get("norm_eps", 1e-5))
        self.rope_theta = float(m.get("rope_theta", 10000.0))
        self.vocab_padded = params["embed.tok.weight"].shape[0]
        self.ffn = params["layers.0.mlp.up.weight"].shape[0]
        self.tied = "head.weight" not in params
        data = deck.get("data", {})
        self.tokenizer = str(data.get("tokenizer", "byte"))
        self.vocab_dir = str(deck.get("sample", {}).get("vocab_dir", "") or "")


def read(path):
    """(Model, {name: float32 array}, root attributes) of a tessera checkpoint."""
    try:
        f = h5py.File(path, "r")
    except OSError as e:
        raise Refusal(f"cannot open '{path}' as a tessera checkpoint: {e}")
    with f:
        if _text(f.attrs.get("format", "")) != "tessera-checkpoint":
            raise Refusal(f"'{path}' is not a tessera checkpoint (no format attribute "
                          "'tessera-checkpoint')")
        tool = _ckpt_tool()
        if "meta_checksum" in f.attrs and tool.meta_checksum(f) != _text(f.attrs["meta_checksum"]):
            raise Refusal(f"'{path}': its root attributes are damaged (checksum mismatch)")
        params = {}
        for name, d in f["params"].items():
            values = d[()]
            if tool.checksum(values) != int(d.attrs["checksum"]):
                raise Refusal(f"'{path}': dataset 'params/{name}' is damaged (checksum mismatch)")
            params[name] = np.ascontiguousarray(values, dtype=np.float32)
        deck = json.loads(_text(f.attrs["deck"]))
        attrs = {k: f.attrs[k] for k in ("step", "seed")}
    return Model(deck, params), params, attrs


def deck_json(sections):
    """The deck attribute: {section: {key: value}} as compact JSON, as tessera writes it."""
    return json.dumps(sections, separators=(",", ":"))


def write(f, params, deck, seed, source):
    """A step-0 checkpoint into the open binary file f: the weights, zero Adam moments (the
    first step after it is Adam's first), root attributes and checksums. params: ordered
    {name: float32 array} in doc/model.md's names and shapes."""
    tool = _ckpt_tool()
    meta = {"step": 0, "samples": 0, "seed": int(seed), "deck": deck_json(deck),
            "layout": json.dumps({"imported_from": source})}
    total = sum(v.nbytes for v in params.values()) * 3
    progress = Progress("writing checkpoint", total)
    with h5py.File(f, "w") as h:
        h.attrs["format"] = np.bytes_("tessera-checkpoint")
        h.attrs["version"] = np.int64(1)
        for k in ("step", "samples", "seed"):
            h.attrs[k] = np.int64(meta[k])
        h.attrs["deck"] = np.bytes_(meta["deck"])
        h.attrs["layout"] = np.bytes_(meta["layout"])
        h.attrs["loss_scale"] = np.float64(0)
        h.attrs["loss_scale_good"] = np.int64(0)
        h.attrs["meta_checksum"] = np.bytes_(tool.meta_checksum(h))
        for group in ("params", "optim/adam_m", "optim/adam_v"):
            for name, values in params.items():
                data = values if group == "params" else np.zeros_like(values)
                d = h.create_dataset(f"{group}/{name}", data=np.ascontiguousarray(data, np.float32))
                d.attrs["checksum"] = np.uint64(tool.checksum(data))
                progress.add(data.nbytes)

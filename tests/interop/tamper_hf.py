"""Damages a copy of a Hugging Face model directory for the refusal tests.

  tamper_hf.py DIR set KEY JSON      config.json[KEY] = JSON value
  tamper_hf.py DIR add-tensor NAME   appends a zero F32 tensor NAME [4] to model.safetensors
  tamper_hf.py DIR to-bf16           rewrites model.safetensors in BF16 (rounded by PyTorch)
"""
import json
import struct
import sys



def read_safetensors(path):
    """(header, data bytes) of a safetensors file."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    return json.loads(blob[8:8 + n]), blob[8 + n:]


d, what = sys.argv[1], sys.argv[2]
if what == "set":
    with open(f"{d}/config.json") as f:
        cfg = json.load(f)
    cfg[sys.argv[3]] = json.loads(sys.argv[4])
    with open(f"{d}/config.json", "w") as f:
        json.dump(cfg, f)
elif what == "add-tensor":
    path = f"{d}/model.safetensors"
    header, data = read_safetensors(path)
    header[sys.argv[3]] = {"dtype": "F32", "shape": [4], "data_offsets": [len(data), len(data) + 16]}
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data + bytes(16))
elif what == "to-bf16":
    import numpy as np
    import torch
    path = f"{d}/model.safetensors"
    header, data = read_safetensors(path)
    out, parts, offset = {}, [], 0
    for name, info in header.items():
        if name == "__metadata__":
            continue
        b, e = info["data_offsets"]
        a = torch.from_numpy(np.frombuffer(data[b:e], dtype="<f4").copy())
        raw = a.to(torch.bfloat16).view(torch.int16).numpy().tobytes()
        out[name] = {"dtype": "BF16", "shape": info["shape"], "data_offsets": [offset, offset + len(raw)]}
        parts.append(raw)
        offset += len(raw)
    text = json.dumps(out).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(parts))
else:
    raise SystemExit(f"unknown action {what}")

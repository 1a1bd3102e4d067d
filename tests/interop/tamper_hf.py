"""Damages a copy of a Hugging Face model directory for the refusal tests.

  tamper_hf.py DIR set KEY JSON      config.json[KEY] = JSON value
  tamper_hf.py DIR add-tensor NAME   appends a zero F32 tensor NAME [4] to model.safetensors
"""
import json
import struct
import sys

d, what = sys.argv[1], sys.argv[2]
if what == "set":
    with open(f"{d}/config.json") as f:
        cfg = json.load(f)
    cfg[sys.argv[3]] = json.loads(sys.argv[4])
    with open(f"{d}/config.json", "w") as f:
        json.dump(cfg, f)
elif what == "add-tensor":
    path = f"{d}/model.safetensors"
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header, data = json.loads(blob[8:8 + n]), blob[8 + n:]
    header[sys.argv[3]] = {"dtype": "F32", "shape": [4], "data_offsets": [len(data), len(data) + 16]}
    text = json.dumps(header).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + data + bytes(16))
else:
    raise SystemExit(f"unknown action {what}")

"""The safetensors format, written and read from its definition: an 8-byte little-endian
header length N, N bytes of JSON ({name: {dtype, shape, data_offsets: [begin, end]}} and an
optional "__metadata__" of strings), then the tensors' raw little-endian bytes, row-major."""
import json
import struct

import numpy as np

from .common import Progress, Refusal

DTYPES = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "F64": np.dtype("<f8")}


def write(f, tensors, metadata=None):
    """tensors: ordered {name: float32 array}, stored as F32."""
    header, offset = {}, 0
    if metadata:
        header["__metadata__"] = {str(k): str(v) for k, v in metadata.items()}
    for name, a in tensors.items():
        header[name] = {"dtype": "F32", "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.size * 4]}
        offset += a.size * 4
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # the data starts 8-aligned
    f.write(struct.pack("<Q", len(text)))
    f.write(text)
    progress = Progress("writing model.safetensors", offset)
    for a in tensors.values():
        data = np.ascontiguousarray(a, dtype="<f4").tobytes()
        f.write(data)
        progress.add(len(data))


def _bf16(raw, shape):
    bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
    return bits.view(np.float32).reshape(shape)


def read(path):
    """{name: float32 array} of a safetensors file (F32, F16 or BF16 tensors)."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise Refusal(f"'{path}' is not a safetensors file (shorter than 8 bytes)")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise Refusal(f"'{path}' is not a safetensors file, or is truncated (header length {n})")
    try:
        header = json.loads(blob[8:8 + n])
    except ValueError as e:
        raise Refusal(f"'{path}': its safetensors header is not JSON ({e})")
    data = memoryview(blob)[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        if end > len(data) or begin > end:
            raise Refusal(f"'{path}': tensor '{name}' lies beyond the end of the file (truncated)")
        raw = bytes(data[begin:end])
        dtype = info["dtype"]
        size = {"BF16": 2}.get(dtype, DTYPES[dtype].itemsize if dtype in DTYPES else 0)
        if size == 0:
            raise Refusal(f"'{path}': tensor '{name}' has dtype {dtype}; tessera imports "
                          "F32, F16, BF16 and F64 weights")
        if int(np.prod(shape)) * size != len(raw):
            raise Refusal(f"'{path}': tensor '{name}' has {len(raw)} bytes for shape {list(shape)}")
        if dtype == "BF16":
            values = _bf16(raw, shape)
        else:
            values = np.frombuffer(raw, dtype=DTYPES[dtype]).reshape(shape)
        out[name] = np.asarray(values, dtype=np.float32)
    return out

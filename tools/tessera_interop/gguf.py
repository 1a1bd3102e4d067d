"""A GGUF (version 3) writer, from the published format description.

File: magic "GGUF", uint32 version, uint64 tensor count, uint64 key/value count; the key/value
pairs (a string key, a uint32 value type, the value); the tensor infos (a string name, uint32
number of dimensions, uint64 sizes innermost first, uint32 tensor type, uint64 offset in the
data section); padding to general.alignment (32); the data section, each tensor aligned.
Strings are a uint64 byte length and UTF-8 bytes; arrays a uint32 element type, a uint64
count and the elements. Everything is little-endian.
"""
import struct

import numpy as np

from .common import Progress

ALIGN = 32
# value types
U8, I8, U16, I16, U32, I32, F32, BOOL, STRING, ARRAY, U64, I64, F64 = range(13)
# tensor types (ggml_type)
TENSOR_TYPES = {"f32": (0, np.dtype("<f4")), "f16": (1, np.dtype("<f2")), "bf16": (30, np.dtype("<u2"))}
_PACK = {U8: "<B", I8: "<b", U16: "<H", I16: "<h", U32: "<I", I32: "<i", F32: "<f", BOOL: "<?",
         U64: "<Q", I64: "<q", F64: "<d"}


def _string(s):
    b = s.encode("utf-8")
    return struct.pack("<Q", len(b)) + b


def _value(vtype, v):
    if vtype == STRING:
        return _string(v)
    return struct.pack(_PACK[vtype], v)


def to_bf16(a):
    """float32 -> bf16 bits, rounded to nearest even (NaN stays NaN)."""
    bits = np.ascontiguousarray(a, dtype=np.float32).view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return rounded.astype(np.uint16)


class Writer:
    def __init__(self):
        self.kv = []          # (key, bytes of type + value)
        self.tensors = []     # (name, array in its stored dtype, ggml type id)

    def add(self, key, vtype, value):
        self.kv.append((key, struct.pack("<I", vtype) + _value(vtype, value)))

    def add_array(self, key, vtype, values):
        body = b"".join(_value(vtype, v) for v in values)
        self.kv.append((key, struct.pack("<IIQ", ARRAY, vtype, len(values)) + body))

    def add_tensor(self, name, array, dtype="f32"):
        type_id, np_type = TENSOR_TYPES[dtype]
        if dtype == "bf16":
            stored = to_bf16(array)
        else:
            stored = np.ascontiguousarray(array, dtype=np.float32).astype(np_type)
        self.tensors.append((name, stored, type_id))

    def write(self, f):
        head = [b"GGUF", struct.pack("<IQQ", 3, len(self.tensors), len(self.kv))]
        head += [_string(k) + v for k, v in self.kv]
        offset = 0
        for name, a, type_id in self.tensors:
            dims = list(reversed(a.shape))  # ggml's ne[0] is the innermost (row) size
            head.append(_string(name) + struct.pack("<I", len(dims)) +
                        b"".join(struct.pack("<Q", d) for d in dims) +
                        struct.pack("<IQ", type_id, offset))
            offset += a.nbytes + (-a.nbytes % ALIGN)
        blob = b"".join(head)
        f.write(blob + b"\0" * (-len(blob) % ALIGN))
        progress = Progress("writing GGUF", offset)
        for _, a, _ in self.tensors:
            f.write(a.tobytes())
            f.write(b"\0" * (-a.nbytes % ALIGN))
            progress.add(a.nbytes)

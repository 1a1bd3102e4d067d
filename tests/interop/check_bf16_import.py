"""An import of BF16 weights holds each original fp32 weight rounded to bf16 by PyTorch,
exactly, and the padding rows zero.

  check_bf16_import.py IMPORTED.h5 ORIGINAL.h5
"""
import sys

import h5py
import numpy as np
import torch

with h5py.File(sys.argv[1], "r") as a, h5py.File(sys.argv[2], "r") as b:
    names = sorted(a["params"])
    assert names == sorted(b["params"]), "different parameter sets"
    bad = [n for n in names if not np.array_equal(
        a["params"][n][()],
        torch.from_numpy(b["params"][n][()]).to(torch.bfloat16).to(torch.float32).numpy())]
print(f"bf16 import: {len(names)} tensors, {len(bad)} differ from PyTorch's bf16 rounding "
      f"{bad[:3]}: {'PASS' if not bad else 'FAIL'}")
sys.exit(1 if bad else 0)

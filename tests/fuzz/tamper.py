#!/usr/bin/env python3
"""Damages a copy of a tessera checkpoint or dataset in one precise way, for the fuzz cases.

  tamper.py nan CKPT DATASET          element 0 of DATASET becomes NaN, its checksum recomputed
                                      (the damage no checksum sees: a diverged run's values)
  tamper.py attr CKPT NAME VALUE      an integer root attribute changed (a flipped bit there)
  tamper.py old-attr CKPT NAME VALUE  the same in a file without the root checksum (older files)
  tamper.py version DATA VALUE        the dataset's format version
  tamper.py vocab DATA VALUE          the vocab_size attribute (a damaged header)
  tamper.py vocab-hash DATA VALUE     the vocab_hash attribute (a file of another vocabulary)
  tamper.py tokenizer DATA VALUE      the tokenizer attribute (a file of another tokenizer)
  tamper.py n-tokens DATA FACTOR      the n_tokens attribute multiplied by FACTOR
  tamper.py offsets-decrease DATA     two document offsets swapped
  tamper.py offsets-past-end DATA     the last document offset beyond the token array
  tamper.py tokens-2d DATA            the token array reshaped to two dimensions
  tamper.py token DATA VALUE          every 50th token set to VALUE (an id >= the vocabulary)
"""
import importlib.machinery
import importlib.util
import os
import sys

import h5py
import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def ckpt_tool():
    path = os.path.join(HERE, "..", "..", "tools", "tessera-ckpt")
    loader = importlib.machinery.SourceFileLoader("tessera_ckpt", path)
    spec = importlib.util.spec_from_loader("tessera_ckpt", loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def main(argv):
    op, path, *rest = argv
    with h5py.File(path, "r+") as f:
        if op == "nan":
            d = f[rest[0]]
            values = d[()]
            values.reshape(-1)[0] = np.nan
            d[...] = values
            d.attrs["checksum"] = np.uint64(ckpt_tool().checksum(values))
        elif op in ("attr", "old-attr"):
            f.attrs[rest[0]] = np.int64(int(rest[1]))
            if op == "old-attr":
                del f.attrs["meta_checksum"]
        elif op == "version":
            f.attrs["version"] = np.int64(int(rest[0]))
        elif op == "vocab":
            f.attrs["vocab_size"] = np.int64(int(rest[0]))
        elif op in ("vocab-hash", "tokenizer"):
            f.attrs[op.replace("-", "_")] = rest[0]
        elif op == "n-tokens":
            f.attrs["n_tokens"] = np.int64(int(f.attrs["n_tokens"]) * int(rest[0]))
        elif op == "offsets-decrease":
            off = f["doc_offsets"][()]
            off[3], off[4] = off[4], off[3]
            f["doc_offsets"][...] = off
        elif op == "offsets-past-end":
            off = f["doc_offsets"][()]
            off[-1] += 1000
            f["doc_offsets"][...] = off
        elif op == "tokens-2d":
            tokens = f["tokens"][()]
            n = tokens.size // 2 * 2
            del f["tokens"]
            f.create_dataset("tokens", data=tokens[:n].reshape(2, -1))
        elif op == "token":
            tokens = f["tokens"][()]
            tokens[::50] = int(rest[0])
            f["tokens"][...] = tokens
        else:
            sys.exit(f"tamper.py: unknown operation {op}")


if __name__ == "__main__":
    main(sys.argv[1:])

"""Compares two greedy decodings (tessera-sample --sample.print_ids=true and
tools/llamacpp-generate.mjs): the prompt's tokenization and the first N generated ids must be
equal, and llama.cpp's probability of each chosen token must be tessera's (the softmax of
LOGITS.h5, tessera-logitsdump of the same ids) within PROB_TOL: a check of the numbers
behind each argmax, which catches a wrong model even where a weak one would pick the same
tokens anyway.

  compare_decode.py TESSERA.txt LLAMACPP.txt N MIN_GAP LOGITS.h5 PROB_TOL

MIN_GAP: the smallest gap between llama.cpp's chosen token's probability and the runner-up's
that is accepted; below it the argmax could flip with rounding on another CPU, and the
comparison would prove nothing (doc/interop.md).
"""
import sys

import h5py
import numpy as np

def ids(path, label):
    with open(path) as f:
        for line in f:
            if line.startswith(label + ":"):
                return [int(t) for t in line.split(":", 1)[1].split()]
    raise SystemExit(f"decode: FAIL: '{path}' has no '{label}:' line")


def main():
    tessera, llamacpp, n, min_gap = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    logits_path, tol = sys.argv[5], float(sys.argv[6])
    with open(llamacpp) as f:
        gap = float([ln for ln in f if ln.startswith("min probability gap:")][0].split(":")[1])
    with open(llamacpp) as f:
        chosen = [float(v) for ln in f if ln.startswith("chosen probabilities:")
                  for v in ln.split(":")[1].split()]
    tp, lp = ids(tessera, "prompt ids"), ids(llamacpp, "prompt ids")
    ts, ls = ids(tessera, "sample ids"), ids(llamacpp, "sample ids")
    print(f"prompt: tessera {tp}\n        llama.cpp {lp}")
    print(f"sample: tessera {ts}\n        llama.cpp {ls}")
    if tp != lp:
        print("decode: FAIL: the prompt's tokenizations differ")
        return 1
    if len(ts) < n:
        print(f"decode: FAIL: tessera generated {len(ts)} tokens before its end-of-text, not {n}")
        return 1
    same = next((i for i in range(n) if i >= len(ls) or ts[i] != ls[i]), n)
    if same < n:
        print(f"decode: FAIL: the decodings differ from token {same} on")
        return 1
    if gap < min_gap:
        print(f"decode: FAIL: the smallest probability gap of llama.cpp's argmax is {gap:.2e} < "
              f"{min_gap:.0e}: too thin for a comparison that holds on every CPU")
        return 1
    with h5py.File(logits_path, "r") as f:
        logits = f["logits"][0].astype(np.float64)
    z = logits - logits.max(axis=-1, keepdims=True)
    probs = np.exp(z) / np.exp(z).sum(axis=-1, keepdims=True)
    ours = [probs[len(tp) - 1 + i, ts[i]] for i in range(n)]
    worst = max(abs(a - b) for a, b in zip(ours, chosen[:n]))
    if len(chosen) < n or worst > tol:
        print(f"decode: FAIL: llama.cpp's probabilities of the chosen tokens differ from tessera's "
              f"by up to {worst:.2e} > {tol:.0e}")
        return 1
    print(f"decode: PASS: {n} tokens equal, prompt of {len(tp)} tokens equal, "
          f"smallest top-2 probability gap {gap:.3f}, chosen tokens' probabilities within "
          f"{worst:.1e} of tessera's (bar {tol:.0e})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

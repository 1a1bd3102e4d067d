#!/usr/bin/python3
"""Self-test of check_reference.py on fake dumps written by make_fake_dump.py.

For each architecture: the checker must PASS an unmodified dump, and FAIL when one
gradient, or one loss, is perturbed by 1e-3 relative. Exits non-zero if any verdict is wrong.
usage: /usr/bin/python3 selftest_checker.py [--arch llama|gpt2|both]
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile

import h5py

HERE = os.path.dirname(os.path.abspath(__file__))
PY = sys.executable


def checker_passes(path):
    r = subprocess.run([PY, os.path.join(HERE, "check_reference.py"), path],
                       stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    summary = [l for l in r.stdout.splitlines() if l.startswith("reference:")]
    print(f"    {os.path.basename(path)}: rc={r.returncode} {summary[-1] if summary else '(no summary)'}")
    if r.returncode not in (0, 1):
        print(r.stdout[-3000:])
    return r.returncode == 0


def perturbed(src, dst, dataset, index=()):
    shutil.copy(src, dst)
    with h5py.File(dst, "r+") as f:
        d = f[dataset]
        if index == ():
            d[...] = d[()] * (1 + 1e-3)
        else:
            d[index] = d[index] * (1 + 1e-3)
    return dst


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--arch", default="both", choices=("llama", "gpt2", "both"))
    arch = ap.parse_args().arch
    archs = ("llama", "gpt2") if arch == "both" else (arch,)
    wrong = 0
    with tempfile.TemporaryDirectory() as tmp:
        for arch in archs:
            print(f"-- {arch}")
            clean = os.path.join(tmp, f"{arch}.h5")
            subprocess.run([PY, os.path.join(HERE, "make_fake_dump.py"), clean, "--arch", arch], check=True)
            grad = perturbed(clean, os.path.join(tmp, f"{arch}_grad.h5"), "check/grad/layers.0.attn.q.weight")
            # the scalar /check/loss for llama, one step of /train/loss for gpt2
            loss = (perturbed(clean, os.path.join(tmp, f"{arch}_loss.h5"), "check/loss") if arch == "llama"
                    else perturbed(clean, os.path.join(tmp, f"{arch}_loss.h5"), "train/loss", 2))
            for path, expect in ((clean, True), (grad, False), (loss, False)):
                ok = checker_passes(path) == expect
                wrong += not ok
                print(f"    expected {'PASS' if expect else 'FAIL'}: {'ok' if ok else 'WRONG VERDICT'}")
    print("selftest: " + ("PASS" if wrong == 0 else f"FAIL ({wrong} wrong verdicts)"))
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())

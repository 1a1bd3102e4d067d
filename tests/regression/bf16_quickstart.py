#!/usr/bin/env python3
"""A quickstart-sized run in bf16 ends within 1% of the fp32 run's validation loss.

usage: bf16_quickstart.py WORKDIR "MPIEXEC -n" NP TESSERA DECK [overrides...]

Trains the deck (inputs/quickstart.in: 300 steps) on NP ranks in train.precision fp32 and
bf16 and compares the last validation loss of each (metrics.jsonl val_loss). The two must
differ (bf16 really ran) and agree to 1% relative (measured 0.05-0.1% on Zen 5 with native
bf16 GEMMs, 0.57% on an AVX2-only CPU whose bf16 GEMMs are widened to fp32 and summed in another
order: doc/testing.md). Prints 'bf16 quickstart: OK'.
"""
import json
import os
import shlex
import shutil
import subprocess
import sys


def main():
    work, mpiexec, np, tessera, deck, extra = (sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4],
                                              sys.argv[5], sys.argv[6:])
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    env = dict(os.environ, OMP_NUM_THREADS="1")

    def val_loss(precision):
        out = os.path.join(work, precision)
        cmd = [*shlex.split(mpiexec), np, tessera, deck, *extra, f"--train.precision={precision}",
               "--output.echo_deck=false", "--checkpoint.at_end=false", f"--output.dir={out}"]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"FAILED: {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
        with open(os.path.join(out, "metrics.jsonl")) as f:
            vals = [r["val_loss"] for r in map(json.loads, filter(str.strip, f)) if "val_loss" in r]
        assert vals, f"{precision}: no validation loss in metrics.jsonl"
        return vals[-1]

    fp32, bf16 = val_loss("fp32"), val_loss("bf16")
    rel = abs(bf16 - fp32) / fp32
    print(f"validation loss: fp32 {fp32:.4f}, bf16 {bf16:.4f}, {100 * rel:.2f}% apart (limit 1%)")
    assert bf16 != fp32, "the bf16 run is the fp32 run"
    assert rel <= 0.01
    print("bf16 quickstart: OK")


if __name__ == "__main__":
    main()

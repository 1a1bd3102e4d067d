#!/usr/bin/env python3
"""ZeRO-3 in bf16 gathers its parameters in bf16: half the bytes of the fp32 run's gathers.

usage: zero3_gather_dtype.py WORKDIR "MPIEXEC -n" NP TESSERA DECK [overrides...]

Runs the deck with parallel.zero = 3 on NP ranks in train.precision fp32 and bf16 and reads
rank 0's traffic.json: the all-gathers of dp_shard move exactly half the bytes in bf16 (and
more than nothing), its reduce-scatters (fp32 gradients in both) the same bytes. The summary's
model-state line names the 16-bit copy of the shard (2Psi/N). Prints 'zero3 gather dtype: OK'.
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

    def run(precision):
        out = os.path.join(work, precision)
        cmd = [*shlex.split(mpiexec), np, tessera, deck, *extra, "--parallel.zero=3",
               f"--train.precision={precision}", "--hardware.peak_flops=1e9",
               "--output.echo_deck=false", f"--output.dir={out}"]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"FAILED: {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
        with open(os.path.join(out, "traffic.json")) as f:
            return json.load(f)["dp_shard"]["kinds"], p.stdout

    (a, _), (b, summary) = run("fp32"), run("bf16")
    print(f"dp_shard all_gather: fp32 {a['all_gather']} bytes, bf16 {b['all_gather']}")
    assert a["all_gather"] > 0 and 2 * b["all_gather"] == a["all_gather"]
    assert a["reduce_scatter"] > 0 and a["reduce_scatter"] == b["reduce_scatter"]
    assert "bf16 compute copy 2Psi/N" in summary, "the model-state line names no 2Psi/N copy"
    print("zero3 gather dtype: OK")


if __name__ == "__main__":
    main()

#!/usr/bin/env python3
"""parallel.grad_reduce_dtype = bf16 halves the data-parallel all-reduce and stays close.

usage: grad_reduce_dtype.py WORKDIR "MPIEXEC -n" TESSERA DECK [overrides...]

Runs the deck serially and on 2 data-parallel ranks with fp32 and with bf16 gradient
reduction. Checks: the bf16 run's gradient bytes per step (metrics.jsonl dp_bytes) are exactly
half the fp32 run's; the bf16 run is not the fp32 one (the rounding is real: losses differ from
step 2 on); its losses stay within 1e-2 of the serial run's at every step. Prints
'grad reduce dtype: OK'.
"""
import json
import os
import shutil
import shlex
import subprocess
import sys


def main():
    work, mpiexec, tessera, deck, extra = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:]
    shutil.rmtree(work, ignore_errors=True)  # a fresh run refuses another run's checkpoints
    os.makedirs(work)
    env = dict(os.environ, OMP_NUM_THREADS="1")

    def run(name, launch, *args):
        out = os.path.join(work, name)
        cmd = [*launch, tessera, deck, *extra, "--hardware.peak_flops=1e9",
               "--output.echo_deck=false", f"--output.dir={out}", *args]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"FAILED: {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
        with open(os.path.join(out, "metrics.jsonl")) as f:
            return [json.loads(l) for l in f if l.strip()]

    np2 = shlex.split(mpiexec) + ["2"]
    serial = run("serial", [])
    fp32 = run("dp2_fp32", np2)
    bf16 = run("dp2_bf16", np2, "--parallel.grad_reduce_dtype=bf16")
    for a, b in zip(fp32, bf16):
        assert 2 * b["dp_bytes"] == a["dp_bytes"], f"step {a['step']}: {b['dp_bytes']} bf16 bytes vs {a['dp_bytes']} fp32"
    print(f"gradient bytes per step: fp32 {fp32[0]['dp_bytes']}, bf16 {bf16[0]['dp_bytes']} (half)")
    assert any(a["loss"] != b["loss"] for a, b in zip(fp32[1:], bf16[1:])), "bf16 reduction changed nothing"
    worst = max(abs(s["loss"] - b["loss"]) / s["loss"] for s, b in zip(serial, bf16))
    print(f"worst step loss vs serial: {worst:.2e} (tol 1e-2)")
    assert len(bf16) == len(serial) and worst <= 1e-2
    print("grad reduce dtype: OK")


if __name__ == "__main__":
    main()

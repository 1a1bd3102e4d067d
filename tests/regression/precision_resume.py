#!/usr/bin/env python3
"""A run may change precision at a restart: checkpoints hold fp32 master weights only.

usage: precision_resume.py WORKDIR TESSERA DECK [overrides...]

Runs 12 steps in fp32 straight, and the same 12 steps as fp32 (1-4) -> bf16 (5-8) -> fp32
(9-12), each segment resuming from the previous one's checkpoint. Checks that every segment
resumes at the right step, that every checkpoint stores fp32 tensors, that the bf16 segment's
first loss differs from the fp32 loss of the same weights (it computed in bf16) by at most
1e-4 relative (measured 1.9e-5 on Zen 5: bf16 operands move the loss by about that), and that
the mixed run ends within 1e-5 of the straight one (measured 1.4e-6: four bf16 steps leave the
fp32 master weights that close). Prints 'precision resume: OK'.
"""
import json
import os
import shutil
import subprocess
import sys

import h5py


def main():
    work, tessera, deck, extra = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
    shutil.rmtree(work, ignore_errors=True)  # a fresh run refuses another run's checkpoints
    os.makedirs(work)
    env = dict(os.environ, OMP_NUM_THREADS="1")

    def run(out, *args):
        cmd = [tessera, deck, *extra, "--train.steps=12", "--checkpoint.every=4", "--checkpoint.keep=3",
               "--hardware.peak_flops=1e9", "--output.echo_deck=false",
               f"--output.dir={os.path.join(work, out)}", *args]
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode != 0:
            sys.exit(f"FAILED: {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
        return p.stdout

    def losses(out):
        with open(os.path.join(work, out, "metrics.jsonl")) as f:
            return {r["step"]: r["loss"] for r in map(json.loads, filter(str.strip, f))}

    run("straight")
    run("mixed", "--train.exit_after=4")
    log = run("mixed", "--train.precision=bf16", "--checkpoint.resume=latest",
              "--train.exit_after=4")
    assert "ckpt-00000004.h5" in log, "bf16 segment did not resume from step 4:\n" + log
    log = run("mixed", "--train.precision=fp32", "--checkpoint.resume=latest")
    assert "ckpt-00000008.h5" in log, "last fp32 segment did not resume from step 8:\n" + log

    for step in (4, 8, 12):
        path = os.path.join(work, "mixed", "checkpoints", f"ckpt-{step:08d}.h5")
        with h5py.File(path, "r") as f:
            kinds = set()
            f.visit(lambda n: kinds.add(str(f[n].dtype)) if isinstance(f[n], h5py.Dataset) else None)
        assert kinds == {"float32"}, f"{path} holds {kinds}, expected float32 only"
        print(f"ckpt-{step:08d}.h5: every tensor float32")

    a, b = losses("straight"), losses("mixed")
    assert sorted(b) == list(range(1, 13)), f"mixed run steps {sorted(b)}"
    assert all(a[s] == b[s] for s in range(1, 5)), "fp32 segment differs from the straight run"
    first = abs(b[5] - a[5]) / a[5]
    last = abs(b[12] - a[12]) / a[12]
    print(f"step 5 (first bf16 step): {b[5]:.6f} vs fp32 {a[5]:.6f}, rel {first:.2e} (tol 1e-4)")
    print(f"step 12 (end): {b[12]:.6f} vs fp32 {a[12]:.6f}, rel {last:.2e} (tol 1e-5)")
    assert 0 < first <= 1e-4, "the bf16 segment must compute in bf16, and close to fp32"
    assert last <= 1e-5
    print("precision resume: OK")


if __name__ == "__main__":
    main()

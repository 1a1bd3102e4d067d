#!/usr/bin/env python3
"""Model-state bytes per rank follow the ZeRO formulas (fp32 training).

usage: zero_memory.py WORKDIR "MPIEXEC... -np" TESSERA DECK [overrides...]

Runs the deck on 4 ranks at ZeRO stages 0-3 and with HSDP (stage 3, shard groups of 2),
reads each run's memory.json (bytes per category measured by the allocator, max over
ranks) and checks params, grads and optimizer bytes against the formulas computed here
from the parameter count: with Psi parameters as laid out and N ranks per shard,
  stage 0: params 4Psi,   grads 4Psi,          Adam 8Psi
  stage 1: params 4Psi,   grads 4Psi + 4Psi/N, Adam 8Psi/N
  stage 2: params 4Psi,   grads 4Psi/N,        Adam 8Psi/N
  stage 3: params 4Psi/N, grads 4Psi/N,        Adam 8Psi/N
Psi includes the padding that makes every part split evenly; the padding itself must stay
below 2% of the parameters.
"""
import json
import os
import subprocess
import sys


def expected(stage, psi, n, experts=0, n_e=1):
    """Model-state bytes per rank of ZeRO stage `stage` in fp32: psi parameters sharded over n
    ranks, and `experts` routed-expert parameters over n_e (doc/moe.md, "Expert memory")."""
    whole = psi + experts
    shard = psi / n + experts / n_e
    params = 4 * shard if stage == 3 else 4 * whole
    grads = {0: 4 * whole, 1: 4 * whole + 4 * shard}.get(stage, 4 * shard)
    optimizer = 8 * whole if stage == 0 else 8 * shard
    return {"params": params, "grads": grads, "optimizer": optimizer}


def main():
    work, mpiexec, tessera, deck = sys.argv[1:5]
    overrides = sys.argv[5:]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    bad = 0
    cases = [(0, 0), (1, 0), (2, 0), (3, 0), (3, 2)]  # (stage, shard group; 0 = all of dp)
    for stage, group in cases:
        out = os.path.join(work, f"zero{stage}_group{group}")
        cmd = mpiexec.split() + ["4", tessera, deck, *overrides, f"--output.dir={out}",
                                 f"--parallel.zero={stage}", f"--parallel.shard_group={group}",
                                 "--hardware.peak_flops=1e9", "--output.echo_deck=false",
                                 "--checkpoint.at_end=false"]
        subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
        with open(os.path.join(out, "memory.json")) as f:
            mem = json.load(f)
        psi, n = mem["parameters_padded"], 4 if group == 0 else group
        if mem["shard_ranks"] != (n if stage > 0 else 1) or mem["zero"] != stage:
            print(f"FAIL stage {stage}: run reports zero {mem['zero']}, shard ranks {mem['shard_ranks']}")
            bad += 1
        padding = (psi - mem["parameters"]) / mem["parameters"]
        if padding > 0.02:
            print(f"FAIL stage {stage}: padding {padding:.2%} of the parameters")
            bad += 1
        for cat, want in expected(stage, psi, n).items():
            got = mem["live"][cat]
            ok = got == want
            bad += not ok
            print(f"{'ok  ' if ok else 'FAIL'} zero {stage} N={n} {cat:9s} {got:10.0f} B "
                  f"= {got / psi:6.3f} B/param (formula {want / psi:6.3f})")
        total = sum(mem["live"][c] for c in ("params", "grads", "optimizer"))
        print(f"     zero {stage} N={n} model state {total / psi:6.3f} B/param, "
              f"comm buffers peak {mem['peak']['comm'] / psi:6.3f} B/param, padding {padding:.2%}")
    print("zero memory: MATCH" if bad == 0 else f"zero memory: DIFFER ({bad})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Expert parallelism divides the routed experts' model state (doc/moe.md, "Expert memory").

usage: moe_expert_memory.py WORKDIR "MPIEXEC... -np" TESSERA DECK [overrides...]

Runs the mixture-of-experts deck (llama experts: gate, up, down of C x F each) at ep 1 and
ep 2 without ZeRO on 2 ranks, and at ep 2 with ZeRO-1 and ZeRO-3 on 4 ranks, reads each run's
memory.json (bytes per category measured by the allocator, max over ranks) and checks:
  * the routed expert parameters a rank registers are moe_blocks x E/ep x 3CF (the deck's
    numbers), so ep 2 holds half the experts of ep 1;
  * without ZeRO the dense parameters (Psi_d, padded) are the same at ep 1 and ep 2, and
    Psi(ep 2) = Psi(ep 1) - half the experts;
  * the summary's model-state line names Psi_e and N_e (ep > 1);
  * params, grads and optimizer bytes equal the ZeRO formulas with the dense parameters over
    N ranks and the held experts (Psi_e, padded) over N_e = N / ep:
      stage 0: params 4(Psi_d + Psi_e),       grads the same,             Adam 8(Psi_d + Psi_e)
      stage 1: params 4(Psi_d + Psi_e),       grads that + 4(Psi_d/N + Psi_e/N_e), Adam 8(...)
      stage 3: params 4(Psi_d/N + Psi_e/N_e), grads the same,             Adam 8(...)
"""
import json
import os
import subprocess
import sys

from zero_memory import expected  # the ZeRO formula, with the experts over n_e

C, F, E, MOE_BLOCKS = 64, 64, 8, 2  # inputs/tiny-moe.in: d_model, expert_ffn, experts, after:1 of 3


def main():
    work, mpiexec, tessera, deck = sys.argv[1:5]
    overrides = sys.argv[5:]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    bad = 0
    runs = {}
    # (ranks, ep, ZeRO stage)
    for ranks, ep, stage in [(2, 1, 0), (2, 2, 0), (4, 2, 1), (4, 2, 3)]:
        out = os.path.join(work, f"np{ranks}_ep{ep}_zero{stage}")
        cmd = mpiexec.split() + [str(ranks), tessera, deck, *overrides, f"--output.dir={out}",
                                 f"--parallel.ep={ep}", f"--parallel.zero={stage}",
                                 "--model.router_bias_step=0", "--hardware.peak_flops=1e9",
                                 "--output.echo_deck=false", "--checkpoint.at_end=false"]
        log = subprocess.run(cmd, check=True, env=env, stdout=subprocess.PIPE, text=True).stdout
        with open(os.path.join(out, "memory.json")) as f:
            mem = json.load(f)
        runs[(ranks, ep, stage)] = mem
        routed = MOE_BLOCKS * (E // ep) * 3 * C * F
        ok = mem["routed_expert_parameters"] == routed and mem["ep"] == ep
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} np {ranks} ep {ep} zero {stage}: routed expert "
              f"parameters {mem['routed_expert_parameters']} (formula {routed})")
        n = ranks if stage > 0 else 1
        n_e = max(1, n // ep) if stage > 0 else 1
        experts = mem["held_expert_parameters_padded"]
        dense = mem["parameters_padded"] - experts
        # The summary's model-state line names the held experts and their shard ranks.
        line = f"of which routed experts: Psi_e = {experts} ({E // ep} of {E} per block, ep {ep}), N_e = {n_e}:"
        ok = (line in log) == (ep > 1)
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} np {ranks} ep {ep} zero {stage}: summary "
              f"{'names' if ep > 1 else 'has no'} held experts")
        for cat, want in expected(stage, dense, n, experts, n_e).items():
            got = mem["live"][cat]
            ok = got == want
            bad += not ok
            print(f"{'ok  ' if ok else 'FAIL'} np {ranks} ep {ep} zero {stage} N={n} N_e={n_e} "
                  f"{cat:9s} {got:10.0f} B (formula {want:10.0f}; Psi_d {dense}, Psi_e {experts})")
    one, two = runs[(2, 1, 0)], runs[(2, 2, 0)]
    half = one["routed_expert_parameters"] // 2
    dense_one = one["parameters_padded"] - one["routed_expert_parameters"]
    dense_two = two["parameters_padded"] - two["held_expert_parameters_padded"]
    checks = [
        ("ep 2 holds half the experts", two["held_expert_parameters_padded"] == half),
        ("dense parameters unchanged", dense_one == dense_two),
        ("Psi(ep 2) = Psi(ep 1) - half the experts",
         two["parameters_padded"] == one["parameters_padded"] - half),
    ]
    for what, ok in checks:
        bad += not ok
        print(f"{'ok  ' if ok else 'FAIL'} {what}")
    total = lambda m: sum(m["live"][c] for c in ("params", "grads", "optimizer"))
    print(f"     model state per rank: ep 1 {total(one):.0f} B, ep 2 {total(two):.0f} B "
          f"(ratio {total(two) / total(one):.3f})")
    print("moe expert memory: MATCH" if bad == 0 else f"moe expert memory: DIFFER ({bad})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

#!/usr/bin/env python3
"""Activation memory per rank with tensor and sequence parallelism.

usage: activation_memory.py WORKDIR "MPIEXEC... -np" TESSERA LLAMA_DECK GPT2_DECK [overrides...]

Runs one step of each architecture at TP 1, TP 2, TP 2 + SP, TP 4, TP 4 + SP and checks the
activation high-water mark the allocator measured (memory.json, max over ranks) equals
tessera's formula (src/perf/memory.hpp, activations_formula) exactly; prints the reduction
factors beside Korthikanti et al.'s (10 + 24/t and 34/t per layer, with the attention-score
term left out because tessera's attention keeps no T x T scores).
"""
import json
import os
import subprocess
import sys


def main():
    work, mpiexec, tessera, llama, gpt2 = sys.argv[1:6]
    overrides = sys.argv[6:]
    env = dict(os.environ, OMP_NUM_THREADS="1")
    bad = 0
    for arch, deck in (("llama", llama), ("gpt2", gpt2)):
        base = None
        for tp, sp in ((1, False), (2, False), (2, True), (4, False), (4, True)):
            out = os.path.join(work, f"{arch}_tp{tp}_sp{int(sp)}")
            cmd = mpiexec.split() + [str(tp), tessera, deck, *overrides, f"--output.dir={out}",
                                     f"--parallel.tp={tp}",
                                     f"--parallel.sequence_parallel={'true' if sp else 'false'}",
                                     "--model.kv_heads=4", "--train.steps=1",
                                     "--checkpoint.at_end=false", "--hardware.peak_flops=1e9",
                                     "--output.echo_deck=false"]
            subprocess.run(cmd, check=True, env=env, stdout=subprocess.DEVNULL)
            with open(os.path.join(out, "memory.json")) as f:
                mem = json.load(f)
            got, want = mem["peak"]["activations"], mem["activations_formula"]
            ok = got == want
            bad += not ok
            base = base or got
            t = float(tp)
            korth = (34 / t) if sp else (10 + 24 / t)
            print(f"{'ok  ' if ok else 'FAIL'} {arch:5s} tp {tp} sp {int(sp)}: activations "
                  f"{got:9.0f} B (formula {want:9.0f}), {got / base:5.3f} of TP 1; "
                  f"Korthikanti per layer {korth / 34:5.3f} of TP 1")
    print("activation memory: MATCH" if bad == 0 else f"activation memory: DIFFER ({bad})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

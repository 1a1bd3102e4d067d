#!/usr/bin/env python3
"""Activation memory per layer under each train.recompute mode, measured against the formula.

usage: recompute_memory.py WORKDIR "MPIEXEC... -np" TESSERA LLAMA_DECK GPT2_DECK [overrides...]

For each architecture, serial and with TP 2 + sequence parallelism, and each mode (none,
selective, full) it runs one step at 2 and at 4 layers: the difference of the activation
high-water marks the allocator measured (memory.json), halved, is what one more block keeps
per micro-batch, and must equal the formula (perf/memory.hpp block_kept_bytes, reported as
activations_per_block.kept) exactly; the whole peak must equal activations_formula (the kept
bytes of every block, one shared rebuilt set, the embedding and head). Prints each mode's
share of the no-recompute bytes per layer beside Korthikanti et al.'s (doc/recompute.md).
"""
import json
import os
import subprocess
import sys

MODES = ("none", "selective", "full")


def run(work, mpiexec, tessera, deck, overrides, arch, tp, mode, layers):
    out = os.path.join(work, f"{arch}_tp{tp}_{mode}_L{layers}")
    cmd = mpiexec.split() + [str(tp), tessera, deck, *overrides, f"--output.dir={out}",
                             f"--parallel.tp={tp}",
                             f"--parallel.sequence_parallel={'true' if tp > 1 else 'false'}",
                             f"--train.recompute={mode}", f"--model.layers={layers}",
                             "--train.steps=1", "--checkpoint.at_end=false",
                             "--hardware.peak_flops=1e9", "--output.echo_deck=false"]
    subprocess.run(cmd, check=True, env=dict(os.environ, OMP_NUM_THREADS="1"),
                   stdout=subprocess.DEVNULL)
    with open(os.path.join(out, "memory.json")) as f:
        return json.load(f)


def main():
    work, mpiexec, tessera, llama, gpt2 = sys.argv[1:6]
    overrides = sys.argv[6:]
    bad = 0
    for arch, deck in (("llama", llama), ("gpt2", gpt2)):
        for tp in (1, 2):
            none_layer = None
            for mode in MODES:
                two, four = (run(work, mpiexec, tessera, deck, overrides, arch, tp, mode, n)
                             for n in (2, 4))
                layer = (four["peak"]["activations"] - two["peak"]["activations"]) / 2
                want = four["activations_per_block"]["kept"]
                whole = all(m["peak"]["activations"] == m["activations_formula"] for m in (two, four))
                ok = layer == want and whole
                bad += not ok
                none_layer = none_layer or layer
                print(f"{'ok  ' if ok else 'FAIL'} {arch:5s} tp {tp} {mode:9s}: per layer "
                      f"{layer:9.0f} B (formula {want:9.0f}), {layer / none_layer:5.3f} of none; "
                      f"rebuilt set {four['activations_per_block']['rebuilt_set']:9.0f} B; "
                      f"whole model {'= formula' if whole else '!= formula'}")
    print("recompute memory per layer: MATCH" if bad == 0 else f"recompute memory per layer: DIFFER ({bad})")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

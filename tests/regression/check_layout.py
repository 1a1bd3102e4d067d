#!/usr/bin/env python3
"""Checks that a run ran the layout and the precision it was asked for.

usage: check_layout.py RUN_DIR NP [ARG...]

ARGs are the run's command line after the deck (--section.key=value; anything else is
ignored). What was asked is those overrides, else the run's deck (run.json "deck"), else the
defaults; what ran is run.json "layout" (the process grid, ZeRO, the batch geometry, sequence
parallelism, the context-parallel kind, the pipeline schedule and the GEMMs' compute dtype, as
the trainer realised them) and gemm.json (the GEMM FLOPs by operand dtype, summed over ranks).
A --parallel.tp=2 that became dp 2, a ZeRO stage that fell back to 0, a bf16 run that multiplied
in fp32 (every GEMM of a 16-bit run has 16-bit operands) each fail.
Prints 'layout: AS ASKED (...)' and exits 0, or 'layout: WRONG ...' and exits 1.
"""
import json
import os
import sys

DTYPE = {"fp32": "f32", "bf16": "bf16", "fp16": "f16"}


def main():
    run_dir, np = sys.argv[1], int(sys.argv[2])
    asked = {}
    for a in sys.argv[3:]:
        if a.startswith("--") and "=" in a:
            key, value = a[2:].split("=", 1)
            asked[key] = value
    with open(os.path.join(run_dir, "run.json")) as f:
        run = json.load(f)
    deck, ran = run["deck"], run["layout"]

    def want(key, default):
        if key in asked:
            return asked[key]
        section, name = key.split(".")
        return str(deck.get(section, {}).get(name, default))

    def num(key, default):
        return int(want(key, default))

    tp, cp, ep, pp = (num(f"parallel.{k}", 1) for k in ("tp", "cp", "ep", "pp"))
    dp_asked = want("parallel.dp", "auto")
    dp = np // (tp * cp * pp) if dp_asked in ("auto", "0") else int(dp_asked)
    zero = num("parallel.zero", 0)
    shard = num("parallel.shard_group", 0)
    micro = num("train.micro_batch", 1)
    glob = want("train.global_batch", "0")
    accum = int(glob) // (micro * dp) if glob not in ("0", "auto") else 1
    precision = want("train.precision", "fp32")
    expect = {
        "world": np, "tp": tp, "cp": cp, "ep": ep, "dp": dp, "pp": pp, "zero": zero,
        # the ranks that share one copy of the model state: all of dp x cp (ZeRO shards over
        # the dp_cp group), or the HSDP group
        "shard_group": 1 if zero == 0 else (shard if shard > 0 else dp * cp),
        "micro_batch": micro, "accumulation": accum,
        "sequence_parallel": want("parallel.sequence_parallel", "false") == "true",
        "compute_dtype": DTYPE[precision],
    }
    if "parallel.order" in asked:
        expect["order"] = asked["parallel.order"]
    if cp > 1:
        expect["cp_kind"] = want("parallel.cp_kind", "ring")
    if pp > 1:
        expect["pp_schedule"] = want("parallel.pp_schedule", "1f1b")
        expect["pp_virtual"] = num("parallel.pp_virtual", 1)
    wrong = [f"{k} asked {v!r} ran {ran.get(k)!r}" for k, v in expect.items() if ran.get(k) != v]
    # The GEMMs' operands: a 16-bit run multiplies nothing in fp32, an fp32 run nothing in 16 bits.
    with open(os.path.join(run_dir, "gemm.json")) as f:
        flops = json.load(f)["flops"]
    total = sum(flops.values())
    if total <= 0:
        wrong.append("no GEMM FLOPs counted (gemm.json)")
    elif flops[DTYPE[precision]] != total:
        wrong.append(f"{precision} asked, GEMM FLOPs by operand dtype {flops}")
    if wrong:
        print("layout: WRONG: " + "; ".join(wrong))
        return 1
    shown = " ".join(f"{k} {expect[k]}" for k in ("world", "tp", "cp", "ep", "dp", "pp", "zero"))
    print(f"layout: AS ASKED ({shown}, {precision}, {total:.3g} GEMM FLOPs all {DTYPE[precision]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

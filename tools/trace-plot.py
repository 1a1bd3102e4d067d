#!/usr/bin/env python3
"""A pipeline timeline from a run's Chrome traces (output.trace = true).

usage: trace-plot.py RUN_DIR [--step N] [--out FILE.png] [--dpi D] [--title TEXT]

RUN_DIR is the run's output.dir (or its trace/ directory). Reads every rank<R>.json, keeps
one pipeline (the ranks with dp 0, tp 0: one per stage) and draws one step: a row per stage,
a box per forward (light) and backward (dark) pass labelled with its micro-batch, a colour
per local chunk; a split backward (zb-h1, zb-v, dualpipev) draws its backward_input (B) dark
and its backward_weight (W) hatched. Receive waits are a thin grey bar under the row; white
is idle. Default step:
the last one traced (the first pays for allocation and warm-up).

It prints, and writes in the title, the measured bubble of that step beside the formula:
per stage, idle = (the step's pipeline span, from the first pass on any stage to the last)
minus that stage's forward and backward time, and bubble = idle / compute, tessera's
definition, beside the schedule's formula with equal pass costs F = B = W (pp::bubble_formula,
doc/pipeline.md): (p-1)/m, (p-1)/(v m), zb-h1 (p-1)/(3m), zb-v max(p-1, 4p-2-2m)/(6m),
dualpipev (p-1)/(6m).

Needs matplotlib (/usr/bin/python3 on Debian: python3-matplotlib).
"""
import argparse
import glob
import json
import os
import re
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Patch  # noqa: E402


def load(run_dir):
    d = os.path.join(run_dir, "trace")
    if not os.path.isdir(d):
        d = run_dir
    paths = sorted(glob.glob(os.path.join(d, "rank*.json")),
                   key=lambda p: int(re.search(r"rank(\d+)\.json$", p).group(1)))
    if not paths:
        sys.exit(f"trace-plot: no rank*.json in {d} (run with --output.trace=true)")
    docs = []
    for p in paths:
        with open(p) as f:
            docs.append(json.load(f))
    return docs


def bubble_formula(kind, p, m, v):
    """The bubble of the schedule at F = B = W, and its text (pp::bubble_formula)."""
    if kind == "zb-h1":
        return (p - 1) / (3 * m), "(p-1)/(3m)"
    if kind == "zb-v":
        return max(p - 1, 4 * p - 2 - 2 * m) / (6 * m), "max(p-1, 4p-2-2m)/(6m)"
    if kind == "dualpipev":
        return (p - 1) / (6 * m), "(p-1)/(6m)"
    if v > 1:
        return (p - 1) / (v * m), "(p-1)/(v m)"
    return (p - 1) / m, "(p-1)/m"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    ap.add_argument("run_dir")
    ap.add_argument("--step", type=int, default=None)
    ap.add_argument("--out", default=None, help="PNG file (default RUN_DIR/pipeline.png)")
    ap.add_argument("--dpi", type=int, default=80)
    ap.add_argument("--title", default=None)
    args = ap.parse_args()

    docs = load(args.run_dir)
    other = docs[0]["otherData"]
    layout = other["layout"]
    p, m = layout["pp"], layout["accumulation"]
    kind, v = other["pp_schedule"]["kind"], other["pp_schedule"]["chunks"]
    if p == 1:
        sys.exit("trace-plot: this run has one stage (parallel.pp = 1); its trace has phases but "
                 "no pipeline passes to draw (open it in ui.perfetto.dev)")
    first, last = other["steps"]
    step = args.step if args.step is not None else last
    if not first <= step <= last:
        sys.exit(f"trace-plot: step {step} was not traced (steps {first}-{last})")

    stages = {}  # stage -> (compute spans, recv waits) of the step
    for doc in docs:
        c = doc["otherData"]["coord"]
        if c["dp"] != 0 or c["tp"] != 0 or c["cp"] != 0:
            continue
        ev = [e for e in doc["traceEvents"] if e["ph"] == "X" and e["args"].get("step") == step]
        stages[c["pp"]] = ([e for e in ev if e["cat"] == "compute"],
                           [e for e in ev if e["name"] == "recv-wait"])
    if sorted(stages) != list(range(p)) or not all(stages[s][0] for s in stages):
        sys.exit(f"trace-plot: step {step} has no passes of every stage 0..{p - 1}")

    t0 = min(e["ts"] for s in stages for e in stages[s][0])
    t1 = max(e["ts"] + e["dur"] for s in stages for e in stages[s][0])
    makespan = t1 - t0
    bubbles = []
    print(f"{kind}, p {p}, m {m}, v {v}, step {step}: pipeline span {makespan / 1e3:.2f} ms")
    for s in range(p):
        compute = sum(e["dur"] for e in stages[s][0])
        waits = sum(max(0.0, min(e["ts"] + e["dur"], t1) - max(e["ts"], t0))
                    for e in stages[s][1])  # within the pipeline span
        bubbles.append((makespan - compute) / compute)
        print(f"  stage {s}: compute {compute / 1e3:.2f} ms, idle {(makespan - compute) / 1e3:.2f}"
              f" ms (of which receive waits {waits / 1e3:.2f} ms), bubble {bubbles[-1]:.3f}")
    mean = sum(bubbles) / p
    formula, formula_text = bubble_formula(kind, p, m, v)
    print(f"  mean bubble {mean:.3f}; formula {formula_text} = {formula:.3f}")

    colours = plt.cm.tab10.colors
    fig, ax = plt.subplots(figsize=(11, 0.6 * p + 1.3))
    for s in range(p):
        y = p - 1 - s
        for e in stages[s][0]:
            x, w = (e["ts"] - t0) / 1e3, e["dur"] / 1e3
            chunk = e["args"]["chunk"]
            fwd = e["name"] == "forward"
            weight = e["name"] == "backward-weight"
            ax.barh(y, w, left=x, height=0.7, color=colours[chunk % 10],
                    alpha=0.45 if fwd else 0.75 if weight else 1.0, hatch="////" if weight else None,
                    edgecolor="black", linewidth=0.3)
            if w > makespan / 1e3 / 140:
                ax.text(x + w / 2, y, str(e["args"]["micro"]), ha="center", va="center",
                        fontsize=6 if m <= 16 else 5, color="black" if fwd else "white")
        for e in stages[s][1]:
            if e["ts"] + e["dur"] <= t0 or e["ts"] >= t1:
                continue
            x = max(e["ts"], t0)
            ax.barh(y - 0.42, (min(e["ts"] + e["dur"], t1) - x) / 1e3, left=(x - t0) / 1e3,
                    height=0.1, color="0.6", linewidth=0)
    ax.set_yticks(range(p))
    ax.set_yticklabels([f"stage {p - 1 - y}\n{bubbles[p - 1 - y]:.2f}" for y in range(p)],
                       fontsize=8)
    ax.set_xlim(0, makespan / 1e3)
    ax.set_ylim(-0.6, p - 0.4)
    ax.set_xlabel("ms since the step's first pass (one clock for all ranks)", fontsize=8)
    ax.tick_params(axis="x", labelsize=8)
    title = args.title or f"{kind}, p = {p}, m = {m}" + (f", v = {v}" if v > 1 else "")
    ax.set_title(f"{title}, step {step}: bubble (idle / compute, per stage at left) mean "
                 f"{mean:.2f}, formula {formula_text} = {formula:.3f}", fontsize=9)
    handles = [Patch(color=colours[c], alpha=0.45, label=f"forward, chunk {c}") for c in range(v)]
    split = kind in ("zb-h1", "zb-v", "dualpipev")
    handles += [Patch(color=colours[c], label=f"{'B' if split else 'backward'}, chunk {c}")
                for c in range(v)]
    if split:
        handles += [Patch(facecolor=colours[c], alpha=0.75, hatch="////", label=f"W, chunk {c}")
                    for c in range(v)]
    handles.append(Patch(color="0.6", label="receive wait"))
    ax.legend(handles=handles, fontsize=7, ncol=len(handles), loc="upper center",
              bbox_to_anchor=(0.5, -0.32 - 0.05 * (4 - min(p, 4))), frameon=False)
    fig.tight_layout()
    out = args.out or os.path.join(args.run_dir, "pipeline.png")
    fig.savefig(out, dpi=args.dpi)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()

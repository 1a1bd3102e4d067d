#!/usr/bin/env python3
"""Pictures of a tessera-plan result: memory per accelerator stacked by category against the
capacity, and step time stacked by component, for each layout in the JSON.

usage: plan-plot.py PLAN.json OUT_DIR      (tessera-plan --plot OUT_DIR runs this)
Writes OUT_DIR/plan-memory.png and OUT_DIR/plan-time.png. Needs matplotlib
(/usr/bin/python3 on Debian: python3-matplotlib).
"""
import json
import os
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

MEMORY = [("params", "weights"), ("grads", "gradients"), ("optimizer", "optimizer states"),
          ("activations", "activations"), ("comm", "comm buffers"), ("workspace", "workspace"),
          ("reserved", "reserved")]
TIME = [("compute", "compute"), ("recompute", "recompute"), ("tp", "TP/SP comm"),
        ("cp", "CP comm"), ("ep_exposed", "EP all-to-all (exposed)"), ("pp_p2p", "PP send/recv"),
        ("pp_bubble", "PP bubble"), ("dp_exposed", "DP/ZeRO comm (exposed)"),
        ("optimizer", "optimizer")]


def estimates(doc):
    if "estimate" in doc:
        return [doc["estimate"]]
    return doc["accepted"]


def label(e, i):
    l = e["layout"]
    parts = [f"dp{l['dp']} tp{l['tp']} pp{l['pp']}"]
    if l["v"] > 1:
        parts.append(f"v{l['v']}")
    if l["cp"] > 1:
        parts.append(f"cp{l['cp']}")
    if l["ep"] > 1:
        parts.append(f"ep{l['ep']}")
    parts.append(f"z{l['zero']}")
    if l["zero"] > 0 and l["shard_group"] < l["dp"] * l["cp"]:
        parts.append(f"hsdp{l['shard_group']}")
    parts.append(f"mb{l['micro_batch']}")
    parts.append({"none": "", "selective": "rc-sel", "full": "rc-full"}[l["recompute"]])
    if l["sequence_parallel"]:
        parts.append("sp")
    return f"#{i + 1}\n" + "\n".join(p for p in " ".join(parts).split(" ") if p)


def stacked(ax, names, rows, keys, scale, unit):
    bottom = [0.0] * len(rows)
    colors = plt.cm.tab10.colors
    for j, (key, text) in enumerate(keys):
        values = [r.get(key, 0.0) / scale for r in rows]
        if not any(values):
            continue
        ax.bar(names, values, bottom=bottom, label=text, color=colors[j % len(colors)])
        bottom = [b + v for b, v in zip(bottom, values)]
    ax.set_ylabel(unit)
    return bottom


def main():
    path, out = sys.argv[1], sys.argv[2]
    with open(path) as f:
        doc = json.load(f)
    es = estimates(doc)
    if not es:
        print("plan-plot: no layout to draw", file=sys.stderr)
        return 1
    names = [label(e, i) for i, e in enumerate(es)]
    model = doc.get("workload", {})
    title = (f"{model.get('arch', '')} {model.get('parameters', 0) / 1e9:.1f}B, "
             f"{es[0]['layout']['dp'] * es[0]['layout']['tp'] * es[0]['layout']['pp'] * es[0]['layout']['cp']} accelerators")
    width = max(6, 1.1 * len(es) + 3)

    fig, ax = plt.subplots(figsize=(width, 5))
    stacked(ax, names, [e["memory_bytes"] for e in es], MEMORY, 1e9, "GB per accelerator")
    cap = es[0]["memory_bytes"]["capacity"] / 1e9
    ax.axhline(cap, color="black", linestyle="--", linewidth=1)
    ax.text(len(es) - 0.5, cap, f" capacity {cap:.0f} GB", va="bottom", ha="right")
    ax.set_title(f"memory per accelerator: {title}")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "plan-memory.png"), dpi=110)

    fig, ax = plt.subplots(figsize=(width, 5))
    rows = []
    for e in es:
        t = dict(e["time_seconds"])
        t["dp_exposed"] = t["dp"] - t["dp_hidden"]
        t["ep_exposed"] = t["ep"] - t.get("ep_hidden", 0)
        rows.append(t)
    tops = stacked(ax, names, rows, TIME, 1.0, "seconds per step")
    for i, e in enumerate(es):
        ax.text(i, tops[i], f"MFU {100 * e['mfu']:.0f}%", ha="center", va="bottom", fontsize=7)
    ax.set_title(f"step time: {title}")
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    ax.tick_params(axis="x", labelsize=7)
    fig.tight_layout()
    fig.savefig(os.path.join(out, "plan-time.png"), dpi=110)
    print(f"plan-plot: wrote {out}/plan-memory.png and {out}/plan-time.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())

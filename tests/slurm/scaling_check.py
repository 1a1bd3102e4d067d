#!/usr/bin/python3
"""Checks a scaling study's report against the runs' own outputs, independently of
tools/scaling_report.py: for every point, the steady-state step times are read again from
its runs' metrics.jsonl (pooled over --repeats; numpy's median), and the speedups and efficiencies recomputed from them
must be the ones in report.json (to 1e-9) and in report.md's tables (as printed, 3
decimals); the time split adds up to the median and has a bubble exactly when the run is
pipelined; the points ran at the rank counts and batches of the plan (run.json); the plots
are PNG files.

usage: scaling_check.py STUDY_DIR RANKS (e.g. 1,2,4)
Prints 'scaling report: CONSISTENT' and exits 0, or names each disagreement and exits 1.
"""
import json
import re
import sys
from pathlib import Path

import numpy as np

study = Path(sys.argv[1])
ranks = [int(x) for x in sys.argv[2].split(",")]
meta = json.loads((study / "study.json").read_text())
report = json.loads((study / "report.json").read_text())
md = (study / "report.md").read_text()
warmup = meta["warmup"]
bad = []


def check(cond, what):
    if not cond:
        bad.append(what)


def close(a, b, rtol=1e-9):
    return abs(a - b) <= rtol * max(abs(a), abs(b))


def md_rows(mode):
    """report.md table rows of one series: {G: [cells]}."""
    part = md.split(f"## {mode.capitalize()} scaling", 1)
    check(len(part) == 2, f"report.md has no {mode} section")
    rows = {}
    if len(part) == 2:
        for line in part[1].split("\n## ")[0].splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if cells and re.fullmatch(r"\d+", cells[0]):
                rows[int(cells[0])] = cells
    return rows


for mode in sorted({p["mode"] for p in meta["points"]}):
    points = [p for p in meta["points"] if p["mode"] == mode]
    check(sorted(p["ranks"] for p in points) == ranks, f"{mode}: rank counts {points}")
    got = {p["ranks"]: p for p in report["series"][mode]}
    rows = md_rows(mode)
    t, n_steady = {}, {}
    for p in points:
        g = p["ranks"]
        steady = []
        for run in p.get("runs", [p["dir"]]):
            out = study / run
            info = json.loads((out / "run.json").read_text())
            check(info["layout"]["world"] == g and info["layout"]["dp"] == p.get("dp", g),
                  f"{run}: run.json layout {info['layout']}")
            check(info["batch"]["global"] == p["global_batch"],
                  f"{run}: ran global batch {info['batch']['global']}, planned {p['global_batch']}")
            recs = {}
            for line in (out / "metrics.jsonl").read_text().splitlines():
                if line.strip():
                    r = json.loads(line)
                    recs[r["step"]] = r["step_time"]
            check(len(recs) == meta["steps"], f"{run}: {len(recs)} steps recorded")
            steady += [recs[s] for s in sorted(recs) if s > warmup]
        steady = np.array(steady)
        runs = len(p.get("runs", [p["dir"]]))
        check(len(steady) == runs * (meta["steps"] - warmup), f"{mode} G={g}: steady steps")
        t[g] = float(np.median(steady))
        check(close(got[g]["t_median"], t[g]), f"{mode} G={g}: median {got[g]['t_median']} vs {t[g]}")
        q1, q3 = np.percentile(steady, [25, 75])
        check(close(got[g]["t_q1"], q1) and close(got[g]["t_q3"], q3), f"{mode} G={g}: quartiles")
        n_steady[g] = len(steady)
        split = got[g].get("split_ms")
        check(split is not None, f"{mode} G={g}: no time split")
        if split:
            check(close(sum(split.values()), 1e3 * t[g], 1e-9), f"{mode} G={g}: split {split}")
            pp = info["layout"].get("pp", 1)
            check((split["bubble"] > 0) == (pp > 1), f"{mode} G={g}: bubble {split['bubble']} at pp {pp}")
    # batches: strong keeps the global batch, weak the batch per rank
    batches = {p["ranks"]: p["global_batch"] for p in points}
    if mode == "strong":
        check(len(set(batches.values())) == 1, f"strong: global batches {batches}")
    else:
        dps = {p["ranks"]: p.get("dp", p["ranks"]) for p in points}
        check(len({b // dps[g] for g, b in batches.items()}) == 1,
              f"weak: per-rank batches {batches}")
    g0 = min(t)
    for g in t:
        if mode == "strong":
            s, e = t[g0] / t[g], g0 * t[g0] / (g * t[g])
        else:
            e = t[g0] / t[g]
            s = e * g / g0
        check(close(got[g]["efficiency"], e), f"{mode} G={g}: efficiency {got[g]['efficiency']} vs {e}")
        check(close(got[g]["speedup"], s), f"{mode} G={g}: speedup {got[g]['speedup']} vs {s}")
        cells = rows.get(g)
        check(cells is not None, f"report.md: no {mode} row for G={g}")
        if cells:
            check(cells[5] == f"{1e3 * t[g]:.2f}", f"report.md {mode} G={g}: T {cells[5]}")
            check(cells[10] == f"{s:.3f}", f"report.md {mode} G={g}: speedup {cells[10]} vs {s:.3f}")
            check(cells[12] == f"{e:.3f}", f"report.md {mode} G={g}: efficiency {cells[12]} vs {e:.3f}")
        print(f"{mode:6s} G={g}: T median {1e3 * t[g]:8.3f} ms over {n_steady[g]} steps "
              f"-> speedup {s:.3f}, efficiency {e:.3f} (report: {got[g]['efficiency']:.3f})")

for png in ("speedup.png", "efficiency.png", "time_split.png"):
    f = study / png
    check(f.exists() and f.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", f"{png} missing or not a PNG")
    check(f"]({png})" in md, f"report.md does not show {png}")

for b in bad:
    print("MISMATCH:", b)
print("scaling report: CONSISTENT" if not bad else f"scaling report: {len(bad)} MISMATCHES")
sys.exit(1 if bad else 0)

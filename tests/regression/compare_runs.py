#!/usr/bin/env python3
"""Compares the per-step losses and gradient norms of two tessera runs (metrics.jsonl).

usage: compare_runs.py REFERENCE_DIR RUN_DIR [--rtol 1e-5] [--grad-rtol RTOL] [--moe-stats]
Exit 0 and 'runs: MATCH' when every step's loss agrees to rtol and its gradient norm to
grad-rtol (default: rtol; doc/testing.md lists the tolerances); 'runs: DIFFER' otherwise.
Where both runs report them, the validation loss must agree to rtol too, and a loss mask's
unmasked targets per step (loss_targets, doc/data.md "Loss masks") exactly. With --moe-stats,
every step's experts' statistics (the "moe" entries: loads, drops, balancing and z-loss sums,
the selection bias's range, cross-node bytes) must agree to rtol as well, and both runs must
report them.
"""
import argparse
import json
import sys


def load(path):
    with open(path + "/metrics.jsonl") as f:
        return [json.loads(line) for line in f if line.strip()]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("reference")
    ap.add_argument("run")
    ap.add_argument("--rtol", type=float, default=1e-5)
    ap.add_argument("--grad-rtol", type=float, default=None)
    ap.add_argument("--moe-stats", action="store_true")
    a = ap.parse_args()
    grad_rtol = a.rtol if a.grad_rtol is None else a.grad_rtol
    ref, run = load(a.reference), load(a.run)
    bad = 0
    if len(ref) != len(run) or not ref:
        print(f"step counts differ or empty: {len(ref)} vs {len(run)}")
        bad += 1
    for r, s in zip(ref, run):
        for key, tol in (("loss", a.rtol), ("grad_norm", grad_rtol)):
            rel = abs(r[key] - s[key]) / max(abs(r[key]), 1e-30)
            ok = rel <= tol
            bad += not ok
            print(f"{'ok  ' if ok else 'FAIL'} step {r['step']:3d} {key:9s} "
                  f"{r[key]:.9g} vs {s[key]:.9g} rel {rel:.2e} (tol {tol:.0e})")
        if "val_loss" in r and "val_loss" in s:
            rel = abs(r["val_loss"] - s["val_loss"]) / max(abs(r["val_loss"]), 1e-30)
            ok = rel <= a.rtol
            bad += not ok
            print(f"{'ok  ' if ok else 'FAIL'} step {r['step']:3d} val_loss  "
                  f"{r['val_loss']:.9g} vs {s['val_loss']:.9g} rel {rel:.2e} (tol {a.rtol:.0e})")
        if a.moe_stats:
            ours, theirs = r.get("moe"), s.get("moe")
            same = bool(ours) and ours is not None and theirs is not None and len(ours) == len(theirs)
            for x, y in zip(ours or [], theirs or []):
                for k in x:
                    if isinstance(x[k], str) or k not in y:
                        same = same and x[k] == y.get(k)
                    else:
                        same = same and abs(x[k] - y[k]) <= a.rtol * max(abs(x[k]), 1e-30)
            bad += not same
            if not same:
                print(f"FAIL step {r['step']:3d} moe statistics {ours} vs {theirs}")
        if r.get("loss_targets") != s.get("loss_targets"):
            bad += 1
            print(f"FAIL step {r['step']:3d} loss_targets {r.get('loss_targets')} vs "
                  f"{s.get('loss_targets')}")
    print("runs: MATCH" if bad == 0 else f"runs: DIFFER ({bad} values)")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

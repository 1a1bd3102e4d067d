#!/usr/bin/env bash
# The two-level expert dispatch's cross-node bytes (doc/moe.md, "Two-level dispatch"): runs the
# deck with parallel.ep_dispatch = flat and two_level, each unrestricted and with
# parallel.ep_max_nodes = 1, and checks, per step and MoE block (metrics.jsonl):
#   * two_level: cross_node_bytes (what ep_cross's byte counter counted for the forward
#     dispatch's rows) equals cross_node_bytes_once_per_node (the formula: per token, the
#     distinct other nodes of its kept experts x d_model x 4 bytes, counted from the routing's
#     choices), to the byte;
#   * the same check rejects the flat run (a row per token and expert): it can fail;
#   * with ep_max_nodes = 1, at most one row per token crosses (tokens x d_model x 4);
#   * two_level and flat train alike: losses and gradient norms to 1e-5, final weights to 1e-5
#     (tessera-ckpt diff); whether they are bit-identical is printed;
#   * traffic.json names the two legs apart (ep_intra, ep_cross).
# usage: moe_two_level.sh WORKDIR "MPIEXEC... NP" PYTHON TESSERA CKPT_TOOL DECK [overrides...]
set -euo pipefail
work=$1 mpiexec=$2 python=$3 tessera=$4 ckpt=$5
shift 5
rm -rf "$work" && mkdir -p "$work"
for d in flat two_level; do
  for m in 0 1; do
    OMP_NUM_THREADS=1 $mpiexec "$tessera" "$@" --parallel.ep_dispatch=$d \
      --parallel.ep_max_nodes=$m --output.dir="$work/$d-m$m" --output.echo_deck=false \
      > "$work/$d-m$m.log"
    grep -E "cross-node dispatch" "$work/$d-m$m.log"
  done
done
weights=OK
for m in 0 1; do
  a=$work/flat-m$m/checkpoints b=$work/two_level-m$m/checkpoints
  "$ckpt" diff --prefix params/ --norm-rtol 1e-5 "$a/$(cat "$a/latest")" "$b/$(cat "$b/latest")" \
    > "$work/diff-m$m.log" 2>&1 || weights=FAIL
  tail -1 "$work/diff-m$m.log"
done
"$python" - "$work" "$weights" <<'PY'
import json, sys
work, weights = sys.argv[1], sys.argv[2]
ok = weights == "OK"
if not ok:
    print("final weights: two_level differs from flat beyond 1e-5")
def run(d, m):
    return [json.loads(l) for l in open(f"{work}/{d}-m{m}/metrics.jsonl") if '"moe"' in l]
deck = json.load(open(f"{work}/two_level-m0/run.json"))["deck"]
row = deck["model"]["d_model"] * 4
tokens = deck["train"]["global_batch"] * deck["model"]["seq_len"]
def once_per_node(d, m):
    """Whether every block of every step sent exactly the formula's bytes."""
    good = True
    for rec in run(d, m):
        for b in rec["moe"]:
            if b["cross_node_bytes"] != b["cross_node_bytes_once_per_node"]:
                good = False
                if d == "two_level":
                    print(f"{d} ep_max_nodes={m} step {rec['step']} {b['layer']}: sent",
                          b["cross_node_bytes"], "!= once per node",
                          b["cross_node_bytes_once_per_node"])
    return good
total = {}
for d in ("flat", "two_level"):
    for m in (0, 1):
        total[d, m] = sum(b["cross_node_bytes"] for r in run(d, m) for b in r["moe"])
        formula = sum(b["cross_node_bytes_once_per_node"] for r in run(d, m) for b in r["moe"])
        print(f"{d:9s} ep_max_nodes={m}: cross-node bytes {total[d, m]:.0f}, "
              f"once per node {formula:.0f}")
for m in (0, 1):
    if not once_per_node("two_level", m) or total["two_level", m] <= 0:
        ok = False
    if once_per_node("flat", m):  # the check must tell a row per expert from a row per node
        ok = False
        print(f"the check accepts the flat dispatch (ep_max_nodes={m}): it cannot fail")
    print(f"two_level / flat at ep_max_nodes={m}: "
          f"{total['two_level', m] / total['flat', m]:.3f}")
for rec in run("two_level", 1):
    for b in rec["moe"]:
        if b["cross_node_bytes"] > tokens * row:
            ok = False
            print("ep_max_nodes=1: more than one row per token crossed at step", rec["step"])
for m in (0, 1):
    worst, same = 0.0, True
    for a, b in zip(run("flat", m), run("two_level", m)):
        for k in ("loss", "grad_norm"):
            worst = max(worst, abs(a[k] - b[k]) / max(abs(a[k]), 1e-30))
            same &= a[k] == b[k]
    print(f"ep_max_nodes={m}: two_level against flat, losses and gradient norms within "
          f"{worst:.2e} relative ({'bit-identical' if same else 'not bit-identical'})")
    ok &= worst <= 1e-5 and len(run("flat", m)) == len(run("two_level", m)) > 0
traffic = json.load(open(f"{work}/two_level-m0/traffic.json"))
if not ("ep_cross" in traffic and "ep_intra" in traffic):
    ok = False
    print("traffic.json lacks ep_cross or ep_intra:", sorted(traffic))
print("two-level dispatch:", "OK" if ok else "FAIL")
PY

#!/usr/bin/env bash
# Node-limited routing's cross-node dispatch bytes (doc/moe.md): runs the deck unrestricted and
# with parallel.ep_max_nodes = 1; checks metrics.jsonl and the summary line.
# usage: moe_cross_node.sh WORKDIR "MPIEXEC... NP" PYTHON TESSERA DECK [overrides...]
set -euo pipefail
work=$1 mpiexec=$2 python=$3 tessera=$4
shift 4
rm -rf "$work" && mkdir -p "$work"
for m in 0 1; do
  OMP_NUM_THREADS=1 $mpiexec "$tessera" "$@" --parallel.ep_max_nodes=$m --output.dir="$work/m$m" \
    --output.echo_deck=false > "$work/m$m.log"
  grep -E "cross-node dispatch" "$work/m$m.log"
done
"$python" - "$work" <<'PY'
import json, sys
work = sys.argv[1]
def steps(m):
    return [json.loads(l) for l in open(f"{work}/m{m}/metrics.jsonl") if '"moe"' in l]
ok = True
sent = {0: 0.0, 1: 0.0}
free = {0: 0.0, 1: 0.0}
for m in (0, 1):
    for rec in steps(m):
        for b in rec["moe"]:
            sent[m] += b["cross_node_bytes"]
            free[m] += b["cross_node_bytes_unrestricted"]
            if m == 0 and b["cross_node_bytes"] != b["cross_node_bytes_unrestricted"]:
                ok = False
                print("unrestricted run: measured", b["cross_node_bytes"], "!= unrestricted",
                      b["cross_node_bytes_unrestricted"], "at step", rec["step"], b["layer"])
    print(f"ep_max_nodes={m}: sent {sent[m]:.0f} B, unrestricted routing {free[m]:.0f} B")
if not (sent[0] > 0 and sent[1] < free[1]):
    ok = False
print("cross-node bytes:", "OK" if ok else "FAIL")
PY

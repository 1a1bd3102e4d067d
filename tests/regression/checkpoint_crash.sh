#!/usr/bin/env bash
# A process killed (SIGKILL) while writing a checkpoint leaves the previous checkpoint intact
# and `latest` pointing to it; resuming from it finishes like an uninterrupted run.
# usage: checkpoint_crash.sh WORKDIR TESSERA DECK [overrides]
set -euo pipefail
work=$1 tessera=$2
shift 2
here=$(cd "$(dirname "$0")" && pwd)
tools=$here/../../tools
rm -rf "$work" && mkdir -p "$work"
run() { OMP_NUM_THREADS=1 "$tessera" "$@" --train.steps=20 --checkpoint.every=10 \
          --hardware.peak_flops=1e9 --output.echo_deck=false; }
run "$@" --output.dir="$work/straight" > "$work/straight.log"
run "$@" --output.dir="$work/crash" --train.exit_after=10 > "$work/first.log"
ckpts=$work/crash/checkpoints
before=$(sha256sum "$ckpts/ckpt-00000010.h5")
# The resumed run dies halfway through writing the step-20 checkpoint.
set +e
TESSERA_FAULT_INJECT=checkpoint-midwrite run "$@" --output.dir="$work/crash" \
  --checkpoint.resume=latest > "$work/killed.log" 2>&1
status=$?
set -e
echo "killed run exit status $status (137 = SIGKILL)"
[ "$status" -ne 0 ]
ls "$ckpts"
[ -e "$ckpts/ckpt-00000020.h5.tmp" ] && echo "partial file left as ckpt-00000020.h5.tmp"
[ ! -e "$ckpts/ckpt-00000020.h5" ]
[ "$(cat "$ckpts/latest")" = "ckpt-00000010.h5" ] && echo "latest still names ckpt-00000010.h5"
[ "$(sha256sum "$ckpts/ckpt-00000010.h5")" = "$before" ] && echo "previous checkpoint unchanged"
"$tools/tessera-ckpt" verify "$ckpts/ckpt-00000010.h5" | tail -1
run "$@" --output.dir="$work/crash" --checkpoint.resume=latest > "$work/resumed.log"
# metrics.jsonl of the crash dir holds steps 1-10, the killed run's 11-20 and the resumed
# 11-20: compare the last 20 records in step order with the straight run.
python3 - "$work" <<'PY'
import json, sys
work = sys.argv[1]
rows = [json.loads(l) for l in open(f"{work}/crash/metrics.jsonl")]
final = {r["step"]: r["loss"] for r in rows}          # later records win: the resumed run
straight = {json.loads(l)["step"]: json.loads(l)["loss"] for l in open(f"{work}/straight/metrics.jsonl")}
same = final == straight
print("crash: resumed losses " + ("IDENTICAL" if same else "DIFFER") + " to the uninterrupted run")
PY
"$tools/tessera-ckpt" diff "$work/straight/checkpoints/ckpt-00000020.h5" "$ckpts/ckpt-00000020.h5" | tail -1

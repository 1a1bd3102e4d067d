#!/usr/bin/env bash
# A bit-flipped or truncated checkpoint gives an error naming the damage, from rank 0, with a
# non-zero exit, and nothing on disk is modified.
# usage: checkpoint_damage.sh WORKDIR "LAUNCH" TESSERA DECK [overrides]
set -uo pipefail
work=$1 launch=$2 tessera=$3
shift 3
rm -rf "$work" && mkdir -p "$work"
run() { OMP_NUM_THREADS=1 $launch "$tessera" "$@" --train.steps=6 --checkpoint.every=3 \
          --hardware.peak_flops=1e9 --output.echo_deck=false; }
run "$@" --output.dir="$work/good" > "$work/good.log" || exit 1
good=$work/good/checkpoints/ckpt-00000006.h5
mkdir -p "$work/flip" "$work/cut"
cp "$good" "$work/flip/ckpt.h5"
/usr/bin/python3 - "$work/flip/ckpt.h5" <<'PY'
import sys, h5py
path = sys.argv[1]
with h5py.File(path, "r") as f:
    offset = f["params/layers.0.mlp.up.weight"].id.get_offset() + 100
with open(path, "r+b") as f:
    f.seek(offset); b = f.read(1); f.seek(offset); f.write(bytes([b[0] ^ 0x10]))
PY
head -c $(( $(stat -c %s "$good") / 2 )) "$good" > "$work/cut/ckpt.h5"
status=0
for case in flip cut; do
  sum_before=$(sha256sum "$work/$case/ckpt.h5")
  out=$(run "$@" --output.dir="$work/$case/run" --checkpoint.resume="$work/$case/ckpt.h5" 2>&1)
  rc=$?
  echo "$out" | grep -E "error" | sed "s/^/$case: /"
  n=$(echo "$out" | grep -c "error")
  [ "$rc" -ne 0 ] || { echo "$case: FAIL exit status 0"; status=1; }
  [ "$n" -eq 1 ] || { echo "$case: FAIL error printed $n times"; status=1; }
  [ "$(sha256sum "$work/$case/ckpt.h5")" = "$sum_before" ] || { echo "$case: FAIL file modified"; status=1; }
  [ ! -e "$work/$case/run/checkpoints" ] || { echo "$case: FAIL wrote checkpoints"; status=1; }
done
[ $status -eq 0 ] && echo "damage: all rejected cleanly"
exit $status

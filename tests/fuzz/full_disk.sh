#!/usr/bin/env bash
# A full file system under output.dir, then under checkpoint.dir: each is refused before step 1
# with one error line naming the directory, its free space and what the run needs. The full
# file system is a 64 KiB tmpfs mounted by the test in a private temporary directory (root
# only: skipped, exit 77, otherwise) and unmounted at the end. Nothing is written there.
# usage: full_disk.sh WORKDIR BASE TESSERA DECK
set -uo pipefail
work=$1 base=$2 tessera=$3 deck=$4
[ "$(id -u)" = 0 ] || { echo "full: skipped (mounting a tmpfs needs root)"; exit 77; }
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
cp "$base/data.h5" data.h5
small=$(mktemp -d /tmp/tfull.XXXXXX) || exit 1
mount -t tmpfs -o size=64k tmpfs "$small" 2>/dev/null || { rmdir "$small"; echo "full: skipped (cannot mount a tmpfs)"; exit 77; }
trap 'umount "$small"; rmdir "$small"' EXIT
export OMP_NUM_THREADS=1
run() {  # run EXPECTED_REGEX ARGS...: refused with exactly one error line matching
  local regex=$1
  shift
  out=$(timeout -k 5 60 "$tessera" "$deck" --data.path=data.h5 --hardware.peak_flops=1e9 "$@" 2>&1)
  status=$?
  [ "$status" -eq 1 ] || { echo "$out"; echo "full: FAIL (exit status $status)"; exit 1; }
  [ "$(grep -c error <<< "$out")" -eq 1 ] || { echo "$out"; echo "full: FAIL (not one error line)"; exit 1; }
  line=$(grep error <<< "$out")
  grep -qE "$regex" <<< "$line" || { echo "$line"; echo "full: FAIL (unexpected message)"; exit 1; }
  [ -z "$(find "$small" -mindepth 1 -type f)" ] || { echo "full: FAIL (a file on the full disk)"; find "$small"; exit 1; }
}
run "error: the output directory '$small/out' has 0\.0[0-9]* MB free, but this run writes about [0-9.]+ MB there before its step 6" \
    --output.dir="$small/out" --checkpoint.dir=ck
echo "full: output.dir refused: $line"
run "error: the checkpoint directory '$small/ck' has 0\.0[0-9]* MB free, but one checkpoint takes 0\.[0-9]+ MB" \
    --output.dir=out --checkpoint.dir="$small/ck"
echo "full: checkpoint.dir refused: $line"
# The default checkpoint directory (output.dir/checkpoints): the advice names output.dir, the
# key the user set, not checkpoint.dir.
run "error: the checkpoint directory '$small/out/checkpoints' has 0\.0[0-9]* MB free, but one checkpoint takes 0\.[0-9]+ MB; free space or choose another output.dir$" \
    --output.dir="$small/out"
echo "full: the default checkpoint directory refused naming output.dir: $line"
cd / && rm -rf "$work"

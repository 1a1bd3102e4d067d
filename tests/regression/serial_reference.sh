#!/usr/bin/env bash
# The serial reference of the layout tests: one run of a deck on one rank, made once per build
# tree and set of arguments (a CTest fixture, tests/regression/CMakeLists.txt, layout_case) and
# shared by every layout test that compares against it.
# usage: serial_reference.sh WORKDIR TESSERA DECK [overrides...]
set -euo pipefail
work=$1 tessera=$2
shift 2
rm -rf "$work" && mkdir -p "$work"
OMP_NUM_THREADS=1 "$tessera" "$@" --output.dir="$work/run" --hardware.peak_flops=1e9 \
  --output.echo_deck=false > "$work/run.log"
ls "$work/run/checkpoints/"ckpt-*.h5 > /dev/null
echo "serial reference: written ($(wc -l < "$work/run/metrics.jsonl") steps)"

#!/usr/bin/env bash
# The signal family (issue 19): SIGTERM, SIGINT and SIGUSR1 sent to mpirun, to tools/tessera-run,
# to one rank or to a serial run, at several moments. A run resumed from fuzz_base's step-6
# checkpoint (micro-batch 1 on each of 2 ranks: the base's 2 sequences a step) trains "forever"
# (train.steps = 100000, no periodic checkpoints, keep 10); the
# signal comes once it has logged a few steps (or at an exact moment through the test hook
# TESSERA_FAULT_INJECT=sigterm-MOMENT-rank-R, src/train/stop_signal.hpp). Each case checks:
#   * the exit status (75: stopped with a checkpoint, jobscripts/README.md; plain mpirun's
#     own answer to SIGTERM/SIGINT is 1, whatever its ranks return: see there);
#   * exactly one line saying why it stopped ("stopped by SIG... after step N: checkpoint
#     written, exit status 75") and no line containing "error";
#   * the checkpoints that were there before (ckpt-3, ckpt-6) byte-identical (SHA-256), and the
#     new one complete: `latest` names it and tools/tessera-ckpt verify passes.
# There is no timing assertion: waits poll metrics.jsonl, and the timeouts only catch a hang.
# usage: signals.sh CASE WORKDIR BASE TESSERA DECK CKPT_TOOL RUN_TOOL MPIEXEC [MPIEXEC_FLAGS...]
#   (MPIEXEC_FLAGS: everything before the executable, e.g. -n 2 --oversubscribe)
set -uo pipefail
case=$1 work=$2 base=$3 tessera=$4 deck=$5 tool=$6 runner=$7
shift 7
mpiexec=("$@")
fail() { echo "signal: FAIL ($case): $*"; [ -f run.log ] && tail -n 30 run.log; exit 1; }

rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
cp "$base/data.h5" data.h5 && cp -a "$base/run/checkpoints" ck || fail "setup"
before=$(sha256sum ck/ckpt-00000003.h5 ck/ckpt-00000006.h5)
export OMP_NUM_THREADS=1
args=("$tessera" "$deck" --data.path=data.h5 --output.dir=out --checkpoint.dir=ck
      --hardware.peak_flops=1e9 --checkpoint.resume=latest --train.steps=100000
      --checkpoint.every=0 --checkpoint.keep=10 --train.micro_batch=1 --train.global_batch=2)

# Starts COMMAND... in the background and sets $pid; waits until it has logged 3 steps. Job
# control (set -m) gives it a process group of its own, as a terminal's foreground job has,
# and leaves SIGINT as it is (without job control a background job ignores SIGINT, and a
# shell cannot trap a signal ignored when it started).
start() {
  set -m
  "$@" > run.log 2>&1 < /dev/null &
  pid=$!
  set +m
  for _ in $(seq 1 1200); do
    [ "$(cat out/metrics.jsonl 2>/dev/null | wc -l)" -ge 3 ] && return 0
    kill -0 "$pid" 2>/dev/null || fail "ended before the signal"
    sleep 0.1
  done
  fail "no progress in 120 s"
}
# Waits for $pid (killing its process group after 120 s: a hang); sets $status. Polls
# /proc rather than leaving a sleeping guard behind that would hold ctest's output pipe.
finish() {
  local state=""
  for _ in $(seq 1 1200); do
    state=$(awk '{print $3}' /proc/"$pid"/stat 2>/dev/null)
    { [ -z "$state" ] || [ "$state" = Z ]; } && break
    sleep 0.1
  done
  { [ -z "$state" ] || [ "$state" = Z ]; } || kill -KILL -- -"$pid" 2>/dev/null
  wait "$pid"
  status=$?
}
# A child process of $1 whose command is tessera (a rank under mpirun).
rank_of() {
  for child in $(pgrep -P "$1"); do
    [ "$(basename "$(readlink -f /proc/"$child"/exe 2>/dev/null)")" = tessera ] && { echo "$child"; return; }
  done
}
# The stop the documented way: exit 75, one line naming the signal (and STEP when given), no
# error, old checkpoints intact, the new one published and verified.
expect_stop() {
  local sig=$1 step=${2:-}
  [ "$status" -eq 75 ] || fail "exit status $status, expected 75"
  [ "$(grep -c 'stopped by' run.log)" -eq 1 ] || fail "not exactly one 'stopped by' line"
  [ "$(grep -c error run.log)" -eq 0 ] || fail "an error line"
  line=$(grep 'stopped by' run.log)
  echo "$line" | grep -qE "^stopped by $sig after step ${step:-[0-9]+}: checkpoint written, exit status 75$" ||
    fail "unexpected line: $line"
  n=$(echo "$line" | sed 's/.* after step \([0-9]*\):.*/\1/')
  intact_and_verified "$(printf 'ckpt-%08d.h5' "$n")"
  echo "signal: pass ($case): $line"
}
intact_and_verified() {
  [ "$(sha256sum ck/ckpt-00000003.h5 ck/ckpt-00000006.h5)" = "$before" ] ||
    fail "a checkpoint that was there before changed"
  [ "$(cat ck/latest)" = "$1" ] || fail "latest names '$(cat ck/latest)', expected $1"
  /usr/bin/python3 "$tool" verify "ck/$1" | tail -n 1 | grep -q "verify: PASS" ||
    fail "ck/$1 does not verify"
}

case $case in
  wrapped_mpirun_sigterm)  # SIGTERM to tools/tessera-run: passed on as SIGUSR1, exit 75
    start "$runner" "${mpiexec[@]}" "${args[@]}"
    kill -TERM "$pid"
    finish
    grep -q "tessera-run: received SIGTERM" run.log || fail "tessera-run did not say what it got"
    expect_stop SIGUSR1 ;;
  wrapped_mpirun_ctrl_c)  # Ctrl-C: SIGINT to the whole foreground process group
    start "$runner" "${mpiexec[@]}" "${args[@]}"
    kill -INT -- -"$pid"
    finish
    expect_stop SIGUSR1 ;;
  mpirun_sigusr1)  # SIGUSR1 to plain mpirun: passed to every rank, exit 75
    start "${mpiexec[@]}" "${args[@]}"
    kill -USR1 "$pid"
    finish
    expect_stop SIGUSR1 ;;
  mpirun_sigterm | mpirun_sigint)  # plain mpirun: Open MPI exits 1 and kills its ranks 1 s later
    start "${mpiexec[@]}" "${args[@]}"
    [ "$case" = mpirun_sigterm ] && kill -TERM "$pid" || kill -INT "$pid"
    finish
    [ "$status" -eq 1 ] || fail "exit status $status, expected Open MPI's 1"
    [ "$(grep -c error run.log)" -le 1 ] || fail "more than one error line"
    [ "$(sha256sum ck/ckpt-00000003.h5 ck/ckpt-00000006.h5)" = "$before" ] ||
      fail "a checkpoint that was there before changed"
    # The ranks' stop either fitted in Open MPI's second (a new checkpoint) or not (latest
    # still names step 6); either way latest names a complete checkpoint.
    intact_and_verified "$(cat ck/latest)"
    echo "signal: pass ($case): exit status 1 (Open MPI), latest $(cat ck/latest) verified" ;;
  one_rank_sigterm | one_rank_sigint | one_rank_sigusr1)  # one rank only: all stop together
    sig=${case#one_rank_sig}
    sig=${sig^^}
    start "${mpiexec[@]}" "${args[@]}"
    rank=$(rank_of "$pid")
    [ -n "$rank" ] || fail "no rank found under mpirun $pid"
    kill -s "$sig" "$rank"
    finish
    expect_stop "SIG$sig" ;;
  serial_ctrl_c)  # a run without mpirun: Ctrl-C reaches tessera itself
    start "${args[@]}"
    kill -INT -- -"$pid"
    finish
    expect_stop SIGINT ;;
  before_first_step)  # SIGTERM to rank 1 before step 7 (the first of the resumed run)
    TESSERA_FAULT_INJECT=sigterm-before-first-step-rank-1 \
      timeout -k 5 120 "${mpiexec[@]}" "${args[@]}" > run.log 2>&1 < /dev/null
    status=$?
    expect_stop SIGTERM 7 ;;
  during_checkpoint_write)  # SIGTERM to rank 1 halfway through writing step 8's checkpoint
    TESSERA_FAULT_INJECT=sigterm-checkpoint-write-rank-1 \
      timeout -k 5 120 "${mpiexec[@]}" "${args[@]}" --checkpoint.every=2 > run.log 2>&1 < /dev/null
    status=$?
    /usr/bin/python3 "$tool" verify ck/ckpt-00000008.h5 | tail -n 1 | grep -q "verify: PASS" ||
      fail "the checkpoint being written when the signal came does not verify"
    expect_stop SIGTERM 9 ;;
  mpirun_sigkill_during_write)  # mpirun killed (SIGKILL) while step 8's checkpoint is written:
    # its orphaned ranks live on a moment (Open MPI: about 2.5 s) and must publish nothing. The
    # test hook makes the write wait until mpirun is gone, so the ranks reach the publication
    # as orphans every time.
    export TESSERA_FAULT_INJECT=checkpoint-write-until-orphaned
    set -m
    "${mpiexec[@]}" "${args[@]}" --checkpoint.every=2 > run.log 2>&1 < /dev/null &
    pid=$!
    set +m
    for _ in $(seq 1 1200); do
      [ -e ck/ckpt-00000008.h5.tmp ] && break
      kill -0 "$pid" 2>/dev/null || fail "ended before its checkpoint write"
      sleep 0.1
    done
    [ -e ck/ckpt-00000008.h5.tmp ] || fail "no checkpoint write in 120 s"
    ranks=$(pgrep -P "$pid")
    [ -n "$ranks" ] || fail "no rank found under mpirun $pid"
    kill -KILL "$pid"
    wait "$pid" 2>/dev/null
    for _ in $(seq 1 300); do
      alive=""
      for r in $ranks; do kill -0 "$r" 2>/dev/null && alive="$alive $r"; done
      [ -z "$alive" ] && break
      sleep 0.1
    done
    [ -z "$alive" ] || { kill -KILL $alive; fail "ranks$alive still alive 30 s after mpirun died"; }
    [ ! -e ck/ckpt-00000008.h5 ] || fail "an orphaned rank published ckpt-00000008.h5"
    intact_and_verified ckpt-00000006.h5
    echo "signal: pass ($case): nothing published after mpirun died, latest ckpt-00000006.h5" ;;
  *) fail "unknown case" ;;
esac
cd / && rm -rf "$work"

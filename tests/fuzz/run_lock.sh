#!/usr/bin/env bash
# One run per directory (issue 36; doc/checkpoints.md, "One run per directory"). A run holding
# the lock (the holder) is started, and once it has logged a step it is stopped (SIGSTOP), so
# that the file system stays still while a second run tries the same directories:
#   fresh    two fresh runs in one output.dir: the second is refused with one line naming the
#            holder's PID and lock file, nothing in the directory changed (SHA-256 of every
#            file); the holder, continued, finishes with every metrics line whole and its
#            checkpoint verified (it trains "forever"; SIGUSR1 stops it with a checkpoint). Then two fresh runs started at the same moment: exactly one
#            is refused, by the lock; the other, stopped by SIGUSR1, leaves a verified checkpoint.
#   resume   two runs resuming from one checkpoint.dir (other output.dirs): the second is
#            refused naming checkpoint.dir, its own output.dir not even created.
#   stale    a holder killed (SIGKILL) leaves its lock files; the next run takes them over with
#            one warning per directory naming the dead holder's PID, and removes them at its end.
#   requeue  a holder of Slurm job 4242 (restart 0) still holds the lock: another run of the
#            same job and restart count is refused; its requeue (SLURM_RESTART_COUNT=1) takes
#            the lock over with a warning and trains.
# usage: run_lock.sh CASE WORKDIR BASE TESSERA DECK CKPT_TOOL
set -uo pipefail
case=$1 work=$2 base=$3 tessera=$4 deck=$5 tool=$6
fail() { echo "lock: FAIL ($case): $*"; for f in *.log; do [ -f "$f" ] && tail -n 20 "$f"; done; exit 1; }

rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
cp "$base/data.h5" data.h5 && cp -a "$base/run/checkpoints" ck || fail "setup"
export OMP_NUM_THREADS=1
unset SLURM_JOB_ID SLURM_RESTART_COUNT
run=("$tessera" "$deck" --data.path=data.h5 --hardware.peak_flops=1e9 --checkpoint.keep=10)
holder=""
trap '[ -n "$holder" ] && kill -KILL "$holder" 2>/dev/null' EXIT

# start LOG ARGS...: the holder, in the background ($holder), stopped once it logged a step
# into the output.dir named by OUT.
start() {
  local log=$1
  shift
  "${run[@]}" "$@" > "$log" 2>&1 < /dev/null &
  holder=$!
  for _ in $(seq 1 600); do
    [ -s "$OUT/metrics.jsonl" ] && { kill -STOP "$holder"; return 0; }
    kill -0 "$holder" 2>/dev/null || fail "the holder ended before it logged a step"
    sleep 0.1
  done
  fail "the holder logged no step in 60 s"
}
snapshot() { find . -type f ! -name '*.log' -exec sha256sum {} + | LC_ALL=C sort; find . ! -name '*.log' | LC_ALL=C sort; }
# refused LOG REGEX ARGS...: a run with ARGS exits 1 with exactly one error line, matching
# REGEX, and leaves every file as it was.
refused() {
  local log=$1 regex=$2
  shift 2
  local before after
  before=$(snapshot)
  timeout -k 5 60 "${run[@]}" "$@" > "$log" 2>&1 < /dev/null
  local status=$?
  after=$(snapshot)
  [ "$status" -eq 1 ] || fail "$log: exit status $status, expected 1"
  [ "$(grep -c error "$log")" -eq 1 ] || fail "$log: $(grep -c error "$log") lines with 'error'"
  grep -E "$regex" "$log" | grep -q error || fail "$log: the error does not match '$regex'"
  [ "$before" = "$after" ] || { diff <(echo "$before") <(echo "$after"); fail "$log: files changed"; }
  echo "lock: refused: $(grep error "$log")"
}
# finish_holder: continues the holder, which trains "forever", and stops it with SIGUSR1; it
# must write its checkpoint and exit 75.
finish_holder() {
  kill -CONT "$holder"
  kill -USR1 "$holder"
  wait "$holder"
  local status=$?
  holder=""
  [ "$status" -eq 75 ] || fail "the holder exited $status, expected 75 (stopped with a checkpoint)"
}
verified() {
  "$tool" verify "$1" > verify.log 2>&1 || fail "tessera-ckpt verify $1"
  /usr/bin/python3 -c "import json,sys; [json.loads(l) for l in open(sys.argv[1])]" "$2" ||
    fail "$2 holds a broken line"
}

case $case in
  fresh)
    OUT=out
    fresh=(--output.dir=out --train.steps=100000 --checkpoint.every=0)
    start holder.log "${fresh[@]}"
    pid=$holder
    refused second.log "output.dir 'out' is in use by another run \\(host [^,]+, pid $pid, started [0-9T:Z-]+; lock file 'out/tessera.lock'\\): wait for it to end, or choose another output.dir" \
      "${fresh[@]}"
    finish_holder
    verified "out/checkpoints/$(cat out/checkpoints/latest)" out/metrics.jsonl
    [ ! -e out/tessera.lock ] && [ ! -e out/checkpoints/tessera.lock ] || fail "lock files left"
    # Two fresh runs at the same moment: the one that gets the lock trains "forever" (until
    # SIGUSR1 stops it with a checkpoint, exit 75), the other is refused by the lock, whichever
    # starts first and however late the other comes.
    rm -rf out
    forever=(--output.dir=out2 --train.steps=100000 --checkpoint.every=0)
    "${run[@]}" "${forever[@]}" > a.log 2>&1 < /dev/null &
    a=$!
    "${run[@]}" "${forever[@]}" > b.log 2>&1 < /dev/null &
    b=$!
    for _ in $(seq 1 600); do
      kill -0 $a 2>/dev/null && kill -0 $b 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 $a 2>/dev/null; then holder=$a loser=$b log=b.log; else holder=$b loser=$a log=a.log; fi
    wait $loser
    status=$?
    [ "$status" -eq 1 ] || fail "$log: exit status $status, expected 1"
    [ "$(grep -c error $log)" -eq 1 ] && grep -q "error: output.dir 'out2' is in use by another run" $log ||
      fail "$log: not refused by the lock"
    for _ in $(seq 1 600); do [ -s out2/metrics.jsonl ] && break; sleep 0.1; done
    kill -USR1 $holder
    wait $holder
    status=$?
    holder=""
    [ "$status" -eq 75 ] || fail "the run holding the lock exited $status, expected 75"
    verified "out2/checkpoints/$(cat out2/checkpoints/latest)" out2/metrics.jsonl
    echo "lock: simultaneous: one refused"
    ;;
  resume)
    OUT=out1
    start holder.log --output.dir=out1 --checkpoint.dir=ck --checkpoint.resume=latest \
      --train.steps=100000 --checkpoint.every=0
    pid=$holder
    refused second.log "checkpoint.dir 'ck' is in use by another run \\(host [^,]+, pid $pid, .*lock file 'ck/tessera.lock'\\)" \
      --output.dir=out2 --checkpoint.dir=ck --checkpoint.resume=latest --train.steps=40
    [ ! -e out2 ] || fail "the refused run left its output.dir"
    finish_holder
    verified "ck/$(cat ck/latest)" out1/metrics.jsonl
    ;;
  stale)
    OUT=out
    # No checkpoint from the holder (checkpoint.every = 0): however far it gets before it is
    # stopped, the next run resumes from the base's step 6 and writes step 12.
    start holder.log --output.dir=out --checkpoint.dir=ck --checkpoint.resume=latest \
      --train.steps=100000 --checkpoint.every=0
    pid=$holder
    kill -KILL "$holder"
    wait "$holder" 2>/dev/null
    holder=""
    grep -q "pid=$pid " out/tessera.lock && grep -q "pid=$pid " ck/tessera.lock || fail "no lock file left"
    timeout -k 5 60 "${run[@]}" --output.dir=out --checkpoint.dir=ck --checkpoint.resume=latest \
      --train.steps=12 > next.log 2>&1 < /dev/null || fail "the next run exited $?"
    for key in "output.dir 'out'" "checkpoint.dir 'ck'"; do
      [ "$(grep -c "^warning: $key was locked by a run that is gone (host [^,]*, pid $pid, started" next.log)" -eq 1 ] ||
        fail "no warning for $key naming pid $pid"
    done
    grep -q error next.log && fail "an error line"
    [ ! -e out/tessera.lock ] && [ ! -e ck/tessera.lock ] || fail "lock files left"
    verified ck/ckpt-00000012.h5 out/metrics.jsonl
    echo "lock: stale taken over"
    ;;
  requeue)
    OUT=out
    resume=(--output.dir=out --checkpoint.dir=ck --checkpoint.resume=latest)
    # No checkpoint from the holder (checkpoint.every = 0): however far it gets before it is
    # stopped, the requeue resumes from the base's step 6 and writes step 9.
    SLURM_JOB_ID=4242 SLURM_RESTART_COUNT=0 start holder.log "${resume[@]}" --train.steps=100000 \
      --checkpoint.every=0
    pid=$holder
    SLURM_JOB_ID=4242 SLURM_RESTART_COUNT=0 refused same.log \
      "output.dir 'out' is in use by another run \\(host [^,]+, pid $pid, Slurm job 4242 \\(restart 0\\), started" \
      "${resume[@]}"
    SLURM_JOB_ID=4242 SLURM_RESTART_COUNT=1 timeout -k 5 60 "${run[@]}" "${resume[@]}" --train.steps=9 \
      > requeue.log 2>&1 < /dev/null || fail "the requeued run exited $?"
    [ "$(grep -c "^warning: .* is still locked by an earlier run of this Slurm job (host [^,]*, pid $pid, Slurm job 4242 (restart 0), .*); this run is its requeue (restart 1) and takes the lock over" requeue.log)" -eq 2 ] ||
      fail "no takeover warning for both directories"
    grep -q error requeue.log && fail "an error line"
    verified ck/ckpt-00000009.h5 out/metrics.jsonl
    kill -KILL "$holder"; wait "$holder" 2>/dev/null; holder=""
    echo "lock: requeue took over"
    ;;
  *) fail "unknown case" ;;
esac
echo "lock: pass ($case)"
cd / && rm -rf "$work"

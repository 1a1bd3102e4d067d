#!/usr/bin/env bash
# Runs a command that must fail cleanly: non-zero exit, the expected message printed exactly
# once (rank 0 only, even with several ranks), within the time limit (no hang).
# usage: expect_error.sh REGEX TIMEOUT_S COMMAND...
set -u
regex=$1 limit=$2
shift 2
out=$(timeout "$limit" "$@" 2>&1)
status=$?
count=$(printf '%s\n' "$out" | grep -cE -e "$regex")
printf '%s\n' "$out" | head -n 40
if [ "$status" -eq 124 ]; then echo "smoke: FAIL: hung (killed after ${limit}s)"; exit 1; fi
if [ "$status" -eq 0 ]; then echo "smoke: FAIL: exit status 0"; exit 1; fi
case $count in ''|*[!0-9]*) echo "smoke: FAIL: could not count the message (pattern '$regex')"; exit 1 ;; esac
if [ "$count" -ne 1 ]; then echo "smoke: FAIL: message printed $count times, expected once"; exit 1; fi
echo "smoke: pass (exit status $status): $(printf '%s\n' "$out" | grep -E -e "$regex")"

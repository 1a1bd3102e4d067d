#!/usr/bin/env bash
# Every CTest command runs under this wrapper (tests/CMakeLists.txt, add_test): it runs the
# command and prints its exit status as the last line. CTest ignores the exit status of a test
# with a PASS_REGULAR_EXPRESSION, so such tests also get the FAIL_REGULAR_EXPRESSION
# "tessera-test: exit status [1-9]": a command that prints its pass text and then crashes,
# hangs up or exits non-zero fails (doc/testing.md, "Exit status").
# usage: exit_status.sh COMMAND...
"$@"
status=$?
printf '\ntessera-test: exit status %d\n' "$status"
exit "$status"

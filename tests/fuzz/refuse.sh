#!/usr/bin/env bash
# Runs a command that must refuse its input cleanly, and checks that it did:
#  * it ends within TIMEOUT_S seconds (no hang) with an exit status from 1 to 123: an error,
#    neither a timeout (124) nor a crash (a signal gives 128 + its number: SIGFPE 136);
#  * its output (stdout and stderr together) has exactly one line containing "error", and
#    that line matches REGEX (grep -E): it names the problem;
#  * its working directory holds the same entries before and after: names, types, link
#    targets and the SHA-256 of every regular file (nothing written, inputs byte-identical).
# The command runs in WORKDIR, which is emptied and filled from the SETUP items first:
#   file:NAME=TEXT        a file holding TEXT (printf %b: \n, \t, \r are escapes)
#   dir:NAME              a directory
#   symlink:NAME=TARGET   a symbolic link to TARGET
#   hardlink:NAME=TARGET  a second name of the file TARGET
#   fifo:NAME             a named pipe
#   copy:NAME=SOURCE      a copy of the file or directory SOURCE (cp -a)
#   run:COMMAND           runs COMMAND (bash) in WORKDIR, to damage a copy (tamper.py)
#   mode:new-files        files may be added (a run that fails after starting writes its
#                         logs), but every entry present before stays byte-identical
# An argument @EMPTY@ of COMMAND is passed as an empty string (a CMake list cannot hold one).
# WORKDIR is removed when the test passes and kept for a look when it fails.
# usage: refuse.sh WORKDIR TIMEOUT_S REGEX [SETUP...] -- COMMAND...
set -u
[ $# -ge 5 ] || { echo "usage: refuse.sh WORKDIR TIMEOUT_S REGEX [SETUP...] -- COMMAND..."; exit 2; }
work=$1 limit=$2 regex=$3 new_files=0
shift 3
fail() { echo "fuzz: FAIL: $*"; exit 1; }

[ -n "$work" ] && [ "$work" != / ] || fail "bad WORKDIR '$work'"
rm -rf "$work" && mkdir -p "$work" || fail "cannot make $work"
cd "$work" || fail "cannot enter $work"
while [ $# -gt 0 ] && [ "$1" != -- ]; do
  item=$1
  shift
  spec=${item#*:} name=${item#*:} value=""
  case $spec in *=*) name=${spec%%=*} value=${spec#*=} ;; esac
  case $item in
    file:*) printf '%b' "$value" > "$name" ;;
    dir:*) mkdir -p "$name" ;;
    symlink:*) ln -s "$value" "$name" ;;
    hardlink:*) ln "$value" "$name" ;;
    fifo:*) mkfifo "$name" ;;
    copy:*) cp -a "$value" "$name" ;;
    run:*) bash -c "$spec" ;;
    mode:new-files) new_files=1 ;;
    *) fail "unknown setup item '$item'" ;;
  esac || fail "setup item '$item'"
done
[ "${1:-}" = -- ] || fail "no -- before the command"
shift
cmd=()
for arg in "$@"; do
  [ "$arg" = @EMPTY@ ] && arg=""
  cmd+=("$arg")
done

# Every entry below the working directory: path, type, link target; then every regular
# file's SHA-256 (find -type f: a FIFO is never opened).
snapshot() {
  find . -mindepth 1 -printf '%p %y %l\n' | LC_ALL=C sort
  find . -type f -exec sha256sum {} + | LC_ALL=C sort
}
before=$(snapshot)
out=$(timeout -k 5 "$limit" "${cmd[@]}" 2>&1 </dev/null)
status=$?
after=$(snapshot)

printf '%s\n' "$out" | head -n 40
errors=$(printf '%s\n' "$out" | grep -c 'error')
line=$(printf '%s\n' "$out" | grep 'error' | head -n 1)
[ "$status" -ne 0 ] || fail "exit status 0"
[ "$status" -ne 124 ] && [ "$status" -ne 137 ] || fail "hung (killed after ${limit}s)"
[ "$status" -lt 124 ] || fail "exit status $status: killed by signal $((status - 128))?"
[ "$errors" -eq 1 ] || fail "$errors lines containing 'error', expected exactly one"
printf '%s\n' "$line" | grep -qE -- "$regex" || fail "the error does not match '$regex'"
if [ "$new_files" -eq 1 ]; then
  lost=$(LC_ALL=C comm -23 <(printf '%s\n' "$before" | LC_ALL=C sort) \
    <(printf '%s\n' "$after" | LC_ALL=C sort))
  [ -z "$lost" ] || { printf '%s\n' "$lost"; fail "an entry present before was removed or altered"; }
elif [ "$before" != "$after" ]; then
  diff <(printf '%s\n' "$before") <(printf '%s\n' "$after")
  fail "the working directory changed (a file was written, removed or altered)"
fi
echo "fuzz: pass (exit status $status, $(find . -mindepth 1 | wc -l) entries unchanged): $line"
cd / && rm -rf "$work"

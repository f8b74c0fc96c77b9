#!/bin/sh
# Runs inferd under compute-sanitizer's memcheck for the black-box tests (scripts/gpu_run.sh): passes SIGTERM on
# to inferd itself so it drains and exits 0, and exits with memcheck's 3 when it found an error.
#   MEMCHECK_LOG=FILE INFERD_REAL_BIN=PATH memcheck_wrapper.sh --config ... --listen ...
compute-sanitizer --tool memcheck --error-exitcode 3 --log-file "$MEMCHECK_LOG" "$INFERD_REAL_BIN" "$@" &
child=$!
trap 'pkill -TERM -x inferd' TERM
wait $child
rc=$?
while kill -0 $child 2>/dev/null; do
  wait $child
  rc=$?
done
exit $rc

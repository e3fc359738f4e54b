# shellcheck shell=bash
# Sourced by the device-call scripts (acceptance_x2.sh, node_lib.sh): `step` runs one piece of a
# call under its own time limit, logs it, and records a row for the table a call prints last.
#   STEP_LOG_DIR   where NAME.log goes (default $OUT)
#   STEP_DEADLINE  epoch seconds by which every step must have ended (optional): a step gets
#                  min(its limit, what is left minus STEP_RESERVE) and is skipped below 10 s, so a
#                  call ends inside the device tool's 600 s however long its build took
#   STEP_ONLY      space-separated step names to run (optional; the others are recorded as skipped)
step_rows=()
STEP_RESERVE=${STEP_RESERVE:-20}  # seconds kept for the summary and the packing of $OUT

step() {  # step NAME SECONDS COMMAND...: runs it with a limit, logs to STEP_LOG_DIR/NAME.log, records rc
  local name=$1 limit=$2; shift 2
  local dir=${STEP_LOG_DIR:-$OUT}
  if [ -n "${STEP_ONLY:-}" ] && [[ " $STEP_ONLY " != *" $name "* ]]; then
    step_rows+=("$(printf '%-28s %-9s %5s' "$name" "not run" "(STEP_ONLY)")")
    return 125
  fi
  if [ -n "${STEP_DEADLINE:-}" ]; then
    local left=$((STEP_DEADLINE - STEP_RESERVE - $(date +%s)))
    if [ "$left" -lt 10 ]; then
      step_rows+=("$(printf '%-28s %-9s %5s' "$name" "skipped" "(no time left in this call)")")
      return 124
    fi
    [ "$left" -lt "$limit" ] && limit=$left
  fi
  local t0 rc pid
  t0=$(date +%s)
  "$@" >"$dir/$name.log" 2>&1 &
  pid=$!
  while kill -0 "$pid" 2>/dev/null && [ $(($(date +%s) - t0)) -lt "$limit" ]; do sleep 1; done
  if kill -0 "$pid" 2>/dev/null; then
    # Over its limit: SIGTERM to every process under the step (a timeout inside the step's script
    # runs in a process group of its own, which a group signal would miss), SIGKILL 15 s later to
    # those and to any still under it (the list is taken first: orphans move under init).
    local tree waited=0
    tree=$(step_tree "$pid")
    # shellcheck disable=SC2086
    kill -TERM $tree 2>/dev/null
    while kill -0 "$pid" 2>/dev/null && [ "$waited" -lt 15 ]; do sleep 1; waited=$((waited + 1)); done
    # shellcheck disable=SC2046,SC2086
    kill -KILL $tree $(step_tree "$pid") 2>/dev/null
    wait "$pid" 2>/dev/null
    rc=124
  else
    wait "$pid"
    rc=$?
  fi
  step_rows+=("$(printf '%-28s rc=%-6s %4ss%s' "$name" "$rc" "$(($(date +%s) - t0))" \
    "$([ "$rc" = 124 ] && echo " (hit its ${limit} s limit)")")")
  return $rc
}

step_tree() {  # step_tree PID: the ids of PID and of every process under it
  ps -eo pid=,ppid= | awk -v root="$1" '{ parent[$1] = $2 }
    END { for (p in parent) { q = p; while (q != root && (q in parent) && q > 1) q = parent[q]; if (q == root) print p } }'
}

step_table() {  # the rows, one per step, in the order they ran
  echo "== steps =="
  printf '%s\n' "${step_rows[@]}"
}

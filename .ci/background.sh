# Steps run beside another, for .ci/run (and tests/test_ci_helpers.py),
# which source this file. They need `logs` (a directory) and `fail MESSAGE`
# (which records a failure in the array `failed`).
#
# `start_background NAME COMMAND...` runs the command (a function and its
# arguments) in a subshell in the background, output to ${logs}/NAME.out.
# However that subshell exits (its commands done, or stopped by an unset
# variable under `set -u`, an `exit`, a signal it can trap), its exit trap
# writes the failures recorded so far to ${logs}/NAME.failed. `collect NAME`
# waits for it, prints its output and counts those failures; it fails the
# step too if the subshell's exit status (what `wait` returns) is not 0, or
# if it left no NAME.failed (killed outright: no trap runs then).
declare -A background=()

start_background() {
  local name="$1"; shift
  rm -f "${logs}/${name}.failed"
  (
    failed=()
    # shellcheck disable=SC2064
    trap "printf '%s\n' \"\${failed[@]}\" > '${logs}/${name}.failed'" EXIT
    "$@" > "${logs}/${name}.out" 2>&1
    exit 0  # The step's verdict is what it recorded, not its last status.
  ) &
  background[${name}]=$!
}

collect() {
  local name="$1" line status=0
  wait "${background[${name}]}" || status=$?
  [[ ! -f "${logs}/${name}.out" ]] || cat "${logs}/${name}.out"
  if [[ -f "${logs}/${name}.failed" ]]; then
    while IFS= read -r line; do
      [[ -z "${line}" ]] || fail "${line}"
    done < "${logs}/${name}.failed"
  fi
  if [[ ${status} -ne 0 ]]; then
    fail "${name}: stopped before its end (exit ${status}; its output is" \
      "above and in ${logs}/${name}.out)"
  elif [[ ! -f "${logs}/${name}.failed" ]]; then
    fail "${name}: recorded no result (${logs}/${name}.failed is missing)"
  fi
}

#!/usr/bin/env bash
# Run every molecule scenario, in lanes side by side: each argument is a lane,
# its scenarios comma-separated and run one after the other (molecule test -s
# a -s b). Scenarios whose lab hosts share names (ct129, ct200) never run at
# once: they share a lane, or the later waits (after:NAME). Each lane's output goes to
# .cache/molecule/<lane>.log and is printed whole when the lane ends, with
# the time each scenario took (also printed as each scenario ends; each of its steps'
# times go to the suite's table, .ci/molecule-steps.py). A scenario in no lane, or in two, is an error:
# none is left out unseen. A lane's item make:TARGET runs `make TARGET` there
# instead (make test runs the conformance tests last in the second lane). An
# item after:NAME waits until the item NAME has ended in its own lane (run,
# failed, or never run because its lane stopped).
#
#   .ci/molecule-lanes.sh deploy,lab,real provision,fleet
#   .ci/molecule-lanes.sh deploy,real provision,fleet,after:deploy,lab,make:conformance
set -uo pipefail
cd "$(dirname "$0")/.."
mapfile -t all < <(for f in molecule/*/molecule.yml; do basename "$(dirname "$f")"; done | sort)
mapfile -t given < <(printf '%s\n' "$@" | tr ',' '\n' | grep -v -e '^$' -e '^make:' -e '^after:' | sort)
if [[ "${all[*]}" != "${given[*]}" ]]; then
  echo "molecule lanes: the lanes name [${given[*]}], the scenarios are [${all[*]}]: each scenario in exactly one lane" >&2
  exit 2
fi
# each item's end, for after:NAME (written when it ends, and for every item when its lane stops)
ended=.cache/molecule/ended
rm -rf "$ended"
mkdir -p "$ended"
for waited in $(printf '%s\n' "$@" | tr ',' '\n' | sed -n 's/^after://p'); do
  if ! printf '%s\n' "$@" | tr ',' '\n' | grep -qx -- "$waited"; then
    echo "molecule lanes: after:$waited waits for an item no lane runs" >&2
    exit 2
  fi
done
exec 3>&1
pids=()
for lane in "$@"; do
  log=.cache/molecule/${lane//,/+}.log
  (
    trap 'for item in ${lane//,/ }; do : >"$ended/${item//[:\/]/_}"; done' EXIT
    for scenario in ${lane//,/ }; do
      start=$SECONDS
      if [[ $scenario == after:* ]]; then
        until [[ -e $ended/${scenario#after:} ]]; do sleep 2; done
        line="molecule lane: $scenario waited $((SECONDS - start)) s"
        echo "$line"
        echo "$line" >&3
        continue
      fi
      if [[ $scenario == make:* ]]; then
        make --no-print-directory "${scenario#make:}"
      else
        # each step's wall time (create, prepare, converge, ...) joins the suite's table too
        .ci/timed "molecule $scenario" molecule test -s "$scenario" 2>&1 | python3 .ci/molecule-steps.py
      fi
      rc=$?
      # to the lane's log and, as it happens, to the script's output (>&3 writes to it; tee /dev/fd/3
      # would reopen a file there with O_TRUNC and empty it)
      line="molecule lane: scenario $scenario ended with $rc after $((SECONDS - start)) s"
      echo "$line"
      echo "$line" >&3
      : >"$ended/${scenario//[:\/]/_}"
      [[ $rc -eq 0 ]] || exit "$rc"
    done
  ) >"$log" 2>&1 &
  pids+=("$!")
  echo "molecule lane [$lane] started: $log"
done
failed=0
for i in "${!pids[@]}"; do
  wait "${pids[$i]}"
  rc=$?
  lane=${*:$((i + 1)):1}
  log=.cache/molecule/${lane//,/+}.log
  echo "===== molecule lane [$lane]: exit $rc ====="
  cat "$log"
  grep '^molecule lane: ' "$log"
  [[ $rc -eq 0 ]] || failed=1
done
exit "$failed"

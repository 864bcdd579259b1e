#!/usr/bin/env bash
# Restarts a daemon of an e2e run (hack/lib/control-plane.sh's cp_daemon recorded how):
#
#   bash hack/e2e/restart.sh DAEMONS_DIR NAME [SECONDS_DOWN]
#
# The tests' faults: kube-apiserver or the real node's kubelet stopped (SIGTERM, SIGKILL
# after 10 s), left down SECONDS_DOWN (default 0), started again with the same command
# line and output file, and waited for until its readiness command succeeds (90 s at most).
# Prints how long it was down.
set -euo pipefail
dir=$1 name=$2 down=${3:-0}
[[ -f "$dir/$name.cmd" ]] || { echo "restart.sh: no daemon $name in $dir" >&2; exit 2; }
log="$(cat "$dir/$name.log")"
pid="$(cat "$dir/$name.pid")"
stopped=$(date +%s.%N)
if kill -TERM "$pid" 2>/dev/null; then
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
fi
sleep "$down"
echo "=== restarted by the tests $(date -u +%FT%TZ)" >>"$log"
bash -c "exec $(cat "$dir/$name.cmd")" </dev/null >>"$log" 2>&1 &
echo $! >"$dir/$name.pid"
for _ in $(seq 1 450); do
  if bash -c "$(cat "$dir/$name.ready")" >/dev/null 2>&1; then
    awk -v name="$name" -v a="$stopped" -v b="$(date +%s.%N)" 'BEGIN {printf "%s down for %.1f s\n", name, b - a}'
    exit 0
  fi
  kill -0 "$(cat "$dir/$name.pid")" 2>/dev/null || { echo "restart.sh: $name exited; see $log" >&2; exit 1; }
  sleep 0.2
done
echo "restart.sh: $name not ready 90 s after its restart; see $log" >&2
exit 1

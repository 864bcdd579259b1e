#!/usr/bin/env bash
# The resident memory of `gpu-admission serve` once it is ready (docs/benchmarks.md,
# "Memory per cached pod, from a cluster file and from the watch"):
#
#   hack/bench/rss.sh BINARY file CLUSTER_FILE    # offline: serve --cluster CLUSTER_FILE
#   hack/bench/rss.sh BINARY watch CLUSTER_FILE   # API mode: the file served by
#                                                 # hack/bench/fake_apiserver.py, watched
#
# Prints one line: the seconds until /readyz answered 200, VmRSS then and SETTLE
# seconds later (default 15), and the peak (VmHWM), in KiB. The server runs in a
# temporary directory (its development certificates) on ports of its own (PORT_BASE,
# default 47100, and the next three), and is stopped after.
set -euo pipefail

binary=$(realpath "$1")
mode=$2
cluster=$(realpath "$3")
settle=${SETTLE:-15}
port=${PORT_BASE:-47100}
here=$(dirname "$(realpath "$0")")
work=$(mktemp -d)
pid=
fake=
stop() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  [ -n "$fake" ] && kill "$fake" 2>/dev/null && wait "$fake" 2>/dev/null
  rm -rf "$work"
}
trap stop EXIT

cd "$work"
case "$mode" in
  file) source_args=(--cluster "$cluster") ;;
  watch)
    : >"$work/fake.log"
    python3 "$here/fake_apiserver.py" "$cluster" "$((port + 3))" >"$work/fake.log" 2>&1 &
    fake=$!
    until grep -q ready "$work/fake.log"; do
      kill -0 "$fake" 2>/dev/null || { cat "$work/fake.log" >&2; exit 1; }
      sleep 0.2
    done
    cat >"$work/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters: [{name: fake, cluster: {server: "http://127.0.0.1:$((port + 3))"}}]
users: [{name: fake, user: {}}]
contexts: [{name: fake, context: {cluster: fake, user: fake}}]
current-context: fake
EOF
    source_args=(--kubeconfig "$work/kubeconfig" --release-queue=false)
    ;;
  *) echo "mode is file or watch, not $mode" >&2; exit 2 ;;
esac

started=$(date +%s.%N)
"$binary" serve "${source_args[@]}" \
  --address "127.0.0.1:$port" --extender-address "127.0.0.1:$((port + 1))" \
  --admin-address "127.0.0.1:$((port + 2))" --log-level warn >"$work/log" 2>&1 &
pid=$!

kib() { awk -v key="$1:" '$1 == key { print $2 }' "/proc/$pid/status"; }

until curl -fs -o /dev/null "http://127.0.0.1:$((port + 2))/readyz"; do
  if ! kill -0 "$pid" 2>/dev/null; then
    echo "the server exited:" >&2
    cat "$work/log" >&2
    exit 1
  fi
  sleep 0.1
done
ready=$(date +%s.%N)
at_ready=$(kib VmRSS)
sleep "$settle"
printf 'ready_s=%.1f rss_ready_kib=%s rss_settled_kib=%s peak_kib=%s\n' \
  "$(echo "$ready - $started" | bc)" "$at_ready" "$(kib VmRSS)" "$(kib VmHWM)"
if [ -n "${SHOW_LOG:-}" ]; then cat "$work/log" >&2; fi

#!/usr/bin/env bash
# gpu-admission at cluster scale on a real control plane, in one command:
#
#   bash hack/scale.sh
#
# 1. builds (or reuses) the control-plane binaries (hack/e2e/build.sh; kube-controller-manager
#    is built but not started here),
#    then gpu-admission and the driver examples/scale.rs (cargo, release profile);
# 2. starts etcd, kube-apiserver (TaintNodesByCondition off: no node lifecycle controller
#    would lift its not-ready taint), two `gpu-admission serve` replicas (a: the extender
#    and the webhooks' backend, b: a second replica watching the same cluster) and ONE
#    kube-scheduler with two profiles: `gpu-scheduler` and the plain `default-scheduler`.
#    The extender list is global, so its `managedResources` (tencent.com/vcuda-core and
#    vcuda-memory, ignoredByScheduler) keep it to the pods that ask for those;
#    (the control plane is hack/lib/control-plane.sh, shared with hack/e2e.sh);
# 3. runs the driver (examples/scale.rs): SCALE_NODES fake GPU nodes; throughput of the two
#    profiles side by side, order plain gpu gpu plain, SCALE_PODS pods per phase from
#    SCALE_CLIENTS parallel creators, with kube-scheduler's own latency histograms per
#    profile and gpu-admission's extender request duration; then SCALE_CREATES sequential
#    pod creates with gpu-admission's webhooks (a namespace with a `Deny` GPUQuota, one
#    with a `Queue` GPUQuota) alternating with the same pod in a namespace they do not
#    select and in one with a core ResourceQuota; then the quota queue: SCALE_QUEUE pods
#    waiting behind a full `Queue` quota, and SCALE_RELEASES times a pod holding the quota
#    deleted and the next waiting pod's gate removal timed (examples/scale/queue.rs);
# 4. prints the machine, the versions, the commit and a summary block, and tears everything
#    down; logs stay in the temporary directory (printed at the end).
#
# No kubelets, no containers: nodes are API objects, bound pods stay Pending (and are
# deleted with grace period 0).
# Environment (defaults):
#   SCALE_NODES (1000), SCALE_PODS (500, per profile per phase), SCALE_CLIENTS (16 parallel
#   creators), SCALE_CREATES (1000 sequential creates per side), SCALE_QUEUE (1000 waiting
#   pods), SCALE_RELEASES (100 timed releases);
#   SCALE_BIND_VERB (`bind`: the extender binds GPU pods itself, as deploy/ configures it —
#   `bindVerb: bind` for kube-scheduler, `placement.bindVerb: true` for gpu-admission;
#   empty: filter only, kube-scheduler binds, as tkestack's configuration does);
#   SCALE_SCHEDULER_QPS (1000; kube-scheduler's clientConnection qps, burst twice that: its
#   own default, 50, caps binding near 60 pods/s for both profiles and hides the extender);
#   SCALE_POLICY (gpu-admission's placement policy; empty: its default);
#   CARGO_TARGET_DIR (default ~/.cache/gpu-admission/target), GPU_ADMISSION_CACHE;
#   SCALE_KEEP=1 keeps the etcd data, SCALE_READY_TIMEOUT (seconds, default 90).
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/gpu-admission/target}"
export CARGO_TERM_COLOR=never
ready_timeout="${SCALE_READY_TIMEOUT:-90}"
nodes="${SCALE_NODES:-1000}"
pods="${SCALE_PODS:-500}"
clients="${SCALE_CLIENTS:-16}"
creates="${SCALE_CREATES:-1000}"
queue="${SCALE_QUEUE:-1000}"
releases="${SCALE_RELEASES:-100}"
bind_verb="${SCALE_BIND_VERB-bind}"
scheduler_qps="${SCALE_SCHEDULER_QPS:-1000}"
policy="${SCALE_POLICY:-}"
for knob in nodes pods clients creates queue releases scheduler_qps; do
  [[ "${!knob}" =~ ^[0-9]+$ ]] || { echo "scale: SCALE_${knob^^}=${!knob} is not a number" >&2; exit 2; }
done

# shellcheck source=hack/lib/control-plane.sh
source "$repo/hack/lib/control-plane.sh"

# ---------------------------------------------------------------- temp dir + teardown
cp_init scale
load_start="$(cut -d' ' -f1-3 /proc/loadavg)"
commit="$(git -C "$repo" rev-parse --short HEAD 2>/dev/null || echo unknown)"
git -C "$repo" diff --quiet HEAD 2>/dev/null || commit="$commit (with uncommitted changes)"

teardown() {
  local rc=$?
  set +e
  cp_stop_all
  if [[ $rc != 0 ]]; then
    tail_logs
    echo "scale: FAILED after $((SECONDS - started))s" >&2
  fi
  if [[ "${SCALE_KEEP:-0}" != 1 ]]; then
    rm -rf "$work/etcd-data"
  fi
  echo "scale: logs in $logs" >&2
  exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- 1. binaries
cp_k8s_binaries

say "building gpu-admission and examples/scale.rs (cargo, release profile, target dir $CARGO_TARGET_DIR)"
cp_cargo_build=(nice -n 10 cargo build --release --locked --bin gpu-admission --example print_crd --example scale)
"${cp_cargo_build[@]}" >"$logs/cargo-build.log" 2>&1 ||
  { tail -n 60 "$logs/cargo-build.log" >&2; die "cargo build failed (log: $logs/cargo-build.log)"; }
mkdir -p "$work/bin"
gpu_admission="$work/bin/gpu-admission"
print_crd="$work/bin/print_crd"
driver="$work/bin/scale"
cp_snapshot release gpu-admission src/main.rs "$gpu_admission" &&
  cp_snapshot release examples/print_crd examples/print_crd.rs "$print_crd" &&
  cp_snapshot release examples/scale examples/scale.rs "$driver" ||
  die "could not take a copy of this checkout's release build from $CARGO_TARGET_DIR (log: $logs/cargo-build.log)"
built_at=$((SECONDS - started))

# ---------------------------------------------------------------- 2. control plane
cp_certs
cp_ports
cp_start_etcd
cp_start_apiserver --disable-admission-plugins=ServiceAccount,TaintNodesByCondition
cp_kubeconfig
cp_install_crd "$print_crd"
cp_gpu_admission_certs "$gpu_admission"
{
  echo "placement:"
  [[ -n "$policy" ]] && echo "  policy: $policy"
  [[ -n "$bind_verb" ]] && echo "  bindVerb: true"
  echo "  gpuManagerCompat: true" # a no-op default, so the block is never empty
  # The identity gpu-admission runs as here writes placements and lets pods out of the
  # quota queue, as the GPU scheduler's ServiceAccount does in deploy/.
  echo "placementWriters: [$cp_name-admin]"
  echo "queue: {releasers: [$cp_name-admin]}"
} >"$work/gpu-admission.yaml"
cp_write_ctl "$gpu_admission" "$work/gpu-admission.yaml" info
bash "$ctl" start a || die "gpu-admission (replica a) did not start (see above)"
bash "$ctl" start b || die "gpu-admission (replica b) did not start (see above)"
say "gpu-admission is ready: replica a webhooks https://127.0.0.1:$webhook_port, extender https://127.0.0.1:$extender_port, admin http://127.0.0.1:$admin_port; replica b admin http://127.0.0.1:$admin_port_b"

# One kube-scheduler, two profiles. `extenders` apply to every profile; managedResources
# makes the extender "interested" only in pods that request gpu-manager's resources, so
# the plain profile's pods (nvidia.com/gpu) never reach it.
bind_line=""
[[ -n "$bind_verb" ]] && bind_line="  bindVerb: $bind_verb"
cat >"$work/kube-scheduler.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: $kubeconfig
  qps: $scheduler_qps
  burst: $((scheduler_qps * 2))
leaderElection:
  leaderElect: false
profiles:
- schedulerName: gpu-scheduler
- schedulerName: default-scheduler
extenders:
- urlPrefix: https://127.0.0.1:$extender_port/scheduler
  filterVerb: predicates
$bind_line
  enableHTTPS: true
  tlsConfig:
    caFile: $work/extender-certs/ca.crt
  nodeCacheCapable: true
  httpTimeout: 5s
  managedResources:
  - {name: tencent.com/vcuda-core, ignoredByScheduler: true}
  - {name: tencent.com/vcuda-memory, ignoredByScheduler: true}
EOF
cp_start_scheduler "$work/kube-scheduler.yaml" --v=1

# ---------------------------------------------------------------- 3. the driver
say "running examples/scale.rs: $nodes nodes, $pods pods per phase, $clients clients, $creates creates, $queue waiting, $releases releases"
driver_started=$SECONDS
load_driver="$(cut -d' ' -f1-3 /proc/loadavg)"
set +e
"$driver" --kubeconfig "$kubeconfig" \
  --nodes "$nodes" --pods "$pods" --clients "$clients" --creates "$creates" \
  --queue "$queue" --releases "$releases" \
  --scheduler-metrics "https://127.0.0.1:$sched_port/metrics" \
  --client-cert "$pki/admin.crt" --client-key "$pki/admin.key" \
  --admin-url "http://127.0.0.1:$admin_port" \
  --webhook-url "https://127.0.0.1:$webhook_port" --ca-file "$work/extender-certs/ca.crt" \
  --kubectl "$k8s_bin/kubectl" --summary-file "$work/summary.txt" 2>&1 | tee "$logs/scale.log"
driver_rc=${PIPESTATUS[0]}
set -e
[[ $driver_rc == 0 ]] || die "the driver (examples/scale.rs) failed (log: $logs/scale.log)"
driver_took=$((SECONDS - driver_started))

# ---------------------------------------------------------------- 4. summary
cpu="$(awk -F': ' '/^model name/ {print $2; exit}' /proc/cpuinfo)"
cat <<EOF

== hack/scale.sh summary
commit:      $commit
machine:     $(nproc) CPUs (${cpu:-unknown}), $(awk '/MemTotal/ {printf "%.0f GB", $2 / 1048576}' /proc/meminfo); load average at start $load_start, when measuring began $load_driver, at end $(cut -d' ' -f1-3 /proc/loadavg)
Kubernetes:  kube-apiserver/kube-scheduler ${k8s_version}, etcd v${etcd_version} (--unsafe-no-fsync)
gpu-admission: release build, two replicas, placement policy ${policy:-default}; extender verbs: filter${bind_verb:+ + $bind_verb}
knobs:       SCALE_NODES=$nodes SCALE_PODS=$pods SCALE_CLIENTS=$clients SCALE_CREATES=$creates SCALE_QUEUE=$queue SCALE_RELEASES=$releases SCALE_SCHEDULER_QPS=$scheduler_qps SCALE_BIND_VERB=${bind_verb:-}
time:        ${driver_took}s measuring, $((SECONDS - started))s in all (${built_at}s of it building)
$(cat "$work/summary.txt")
logs:        $logs
EOF

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
#    last, the defragmentation planner's API load (examples/scale/defrag.rs): the earlier
#    phases' pods and GPUQuotas deleted, every node given one bound 1-GPU pod (7 of 8 GPUs
#    free on each, so an 8-GPU pod fits on none while the cluster has plenty free:
#    `Fragmented`), both replicas restarted ($work/defrag-restart.sh, written below) with replica a, the Lease
#    holder, running `defrag: {mode: DryRun, pendingSeconds: 5}` as a user of its own
#    (`scale-sidecar`, a client certificate; the other phases ran it as the admin, so the
#    phase changes none of their figures), then its requests counted in kube-apiserver's
#    audit log (level Metadata for that user only) over two windows of
#    SCALE_DEFRAG_SECONDS each: A with no GPU pod pending, B with one 8-GPU pod pending
#    that /explain says is `Fragmented`;
# 4. prints the machine, the versions, the commit and a summary block, and tears everything
#    down; logs stay in the temporary directory (printed at the end).
#
# No kubelets, no containers: nodes are API objects, bound pods stay Pending (and are
# deleted with grace period 0).
# Environment (defaults):
#   SCALE_NODES (1000), SCALE_PODS (500, per profile per phase), SCALE_CLIENTS (16 parallel
#   creators), SCALE_CREATES (1000 sequential creates per side), SCALE_QUEUE (1000 waiting
#   pods), SCALE_RELEASES (100 timed releases), SCALE_DEFRAG_SECONDS (120: each window of
#   the planner's API load; 0 skips that phase, and the audit log with it);
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
defrag_seconds="${SCALE_DEFRAG_SECONDS:-120}"
for knob in nodes pods clients creates queue releases scheduler_qps defrag_seconds; do
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
# The planner's API load is counted at the API server: an audit log of replica a's own user
# (level Metadata, each request once: RequestReceived omitted, a watch also logs its
# ResponseStarted), nothing for anyone else. Only replica a during the last phase runs as
# that user.
sidecar_user="$cp_name-sidecar"
audit_log="$work/audit-sidecar.jsonl"
audit_flags=()
if ((defrag_seconds > 0)); then
  cat >"$work/audit-policy.yaml" <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  users: [$sidecar_user]
- level: None
EOF
  audit_flags=(--audit-policy-file="$work/audit-policy.yaml" --audit-log-path="$audit_log"
    --audit-log-format=json --audit-log-maxsize=1024)
fi
cp_start_apiserver --disable-admission-plugins=ServiceAccount,TaintNodesByCondition "${audit_flags[@]}"
cp_kubeconfig
cp_client_identity "$sidecar_user" system:masters
cp_install_crd "$print_crd"
cp_gpu_admission_certs "$gpu_admission"
{
  echo "placement:"
  [[ -n "$policy" ]] && echo "  policy: $policy"
  [[ -n "$bind_verb" ]] && echo "  bindVerb: true"
  echo "  gpuManagerCompat: true" # a no-op default, so the block is never empty
  # The identities gpu-admission runs as here (the admin; replica a as $sidecar_user in the
  # planner's phase) write placements and let pods out of the quota queue, as the GPU
  # scheduler's ServiceAccount does in deploy/.
  echo "placementWriters: [$cp_name-admin, $sidecar_user]"
  echo "queue: {releasers: [$cp_name-admin, $sidecar_user]}"
} >"$work/gpu-admission.yaml"
cp_write_ctl "$gpu_admission" "$work/gpu-admission.yaml" info
{
  cat "$work/gpu-admission.yaml"
  echo "defrag: {mode: DryRun, pendingSeconds: 5}"
} >"$work/gpu-admission-defrag.yaml"

# The planner's phase (examples/scale/defrag.rs) runs this once its nodes are filled: both
# replicas stopped; gpu-admission's namespace created (the controller Lease lives there;
# without it no replica ever leads, as in the other phases); replica a started with the
# defrag config as $sidecar_user and left to take the Lease; then replica b as before.
{
  echo '#!/usr/bin/env bash'
  echo "# The restart of hack/scale.sh's planner phase (written by hack/scale.sh)."
  printf 'ctl=%q kubectl=%q kubeconfig=%q\n' "$ctl" "$k8s_bin/kubectl" "$kubeconfig"
  printf 'config=%q sidecar_kubeconfig=%q pidfile=%q\n' \
    "$work/gpu-admission-defrag.yaml" "$work/$sidecar_user.kubeconfig" "$replica_a_pidfile"
  cat <<'EOF'
set -euo pipefail
k() { "$kubectl" --kubeconfig "$kubeconfig" "$@"; }
bash "$ctl" stop b
bash "$ctl" stop a
k get namespace gpu-admission >/dev/null 2>&1 || k create namespace gpu-admission >/dev/null
GPU_ADMISSION_CONFIG="$config" REPLICA_KUBECONFIG="$sidecar_kubeconfig" bash "$ctl" start a
pid="$(cat "$pidfile")"
holder=""
for _ in $(seq 1 60); do
  holder="$(k get lease -n gpu-admission gpu-admission-controller -o 'jsonpath={.spec.holderIdentity}' 2>/dev/null || true)"
  [[ "$holder" == *"_${pid}_"* ]] && break
  sleep 0.5
done
if [[ "$holder" != *"_${pid}_"* ]]; then
  echo "replica a (pid $pid) did not take the controller Lease within 30 s; holder: ${holder:-none}" >&2
  exit 1
fi
bash "$ctl" start b
echo "replica a (pid $pid) holds the controller Lease ($holder)"
EOF
} >"$work/defrag-restart.sh"
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
say "running examples/scale.rs: $nodes nodes, $pods pods per phase, $clients clients, $creates creates, $queue waiting, $releases releases, planner windows of ${defrag_seconds}s"
driver_started=$SECONDS
load_driver="$(cut -d' ' -f1-3 /proc/loadavg)"
set +e
"$driver" --kubeconfig "$kubeconfig" \
  --nodes "$nodes" --pods "$pods" --clients "$clients" --creates "$creates" \
  --queue "$queue" --releases "$releases" \
  --defrag-seconds "$defrag_seconds" --defrag-restart "$work/defrag-restart.sh" \
  --audit-log "$audit_log" --sidecar-user "$sidecar_user" \
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
knobs:       SCALE_NODES=$nodes SCALE_PODS=$pods SCALE_CLIENTS=$clients SCALE_CREATES=$creates SCALE_QUEUE=$queue SCALE_RELEASES=$releases SCALE_DEFRAG_SECONDS=$defrag_seconds SCALE_SCHEDULER_QPS=$scheduler_qps SCALE_BIND_VERB=${bind_verb:-}
time:        ${driver_took}s measuring, $((SECONDS - started))s in all (${built_at}s of it building)
$(cat "$work/summary.txt")
logs:        $logs
EOF

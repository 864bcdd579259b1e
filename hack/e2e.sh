#!/usr/bin/env bash
# End-to-end tests on a real Kubernetes control plane, in one command:
#
#   bash hack/e2e.sh
#
# 1. builds (or reuses) kube-apiserver, kube-scheduler, kube-controller-manager, kubectl and
#    etcd (hack/e2e/build.sh) and Volcano's vc-scheduler (hack/e2e/build-volcano.sh), then gpu-admission
#    (cargo, release profile, as it ships) and the e2e test binary (debug profile);
# 2. creates a temporary directory with fresh certificates, a service-account key pair and
#    an admin kubeconfig (client certificate in group system:masters), plus a second CA and
#    the client certificate kube-apiserver presents to the webhooks (mutual TLS);
# 3. starts etcd and kube-apiserver on 127.0.0.1 (free ports; an AdmissionConfiguration
#    gives the webhook plugins that client certificate; every request of gpu-admission's
#    ServiceAccounts is audited, for the RBAC check), waits for /readyz; the tests restart
#    it (and the kubelet) through hack/e2e/restart.sh;
# 4. installs the GPUQuota CRD (generated from the Rust type) and deploy/'s namespace and
#    RBAC as shipped, starts two replicas of `gpu-admission serve` against the cluster as
#    the GPU scheduler's ServiceAccount (a token) — each with a webhook door (`--address`,
#    `--client-ca`: only the API server's certificate gets in) and an extender door
#    (`--extender-address`) — and waits for their /readyz;
# 5. starts kube-scheduler (as the same ServiceAccount) with a `gpu-scheduler` profile that
#    calls replica a's extender door as its extender over TLS, and kube-controller-manager (Jobs, ReplicaSets, the
#    garbage collector...; node lifecycle and pod GC off: no kubelets);
# 5a. builds (or reuses) Prometheus and promtool (hack/e2e/build-prometheus.sh), for the
#    observability scenario (tests/e2e/observability.rs), which runs its own Prometheus;
# 5b. installs Volcano's scheduling CRDs (PodGroup, Queue, ... from the Volcano module
#    source) and starts Volcano's vc-scheduler (built from the Go module proxy by
#    hack/e2e/build-volcano.sh), scheduler name `volcano`, whose `extender` plugin calls
#    replica a's extender door (`/scheduler/vpredicates`) over TLS;
# 6. runs `cargo test --test e2e -- --test-threads=1` (tests/e2e/) against it, but the
#    real node's scenarios; then registers a real node (hack/lib/node.sh: containerd, runc,
#    CNI, kubelet, kube-proxy; needs root), imports the images hack/image.sh and
#    hack/scheduler-image.sh build, and runs the `node::` scenarios (the installs of deploy/
#    and the chart, their faults, the RBAC check);
# 7. tears everything down; logs stay in the temporary directory (printed at the end,
#    with their last lines when something failed). Last line: `N passed, M failed`.
#
# No kubelets, no containers: nodes are API objects, bound pods stay Pending.
# Environment: CARGO_TARGET_DIR (default ~/.cache/gpu-admission/target), GPU_ADMISSION_CACHE
# (default ~/.cache/gpu-admission, where the Kubernetes binaries are cached),
# E2E_FILTER="name ..." runs only the tests whose names contain one of the words,
# E2E_KEEP=1 keeps the whole temporary directory (etcd data included), E2E_READY_TIMEOUT
# (seconds, default 90) bounds every wait for a component to come up.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/gpu-admission/target}"
export CARGO_TERM_COLOR=never
ready_timeout="${E2E_READY_TIMEOUT:-90}"

# shellcheck source=hack/lib/control-plane.sh
source "$repo/hack/lib/control-plane.sh"
# shellcheck source=hack/lib/node.sh
source "$repo/hack/lib/node.sh"

# ---------------------------------------------------------------- temp dir + teardown
cp_init e2e
summary="0 passed, 0 failed (the e2e tests did not run: the setup failed, see above)"

teardown() {
  local rc=$?
  set +e
  if [[ -n "${node_dir:-}" && $rc != 0 ]]; then
    # What ran on the real node (an install's pods) goes with the node: keep its logs.
    local previous
    for previous in false true; do
      "$k8s_bin/kubectl" --kubeconfig "$kubeconfig" logs -n gpu-admission --all-containers --prefix \
        --previous="$previous" -l app.kubernetes.io/name=gpu-admission --tail=-1 \
        >"$logs/node-pods-previous-$previous.log" 2>&1
    done
  fi
  node_stop
  cp_stop_all
  if [[ $rc != 0 ]]; then
    tail_logs
  fi
  if [[ "${E2E_KEEP:-0}" != 1 ]]; then
    # The data and the copied binaries (half a GB a run); the logs stay.
    rm -rf "$work/etcd-data" "$work/bin"
  fi
  echo "e2e: Kubernetes: kube-apiserver ${k8s_version}; logs in $logs" >&2
  echo "$summary"
  exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- 1. binaries
cp_k8s_binaries
cp_volcano_binaries
cp_prometheus_binaries

# ---------------------------------------------------------------- 1b. gpu-admission and the tests
# Built before any component starts, so a compile error fails fast and the test phase
# below measures the tests, not the compiler.
# gpu-admission as it ships (the release profile: .ci/run has built it for the image
# already), so the `measure` scenario times what users run; the tests in the debug profile.
say "building gpu-admission (release profile) and tests/e2e/ (debug), target dir $CARGO_TARGET_DIR"
{
  nice -n 19 cargo build --locked --release --bin gpu-admission --example print_crd &&
    nice -n 19 cargo test --locked --test e2e --no-run
} >"$logs/cargo-build.log" 2>&1 ||
  { tail -n 60 "$logs/cargo-build.log" >&2; die "cargo build of gpu-admission or of tests/e2e/ failed (log: $logs/cargo-build.log)"; }

# Runs copies of the build (see cp_snapshot): the target directory may be shared.
cp_cargo_build=(nice -n 19 cargo build --locked --release --bin gpu-admission --example print_crd)
mkdir -p "$work/bin"
gpu_admission="$work/bin/gpu-admission"
print_crd="$work/bin/print_crd"
cp_snapshot release gpu-admission src/main.rs "$gpu_admission" &&
  cp_snapshot release examples/print_crd examples/print_crd.rs "$print_crd" ||
  die "could not take a copy of this checkout's gpu-admission build from $CARGO_TARGET_DIR (log: $logs/cargo-build.log)"

# ---------------------------------------------------------------- 2. certificates
cp_certs

# ---------------------------------------------------------------- 3. etcd + apiserver
cp_ports
cp_start_etcd
# The real node's kubelet is called at its InternalIP (kubectl logs, exec); pods on it reach
# the API server at the address it advertises, the node's (the `kubernetes` Service).
node_address
# Every request of gpu-admission's ServiceAccounts (namespace gpu-admission) is audited, for
# the whole run: tests/e2e/node/rbac.rs holds deploy/'s RBAC to what they did.
cat >"$work/audit-policy.yaml" <<EOF
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
- level: Metadata
  userGroups: ["system:serviceaccounts:gpu-admission"]
- level: None
EOF
apiserver_flags=(--kubelet-preferred-address-types=InternalIP --bind-address=0.0.0.0 --advertise-address="$node_ip"
  --audit-policy-file="$work/audit-policy.yaml" --audit-log-path="$logs/audit.log")
cp_start_apiserver --disable-admission-plugins=ServiceAccount "${apiserver_flags[@]}"

# ---------------------------------------------------------------- 4. kubeconfig
cp_kubeconfig

# ---------------------------------------------------------------- 5. gpu-admission
cp_install_crd "$print_crd"
cp_gpu_admission_certs "$gpu_admission"
# gpu-admission and kube-scheduler run as the GPU scheduler's ServiceAccount, with the
# roles deploy/10-rbac.yaml ships (its extender sidecar's role covers everything both
# replicas do here: webhooks, extender, quota queue releaser), so a verb missing there
# fails these tests. placementWriters, queue.releasers: that identity, as in deploy/, and
# the admin certificate's user, which the tests use to stand in for gpu-manager.
cp_shipped_identity gpu-scheduler
sa_kubeconfig="$work/gpu-scheduler.kubeconfig"
cat >"$work/gpu-admission.yaml" <<EOF
placement:
  policy: original
  bindVerb: true
placementWriters: [system:serviceaccount:gpu-admission:gpu-scheduler, $cp_name-admin]
queue:
  releasers: [system:serviceaccount:gpu-admission:gpu-scheduler, $cp_name-admin]
# Short, so the reclaim bound's scenario waits seconds, not minutes.
reclaim:
  timeoutSeconds: 5
  maxGraceSeconds: 3
# The defrag scenario's dry run: plans told as Events, a pod pending 2 s on.
defrag:
  mode: DryRun
  pendingSeconds: 2
EOF

# The tests stop and restart gpu-admission through $ctl (extender and webhook outage).
# Replica `a` is the scheduler's extender and the webhooks' usual backend; replica `b` is
# a second webhook server on other ports against the same cluster, for the two-replica
# quota scenario (their doors: see cp_write_ctl). Both re-read their certificate files
# every second, for the certificate rotation scenario.
cp_write_ctl "$gpu_admission" "$work/gpu-admission.yaml" info,gpu_admission=debug "$sa_kubeconfig"
bash "$ctl" start a || die "gpu-admission (replica a) did not start (see above)"
bash "$ctl" start b || die "gpu-admission (replica b) did not start (see above)"
say "gpu-admission is ready: replica a webhooks https://127.0.0.1:$webhook_port (mutual TLS), extender https://127.0.0.1:$extender_port, admin http://127.0.0.1:$admin_port; replica b webhooks https://127.0.0.1:$webhook_port_b, extender https://127.0.0.1:$extender_port_b, admin http://127.0.0.1:$admin_port_b"

# The webhook servers' own identity in deploy/ (ServiceAccount gpu-admission, which may not
# write pods): a webhook-only server as shipped (`--release-queue=false`) must become ready,
# i.e. its role lets it list and watch everything it reads (a missing verb keeps /readyz
# failing and names the resource in its log).
cp_shipped_identity gpu-admission
free_port webhook_only_port
free_port webhook_only_admin
NO_COLOR=1 "$gpu_admission" serve --kubeconfig "$work/gpu-admission.kubeconfig" --release-queue=false \
  --address "127.0.0.1:$webhook_only_port" --admin-address "127.0.0.1:$webhook_only_admin" \
  --tls-cert "$work/extender-certs/tls.crt" --tls-key "$work/extender-certs/tls.key" \
  --config "$work/gpu-admission.yaml" </dev/null >"$logs/gpu-admission-webhook-only.log" 2>&1 &
webhook_only_pid=$!
pids+=("$webhook_only_pid")
wait_ready "gpu-admission as ServiceAccount gpu-admission (webhook-only, as deploy/ runs it)" \
  "$webhook_only_pid" "$logs/gpu-admission-webhook-only.log" \
  curl -fsS "http://127.0.0.1:$webhook_only_admin/readyz"
kill -TERM "$webhook_only_pid"

# ---------------------------------------------------------------- 6. kube-scheduler
cat >"$work/kube-scheduler.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: $sa_kubeconfig
leaderElection:
  leaderElect: false
profiles:
- schedulerName: gpu-scheduler
extenders:
- urlPrefix: https://127.0.0.1:$extender_port/scheduler
  filterVerb: predicates
  bindVerb: bind
  enableHTTPS: true
  tlsConfig:
    caFile: $work/extender-certs/ca.crt
  nodeCacheCapable: true
  httpTimeout: 5s
  managedResources:
  - {name: tencent.com/vcuda-core, ignoredByScheduler: true}
  - {name: tencent.com/vcuda-memory, ignoredByScheduler: true}
  - {name: nvidia.com/gpu, ignoredByScheduler: true}
EOF
cp_start_scheduler "$work/kube-scheduler.yaml" --v=2
cp_start_controller_manager --v=1

# ---------------------------------------------------------------- 6b. Volcano's vc-scheduler
# Pods with `schedulerName: volcano` and a PodGroup (the tests create one per pod; no
# vc-controller-manager runs). vc-scheduler creates the `root` and `default` queues
# itself. No `proportion`/`capacity` plugin: they skip queues whose status is not Open,
# a status only vc-controller-manager writes.
cat >"$work/volcano-scheduler.conf" <<EOF
actions: "enqueue, allocate, backfill"
tiers:
- plugins:
  - name: priority
  - name: gang
  - name: conformance
- plugins:
  - name: drf
  - name: predicates
  - name: nodeorder
  - name: binpack
  - name: extender
    arguments:
      extender.urlPrefix: https://127.0.0.1:$extender_port/scheduler
      extender.predicateVerb: vpredicates
      extender.httpTimeout: 1s
      extender.ignorable: false
      extender.managedResources:
      - tencent.com/vcuda-core
      - tencent.com/vcuda-memory
      - nvidia.com/gpu
EOF
cp_install_volcano_crds
cp_start_volcano "$work/volcano-scheduler.conf" "$work/extender-certs/ca.crt" --scheduler-name=volcano --v=3

# ---------------------------------------------------------------- 7. the tests
# The Helm chart's default rendering, for the server-side dry-run scenario (helm is built
# once and cached by hack/helm.sh; .ci/run's chart check has built it already).
chart_render="$work/chart-rendered.yaml"
"$(bash "$repo/hack/helm.sh")" template gpu-admission "$repo/charts/gpu-admission" \
  --namespace gpu-admission >"$chart_render" 2>"$logs/helm.log" || die "helm template failed: $(tail -5 "$logs/helm.log")"
# The chart's monitoring objects (ServiceMonitor, PrometheusRule, dashboard), for the
# observability scenario's Prometheus.
chart_monitoring="$work/chart-monitoring.yaml"
"$(bash "$repo/hack/helm.sh")" template gpu-admission "$repo/charts/gpu-admission" --namespace gpu-admission \
  --set metrics.serviceMonitor.enabled=true --set metrics.prometheusRule.enabled=true \
  --set grafana.dashboard.enabled=true --show-only templates/servicemonitor.yaml \
  --show-only templates/prometheusrule.yaml --show-only templates/grafana-dashboard.yaml \
  >"$chart_monitoring" 2>>"$logs/helm.log" || die "helm template (monitoring) failed: $(tail -5 "$logs/helm.log")"
test_env=(
  GPU_ADMISSION_E2E_KUBECONFIG="$kubeconfig" GPU_ADMISSION_E2E_CTL="$ctl"
  GPU_ADMISSION_E2E_CHART_RENDER="$chart_render"
  GPU_ADMISSION_E2E_CHART_MONITORING="$chart_monitoring"
  GPU_ADMISSION_E2E_PROMETHEUS="$prometheus_dir/bin/prometheus"
  GPU_ADMISSION_E2E_PROMTOOL="$prometheus_dir/bin/promtool"
  GPU_ADMISSION_E2E_SCHEDULER=gpu-scheduler
  GPU_ADMISSION_E2E_VOLCANO_SCHEDULER=volcano
  GPU_ADMISSION_E2E_SERVER_URL="https://127.0.0.1:$webhook_port"
  GPU_ADMISSION_E2E_CA_FILE="$work/extender-certs/ca.crt"
  GPU_ADMISSION_E2E_SERVER_URL_B="https://127.0.0.1:$webhook_port_b"
  GPU_ADMISSION_E2E_SERVER_URL_C="https://127.0.0.1:$webhook_port_c"
  GPU_ADMISSION_E2E_EXTENDER_URL="https://127.0.0.1:$extender_port"
  GPU_ADMISSION_E2E_CLIENT_CERT="$pki/apiserver-webhook-client.crt"
  GPU_ADMISSION_E2E_CLIENT_KEY="$pki/apiserver-webhook-client.key"
  GPU_ADMISSION_E2E_CLIENT_CA="$pki/webhook-client-ca.crt"
  GPU_ADMISSION_E2E_BIN="$gpu_admission"
  GPU_ADMISSION_E2E_CONFIG="$work/gpu-admission.yaml"
  GPU_ADMISSION_E2E_KUBECTL="$k8s_bin/kubectl"
  GPU_ADMISSION_E2E_ADMIN_URL="http://127.0.0.1:$admin_port"
  GPU_ADMISSION_E2E_ADMIN_URL_B="http://127.0.0.1:$admin_port_b"
  GPU_ADMISSION_E2E_CERT_DIR="$work/extender-certs"
  GPU_ADMISSION_E2E_DAEMONS="$work/daemons"
  GPU_ADMISSION_E2E_AUDIT_LOG="$logs/audit.log"
  GPU_ADMISSION_E2E_APISERVER_LOG="$logs/kube-apiserver.log"
  GPU_ADMISSION_E2E_PROXY_PORT="$proxy_port" GPU_ADMISSION_E2E_API_PORT="$api_port"
  GPU_ADMISSION_E2E_EXTENDER_URL_C="https://127.0.0.1:$extender_port_c"
  GPU_ADMISSION_E2E_ADMIN_URL_C="http://127.0.0.1:$admin_port_c"
)
# run_tests LOG ARGS...: cargo test --test e2e with the environment above; adds to the
# counts, and fails the run on a failure or on a test that skipped itself.
passed=0 failed=0 test_rc=0 ran=0
run_tests() {
  local log=$1
  shift
  set +e
  env "${test_env[@]}" nice -n 19 cargo test --locked --test e2e -- "$@" --ignored \
    --test-threads=1 --nocapture 2>&1 | tee "$log"
  local rc=${PIPESTATUS[0]}
  set -e
  local result
  result="$(grep -E '^test result: ' "$log" | tail -n1 || true)"
  [[ -n "$result" ]] || { test_rc=1; return 0; }
  ran=$((ran + 1))
  passed=$((passed + $(sed -nE 's/.* ([0-9]+) passed.*/\1/p' <<<"$result")))
  failed=$((failed + $(sed -nE 's/.* ([0-9]+) failed.*/\1/p' <<<"$result")))
  if grep -q 'DID NOT RUN' "$log"; then
    echo "e2e: some tests skipped themselves although GPU_ADMISSION_E2E_KUBECONFIG was set" >&2
    rc=1
  fi
  [[ $rc == 0 ]] || test_rc=1
}

say "running cargo test --test e2e (tests/e2e/), all but the real node's scenarios"
# shellcheck disable=SC2086 # E2E_FILTER is a list of words
run_tests "$logs/cargo-test.log" ${E2E_FILTER:-} --skip node::

# ---------------------------------------------------------------- 8. the real node
# Registered only now: the scenarios above count and list the cluster's nodes. Its
# scenarios run unless E2E_FILTER names others only.
if [[ -z "${E2E_FILTER:-}" || " ${E2E_FILTER} " == *" node"* ]]; then
  # The scenarios' nodes have no kubelet, and one that failed may have left its own
  # behind: deploy/'s pods must find the real node only.
  "$k8s_bin/kubectl" --kubeconfig "$kubeconfig" delete nodes -l gpu-admission-e2e/scenario \
    --ignore-not-found >/dev/null
  node_packages
  node_pause_image
  say "building the container image (hack/image.sh)"
  bash "$repo/hack/image.sh" >"$logs/image.log" 2>&1 || die "hack/image.sh failed (log: $logs/image.log)"
  image="$(awk '/image: .*gpu-admission\/gpu-admission:/ {print $2; exit}' "$repo/deploy/30-webhook.yaml")"
  image_archive="${GPU_ADMISSION_IMAGE_DIR:-$HOME/.cache/gpu-admission/image}/gpu-admission-oci.tar"
  say "building the GPU scheduler's kube-scheduler image (hack/scheduler-image.sh)"
  scheduler_archive="$(bash "$repo/hack/scheduler-image.sh" 2>>"$logs/image.log" | tail -n1)" ||
    die "hack/scheduler-image.sh failed (log: $logs/image.log)"
  node_start e2e-node "${image%:*}:$image_archive" "registry.k8s.io/kube-scheduler:$scheduler_archive"
  # From here the GPU scheduler is the one deploy/ and the chart install (same profile name).
  cp_daemon_stop kube-scheduler
  # deploy/'s pods use ServiceAccount tokens (mounted by the ServiceAccount admission
  # plugin, off until now: the scenarios above create pods in namespaces whose default
  # ServiceAccount may not exist yet), Services by ClusterIP and the default scheduler.
  cp_restart_apiserver "${apiserver_flags[@]}"
  node_cluster_services
  say "node e2e-node is Ready (kubelet $("$k8s_bin/kubelet" --version | awk '{print $2}'), containerd $(containerd --version | awk '{print $3}'))"
  # For pods on the node that run as the webhook servers' identity (host network: the API
  # server listens on 127.0.0.1): that ServiceAccount's kubeconfig, self-contained.
  "$k8s_bin/kubectl" --kubeconfig "$work/gpu-admission.kubeconfig" config view --flatten --minify \
    >"$work/gpu-admission-pod.kubeconfig"
  test_env+=(GPU_ADMISSION_E2E_NODE=e2e-node GPU_ADMISSION_E2E_IMAGE="$image"
    GPU_ADMISSION_E2E_NODE_SOCKET="$node_socket" GPU_ADMISSION_E2E_HELM="$(bash "$repo/hack/helm.sh")"
    GPU_ADMISSION_E2E_POD_KUBECONFIG="$work/gpu-admission-pod.kubeconfig")
  node_filter=(node::)
  if [[ -n "${E2E_FILTER:-}" ]]; then
    # shellcheck disable=SC2086 # E2E_FILTER is a list of words
    read -r -a node_filter <<<"$(printf '%s\n' $E2E_FILTER | grep '^node' | paste -sd' ')"
  fi
  run_tests "$logs/cargo-test-node.log" "${node_filter[@]}"
fi

say "done in $((SECONDS - started))s (Kubernetes: kube-apiserver ${k8s_version}; Volcano: vc-scheduler ${volcano_version})"
if [[ $ran == 0 ]]; then
  summary="0 passed, 0 failed (the e2e tests did not run to completion, build error? see $logs/cargo-test.log)"
  exit 1
fi
summary="${passed} passed, ${failed} failed"
[[ $test_rc == 0 ]] || exit 1

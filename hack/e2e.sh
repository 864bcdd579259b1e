#!/usr/bin/env bash
# End-to-end tests on a real Kubernetes control plane, in one command:
#
#   bash hack/e2e.sh
#
# 1. builds (or reuses) kube-apiserver, kube-scheduler, kubectl and etcd (hack/e2e/build.sh),
#    then gpu-admission and the e2e test binary (cargo, debug profile);
# 2. creates a temporary directory with fresh certificates, a service-account key pair and
#    an admin kubeconfig (client certificate in group system:masters), plus a second CA and
#    the client certificate kube-apiserver presents to the webhooks (mutual TLS);
# 3. starts etcd and kube-apiserver on 127.0.0.1 (free ports; an AdmissionConfiguration
#    gives the webhook plugins that client certificate), waits for /readyz;
# 4. installs the GPUQuota CRD (generated from the Rust type), starts two replicas of
#    `gpu-admission serve` against the cluster — each with a webhook door (`--address`,
#    `--client-ca`: only the API server's certificate gets in) and an extender door
#    (`--extender-address`) — and waits for their /readyz;
# 5. starts kube-scheduler with a `gpu-scheduler` profile that calls replica a's extender
#    door as its extender over TLS;
# 6. runs `cargo test --test e2e -- --test-threads=1` (tests/e2e.rs) against it;
# 7. tears everything down; logs stay in the temporary directory (printed at the end,
#    with their last lines when something failed). Last line: `N passed, M failed`.
#
# No kubelets, no containers: nodes are API objects, bound pods stay Pending.
# Environment: CARGO_TARGET_DIR (default ~/.cache/gpu-admission/target), GPU_ADMISSION_CACHE
# (default ~/.cache/gpu-admission, where the Kubernetes binaries are cached),
# E2E_KEEP=1 keeps the whole temporary directory (etcd data included), E2E_READY_TIMEOUT
# (seconds, default 90) bounds every wait for a component to come up.
set -euo pipefail

repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/gpu-admission/target}"
export CARGO_TERM_COLOR=never
ready_timeout="${E2E_READY_TIMEOUT:-90}"
started=$SECONDS
k8s_version="(not built)"

say() { echo "e2e [$((SECONDS - started))s]: $*" >&2; }
die() {
  echo "e2e: FAILED: $*" >&2
  exit 1
}

# ---------------------------------------------------------------- temp dir + teardown
work="$(mktemp -d "${TMPDIR:-/tmp}/gpu-admission-e2e.XXXXXX")"
logs="$work/logs"
mkdir -p "$logs"
declare -a pids=()
summary="0 passed, 0 failed (the e2e tests did not run: the setup failed, see above)"
replica_a_pidfile="$work/gpu-admission.pid"
replica_b_pidfile="$work/gpu-admission-b.pid"

tail_logs() {
  for f in "$logs"/*.log; do
    [[ -s "$f" ]] || continue
    echo "----- last 30 lines of $f" >&2
    tail -n 30 "$f" >&2
  done
}

teardown() {
  local rc=$?
  set +e
  local all=("${pids[@]}")
  [[ -f "$replica_a_pidfile" ]] && all+=("$(cat "$replica_a_pidfile")")
  [[ -f "$replica_b_pidfile" ]] && all+=("$(cat "$replica_b_pidfile")")
  # Stop in reverse start order (gpu-admission, scheduler, apiserver, etcd), each
  # before the next, so nothing logs pages of errors about a peer that went first.
  for ((i = ${#all[@]} - 1; i >= 0; i--)); do
    local pid=${all[i]}
    kill -TERM "$pid" 2>/dev/null || continue
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
  done
  wait 2>/dev/null
  if [[ $rc != 0 ]]; then
    tail_logs
  fi
  if [[ "${E2E_KEEP:-0}" != 1 ]]; then
    rm -rf "$work/etcd-data"
  fi
  echo "e2e: Kubernetes: kube-apiserver ${k8s_version}; logs in $logs" >&2
  echo "$summary"
  exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT TERM

# ---------------------------------------------------------------- 1. binaries
say "building or reusing the Kubernetes binaries (hack/e2e/build.sh)"
k8s_bin="$(bash hack/e2e/build.sh 2> >(tee "$logs/build.log" >&2) | tail -n1)" ||
  die "building the Kubernetes binaries failed (hack/e2e/build.sh; log: $logs/build.log)"
[[ -x "$k8s_bin/kube-apiserver" ]] || die "hack/e2e/build.sh did not produce $k8s_bin/kube-apiserver"
k8s_version="$("$k8s_bin/kube-apiserver" --version | awk '{print $2}')"
etcd_version="$("$k8s_bin/etcd" --version | awk '/etcd Version/ {print $3}')"
say "kube-apiserver ${k8s_version}, etcd v${etcd_version}"

# free_port VAR: set VAR to a free TCP port on 127.0.0.1, not handed out before. Taken
# below the kernel's ephemeral range: a port from inside it can be handed to some outgoing
# connection (a kube client's) between this check and the server's bind.
declare -a taken=()
read -r ephemeral_low _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || ephemeral_low=32768
((ephemeral_low > 11000)) || ephemeral_low=32768
free_port() {
  local p
  for _ in $(seq 1 200); do
    p=$((10000 + RANDOM % (ephemeral_low - 10000)))
    [[ " ${taken[*]:-} " == *" $p "* ]] && continue
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      taken+=("$p")
      printf -v "$1" '%s' "$p"
      return 0
    fi
  done
  die "no free TCP port found on 127.0.0.1"
}

# wait_ready NAME PID LOG COMMAND...: run COMMAND until it succeeds, for at most
# $ready_timeout seconds, failing early if process PID died.
wait_ready() {
  local name=$1 pid=$2 log=$3
  shift 3
  local deadline=$((SECONDS + ready_timeout))
  until "$@" >/dev/null 2>&1; do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "e2e: $name exited during startup; last log lines ($log):" >&2
      tail -n 40 "$log" >&2
      die "$name did not start"
    fi
    if ((SECONDS >= deadline)); then
      echo "e2e: $name did not become ready within ${ready_timeout}s; last log lines ($log):" >&2
      tail -n 40 "$log" >&2
      die "$name did not become ready within ${ready_timeout}s"
    fi
    sleep 0.5
  done
  say "$name is ready"
}

# ---------------------------------------------------------------- 1b. gpu-admission and the tests
# Built before any component starts, so a compile error fails fast and the test phase
# below measures the tests, not the compiler.
say "building gpu-admission and tests/e2e.rs (cargo, debug profile, target dir $CARGO_TARGET_DIR)"
{
  nice -n 19 cargo build --locked --bin gpu-admission --example print_crd &&
    nice -n 19 cargo test --locked --test e2e --no-run
} >"$logs/cargo-build.log" 2>&1 ||
  { tail -n 60 "$logs/cargo-build.log" >&2; die "cargo build of gpu-admission or of tests/e2e.rs failed (log: $logs/cargo-build.log)"; }

# The target directory may be shared with other checkouts of this repository, whose builds
# replace target/debug/gpu-admission (cargo's uplifted copy) at any time; a restart in the
# middle of the tests would then run another version. So the run uses its own copies, taken
# under cargo's lock on the build directory and only when the `.d` file next to the output
# names this checkout's sources (else a no-op cargo build links ours back first).
snapshot() { # snapshot OUTPUT SOURCE DEST: copy $CARGO_TARGET_DIR/debug/OUTPUT to DEST
  local out="$CARGO_TARGET_DIR/debug/$1"
  for _ in 1 2 3 4 5; do
    # shellcheck disable=SC2016 # expanded by the inner bash
    if flock "$CARGO_TARGET_DIR/debug/.cargo-lock" bash -c \
      'grep -qF " $2" "$1.d" && cp "$1" "$3"' _ "$out" "$repo/$2" "$3"; then
      return 0
    fi
    nice -n 19 cargo build --locked --bin gpu-admission --example print_crd >>"$logs/cargo-build.log" 2>&1 ||
      return 1
  done
  return 1
}
mkdir -p "$work/bin"
gpu_admission="$work/bin/gpu-admission"
print_crd="$work/bin/print_crd"
snapshot gpu-admission src/main.rs "$gpu_admission" &&
  snapshot examples/print_crd examples/print_crd.rs "$print_crd" ||
  die "could not take a copy of this checkout's gpu-admission build from $CARGO_TARGET_DIR (log: $logs/cargo-build.log)"

# ---------------------------------------------------------------- 2. certificates
pki="$work/pki"
mkdir -p "$pki"
(
  cd "$pki"
  ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
  openssl req -x509 "${ec[@]}" -keyout ca.key -out ca.crt -days 2 -subj "/CN=gpu-admission-e2e-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
  # The CA that signs the client certificate kube-apiserver presents to admission webhooks:
  # a CA of its own, so gpu-admission's --client-ca trusts that one certificate's issuer
  # and nothing else of the cluster (not the admin's certificate, say).
  openssl req -x509 "${ec[@]}" -keyout webhook-client-ca.key -out webhook-client-ca.crt -days 2 \
    -subj "/CN=gpu-admission-e2e-webhook-client-ca" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
  leaf() { # leaf NAME SUBJECT EXTENSIONS [CA]: a certificate signed by CA (default ca)
    local ca=${4:-ca}
    openssl req -new "${ec[@]}" -keyout "$1.key" -out "$1.csr" -subj "$2"
    printf '%b' "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n$3\n" >"$1.ext"
    openssl x509 -req -in "$1.csr" -CA "$ca.crt" -CAkey "$ca.key" -CAcreateserial -days 2 \
      -out "$1.crt" -extfile "$1.ext"
  }
  leaf apiserver "/CN=kube-apiserver" "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
  leaf admin "/O=system:masters/CN=e2e-admin" "extendedKeyUsage=clientAuth"
  leaf apiserver-webhook-client "/CN=kube-apiserver-webhook-client" "extendedKeyUsage=clientAuth" webhook-client-ca
  openssl ecparam -name prime256v1 -genkey -noout -out sa.key
  openssl ec -in sa.key -pubout -out sa.pub
) >"$logs/openssl.log" 2>&1 || { cat "$logs/openssl.log" >&2; die "creating certificates with openssl failed"; }

# What kube-apiserver presents when it calls an admission webhook: the webhook plugins'
# AdmissionConfiguration points at a kubeconfig whose user `*` (every webhook, whatever its
# host) carries the client certificate above (docs: Dynamic Admission Control,
# "Authenticate API servers").
cat >"$work/webhook-client.kubeconfig" <<EOF
apiVersion: v1
kind: Config
users:
- name: "*"
  user:
    client-certificate: $pki/apiserver-webhook-client.crt
    client-key: $pki/apiserver-webhook-client.key
EOF
cat >"$work/admission-config.yaml" <<EOF
apiVersion: apiserver.config.k8s.io/v1
kind: AdmissionConfiguration
plugins:
- name: ValidatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: $work/webhook-client.kubeconfig
- name: MutatingAdmissionWebhook
  configuration:
    apiVersion: apiserver.config.k8s.io/v1
    kind: WebhookAdmissionConfiguration
    kubeConfigFile: $work/webhook-client.kubeconfig
EOF

# ---------------------------------------------------------------- 3. etcd + apiserver
free_port etcd_port
free_port etcd_peer_port
free_port api_port
free_port sched_port
free_port webhook_port
free_port extender_port
free_port admin_port
free_port webhook_port_b
free_port extender_port_b
free_port admin_port_b

"$k8s_bin/etcd" --name e2e --data-dir "$work/etcd-data" \
  --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" \
  --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
  --initial-cluster "e2e=http://127.0.0.1:$etcd_peer_port" \
  --unsafe-no-fsync --log-level warn >"$logs/etcd.log" 2>&1 &
pids+=($!)
wait_ready etcd "$!" "$logs/etcd.log" curl -fsS "http://127.0.0.1:$etcd_port/health"

"$k8s_bin/kube-apiserver" \
  --etcd-servers="http://127.0.0.1:$etcd_port" \
  --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="$api_port" \
  --tls-cert-file="$pki/apiserver.crt" --tls-private-key-file="$pki/apiserver.key" \
  --client-ca-file="$pki/ca.crt" \
  --requestheader-client-ca-file="$pki/ca.crt" --requestheader-allowed-names=front-proxy-client \
  --requestheader-username-headers=X-Remote-User --requestheader-group-headers=X-Remote-Group \
  --requestheader-extra-headers-prefix=X-Remote-Extra- \
  --authorization-mode=RBAC \
  --service-account-issuer=https://kubernetes.default.svc.cluster.local \
  --service-account-key-file="$pki/sa.pub" --service-account-signing-key-file="$pki/sa.key" \
  --service-cluster-ip-range=10.0.0.0/24 \
  --disable-admission-plugins=ServiceAccount \
  --admission-control-config-file="$work/admission-config.yaml" \
  --cert-dir="$work/apiserver-certs" \
  --v=1 >"$logs/kube-apiserver.log" 2>&1 &
pids+=($!)
wait_ready kube-apiserver "$!" "$logs/kube-apiserver.log" \
  curl -fsS --cacert "$pki/ca.crt" --cert "$pki/admin.crt" --key "$pki/admin.key" \
  "https://127.0.0.1:$api_port/readyz"

# ---------------------------------------------------------------- 4. kubeconfig
kubeconfig="$work/admin.kubeconfig"
cat >"$kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: e2e
  cluster:
    server: https://127.0.0.1:$api_port
    certificate-authority: $pki/ca.crt
users:
- name: e2e-admin
  user:
    client-certificate: $pki/admin.crt
    client-key: $pki/admin.key
contexts:
- name: e2e
  context: {cluster: e2e, user: e2e-admin}
current-context: e2e
EOF
kubectl=("$k8s_bin/kubectl" --kubeconfig "$kubeconfig")

# ---------------------------------------------------------------- 5. gpu-admission
"$print_crd" >"$work/gpuquota-crd.yaml"
"${kubectl[@]}" apply -f "$work/gpuquota-crd.yaml" >"$logs/kubectl.log" 2>&1 ||
  { cat "$logs/kubectl.log" >&2; die "installing the GPUQuota CRD failed"; }
"${kubectl[@]}" wait --for condition=Established --timeout=60s crd/gpuquotas.gpu-admission.io \
  >>"$logs/kubectl.log" 2>&1 ||
  { cat "$logs/kubectl.log" >&2; die "the GPUQuota CRD was not Established within 60s"; }
say "GPUQuota CRD installed"

"$gpu_admission" certs --service gpu-admission --namespace gpu-admission \
  --out-dir "$work/extender-certs" --host localhost --ip 127.0.0.1 >"$logs/certs.log" 2>&1 ||
  { cat "$logs/certs.log" >&2; die "gpu-admission certs failed"; }
cat >"$work/gpu-admission.yaml" <<EOF
placement:
  policy: original
  bindVerb: true
EOF

# The tests stop and restart gpu-admission through this script (extender and webhook
# outage). Replica `a` is the scheduler's extender and the webhooks' usual backend;
# replica `b` is a second webhook server on other ports against the same cluster, for the
# two-replica quota scenario. Each has two TLS doors: the webhook door (`--address`,
# `/mutate` and `/validate`, mutual TLS: `--client-ca` is the CA of kube-apiserver's
# webhook client certificate) and the extender door (`--extender-address`,
# `/scheduler/*`, no client certificate asked). Both serve the same certificate files
# and re-read them every second (`--tls-reload-interval 1s`, for the certificate
# rotation scenario).
ctl="$work/gpu-admission-ctl.sh"
cat >"$ctl" <<EOF
#!/usr/bin/env bash
# Usage: $ctl start|stop [a|b] — the e2e run's gpu-admission replica a (the default; PID
# in $replica_a_pidfile) or b (PID in $replica_b_pidfile).
set -euo pipefail
case "\${2:-a}" in
  a) pidfile="$replica_a_pidfile"; log="$logs/gpu-admission.log"; port=$webhook_port; extender=$extender_port; admin=$admin_port ;;
  b) pidfile="$replica_b_pidfile"; log="$logs/gpu-admission-b.log"; port=$webhook_port_b; extender=$extender_port_b; admin=$admin_port_b ;;
  *) echo "usage: \$0 start|stop [a|b]" >&2; exit 2 ;;
esac
case "\${1:-}" in
  start)
    if [[ -f "\$pidfile" ]] && kill -0 "\$(cat "\$pidfile")" 2>/dev/null; then
      echo "gpu-admission is already running (pid \$(cat "\$pidfile"))" >&2; exit 1
    fi
    echo "=== start \$(date -u +%FT%TZ)" >>"\$log"
    NO_COLOR=1 "$gpu_admission" serve --kubeconfig "$kubeconfig" \\
      --address 127.0.0.1:\$port --extender-address 127.0.0.1:\$extender \\
      --admin-address 127.0.0.1:\$admin --client-ca "$pki/webhook-client-ca.crt" \\
      --tls-cert "$work/extender-certs/tls.crt" --tls-key "$work/extender-certs/tls.key" \\
      --tls-reload-interval 1s \\
      --config "$work/gpu-admission.yaml" --log-level info,gpu_admission=debug \\
      </dev/null >>"\$log" 2>&1 &
    echo \$! >"\$pidfile"
    for _ in \$(seq 1 $((ready_timeout * 2))); do
      if curl -fsS "http://127.0.0.1:\$admin/readyz" >/dev/null 2>&1; then exit 0; fi
      if ! kill -0 "\$(cat "\$pidfile")" 2>/dev/null; then
        echo "gpu-admission exited during startup; last log lines (\$log):" >&2; tail -n 40 "\$log" >&2; exit 1
      fi
      sleep 0.5
    done
    echo "gpu-admission did not become ready within ${ready_timeout}s; last log lines (\$log):" >&2
    tail -n 40 "\$log" >&2
    exit 1
    ;;
  stop)
    pid="\$(cat "\$pidfile")"
    kill -TERM "\$pid"
    for _ in \$(seq 1 300); do kill -0 "\$pid" 2>/dev/null || { rm -f "\$pidfile"; exit 0; }; sleep 0.1; done
    kill -KILL "\$pid"; rm -f "\$pidfile"
    ;;
  *) echo "usage: \$0 start|stop [a|b]" >&2; exit 2 ;;
esac
EOF
bash "$ctl" start a || die "gpu-admission (replica a) did not start (see above)"
bash "$ctl" start b || die "gpu-admission (replica b) did not start (see above)"
say "gpu-admission is ready: replica a webhooks https://127.0.0.1:$webhook_port (mutual TLS), extender https://127.0.0.1:$extender_port, admin http://127.0.0.1:$admin_port; replica b webhooks https://127.0.0.1:$webhook_port_b, extender https://127.0.0.1:$extender_port_b, admin http://127.0.0.1:$admin_port_b"

# ---------------------------------------------------------------- 6. kube-scheduler
cat >"$work/kube-scheduler.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: $kubeconfig
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
"$k8s_bin/kube-scheduler" --config="$work/kube-scheduler.yaml" \
  --bind-address=127.0.0.1 --secure-port="$sched_port" --cert-dir="$work/scheduler-certs" \
  --authentication-kubeconfig="$kubeconfig" --authorization-kubeconfig="$kubeconfig" \
  --v=2 >"$logs/kube-scheduler.log" 2>&1 &
pids+=($!)
wait_ready kube-scheduler "$!" "$logs/kube-scheduler.log" \
  curl -fsSk "https://127.0.0.1:$sched_port/readyz"

# ---------------------------------------------------------------- 7. the tests
# The Helm chart's default rendering, for the server-side dry-run scenario (helm is built
# once and cached by hack/helm.sh; .ci/run's chart check has built it already).
chart_render="$work/chart-rendered.yaml"
"$(bash "$repo/hack/helm.sh")" template gpu-admission "$repo/charts/gpu-admission" \
  --namespace gpu-admission >"$chart_render" 2>"$logs/helm.log" || die "helm template failed: $(tail -5 "$logs/helm.log")"
say "running cargo test --test e2e (tests/e2e.rs)"
set +e
GPU_ADMISSION_E2E_KUBECONFIG="$kubeconfig" GPU_ADMISSION_E2E_CTL="$ctl" \
  GPU_ADMISSION_E2E_CHART_RENDER="$chart_render" \
  GPU_ADMISSION_E2E_SCHEDULER=gpu-scheduler \
  GPU_ADMISSION_E2E_SERVER_URL="https://127.0.0.1:$webhook_port" \
  GPU_ADMISSION_E2E_CA_FILE="$work/extender-certs/ca.crt" \
  GPU_ADMISSION_E2E_SERVER_URL_B="https://127.0.0.1:$webhook_port_b" \
  GPU_ADMISSION_E2E_EXTENDER_URL="https://127.0.0.1:$extender_port" \
  GPU_ADMISSION_E2E_CLIENT_CERT="$pki/apiserver-webhook-client.crt" \
  GPU_ADMISSION_E2E_CLIENT_KEY="$pki/apiserver-webhook-client.key" \
  GPU_ADMISSION_E2E_CLIENT_CA="$pki/webhook-client-ca.crt" \
  GPU_ADMISSION_E2E_BIN="$gpu_admission" \
  GPU_ADMISSION_E2E_ADMIN_URL="http://127.0.0.1:$admin_port" \
  GPU_ADMISSION_E2E_CERT_DIR="$work/extender-certs" \
  nice -n 19 cargo test --locked --test e2e -- --ignored --test-threads=1 --nocapture 2>&1 | tee "$logs/cargo-test.log"
test_rc=${PIPESTATUS[0]}
set -e

result="$(grep -E '^test result: ' "$logs/cargo-test.log" | tail -n1 || true)"
passed="$(sed -nE 's/.* ([0-9]+) passed.*/\1/p' <<<"$result")"
failed="$(sed -nE 's/.* ([0-9]+) failed.*/\1/p' <<<"$result")"
if grep -q 'DID NOT RUN' "$logs/cargo-test.log"; then
  echo "e2e: some tests skipped themselves although GPU_ADMISSION_E2E_KUBECONFIG was set" >&2
  test_rc=1
fi
say "done in $((SECONDS - started))s (Kubernetes: kube-apiserver ${k8s_version})"
if [[ -z "$passed" ]]; then
  summary="0 passed, 0 failed (the e2e tests did not run to completion, build error? see $logs/cargo-test.log)"
  exit 1
fi
summary="${passed} passed, ${failed} failed"
[[ $test_rc == 0 ]] || exit 1

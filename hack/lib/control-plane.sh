# shellcheck shell=bash
# A throw-away Kubernetes control plane on 127.0.0.1 with gpu-admission in it: the parts
# hack/e2e.sh (the end-to-end tests) and hack/scale.sh (the cluster-scale benchmark) share.
# Sourced, not run; bash functions over a few globals:
#
#   cp_init NAME            temp dir ${TMPDIR:-/tmp}/gpu-admission-NAME.XXXXXX ($work, $logs),
#                           say/die prefixed with NAME, $pids, the replicas' pid files
#   cp_stop_all             stops every started process, newest first (for the caller's trap)
#   free_port VAR           a free TCP port on 127.0.0.1 into VAR
#   wait_ready NAME PID LOG COMMAND...
#   cp_k8s_binaries         hack/e2e/build.sh: $k8s_bin, $k8s_version, $etcd_version
#   cp_snapshot PROFILE OUTPUT SOURCE DEST
#                           copies this checkout's cargo output (rebuilds with "${cp_cargo_build[@]}")
#   cp_ports                every port below ($etcd_port, $api_port, $sched_port, replica a's
#                           $webhook_port $extender_port $admin_port, replica b's ..._b)
#   cp_certs                $pki: CA, apiserver, admin (system:masters), service-account keys,
#                           the webhook client CA + kube-apiserver's webhook client certificate,
#                           and $work/admission-config.yaml handing that certificate to the
#                           webhook plugins (mutual TLS)
#   cp_start_etcd           etcd (--unsafe-no-fsync), waits for /health
#   cp_start_apiserver ARGS...   kube-apiserver (+ARGS), waits for /readyz
#   cp_kubeconfig           $kubeconfig (admin), $kubectl (array)
#   cp_client_identity USER GROUP
#                           a client certificate for USER in GROUP signed by the cluster CA
#                           ($pki/USER.crt, .key) and $work/USER.kubeconfig using it
#   cp_install_crd PRINT_CRD     the GPUQuota CRD, waits for Established
#   cp_gpu_admission_certs BIN   gpu-admission's serving certificate in $work/extender-certs
#   cp_shipped_identity SA  applies deploy/'s namespace and RBAC as shipped; writes
#                           $work/SA.kubeconfig, a token of ServiceAccount gpu-admission/SA
#   cp_write_ctl BIN CONFIG LOG_LEVEL [KUBECONFIG]
#                           $ctl: a script `start|stop [a|b]` for the two gpu-admission replicas
#                           (GPU_ADMISSION_CONFIG / REPLICA_KUBECONFIG in its environment:
#                           start one with another config file / as another user)
#   cp_start_scheduler CONFIG ARGS...   kube-scheduler (+ARGS), waits for /readyz
#   cp_start_controller_manager ARGS... kube-controller-manager (+ARGS), waits for /healthz
#   cp_volcano_binaries     hack/e2e/build-volcano.sh: $volcano_dir (bin/vc-scheduler, crd/),
#                           $volcano_version
#   cp_prometheus_binaries  hack/e2e/build-prometheus.sh: $prometheus_dir (bin/prometheus,
#                           bin/promtool)
#   cp_install_volcano_crds the CRDs vc-scheduler watches (PodGroup, Queue, ...), Established
#   cp_start_volcano CONF CA ARGS...   vc-scheduler (+ARGS) with scheduler conf CONF, Go
#                           trusting CA (SSL_CERT_FILE), waits for /healthz
#
# The caller sets `set -euo pipefail`, $repo, $ready_timeout (seconds) and its EXIT trap.

cp_init() { # cp_init NAME
  cp_name=$1
  started=$SECONDS
  k8s_version="(not built)"
  work="$(mktemp -d "${TMPDIR:-/tmp}/gpu-admission-$cp_name.XXXXXX")"
  logs="$work/logs"
  mkdir -p "$logs"
  pids=()
  replica_a_pidfile="$work/gpu-admission.pid"
  replica_b_pidfile="$work/gpu-admission-b.pid"
  replica_c_pidfile="$work/gpu-admission-c.pid"
  taken=()
  read -r ephemeral_low _ </proc/sys/net/ipv4/ip_local_port_range 2>/dev/null || ephemeral_low=32768
  ((ephemeral_low > 11000)) || ephemeral_low=32768
}

say() { echo "$cp_name [$((SECONDS - started))s]: $*" >&2; }
die() {
  echo "$cp_name: FAILED: $*" >&2
  exit 1
}

tail_logs() {
  for f in "$logs"/*.log; do
    [[ -s "$f" ]] || continue
    echo "----- last 30 lines of $f" >&2
    tail -n 30 "$f" >&2
  done
}

# Stops in reverse start order (gpu-admission, scheduler, apiserver, etcd), each before
# the next, so nothing logs pages of errors about a peer that went first.
cp_stop_all() {
  local all=("${pids[@]}")
  [[ -f "$replica_a_pidfile" ]] && all+=("$(cat "$replica_a_pidfile")")
  [[ -f "$replica_b_pidfile" ]] && all+=("$(cat "$replica_b_pidfile")")
  [[ -f "$replica_c_pidfile" ]] && all+=("$(cat "$replica_c_pidfile")")
  # Daemons a test restarted run under new PIDs.
  local f
  for f in "$work"/daemons/*.pid; do [[ -f "$f" ]] && all+=("$(cat "$f")"); done
  for ((i = ${#all[@]} - 1; i >= 0; i--)); do
    local pid=${all[i]}
    kill -TERM "$pid" 2>/dev/null || continue
    for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
    kill -KILL "$pid" 2>/dev/null
  done
  wait 2>/dev/null
}

# free_port VAR: set VAR to a free TCP port on 127.0.0.1, not handed out before. Taken
# below the kernel's ephemeral range: a port from inside it can be handed to some outgoing
# connection (a kube client's) between this check and the server's bind.
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
      echo "$cp_name: $name exited during startup; last log lines ($log):" >&2
      tail -n 40 "$log" >&2
      die "$name did not start"
    fi
    if ((SECONDS >= deadline)); then
      echo "$cp_name: $name did not become ready within ${ready_timeout}s; last log lines ($log):" >&2
      tail -n 40 "$log" >&2
      die "$name did not become ready within ${ready_timeout}s"
    fi
    sleep 0.5
  done
  say "$name is ready"
}

cp_k8s_binaries() {
  say "building or reusing the Kubernetes binaries (hack/e2e/build.sh)"
  k8s_bin="$(bash "$repo/hack/e2e/build.sh" 2> >(tee "$logs/build.log" >&2) | tail -n1)" ||
    die "building the Kubernetes binaries failed (hack/e2e/build.sh; log: $logs/build.log)"
  [[ -x "$k8s_bin/kube-apiserver" ]] || die "hack/e2e/build.sh did not produce $k8s_bin/kube-apiserver"
  k8s_version="$("$k8s_bin/kube-apiserver" --version | awk '{print $2}')"
  etcd_version="$("$k8s_bin/etcd" --version | awk '/etcd Version/ {print $3}')"
  say "kube-apiserver ${k8s_version}, etcd v${etcd_version}"
}

# The target directory may be shared with other checkouts of this repository, whose builds
# replace target/<profile>/gpu-admission (cargo's uplifted copy) at any time; a restart in
# the middle of a run would then run another version. So a run uses its own copies, taken
# under cargo's lock on the build directory and only when the `.d` file next to the output
# names this checkout's sources (else a no-op build, "${cp_cargo_build[@]}", links ours
# back first).
cp_snapshot() { # cp_snapshot PROFILE OUTPUT SOURCE DEST: copy $CARGO_TARGET_DIR/PROFILE/OUTPUT to DEST
  local out="$CARGO_TARGET_DIR/$1/$2"
  for _ in 1 2 3 4 5; do
    # shellcheck disable=SC2016 # expanded by the inner bash
    if flock "$CARGO_TARGET_DIR/$1/.cargo-lock" bash -c \
      'grep -qF " $2" "$1.d" && cp "$1" "$3"' _ "$out" "$repo/$3" "$4"; then
      return 0
    fi
    "${cp_cargo_build[@]}" >>"$logs/cargo-build.log" 2>&1 || return 1
  done
  return 1
}

cp_ports() {
  free_port etcd_port
  free_port etcd_peer_port
  free_port api_port
  free_port sched_port
  free_port kcm_port
  free_port webhook_port
  free_port extender_port
  free_port admin_port
  free_port webhook_port_b
  free_port extender_port_b
  free_port admin_port_b
  free_port webhook_port_c
  free_port extender_port_c
  free_port admin_port_c
  free_port proxy_port
}

cp_certs() {
  pki="$work/pki"
  mkdir -p "$pki"
  (
    cd "$pki"
    ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes)
    openssl req -x509 "${ec[@]}" -keyout ca.key -out ca.crt -days 2 -subj "/CN=gpu-admission-$cp_name-ca" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
    # The CA that signs the client certificate kube-apiserver presents to admission webhooks:
    # a CA of its own, so gpu-admission's --client-ca trusts that one certificate's issuer
    # and nothing else of the cluster (not the admin's certificate, say).
    openssl req -x509 "${ec[@]}" -keyout webhook-client-ca.key -out webhook-client-ca.crt -days 2 \
      -subj "/CN=gpu-admission-$cp_name-webhook-client-ca" \
      -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
    leaf() { # leaf NAME SUBJECT EXTENSIONS [CA]: a certificate signed by CA (default ca)
      local ca=${4:-ca}
      openssl req -new "${ec[@]}" -keyout "$1.key" -out "$1.csr" -subj "$2"
      printf '%b' "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n$3\n" >"$1.ext"
      openssl x509 -req -in "$1.csr" -CA "$ca.crt" -CAkey "$ca.key" -CAcreateserial -days 2 \
        -out "$1.crt" -extfile "$1.ext"
    }
    leaf apiserver "/CN=kube-apiserver" "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc"
    leaf admin "/O=system:masters/CN=$cp_name-admin" "extendedKeyUsage=clientAuth"
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
}

cp_start_etcd() {
  "$k8s_bin/etcd" --name "$cp_name" --data-dir "$work/etcd-data" \
    --listen-client-urls "http://127.0.0.1:$etcd_port" --advertise-client-urls "http://127.0.0.1:$etcd_port" \
    --listen-peer-urls "http://127.0.0.1:$etcd_peer_port" \
    --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer_port" \
    --initial-cluster "$cp_name=http://127.0.0.1:$etcd_peer_port" \
    --unsafe-no-fsync --log-level warn >"$logs/etcd.log" 2>&1 &
  pids+=($!)
  wait_ready etcd "$!" "$logs/etcd.log" curl -fsS "http://127.0.0.1:$etcd_port/health"
}

cp_start_apiserver() { # cp_start_apiserver EXTRA_ARGS... (e.g. --disable-admission-plugins=...)
  apiserver_args=("$@")
  cp_daemon kube-apiserver "$logs/kube-apiserver.log" \
    "curl -fsS --cacert $pki/ca.crt --cert $pki/admin.crt --key $pki/admin.key https://127.0.0.1:$api_port/readyz" \
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
    "$@" \
    --admission-control-config-file="$work/admission-config.yaml" \
    --cert-dir="$work/apiserver-certs" \
    --v=1
}

# cp_restart_apiserver EXTRA_ARGS...: stops kube-apiserver and starts it again on the same
# port and data with other extra arguments; its clients reconnect.
cp_restart_apiserver() {
  cp_daemon_stop kube-apiserver
  echo "=== restart $(date -u +%FT%TZ): $*" >>"$logs/kube-apiserver.log"
  cp_start_apiserver "$@"
}

# cp_daemon NAME LOG READY COMMAND...: starts COMMAND in the background (output appended to
# LOG) and waits until the shell command READY succeeds. How to run it again is kept in
# $work/daemons/NAME.{cmd,ready,log,pid}: hack/e2e/restart.sh restarts it from there (the
# tests' faults: the API server or the kubelet restarted mid-scenario); cp_stop_all stops
# whatever runs under that PID then.
cp_daemon() {
  local name=$1 log=$2 ready=$3 dir="$work/daemons"
  shift 3
  mkdir -p "$dir"
  printf '%q ' "$@" >"$dir/$name.cmd"
  printf '%s' "$ready" >"$dir/$name.ready"
  printf '%s' "$log" >"$dir/$name.log"
  "$@" </dev/null >>"$log" 2>&1 &
  daemon_pid=$!
  echo "$daemon_pid" >"$dir/$name.pid"
  wait_ready "$name" "$daemon_pid" "$log" bash -c "$ready"
}

# cp_daemon_stop NAME: TERM, then KILL after 10 s, the daemon NAME as it runs now.
cp_daemon_stop() {
  local pid
  pid="$(cat "$work/daemons/$1.pid" 2>/dev/null)" || return 0
  kill -TERM "$pid" 2>/dev/null || return 0
  for _ in $(seq 1 100); do kill -0 "$pid" 2>/dev/null || return 0; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null
}

# write_kubeconfig FILE USER USER_FIELDS: a kubeconfig for this cluster as USER, whose
# `user:` block is USER_FIELDS (YAML, indented four spaces).
write_kubeconfig() {
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: $cp_name
  cluster:
    server: https://127.0.0.1:$api_port
    certificate-authority: $pki/ca.crt
users:
- name: $2
  user:
$3
contexts:
- name: $cp_name
  context: {cluster: $cp_name, user: $2}
current-context: $cp_name
EOF
}

cp_kubeconfig() {
  kubeconfig="$work/admin.kubeconfig"
  write_kubeconfig "$kubeconfig" "$cp_name-admin" \
    "    client-certificate: $pki/admin.crt
    client-key: $pki/admin.key"
  kubectl=("$k8s_bin/kubectl" --kubeconfig "$kubeconfig")
}

# cp_client_identity USER GROUP: a user of its own (a client certificate with CN=USER, O=GROUP,
# signed by the cluster CA, valid two days) and $work/USER.kubeconfig, so the API server's
# audit log can tell its requests from the admin's.
cp_client_identity() {
  local user=$1 group=$2
  (
    cd "$pki"
    openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
      -keyout "$user.key" -out "$user.csr" -subj "/O=$group/CN=$user"
    printf '%b' "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n" >"$user.ext"
    openssl x509 -req -in "$user.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
      -out "$user.crt" -extfile "$user.ext"
  ) >>"$logs/openssl.log" 2>&1 || { cat "$logs/openssl.log" >&2; die "creating the certificate of $user failed"; }
  write_kubeconfig "$work/$user.kubeconfig" "$user" \
    "    client-certificate: $pki/$user.crt
    client-key: $pki/$user.key"
}

# The identity an install from deploy/ gives a component: deploy/'s namespace and RBAC are
# applied exactly as shipped, and a kubeconfig carries a token of ServiceAccount
# gpu-admission/$1 (TokenRequest, valid for two days), so a verb missing from the shipped
# roles fails here as it would in a customer's cluster.
cp_shipped_identity() { # cp_shipped_identity SERVICE_ACCOUNT -> $work/SERVICE_ACCOUNT.kubeconfig
  local sa=$1 token
  "${kubectl[@]}" apply -f "$repo/deploy/00-namespace.yaml" -f "$repo/deploy/10-rbac.yaml" \
    >>"$logs/kubectl.log" 2>&1 || die "applying deploy/10-rbac.yaml failed: $(tail -5 "$logs/kubectl.log")"
  token=$("${kubectl[@]}" create token "$sa" -n gpu-admission --duration=48h 2>>"$logs/kubectl.log") ||
    die "no token for ServiceAccount gpu-admission/$sa: $(tail -5 "$logs/kubectl.log")"
  write_kubeconfig "$work/$sa.kubeconfig" "$sa" "    token: $token"
}

cp_install_crd() { # cp_install_crd PRINT_CRD
  "$1" >"$work/gpuquota-crd.yaml"
  "${kubectl[@]}" apply -f "$work/gpuquota-crd.yaml" >"$logs/kubectl.log" 2>&1 ||
    { cat "$logs/kubectl.log" >&2; die "installing the GPUQuota CRD failed"; }
  "${kubectl[@]}" wait --for condition=Established --timeout=60s crd/gpuquotas.gpu-admission.io \
    >>"$logs/kubectl.log" 2>&1 ||
    { cat "$logs/kubectl.log" >&2; die "the GPUQuota CRD was not Established within 60s"; }
  say "GPUQuota CRD installed"
}

cp_gpu_admission_certs() { # cp_gpu_admission_certs GPU_ADMISSION
  "$1" certs --service gpu-admission --namespace gpu-admission \
    --out-dir "$work/extender-certs" --host localhost --ip 127.0.0.1 >"$logs/certs.log" 2>&1 ||
    { cat "$logs/certs.log" >&2; die "gpu-admission certs failed"; }
}

# cp_write_ctl GPU_ADMISSION CONFIG LOG_LEVEL: writes $ctl, which starts and stops
# gpu-admission replica `a` (the scheduler's extender and the webhooks' usual backend) or
# `b` (a second server on other ports against the same cluster); GPU_ADMISSION_CONFIG in
# its environment starts one with another config file, REPLICA_KUBECONFIG with
# another kubeconfig (another user; not gpu-admission's own GPU_ADMISSION_KUBECONFIG, which a
# shell may hold for a real cluster). Each has two TLS doors:
# the webhook door (`--address`, `/mutate` and `/validate`, mutual TLS: `--client-ca` is
# the CA of kube-apiserver's webhook client certificate) and the extender door
# (`--extender-address`, `/scheduler/*`, no client certificate asked). Both serve the same
# certificate files and re-read them every second (`--tls-reload-interval 1s`).
cp_write_ctl() {
  local gpu_admission=$1 config=$2 log_level=$3 serve_kubeconfig=${4:-$kubeconfig}
  ctl="$work/gpu-admission-ctl.sh"
  cat >"$ctl" <<EOF
#!/usr/bin/env bash
# Usage: $ctl start|stop|kill [a|b|c] — the $cp_name run's gpu-admission replica a (the default; PID
# in $replica_a_pidfile), b (PID in $replica_b_pidfile) or c (started by a scenario only).
set -euo pipefail
case "\${2:-a}" in
  a) pidfile="$replica_a_pidfile"; log="$logs/gpu-admission.log"; port=$webhook_port; extender=$extender_port; admin=$admin_port ;;
  b) pidfile="$replica_b_pidfile"; log="$logs/gpu-admission-b.log"; port=$webhook_port_b; extender=$extender_port_b; admin=$admin_port_b ;;
  # c: the API server through 127.0.0.1:$proxy_port, a proxy the watch-cut scenarios run
  # (directly with C_DIRECT=1: a third replica for the quota scenarios).
  c) pidfile="$replica_c_pidfile"; log="$logs/gpu-admission-c.log"; port=$webhook_port_c; extender=$extender_port_c; admin=$admin_port_c
     if [[ -z "\${C_DIRECT:-}" ]]; then
       kubeconfig_c="$work/proxied.kubeconfig"
       sed "s#https://127.0.0.1:$api_port#https://127.0.0.1:$proxy_port#" "$serve_kubeconfig" >"\$kubeconfig_c"
     fi ;;
  *) echo "usage: \$0 start|stop|kill [a|b|c]" >&2; exit 2 ;;
esac
case "\${1:-}" in
  start)
    if [[ -f "\$pidfile" ]] && kill -0 "\$(cat "\$pidfile")" 2>/dev/null; then
      echo "gpu-admission is already running (pid \$(cat "\$pidfile"))" >&2; exit 1
    fi
    echo "=== start \$(date -u +%FT%TZ)" >>"\$log"
    NO_COLOR=1 "$gpu_admission" serve --kubeconfig "\${REPLICA_KUBECONFIG:-\${kubeconfig_c:-$serve_kubeconfig}}" \\
      --address 127.0.0.1:\$port --extender-address 127.0.0.1:\$extender \\
      --admin-address 127.0.0.1:\$admin --client-ca "$pki/webhook-client-ca.crt" \\
      --tls-cert "$work/extender-certs/tls.crt" --tls-key "$work/extender-certs/tls.key" \\
      --tls-reload-interval 1s \\
      --config "\${GPU_ADMISSION_CONFIG:-$config}" --log-level $log_level \\
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
  kill)
    # SIGKILL: a crash, nothing drained.
    pid="\$(cat "\$pidfile")"
    kill -KILL "\$pid"
    for _ in \$(seq 1 100); do kill -0 "\$pid" 2>/dev/null || break; sleep 0.1; done
    rm -f "\$pidfile"
    ;;
  *) echo "usage: \$0 start|stop|kill [a|b]" >&2; exit 2 ;;
esac
EOF
}

cp_start_scheduler() { # cp_start_scheduler CONFIG EXTRA_ARGS... (e.g. --v=2)
  cp_daemon kube-scheduler "$logs/kube-scheduler.log" "curl -fsSk https://127.0.0.1:$sched_port/readyz" \
    "$k8s_bin/kube-scheduler" --config="$1" \
    --bind-address=127.0.0.1 --secure-port="$sched_port" --cert-dir="$work/scheduler-certs" \
    --authentication-kubeconfig="$kubeconfig" --authorization-kubeconfig="$kubeconfig" \
    "${@:2}"
}

# kube-controller-manager from the same build, so Jobs, ReplicaSets, StatefulSets, the
# garbage collector, namespaces and ResourceClaimTemplates work as in a cluster. Two
# controllers stay off: the node lifecycle controller (the nodes are API objects without a
# kubelet: it would taint them unreachable and evict their pods) and the pod garbage
# collector (it deletes pods bound to nodes a test has removed or never made).
cp_start_controller_manager() { # cp_start_controller_manager EXTRA_ARGS...
  "$k8s_bin/kube-controller-manager" \
    --kubeconfig="$kubeconfig" \
    --authentication-kubeconfig="$kubeconfig" --authorization-kubeconfig="$kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="$kcm_port" --cert-dir="$work/kcm-certs" \
    --leader-elect=false --use-service-account-credentials=false \
    --service-account-private-key-file="$pki/sa.key" --root-ca-file="$pki/ca.crt" \
    --controllers='*,-node-lifecycle-controller,-pod-garbage-collector-controller' \
    "$@" >"$logs/kube-controller-manager.log" 2>&1 &
  pids+=($!)
  wait_ready kube-controller-manager "$!" "$logs/kube-controller-manager.log" \
    curl -fsSk "https://127.0.0.1:$kcm_port/healthz"
}

cp_volcano_binaries() {
  say "building or reusing Volcano's vc-scheduler (hack/e2e/build-volcano.sh)"
  volcano_dir="$(bash "$repo/hack/e2e/build-volcano.sh" 2> >(tee "$logs/build-volcano.log" >&2) | tail -n1)" ||
    die "building vc-scheduler failed (hack/e2e/build-volcano.sh; log: $logs/build-volcano.log)"
  [[ -x "$volcano_dir/bin/vc-scheduler" ]] || die "hack/e2e/build-volcano.sh did not produce $volcano_dir/bin/vc-scheduler"
  volcano_version="$("$volcano_dir/bin/vc-scheduler" --version 2>/dev/null | awk '/^Version:/ {print $2}')"
  say "Volcano vc-scheduler ${volcano_version}"
}

cp_prometheus_binaries() {
  say "building or reusing Prometheus (hack/e2e/build-prometheus.sh)"
  prometheus_dir="$(bash "$repo/hack/e2e/build-prometheus.sh" 2> >(tee "$logs/build-prometheus.log" >&2) | tail -n1)" ||
    die "building Prometheus failed (hack/e2e/build-prometheus.sh; log: $logs/build-prometheus.log)"
  [[ -x "$prometheus_dir/bin/prometheus" && -x "$prometheus_dir/bin/promtool" ]] ||
    die "hack/e2e/build-prometheus.sh did not produce $prometheus_dir/bin/{prometheus,promtool}"
  say "$("$prometheus_dir/bin/prometheus" --version 2>&1 | head -n1)"
}

# Server-side apply: Volcano's CRDs carry large OpenAPI schemas (no last-applied annotation).
cp_install_volcano_crds() {
  "${kubectl[@]}" apply --server-side -f "$volcano_dir/crd" >"$logs/kubectl-volcano.log" 2>&1 ||
    { cat "$logs/kubectl-volcano.log" >&2; die "installing Volcano's CRDs failed"; }
  "${kubectl[@]}" wait --for condition=Established --timeout=60s -f "$volcano_dir/crd" \
    >>"$logs/kubectl-volcano.log" 2>&1 ||
    { cat "$logs/kubectl-volcano.log" >&2; die "Volcano's CRDs were not Established within 60s"; }
  say "Volcano CRDs installed ($(cd "$volcano_dir/crd" && echo *.yaml))"
}

# vc-scheduler's extender plugin calls with Go's default HTTP client, which trusts the
# system roots only: SSL_CERT_FILE=CA makes it trust gpu-admission's serving CA (and
# nothing else: vc-scheduler's own API client takes its CA from the kubeconfig).
cp_start_volcano() { # cp_start_volcano CONF CA EXTRA_ARGS...
  free_port volcano_healthz_port
  SSL_CERT_FILE="$2" "$volcano_dir/bin/vc-scheduler" --kubeconfig="$kubeconfig" \
    --scheduler-conf="$1" --leader-elect=false \
    --enable-healthz --healthz-address="127.0.0.1:$volcano_healthz_port" \
    --cache-dump-dir="$work" \
    "${@:3}" >"$logs/vc-scheduler.log" 2>&1 &
  pids+=($!)
  wait_ready vc-scheduler "$!" "$logs/vc-scheduler.log" \
    curl -fsS "http://127.0.0.1:$volcano_healthz_port/healthz"
}

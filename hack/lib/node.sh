# A real node for the end-to-end cluster (docs/e2e.md, "The real node"): kubelet from the
# same Kubernetes build as the control plane, Debian's containerd 1.6 and runc 1.1 as its
# container runtime, and a bridge CNI network (Debian's containernetworking-plugins) whose
# pod addresses the API server, on the same host, reaches directly. No registry: images are
# OCI archives imported into containerd (`imagePullPolicy: Never` or `IfNotPresent`).
#
# Sourced after hack/lib/control-plane.sh (it uses $work, $logs, $pids, $kubeconfig,
# $k8s_bin, free_port, say, die, wait_ready). Functions:
#   node_packages                 installs containerd, runc, the CNI plugins and umoci (apt) if missing
#   node_pause_image              the sandbox image, built from the Kubernetes module's
#                                 pause.c (static) and cached: $pause_archive
#   node_start NAME BASE:ARCHIVE... containerd + kubelet as node NAME, its address the
#                                 host's (the kubelet refuses a loopback node IP), the
#                                 images imported, waits for the node to be Ready
#   node_stop                     kubelet, the pods' containers, containerd; unmounts
#
# Facts of this VM the set-up leans on: cgroup v1 (hybrid), so the kubelet runs with
# `failCgroupV1: false` and `cgroupDriver: cgroupfs` (crun refuses hybrid cgroups; runc
# works); the kernel refuses a negative oom_score_adj even to root, so containerd's CRI
# plugin has `restrict_oom_score_adj = true`. Needs root.

node_pause_version=3.10.2

node_packages() {
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  [[ -x /usr/lib/cni/bridge ]] || missing+=(containernetworking-plugins)
  # The node's images (pause, gpu-admission's, the scheduler's) are packed by umoci.
  command -v umoci >/dev/null || missing+=(umoci)
  ((${#missing[@]} == 0)) && return 0
  say "installing ${missing[*]} (apt)"
  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}"; } \
    >"$logs/apt-node.log" 2>&1 || die "apt-get install ${missing[*]} failed (log: $logs/apt-node.log)"
}

# The pause image: Kubernetes' own pause.c from the module cache, linked statically, in an
# OCI archive named registry.k8s.io/pause:$node_pause_version.
node_pause_image() {
  local cache="${GPU_ADMISSION_CACHE:-$HOME/.cache/gpu-admission}/node"
  pause_archive="$cache/pause-$node_pause_version-oci.tar"
  [[ -s "$pause_archive" ]] && return 0
  local source build
  source="$(cd "$repo/hack/e2e" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)/build/pause/linux/pause.c"
  [[ -f "$source" ]] || die "no pause.c at $source (the Kubernetes module is fetched by hack/e2e/build.sh)"
  command -v umoci >/dev/null || die "umoci is not installed (apt-get install umoci)"
  build="$(mktemp -d "$work/pause.XXXXXX")"
  mkdir -p "$cache"
  gcc -Os -static -DVERSION="v$node_pause_version" -o "$build/pause" "$source" ||
    die "could not compile pause.c (gcc, static glibc)"
  (
    cd "$build"
    umoci init --layout oci
    umoci new --image "oci:$node_pause_version"
    umoci unpack --image "oci:$node_pause_version" bundle >/dev/null
    install -m 0755 pause bundle/rootfs/pause
    umoci repack --image "oci:$node_pause_version" bundle
    umoci config --image "oci:$node_pause_version" --os linux --architecture amd64 \
      --config.user 65535:65535 --config.entrypoint /pause \
      --manifest.annotation "org.opencontainers.image.ref.name=registry.k8s.io/pause:$node_pause_version"
    umoci gc --layout oci
    tar -C oci -cf pause-oci.tar .
  ) >"$logs/pause-image.log" 2>&1 || die "could not build the pause image (log: $logs/pause-image.log)"
  mv "$build/pause-oci.tar" "$pause_archive"
  rm -rf "$build"
}

node_start() { # node_start NAME IMAGE_ARCHIVE:BASE_NAME...
  node_name=$1
  shift
  [[ $EUID == 0 ]] || die "the real node needs root (containerd, runc, CNI, mounts)"
  node_dir="$work/node"
  node_socket="$node_dir/containerd.sock"
  mkdir -p "$node_dir"/{cni,kubelet,manifests}
  cat >"$node_dir/containerd.toml" <<EOF
version = 2
root = "$node_dir/containerd-root"
state = "$node_dir/containerd-state"
[grpc]
  address = "$node_socket"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "registry.k8s.io/pause:$node_pause_version"
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$node_dir/cni"
EOF
  # A bridge of its own, addresses kept in the run's directory (not /var/lib/cni).
  cat >"$node_dir/cni/10-e2e.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "gpu-admission-e2e", "plugins": [
  {"type": "bridge", "bridge": "gae2e0", "isGateway": true, "ipMasq": true,
   "ipam": {"type": "host-local", "dataDir": "$node_dir/cni-ipam",
            "ranges": [[{"subnet": "10.88.0.0/16"}]], "routes": [{"dst": "0.0.0.0/0"}]}},
  {"type": "portmap", "capabilities": {"portMappings": true}}]}
EOF
  containerd --config "$node_dir/containerd.toml" >"$logs/containerd.log" 2>&1 &
  node_containerd_pid=$!
  wait_ready containerd "$node_containerd_pid" "$logs/containerd.log" \
    ctr --address "$node_socket" version
  local image
  for image in "registry.k8s.io/pause:$pause_archive" "$@"; do
    local base=${image%%:*} archive=${image#*:}
    ctr --address "$node_socket" -n k8s.io images import --base-name "$base" "$archive" \
      >>"$logs/containerd-import.log" 2>&1 || die "importing $archive into containerd failed (log: $logs/containerd-import.log)"
  done
  local port healthz
  free_port port
  free_port healthz
  node_address
  cat >"$node_dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
containerRuntimeEndpoint: unix://$node_socket
address: $node_ip
port: $port
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $healthz
# A test node: the API server calls it without a client certificate (kubectl logs, exec).
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
staticPodPath: $node_dir/manifests
failSwapOn: false
cgroupsPerQOS: false
enforceNodeAllocatable: []
# A test node on a shared disk: never evict for disk or memory pressure, never GC images.
evictionHard: {memory.available: "0%", nodefs.available: "0%", imagefs.available: "0%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
resolvConf: /etc/resolv.conf
EOF
  # Its readiness after a restart is its health endpoint: the node's Ready condition stays
  # True through a short restart.
  cp_daemon kubelet "$logs/kubelet.log" "curl -fsS http://127.0.0.1:$healthz/healthz" \
    "$k8s_bin/kubelet" --config "$node_dir/kubelet.yaml" --kubeconfig "$kubeconfig" \
    --hostname-override "$node_name" --node-ip "$node_ip" \
    --root-dir "$node_dir/kubelet" --cert-dir "$node_dir/kubelet/pki" --v=1
  wait_ready "node $node_name" "$daemon_pid" "$logs/kubelet.log" node_is_ready "$node_name"
  # The kubelet registers with the taint node.kubernetes.io/not-ready, which the node
  # lifecycle controller lifts once the node is Ready; that controller is off in this
  # cluster (it would evict the pods of the kubelet-less API nodes), so lift it here.
  "$k8s_bin/kubectl" --kubeconfig "$kubeconfig" taint nodes "$node_name" \
    node.kubernetes.io/not-ready:NoSchedule- >>"$logs/kubectl.log" 2>&1 || true
}

# node_address: $node_ip, the address of the host's default route: the node's InternalIP,
# where the API server calls the kubelet (kubectl logs, exec), and the address the API
# server advertises to pods (the `kubernetes` Service's endpoint).
node_address() {
  node_ip="$(ip -4 route get 1.1.1.1 2>/dev/null | awk '{for (i = 1; i < NF; i++) if ($i == "src") print $(i + 1)}')"
  [[ -n "$node_ip" ]] || node_ip="$(hostname -I | awk '{print $1}')"
  [[ -n "$node_ip" ]] || die "no IPv4 address for the node (ip -4 route get, hostname -I)"
}

# node_cluster_services: what pods of an install from deploy/ need of the cluster around
# them: kube-proxy (iptables mode: Services by ClusterIP, the `kubernetes` Service
# included) and a kube-scheduler with the default profile (deploy/'s own pods use it).
node_cluster_services() {
  local health metrics sched
  free_port health
  free_port metrics
  free_port sched
  "$k8s_bin/kube-proxy" --kubeconfig "$kubeconfig" --hostname-override "$node_name" \
    --proxy-mode iptables --cluster-cidr 10.88.0.0/16 \
    --healthz-bind-address "127.0.0.1:$health" --metrics-bind-address "127.0.0.1:$metrics" \
    >"$logs/kube-proxy.log" 2>&1 &
  node_proxy_pid=$!
  pids+=("$node_proxy_pid")
  wait_ready kube-proxy "$node_proxy_pid" "$logs/kube-proxy.log" curl -fsS "http://127.0.0.1:$health/healthz"
  cat >"$node_dir/default-scheduler.yaml" <<EOF
apiVersion: kubescheduler.config.k8s.io/v1
kind: KubeSchedulerConfiguration
clientConnection:
  kubeconfig: $kubeconfig
leaderElection:
  leaderElect: false
EOF
  "$k8s_bin/kube-scheduler" --config="$node_dir/default-scheduler.yaml" \
    --bind-address=127.0.0.1 --secure-port="$sched" --cert-dir="$node_dir/default-scheduler-certs" \
    --authentication-kubeconfig="$kubeconfig" --authorization-kubeconfig="$kubeconfig" \
    >"$logs/kube-scheduler-default.log" 2>&1 &
  pids+=($!)
  wait_ready "kube-scheduler (default profile)" "$!" "$logs/kube-scheduler-default.log" \
    curl -fsSk "https://127.0.0.1:$sched/readyz"
}

node_is_ready() {
  [[ "$("$k8s_bin/kubectl" --kubeconfig "$kubeconfig" get node "$1" \
    -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]
}

node_stop() {
  [[ -n "${node_dir:-}" ]] || return 0
  local pid
  cp_daemon_stop kubelet
  # The pods' shims (and their containers) outlive the kubelet and containerd.
  pkill -KILL -f "containerd-shim-runc-v2 .*-address $node_socket" 2>/dev/null
  for pid in ${node_containerd_pid:-}; do
    kill -TERM "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  done
  mount | awk -v d="$node_dir/" 'index($3, d) == 1 {print $3}' | sort -r | xargs -r -n1 umount -l 2>/dev/null
  rm -rf "$node_dir/containerd-root" "$node_dir/containerd-state" "$node_dir/kubelet" 2>/dev/null
  node_dir=
}

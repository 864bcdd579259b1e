#!/usr/bin/env bash
# Builds the Kubernetes binaries the end-to-end tests run — kube-apiserver,
# kube-scheduler, kube-controller-manager, kubectl, the kubelet of the real node, and etcd, at the versions
# hack/e2e/go.mod pins — into
#   ${GPU_ADMISSION_CACHE:-~/.cache/gpu-admission}/k8s-<version>/bin/
# and reuses them when they are already there (the cache is keyed by the Kubernetes
# version, and a checksum of go.mod/go.sum: editing the pins rebuilds).
#
# Prints the bin directory as its last line of stdout; progress goes to stderr.
# Needs Go (>= the go line of go.mod) and the Go module proxy; nothing else.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cd "$here"

K8S_VERSION="v1.36.3"
ETCD_VERSION="v3.6.8"

# The pins in go.mod must agree with the versions the cache directory is named after.
grep -q "k8s.io/kubernetes ${K8S_VERSION}\$" go.mod ||
  { echo "build.sh: go.mod does not require k8s.io/kubernetes ${K8S_VERSION}; update K8S_VERSION" >&2; exit 1; }
grep -q "go.etcd.io/etcd/server/v3 ${ETCD_VERSION}\$" go.mod ||
  { echo "build.sh: go.mod does not require go.etcd.io/etcd/server/v3 ${ETCD_VERSION}; update ETCD_VERSION" >&2; exit 1; }

cache_root="${GPU_ADMISSION_CACHE:-$HOME/.cache/gpu-admission}"
bin="${cache_root}/k8s-${K8S_VERSION}/bin"
stamp="${bin}/.built-from"
# Bump RECIPE when the way the binaries are built changes (flags), to rebuild caches.
RECIPE=2
want_stamp="recipe ${RECIPE} k8s ${K8S_VERSION} etcd ${ETCD_VERSION} $(cat go.mod go.sum | sha256sum | cut -c1-16)"

binaries=(kube-apiserver kube-scheduler kube-controller-manager kubectl kubelet kube-proxy etcd)
declare -A pkg=(
  [kube-apiserver]=k8s.io/kubernetes/cmd/kube-apiserver
  [kube-scheduler]=k8s.io/kubernetes/cmd/kube-scheduler
  [kube-controller-manager]=k8s.io/kubernetes/cmd/kube-controller-manager
  [kubectl]=k8s.io/kubernetes/cmd/kubectl
  [kubelet]=k8s.io/kubernetes/cmd/kubelet
  [kube-proxy]=k8s.io/kubernetes/cmd/kube-proxy
  [etcd]=go.etcd.io/etcd/server/v3
)

have_all=1
for b in "${binaries[@]}"; do [[ -x "$bin/$b" ]] || have_all=0; done
if [[ $have_all == 1 && -f "$stamp" && "$(cat "$stamp")" == "$want_stamp" ]]; then
  echo "build.sh: reusing cached binaries in $bin ($want_stamp)" >&2
  echo "$bin"
  exit 0
fi

if ! command -v go >/dev/null; then
  echo "build.sh: 'go' is not installed; the e2e control plane is built from source with Go" >&2
  exit 1
fi

mkdir -p "$bin"
# Same recipe and pins: only the binaries missing from the cache are built (a binary added
# to the list does not rebuild the others).
same_recipe=0
[[ -f "$stamp" && "$(cat "$stamp")" == "$want_stamp" ]] && same_recipe=1
rm -f "$stamp"
staging="$(mktemp -d "${bin}/.build.XXXXXX")"
trap 'rm -rf "$staging"' EXIT

export GOFLAGS="-trimpath -mod=readonly ${GOFLAGS:-}"
export CGO_ENABLED=0
# Kubernetes binaries learn their version from -X flags (as its own hack/lib/version.sh
# sets them); without them they report v0.0.0-master, which also confuses the
# apiserver's compatibility-version logic.
minor="${K8S_VERSION#v1.}"; minor="${minor%%.*}"
v=k8s.io/component-base/version
k8s_ldflags="-s -w -X $v.gitVersion=${K8S_VERSION} -X $v.gitMajor=1 -X $v.gitMinor=${minor} -X $v.gitTreeState=clean"
start=$SECONDS
echo "build.sh: building ${binaries[*]} (Kubernetes ${K8S_VERSION}, etcd ${ETCD_VERSION}) with $(go version | cut -d' ' -f3) into $bin; a fresh build takes several minutes" >&2
for b in "${binaries[@]}"; do
  if [[ $same_recipe == 1 && -x "$bin/$b" ]]; then
    continue
  fi
  t=$SECONDS
  ldflags="-s -w"
  [[ $b == etcd ]] || ldflags="$k8s_ldflags"
  if ! nice -n 19 go build -ldflags="$ldflags" -o "$staging/$b" "${pkg[$b]}"; then
    echo "build.sh: 'go build ${pkg[$b]}' failed (see the compiler output above)" >&2
    exit 1
  fi
  mv -f "$staging/$b" "$bin/$b"
  echo "build.sh: built $b in $((SECONDS - t))s" >&2
done
echo "$want_stamp" >"$stamp"
echo "build.sh: all binaries built in $((SECONDS - start))s" >&2
echo "$bin"

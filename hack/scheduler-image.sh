#!/usr/bin/env bash
# Builds the GPU scheduler's kube-scheduler image without a container engine, from the
# kube-scheduler binary hack/e2e/build.sh builds (the same Kubernetes build as the test
# control plane), under the name deploy/50-gpu-scheduler.yaml runs:
#
#   bash hack/scheduler-image.sh      # prints where the archive is and its size
#
# What goes in, as in the upstream image (a distroless static base and the binary):
#   /usr/local/bin/kube-scheduler   statically linked (CGO_ENABLED=0)
#   /etc/passwd, /etc/group with root and nonroot (65532), /tmp (1777); no shell.
# Config: PATH=/usr/local/bin:/usr/bin:/bin (deploy/ runs `command: [kube-scheduler, ...]`),
# user 65532:65532 (deploy/ sets it in the pod's securityContext anyway).
#
# The tag deploy/ names must be the build's version: the image would otherwise carry a
# scheduler of another version under that name. Output: an OCI archive in
# $GPU_ADMISSION_IMAGE_DIR (default ~/.cache/gpu-admission/image)/kube-scheduler-oci.tar, to
# load with `ctr -n k8s.io images import --base-name registry.k8s.io/kube-scheduler`.
# Needs umoci (Debian package `umoci`) and python3.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
cd "$repo"

# shellcheck source=hack/lib/oci.sh
source "$repo/hack/lib/oci.sh"
say() { echo "scheduler-image: $*" >&2; }
die() { echo "scheduler-image: FAILED: $*" >&2; exit 1; }
command -v umoci >/dev/null || die "umoci is not installed (apt-get install umoci)"

image="$(awk '/image: .*\/kube-scheduler:/ {print $2; exit}' deploy/50-gpu-scheduler.yaml)"
[[ -n "$image" ]] || die "deploy/50-gpu-scheduler.yaml names no kube-scheduler image"
tag="${image##*:}"

k8s_bin="$(bash hack/e2e/build.sh | tail -n1)" || die "hack/e2e/build.sh failed"
binary="$k8s_bin/kube-scheduler"
version="$("$binary" --version | awk '{print $2}')"
[[ "$version" == "$tag" ]] ||
  die "deploy/ names $image but hack/e2e/build.sh builds kube-scheduler $version: change one of them"

out="${GPU_ADMISSION_IMAGE_DIR:-$HOME/.cache/gpu-admission/image}"
archive="$out/kube-scheduler-oci.tar"
work="$(mktemp -d "${TMPDIR:-/tmp}/kube-scheduler-image.XXXXXX")"
trap 'rm -rf "$work"' EXIT
layout="$work/oci"

rootfs="$work/rootfs"
mkdir -p "$rootfs"/{usr/local/bin,etc,tmp}
chmod 1777 "$rootfs/tmp"
install -m 0755 "$binary" "$rootfs/usr/local/bin/kube-scheduler"
printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' \
  >"$rootfs/etc/passwd"
printf 'root:x:0:\nnonroot:x:65532:\n' >"$rootfs/etc/group"

oci_image "$rootfs" "$layout" "$image" "$archive" \
  --config.user 65532:65532 --config.env PATH=/usr/local/bin:/usr/bin:/bin
say "$image (kube-scheduler $version): $archive, $(du -m "$archive" | cut -f1) MB"
echo "$archive"

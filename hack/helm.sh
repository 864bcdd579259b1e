#!/usr/bin/env bash
# Prints the path of a helm binary, building it through the Go module proxy the first
# time and reusing ~/.cache/gpu-admission/helm-<version>/helm afterwards (CI caches it).
# HELM_VERSION overrides the pinned version; HELM (a path) skips the build entirely.
set -euo pipefail

if [[ -n "${HELM:-}" ]]; then
  echo "$HELM"
  exit 0
fi
version="${HELM_VERSION:-v3.22.0}"
dir="${XDG_CACHE_HOME:-$HOME/.cache}/gpu-admission/helm-${version}"
if [[ -x "$dir/helm" ]]; then
  echo "$dir/helm"
  exit 0
fi
if ! command -v go >/dev/null; then
  echo "hack/helm.sh: go is needed to build helm ${version}" >&2
  exit 1
fi
echo "hack/helm.sh: building helm ${version} into ${dir} (once)" >&2
mkdir -p "$dir"
GOBIN="$dir" GOFLAGS=-mod=mod CGO_ENABLED=0 nice -n 10 \
  go install "helm.sh/helm/v3/cmd/helm@${version}" >&2
echo "$dir/helm"

#!/usr/bin/env bash
# Builds Volcano's scheduler (vc-scheduler, volcano.sh/volcano/cmd/scheduler) for the
# end-to-end tests, from the Go module proxy, into
#   ${GPU_ADMISSION_CACHE:-~/.cache/gpu-admission}/volcano-<version>/bin/vc-scheduler
# next to the CRDs it needs (crd/, copied from the same module source), and reuses them
# when they are already there (keyed by the Volcano version and this recipe).
#
# Prints the volcano-<version> directory as its last line of stdout; progress goes to
# stderr. Needs Go and the Go module proxy; nothing else.
#
# Why not a `require` in hack/e2e/go.mod like the Kubernetes binaries: Volcano's go.mod
# pins its Kubernetes libraries with replace directives (v0.34, where kube-apiserver is
# v0.36), and replace directives only count in the main module. So the module source is
# copied to a temporary directory and built there as the main module, its own
# go.mod/go.sum honoured.
#
# Since v1.14 that go.mod also replaces volcano.sh/apis with ./staging/src/volcano.sh/apis,
# a nested module, which module zips leave out; it is pointed at the published
# volcano.sh/apis release made from that staging directory instead (VOLCANO_APIS_VERSION).
# The module proxy has not every Volcano release: v1.14.1 is the newest whose apis
# release is there too (v1.15.x stages apis changes not published as a module).
set -euo pipefail

VOLCANO_VERSION="v1.14.1"
VOLCANO_APIS_VERSION="v1.14.0"
# Bump RECIPE when the way the binary is built changes (flags), to rebuild caches.
RECIPE=1

cache_root="${GPU_ADMISSION_CACHE:-$HOME/.cache/gpu-admission}"
out="${cache_root}/volcano-${VOLCANO_VERSION}"
stamp="${out}/.built-from"
want_stamp="recipe ${RECIPE} volcano ${VOLCANO_VERSION} apis ${VOLCANO_APIS_VERSION}"

if [[ -x "$out/bin/vc-scheduler" && -d "$out/crd" && -f "$stamp" && "$(cat "$stamp")" == "$want_stamp" ]]; then
  echo "build-volcano.sh: reusing $out/bin/vc-scheduler ($want_stamp)" >&2
  echo "$out"
  exit 0
fi

if ! command -v go >/dev/null; then
  echo "build-volcano.sh: 'go' is not installed; vc-scheduler is built from source with Go" >&2
  exit 1
fi

start=$SECONDS
mkdir -p "$out"
rm -f "$stamp"
staging="$(mktemp -d "${out}/.build.XXXXXX")"
trap 'chmod -R u+w "$staging" 2>/dev/null; rm -rf "$staging"' EXIT

# Outside any module (the temp dir), so hack/e2e/go.mod plays no part.
t=$SECONDS
src="$(cd "$staging" && GOFLAGS=-mod=mod go mod download -json "volcano.sh/volcano@${VOLCANO_VERSION}" |
  sed -nE 's/^[[:space:]]*"Dir": "(.*)",?$/\1/p')"
[[ -n "$src" && -f "$src/go.mod" ]] ||
  { echo "build-volcano.sh: 'go mod download volcano.sh/volcano@${VOLCANO_VERSION}' gave no source directory" >&2; exit 1; }
echo "build-volcano.sh: volcano.sh/volcano@${VOLCANO_VERSION} source in $src ($((SECONDS - t))s)" >&2

cp -R "$src" "$staging/volcano"
chmod -R u+w "$staging/volcano" # the module cache is read-only
cd "$staging/volcano"
go mod edit -replace "volcano.sh/apis=volcano.sh/apis@${VOLCANO_APIS_VERSION}"

# -mod=mod: go.sum gains the lines of the replacement apis module (verified against the
# checksum database as usual); nothing else changes.
export GOFLAGS="-trimpath -mod=mod"
export CGO_ENABLED=0
v=volcano.sh/volcano/pkg/version
ldflags="-s -w -X $v.Version=${VOLCANO_VERSION} -X $v.GitSHA=module-proxy"
t=$SECONDS
echo "build-volcano.sh: building vc-scheduler (Volcano ${VOLCANO_VERSION}, apis ${VOLCANO_APIS_VERSION}) with $(go version | cut -d' ' -f3); a fresh build takes several minutes" >&2
if ! nice -n 19 go build -ldflags="$ldflags" -o "$staging/vc-scheduler" ./cmd/scheduler; then
  echo "build-volcano.sh: 'go build ./cmd/scheduler' failed (see the compiler output above)" >&2
  exit 1
fi
echo "build-volcano.sh: built vc-scheduler in $((SECONDS - t))s" >&2

# The CRDs vc-scheduler lists and watches, from the same source: PodGroup and Queue
# (scheduling.volcano.sh), HyperNode (topology), Numatopology (nodeinfo), NodeShard
# (shard); not Volcano's Job, Command or colocation CRDs, which only its controllers use.
rm -rf "$out/crd" "$out/bin"
mkdir -p "$out/bin" "$out/crd"
for group in scheduling topology nodeinfo shard; do
  cp "$src/config/crd/volcano/bases/${group}.volcano.sh_"*.yaml "$out/crd/"
done
chmod -R u+w "$out/crd"
mv -f "$staging/vc-scheduler" "$out/bin/vc-scheduler"
echo "$want_stamp" >"$stamp"
echo "build-volcano.sh: done in $((SECONDS - start))s" >&2
echo "$out"

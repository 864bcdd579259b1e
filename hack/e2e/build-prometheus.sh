#!/usr/bin/env bash
# Builds Prometheus (the server and promtool) for the end-to-end tests, from the Go module
# proxy, into
#   ${GPU_ADMISSION_CACHE:-~/.cache/gpu-admission}/prometheus-<version>/bin/{prometheus,promtool}
# and reuses them when they are already there (keyed by the version and this recipe).
#
# Prints the prometheus-<version> directory as its last line of stdout; progress goes to
# stderr. Needs Go and the Go module proxy; nothing else. A fresh build (module download
# and compile of both commands) takes a few minutes on 2 cores (docs/e2e.md).
#
# Prometheus 3.x is published as the Go module github.com/prometheus/prometheus
# v0.3XX.Y (3.16.0 is v0.316.0). Its go.mod has no replace directives, so `go install
# module@version` builds it as is. Without the `builtinassets` build tag the web UI is
# not embedded (it is built with npm, which the module zip does not carry): the HTTP API,
# which is all the tests use, is there either way.
set -euo pipefail

PROMETHEUS_VERSION="3.16.0"
PROMETHEUS_MODULE_VERSION="v0.316.0"
# Bump RECIPE when the way the binaries are built changes (flags), to rebuild caches.
RECIPE=1
GO_TAGS="remove_all_sd"

cache_root="${GPU_ADMISSION_CACHE:-$HOME/.cache/gpu-admission}"
out="${cache_root}/prometheus-${PROMETHEUS_VERSION}"
stamp="${out}/.built-from"
want_stamp="recipe ${RECIPE} prometheus ${PROMETHEUS_MODULE_VERSION} tags ${GO_TAGS}"

if [[ -x "$out/bin/prometheus" && -x "$out/bin/promtool" && -f "$stamp" && "$(cat "$stamp")" == "$want_stamp" ]]; then
  echo "build-prometheus.sh: reusing $out/bin/prometheus ($want_stamp)" >&2
  echo "$out"
  exit 0
fi

if ! command -v go >/dev/null; then
  echo "build-prometheus.sh: 'go' is not installed; Prometheus is built from source with Go" >&2
  exit 1
fi

start=$SECONDS
mkdir -p "$out"
rm -f "$stamp"
staging="$(mktemp -d "${out}/.build.XXXXXX")"
trap 'rm -rf "$staging"' EXIT

# Outside any module (the temp dir), so hack/e2e/go.mod plays no part.
cd "$staging"
export GOFLAGS="-trimpath"
export CGO_ENABLED=0
export GOBIN="$staging/bin"
v=github.com/prometheus/common/version
ldflags="-s -w -X $v.Version=${PROMETHEUS_VERSION} -X $v.Revision=module-proxy -X $v.Branch=${PROMETHEUS_MODULE_VERSION}"
m=github.com/prometheus/prometheus
echo "build-prometheus.sh: building prometheus and promtool (${m}@${PROMETHEUS_MODULE_VERSION}) with $(go version | cut -d' ' -f3); a fresh build takes 4-8 minutes" >&2
if ! nice -n 19 go install -tags "$GO_TAGS" -ldflags="$ldflags" \
  "$m/cmd/prometheus@${PROMETHEUS_MODULE_VERSION}" "$m/cmd/promtool@${PROMETHEUS_MODULE_VERSION}"; then
  echo "build-prometheus.sh: 'go install $m/cmd/{prometheus,promtool}@${PROMETHEUS_MODULE_VERSION}' failed (see the compiler output above)" >&2
  exit 1
fi
"$GOBIN/prometheus" --version >&2

rm -rf "$out/bin"
mv -f "$GOBIN" "$out/bin"
echo "$want_stamp" >"$stamp"
echo "build-prometheus.sh: done in $((SECONDS - start))s" >&2
echo "$out"

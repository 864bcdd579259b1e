#!/usr/bin/env bash
# Lints the chart and checks that its default rendering is the same install as deploy/.
# Both sides are parsed as YAML and compared object by object (keyed by kind, namespace
# and name), after normalising what is meant to differ:
#   - Helm's bookkeeping labels (app.kubernetes.io/instance, version, managed-by,
#     helm.sh/chart) and annotations (helm.sh/*, checksum/*: pods roll on config change);
#   - the Namespace object: the chart is installed with `--namespace gpu-admission
#     --create-namespace` instead;
#   - comments and key order, and the embedded config files (ConfigMap data *.yaml are
#     compared parsed).
# The certificate Job is a post-install/post-upgrade hook in the chart (a Job's pod
# template is immutable, so each upgrade runs a new one); only its hook annotations differ.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! python3 -c "import yaml" 2>/dev/null; then
  echo "hack/check-chart.sh needs python3 with PyYAML (apt-get install python3-yaml)" >&2
  exit 1
fi
helm="$(bash hack/helm.sh)"
chart=charts/gpu-admission

echo "== helm lint"
"$helm" lint "$chart"
for mode in certManager "secret --set certificates.caBundle=Q0EK"; do
  # shellcheck disable=SC2086
  "$helm" lint "$chart" --quiet --set certificates.mode=$mode \
    --set metrics.serviceMonitor.enabled=true --set metrics.prometheusRule.enabled=true >/dev/null
done
"$helm" lint "$chart" --quiet --set gpuScheduler.enabled=false --set metrics.prometheusRule.enabled=true >/dev/null
"$helm" lint "$chart" --quiet --set grafana.dashboard.enabled=true >/dev/null
# The options off the default path: mutual TLS (a Secret or a ConfigMap), no NetworkPolicy,
# an existing PriorityClass.
"$helm" lint "$chart" --quiet --set webhooks.clientCA.enabled=true \
  --set webhooks.clientCA.secretName=apiserver-client-ca >/dev/null
"$helm" lint "$chart" --quiet --set webhooks.clientCA.enabled=true \
  --set webhooks.clientCA.configMapName=apiserver-client-ca --set networkPolicy.enabled=false \
  --set priorityClass.create=false --set priorityClass.name=system-cluster-critical >/dev/null
if "$helm" template gpu-admission "$chart" --set webhooks.clientCA.enabled=true >/dev/null 2>&1; then
  echo "webhooks.clientCA.enabled without a secretName or configMapName should be refused" >&2
  exit 1
fi

echo "== helm template (defaults) vs deploy/"
rendered="$(mktemp)"
trap 'rm -f "$rendered"' EXIT
"$helm" template gpu-admission "$chart" --namespace gpu-admission --include-crds >"$rendered"

python3 - "$rendered" deploy <<'PY'
import pathlib, sys, yaml

HELM_LABELS = {"app.kubernetes.io/instance", "app.kubernetes.io/version",
               "app.kubernetes.io/managed-by", "helm.sh/chart"}

def normalise(obj):
    def clean_meta(meta):
        labels = meta.get("labels") or {}
        for key in HELM_LABELS:
            labels.pop(key, None)
        if not labels:
            meta.pop("labels", None)
        notes = meta.get("annotations") or {}
        for key in list(notes):
            if key.startswith("helm.sh/") or key.startswith("checksum/"):
                notes.pop(key)
        if not notes:
            meta.pop("annotations", None)
    clean_meta(obj.setdefault("metadata", {}))
    template = (obj.get("spec") or {}).get("template")
    if isinstance(template, dict):
        clean_meta(template.setdefault("metadata", {}))
    if obj.get("kind") == "ConfigMap":
        for key, value in (obj.get("data") or {}).items():
            if key.endswith(".yaml"):
                obj["data"][key] = yaml.safe_load(value)
    return obj

def key(obj):
    meta = obj["metadata"]
    return (obj["kind"], meta.get("namespace", ""), meta["name"])

def load(paths):
    out = {}
    for path in paths:
        for doc in yaml.safe_load_all(pathlib.Path(path).read_text()):
            if doc:
                out[key(doc)] = normalise(doc)
    return out

chart = load([sys.argv[1]])
deploy = load(sorted(pathlib.Path(sys.argv[2]).glob("*.yaml")))
deploy.pop(("Namespace", "", "gpu-admission"), None)  # --create-namespace

def diff(a, b, path="$"):
    if type(a) is not type(b):
        return [f"{path}: chart {a!r} != deploy {b!r}"]
    if isinstance(a, dict):
        out = []
        for k in sorted(set(a) | set(b), key=str):
            if k not in a:
                out.append(f"{path}.{k}: only in deploy/")
            elif k not in b:
                out.append(f"{path}.{k}: only in the chart")
            else:
                out += diff(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list):
        if len(a) != len(b):
            return [f"{path}: chart has {len(a)} items, deploy/ {len(b)}"]
        return [d for i, (x, y) in enumerate(zip(a, b)) for d in diff(x, y, f"{path}[{i}]")]
    return [] if a == b else [f"{path}: chart {a!r} != deploy {b!r}"]

problems = []
for k in sorted(set(chart) | set(deploy)):
    name = "/".join(p for p in k if p)
    if k not in deploy:
        problems.append(f"{name}: only in the chart")
    elif k not in chart:
        problems.append(f"{name}: only in deploy/")
    else:
        problems += [f"{name} {d}" for d in diff(chart[k], deploy[k])]
if problems:
    print("chart and deploy/ differ:", *problems, sep="\n  ")
    sys.exit(1)
print(f"ok: {len(chart)} objects, the chart's defaults match deploy/")
PY

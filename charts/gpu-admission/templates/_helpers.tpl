{{/* Names are fixed: `certs --install` and the docs refer to them; one install per cluster. */}}

{{- define "gpu-admission.labels" -}}
app.kubernetes.io/name: gpu-admission
app.kubernetes.io/instance: {{ .Release.Name }}
app.kubernetes.io/version: {{ .Chart.AppVersion | quote }}
app.kubernetes.io/managed-by: {{ .Release.Service }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version | replace "+" "_" }}
{{- end -}}

{{- define "gpu-admission.image" -}}
{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}
{{- end -}}

{{- define "gpu-admission.serviceHost" -}}
gpu-admission.{{ .Release.Namespace }}.svc
{{- end -}}

{{/* The GPU resource names, as a JSON list: vcuda-core, vcuda-memory, then the whole-GPU ones. */}}
{{- define "gpu-admission.resourceNames" -}}
{{- $r := .Values.gpuResources -}}
{{- concat (list $r.vcudaCore $r.vcudaMemory) $r.wholeGpu | toJson -}}
{{- end -}}

{{/* CEL: the pod asks for one of the GPU resources in the limits or requests of a
     container or an initContainer. The same expression as deploy/40-webhook-configurations.yaml. */}}
{{- define "gpu-admission.matchExpression" -}}
{{- $names := include "gpu-admission.resourceNames" . | fromJsonArray -}}
{{- $fields := list -}}
{{- range $field := list "limits" "requests" -}}
{{- $tests := list -}}
{{- range $name := $names -}}
{{- $tests = append $tests (printf "'%s' in c.resources.%s" $name $field) -}}
{{- end -}}
{{- $tests = append $tests (printf "c.resources.%s.exists(k, k.startsWith('%s'))" $field $.Values.gpuResources.migPrefix) -}}
{{- $fields = append $fields (printf "(has(c.resources.%s) && (%s))" $field (join " || " $tests)) -}}
{{- end -}}
{{- $c := printf "has(c.resources) && (%s)" (join " || " $fields) -}}
{{- printf "object.spec.containers.exists(c, %s) || (has(object.spec.initContainers) && object.spec.initContainers.exists(c, %s))" $c $c -}}
{{- end -}}

{{/* CEL: the ResourceClaim asks for devices (which DeviceClasses hand out GPUs is found
     at run time). The same expression as deploy/40-webhook-configurations.yaml. */}}
{{- define "gpu-admission.claimMatchExpression" -}}
has(object.spec.devices) && has(object.spec.devices.requests) && size(object.spec.devices.requests) > 0
{{- end -}}

{{/* The users that may change placement annotations (config placementWriters): the
GPU scheduler's ServiceAccount, then .Values.placementWriters (gpu-manager's). JSON. */}}
{{- define "gpu-admission.placementWriters" -}}
{{- $writers := list (printf "system:serviceaccount:%s:gpu-scheduler" .Release.Namespace) -}}
{{- range .Values.placementWriters }}{{ $writers = append $writers . }}{{ end -}}
{{- toJson $writers -}}
{{- end -}}

{{/* The users whose ResourceClaims for a pod's DRA-backed extended resources are the
pod's own GPUs (config schedulerUsers): kube-scheduler, the GPU scheduler's ServiceAccount,
then .Values.schedulerUsers (other schedulers that bind GPU pods). JSON. */}}
{{- define "gpu-admission.schedulerUsers" -}}
{{- $users := list "system:kube-scheduler" (printf "system:serviceaccount:%s:gpu-scheduler" .Release.Namespace) -}}
{{- range .Values.schedulerUsers }}{{ $users = append $users . }}{{ end -}}
{{- toJson $users -}}
{{- end -}}

{{/* gpu-admission's own identity (config queue.releasers): the GPU scheduler's
ServiceAccount, whose sidecar lets pods out of the quota queue and writes the other marks
only gpu-admission writes (holds, borrowed and reclaim annotations). JSON. */}}
{{- define "gpu-admission.queueReleasers" -}}
{{- toJson (list (printf "system:serviceaccount:%s:gpu-scheduler" .Release.Namespace)) -}}
{{- end -}}

{{/* CEL: every CREATE, and of the UPDATEs those that change a mark only gpu-admission
(or gpu-manager) writes by a user who may not write it. files/guarded-change.cel is
generated from the one list of marks in the code (src/marks.rs, whose tests hold the file
to it); its placeholders take this release's names and users here. */}}
{{- define "gpu-admission.guardedChangeExpression" -}}
{{- .Files.Get "files/guarded-change.cel" | trim
    | replace "__ANNOTATION_PREFIX__" .Values.gpuResources.annotationPrefix
    | replace "__TYPE_ANNOTATION__" .Values.typeAnnotation
    | replace "__PLACEMENT_WRITERS__" (include "gpu-admission.placementWriters" .)
    | replace "__GPU_ADMISSION_USERS__" (include "gpu-admission.queueReleasers" .) -}}
{{- end -}}

{{/* Pod labels: the Service gpu-admission-metrics selects every pod with this label. */}}
{{- define "gpu-admission.metricsLabel" -}}
gpu-admission.io/metrics: "true"
{{- end -}}

{{- define "gpu-admission.priorityClassName" -}}
{{- with .Values.priorityClass.name }}
priorityClassName: {{ . }}
{{- end }}
{{- end -}}

{{- define "gpu-admission.podSecurityContext" -}}
runAsNonRoot: true
runAsUser: 65532
runAsGroup: 65532
fsGroup: 65532
seccompProfile:
  type: RuntimeDefault
{{- end -}}

{{- define "gpu-admission.containerSecurityContext" -}}
allowPrivilegeEscalation: false
readOnlyRootFilesystem: true
capabilities:
  drop: [ALL]
{{- end -}}

{{- define "gpu-admission.probes" -}}
livenessProbe:
  httpGet:
    path: /livez
    port: metrics
  periodSeconds: 10
  failureThreshold: 3
readinessProbe:
  httpGet:
    path: /readyz
    port: metrics
  periodSeconds: 5
  failureThreshold: 2
{{- end -}}

{{- define "gpu-admission.serveArgs" -}}
- --tls-cert=/etc/gpu-admission/tls/tls.crt
- --tls-key=/etc/gpu-admission/tls/tls.key
- --config=/etc/gpu-admission/config/config.yaml
- --log-format={{ .Values.logFormat }}
{{- end -}}

{{- define "gpu-admission.validate" -}}
{{- if not (has .Values.certificates.mode (list "job" "certManager" "secret")) -}}
{{- fail "certificates.mode must be job, certManager or secret" -}}
{{- end -}}
{{- if and (eq .Values.certificates.mode "secret") (not .Values.certificates.caBundle) -}}
{{- fail "certificates.mode=secret needs certificates.caBundle (base64 of the PEM CA)" -}}
{{- end -}}
{{- $ca := .Values.webhooks.clientCA -}}
{{- if and $ca.enabled (eq (empty $ca.secretName) (empty $ca.configMapName)) -}}
{{- fail "webhooks.clientCA.enabled needs exactly one of webhooks.clientCA.secretName and webhooks.clientCA.configMapName" -}}
{{- end -}}
{{- if and .Values.priorityClass.create (not .Values.priorityClass.name) -}}
{{- fail "priorityClass.create needs priorityClass.name" -}}
{{- end -}}
{{- end -}}

{{/* Labels on every object: kustomize's (deploy/base) and Helm's own. */}}
{{- define "holdfast.labels" -}}
app.kubernetes.io/part-of: holdfast
app.kubernetes.io/managed-by: {{ .Release.Service }}
app.kubernetes.io/instance: {{ .Release.Name }}
helm.sh/chart: {{ printf "%s-%s" .Chart.Name .Chart.Version }}
{{- end }}

{{/* The servers' image, and its pull policy and secrets when set. */}}
{{- define "holdfast.image" -}}
image: {{ printf "%s:%s" .Values.image.repository (.Values.image.tag | default .Chart.AppVersion) | quote }}
{{- with .Values.image.pullPolicy }}
imagePullPolicy: {{ . }}
{{- end }}
{{- end }}

{{- define "holdfast.pullSecrets" -}}
{{- with .Values.imagePullSecrets }}
imagePullSecrets:
  {{- toYaml . | nindent 2 }}
{{- end }}
{{- end }}

{{/* HOLDFAST_ETCD: the bundled members' client URLs (the names their certificates carry), or yours. */}}
{{- define "holdfast.etcdEndpoints" -}}
{{- if .Values.etcd.bundled.enabled -}}
{{- $ns := .Release.Namespace -}}
{{- $urls := list -}}
{{- range $i := until 3 -}}
{{- $urls = append $urls (printf "https://holdfast-etcd-%d.holdfast-etcd.%s.svc:2379" $i $ns) -}}
{{- end -}}
{{- join "," $urls -}}
{{- else -}}
{{- join "," .Values.etcd.endpoints -}}
{{- end -}}
{{- end }}

{{/* The coordinator Service's address inside the cluster. */}}
{{- define "holdfast.coordinatorService" -}}
holdfast-coordinator.{{ .Release.Namespace }}.svc
{{- end }}

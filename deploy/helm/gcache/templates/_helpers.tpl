{{/* The labels of every object of one component ("master", "server"). */}}
{{- define "gcache.labels" -}}
app.kubernetes.io/name: gcache
app.kubernetes.io/component: {{ . }}
{{- end -}}

{{/* The masters' gRPC addresses, comma separated: the servers' GCACHE_SERVER_MASTER. */}}
{{- define "gcache.masterAddresses" -}}
{{- $addresses := list -}}
{{- range $i := until (int .Values.master.replicas) -}}
{{- $addresses = append $addresses (printf "gcache-master-%d.gcache-master:7600" $i) -}}
{{- end -}}
{{- join "," $addresses -}}
{{- end -}}

{{/* Values the daemons would refuse, refused at render time instead. */}}
{{- define "gcache.checkValues" -}}
{{- if not (has (int .Values.master.replicas) (list 1 3 5)) -}}
{{- fail (printf "master.replicas is %v; a Raft group has 1, 3 or 5 members" .Values.master.replicas) -}}
{{- end -}}
{{- if le (int .Values.server.terminationGracePeriodSeconds) (int .Values.server.drainWaitSeconds) -}}
{{- fail (printf "server.terminationGracePeriodSeconds (%v) must exceed server.drainWaitSeconds (%v): the grace period covers the preStop drain" .Values.server.terminationGracePeriodSeconds .Values.server.drainWaitSeconds) -}}
{{- end -}}
{{- $token := toString .Values.token.value -}}
{{- if and .Values.token.create (lt (len $token) 16) (ne $token "CHANGE-ME") -}}
{{- fail "token.value must be at least 16 characters (the daemons refuse a shorter one)" -}}
{{- end -}}
{{- end -}}

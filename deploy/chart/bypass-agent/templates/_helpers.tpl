{{- define "bypass.name" -}}bypass-agent{{- end -}}
{{- define "bypass.image" -}}{{ .Values.image.repository }}:{{ .Values.image.tag | default .Chart.AppVersion }}{{- end -}}

#!/bin/sh
# Print loopguard-alerts.yaml wrapped in a PrometheusRule, for
# prometheus-operator (kube-prometheus-stack and the like):
#
#   monitoring/prometheus/prometheusrule.sh [NAMESPACE [LABEL=VALUE ...]] | kubectl apply -f -
#
# NAMESPACE defaults to "monitoring". Add the labels your Prometheus
# resource's ruleSelector asks for, e.g. release=kube-prometheus-stack.
# The rule groups are copied as they are (the resource's spec is the rule
# file's content): nothing to keep in sync by hand.
set -eu
rules="$(dirname "$0")/loopguard-alerts.yaml"
namespace="${1:-monitoring}"
[ $# -gt 0 ] && shift
cat <<HEAD
apiVersion: monitoring.coreos.com/v1
kind: PrometheusRule
metadata:
  name: loopguard
  namespace: "$namespace"
  labels:
    app.kubernetes.io/name: loopguard
HEAD
for label in "$@"; do
  case "$label" in
    *=*) printf '    %s: "%s"\n' "${label%%=*}" "${label#*=}" ;;
    *) echo "prometheusrule.sh: a label is NAME=VALUE, not '$label'" >&2; exit 2 ;;
  esac
done
echo "spec:"
# The rule file, comment lines dropped, indented under spec.
grep -v '^#' "$rules" | sed 's/^/  /'

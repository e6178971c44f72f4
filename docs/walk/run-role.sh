#!/bin/bash
# Run warmpool's role $1 on this host as its pod would (docs/operating.md, section 7): its
# ServiceAccount's token (so the Role of deploy/base/rbac.yaml and nothing more), the overlay's
# ConfigMap as its environment, the Redis URL from the Secret warmpool-redis; the rest of the
# arguments are the role's. Needs KUBECONFIG (the control plane's) and WALK_OUT (a directory).
set -euo pipefail
role=$1; shift
ns=theia-cloud
repo=$(cd "$(dirname "$0")/../.." && pwd)
secret=$(kubectl -n $ns get sa "warmpool-$role" -o jsonpath='{.secrets[0].name}')
token=$(kubectl -n $ns get secret "$secret" -o jsonpath='{.data.token}' | base64 -d)
server=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')
kc=$WALK_OUT/kubeconfig-$role
cat > "$kc" <<KC
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "$server", insecure-skip-tls-verify: true}}]
users: [{name: $role, user: {token: "$token"}}]
contexts: [{name: c, context: {cluster: c, user: $role, namespace: $ns}}]
current-context: c
KC
cm=$(kubectl -n $ns get deploy "warmpool-$role" \
  -o jsonpath='{.spec.template.spec.containers[0].envFrom[0].configMapRef.name}')
envs=$(kubectl -n $ns get cm "$cm" \
  -o go-template='{{range $k, $v := .data}}{{$k}}={{$v}}{{"\n"}}{{end}}')
redis=$(kubectl -n $ns get secret warmpool-redis -o jsonpath='{.data.url}' | base64 -d)
while IFS= read -r kv; do [ -n "$kv" ] && export "$kv"; done <<< "$envs"
export WARMPOOL_NAMESPACE=$ns WARMPOOL_REDIS_URL="$redis" KUBECONFIG=$kc PYTHONWARNINGS=ignore
exec "$repo/.venv/bin/warmpool" "$role" "$@"

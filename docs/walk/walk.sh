#!/bin/bash
# The walk through docs/operating.md on the local control plane with upstream Theia Cloud's CRDs
# (its section 7): a control plane and a Redis of its own, the install of theia_install.py, then
# the page's commands in its order, each with its output into $WALK_OUT/transcript.txt; every
# process it started is stopped at the end. From the repository, after `make venv`:
#   bash docs/walk/walk.sh
# WALK_STATE (default /tmp/walk-cluster): the control plane's state dir, deleted first.
# WALK_REDIS_PORT (default 6391): a port for a Redis of its own. WALK_OUT: default
# /tmp/warmpool-walk.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
state=${WALK_STATE:-/tmp/walk-cluster}
port=${WALK_REDIS_PORT:-6391}
export WALK_OUT=${WALK_OUT:-/tmp/warmpool-walk}
mkdir -p "$WALK_OUT"
out=$WALK_OUT/transcript.txt
: > "$out"
cd "$repo"
export PATH=$repo/.venv/bin:$PATH PYTHONWARNINGS=ignore
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null; done
  sleep 5
  warmpool cluster down --state-dir "$state" >/dev/null
  redis-cli -p "$port" shutdown nosave >/dev/null 2>&1
}
trap cleanup EXIT
rm -rf "$state"
redis-server --port "$port" --daemonize yes --save '' --appendonly no >/dev/null
warmpool cluster up --state-dir "$state" --crds upstream >/dev/null
export KUBECONFIG=$state/kubeconfig
python docs/walk/theia_install.py

run() {  # run TITLE COMMAND: the command and its output into the transcript
  { echo "=== $1"; echo "\$ $2"; } >> "$out"
  bash -c "$2" >> "$out" 2>&1
  echo "[rc=$?]" >> "$out"
}
admin="KUBECONFIG=$WALK_OUT/kubeconfig-admin"
ing='kubectl -n theia-cloud get ingress theia-cloud-demo-ws-ingress -o jsonpath='"'"'{range .spec.rules[*]}{.host} {.http.paths[*].path} {.http.paths[*].backend.service.name}{"\n"}{end}'"'"
sess='kubectl -n theia-cloud get sessions -o custom-columns='"'"'NAME:.metadata.name,STATUS:.status.operatorStatus,INSTANCE:.metadata.annotations.theia-cloud\.io/instance-id,URL:.status.url'"'"
pods='kubectl -n theia-cloud get pods -o custom-columns=NAME:.metadata.name,UID:.metadata.uid,READY:.status.containerStatuses[*].ready'
cms='kubectl -n theia-cloud get configmap -o custom-columns=NAME:.metadata.name,LIST:.data.authenticated-emails-list,OWNERS:.metadata.ownerReferences[*].kind | grep email'
objs='kubectl -n theia-cloud get svc,deploy,cm -o custom-columns=NAME:.metadata.name,UID:.metadata.uid,OWNERS:.metadata.ownerReferences[*].name | grep -E "instance-[12]-"'
live="$objs; $pods | grep -E 'instance-[12]-'; $cms; $ing; $sess"

# section 2
run args "kubectl -n theia-cloud get deploy operator-deployment -o jsonpath='{.spec.template.spec.containers[0].args}'"
run crds "kubectl get crd appdefinitions.theia.cloud sessions.theia.cloud -o custom-columns='NAME:.metadata.name,SERVED:.spec.versions[?(@.served==true)].name,STORAGE:.spec.versions[?(@.storage==true)].name'"
run redis-secret "kubectl -n theia-cloud create secret generic warmpool-redis --from-literal=url='redis://127.0.0.1:$port/0'"
run label "kubectl -n theia-cloud get svc,deploy,configmap -l '!theia-cloud.io/appdefinition-generation' -o name | grep '/instance-[1-9]' | xargs -r -I{} kubectl -n theia-cloud label {} theia-cloud.io/appdefinition-generation=0"
# section 3, step 1
run sessions-before "kubectl -n theia-cloud get sessions -o custom-columns='NAME:.metadata.name,STATUS:.status.operatorStatus,URL:.status.url'"
run status-before "warmpool status -n theia-cloud"
run ingress-before "$ing"
run pods-before "$pods"
run objs-before "$objs; $pods | grep -E 'instance-[12]-'"
# step 2 (no Helm: what its upgrade changes)
run stop-java "kubectl -n theia-cloud scale deploy/operator-deployment --replicas=0"
run wait-java "kubectl -n theia-cloud wait --for=delete pod -l app=operator --timeout=120s"
# step 3
run apply "kubectl apply -k docs/walk/overlay"
run rollout "kubectl -n theia-cloud rollout status deploy/warmpool-scheduler; kubectl -n theia-cloud rollout status deploy/warmpool-worker"
# the admin CLI from here on: a token bound to the overlay's Role warmpool-admin
kubectl -n theia-cloud create sa walk-admin >/dev/null
kubectl -n theia-cloud create rolebinding walk-admin --role=warmpool-admin \
  --serviceaccount=theia-cloud:walk-admin >/dev/null
sleep 2
secret=$(kubectl -n theia-cloud get sa walk-admin -o jsonpath='{.secrets[0].name}')
token=$(kubectl -n theia-cloud get secret "$secret" -o jsonpath='{.data.token}' | base64 -d)
server=$(kubectl config view --minify -o jsonpath='{.clusters[0].cluster.server}')
cat > "$WALK_OUT/kubeconfig-admin" <<KC
apiVersion: v1
kind: Config
clusters: [{name: c, cluster: {server: "$server", insecure-skip-tls-verify: true}}]
users: [{name: admin-role, user: {token: "$token"}}]
contexts: [{name: c, context: {cluster: c, user: admin-role, namespace: theia-cloud}}]
current-context: c
KC
# the roles, as their pods would run them (health and metrics on ports of their own)
docs/walk/run-role.sh scheduler --health-host=127.0.0.1 --health-port=18080 \
  --metrics-port=19090 --resync-period=60 --log-level=INFO > "$WALK_OUT/scheduler.log" 2>&1 &
pids+=($!)
docs/walk/run-role.sh worker --processes=2 --threads=8 --health-host=127.0.0.1 \
  --health-port=18081 --metrics-port=19091 > "$WALK_OUT/worker.log" 2>&1 &
pids+=($!)
sleep 30
# step 4
run status-after "$admin warmpool status -n theia-cloud"
run conflicts "kubectl -n theia-cloud get events --field-selector reason=InstanceConflict"
run sessions-after "$sess"
run pods-after "$pods"
run cms-after "$cms"
run objs-after "$objs; $pods | grep -E 'instance-[12]-'"
run ingress-after "$ing"
run proxy-events "kubectl -n theia-cloud get events --field-selector involvedObject.name=oauth2-proxy-config"
run netpol-pods "kubectl -n theia-cloud get pods -l theia-cloud.io/appdefinition-generation"
# step 5
run scale-up "$admin warmpool scale theia-cloud-demo --min 5 -n theia-cloud"
sleep 10
run carol "kubectl apply -f - <<'YAML'
apiVersion: theia.cloud/v1beta8
kind: Session
metadata: {name: carol-session, namespace: theia-cloud}
spec: {name: carol-session, appDefinition: theia-cloud-demo, user: carol@example.com}
YAML"
sleep 8
run status-carol "$admin warmpool status -n theia-cloud -o wide"
run ingress-carol "$ing"
run scale-down "$admin warmpool scale theia-cloud-demo --min 1 -n theia-cloud"
sleep 10
run status-down "$admin warmpool status -n theia-cloud"
run end-carol "kubectl -n theia-cloud delete session carol-session"
sleep 10
run status-carol-gone "$admin warmpool status -n theia-cloud"
run ingress-carol-gone "$ing"
run live-before-uninstall "$live"
# section 4, step 1; section 5
run stop-warmpool "kubectl -n theia-cloud scale deploy/warmpool-scheduler deploy/warmpool-worker --replicas=0; kubectl -n theia-cloud wait --for=delete pod -l app.kubernetes.io/name=warmpool --timeout=120s"
for pid in "${pids[@]}"; do kill -TERM "$pid"; done
wait
pids=()
run uninstall "$(sed -n '/^## 5. Uninstall/,$p' docs/operating.md | sed -n '/^```sh$/,/^```$/p' | sed '1d;$d' | sed -n '1,/^kubectl delete crd/p')"
run live-after-uninstall "$live"
run finder "$(sed -n '/One gap needs a look/,$p' docs/operating.md | sed -n '/^```sh$/,/^```$/p' | sed '1d;$d' | sed -n '1,/^  while read/p')"
run admin-bindings "kubectl -n theia-cloud get rolebinding -o custom-columns=NAME:.metadata.name,ROLE:.roleRef.name | grep -w warmpool-admin"
run deploys "kubectl -n theia-cloud get deploy"
section() { awk -v n="=== $1" '$0==n{f=1;next} /^=== /{f=0} f' "$out" | sed 1d; }
# The migration: the ten objects of alice's and bob's instances and their pods, the same uids.
if [ "$(section objs-before | awk '{print $1, $2}')" = "$(section objs-after | awk '{print $1, $2}')" ]
then echo "migrated: alice's and bob's instances kept every object and pod (the same uids)"
else echo "CHANGED by the migration"; exit 1; fi
if [ "$(section live-after-uninstall)" = "$(section live-before-uninstall)" ]
then echo "nothing lost: the live Sessions' objects, pods, allow-lists, rules and status are as before the uninstall"
else echo "CHANGED by the uninstall"; exit 1; fi

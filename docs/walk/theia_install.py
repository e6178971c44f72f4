"""An upstream Theia Cloud install whose Java operator runs an eager pool, written to the local
control plane for the walk through docs/operating.md (its section 7): what the chart 1.3.0-next
renders with `operator.eagerStart: true` (namespace, oauth2-proxy template, shared Ingress,
operator Deployment, the demo AppDefinition at v1beta10 with minInstances 3) and what upstream's
operator leaves (instances 1 to 3, alice's and bob's Sessions on 1 and 2, their rules on the
shared Ingress). Run with KUBECONFIG set: `python docs/walk/theia_install.py`.
"""

from __future__ import annotations

import os
from pathlib import Path

from warmpool.kube.api import Kube, connect
from warmpool.testing.java_operator import JavaLine, JavaPool
from warmpool.testing.world import create_namespace

NS = "theia-cloud"
HOST = "instances.theia-cloud.local"
INGRESS = "theia-cloud-demo-ws-ingress"
ING = "networking.k8s.io/v1"
#: The chart's charts/theia-cloud/templates/operator.yaml, rendered: Keycloak on, eagerStart,
#: no usePaths, the values' defaults elsewhere (the token is the chart's public default).
ARGS = ["--keycloak", "--keycloakURL", "https://keycloak.theia-cloud.local/", "--keycloakRealm",
        "TheiaCloud", "--keycloakClientId", "theia-cloud", "--eagerStart", "--cloudProvider",
        "K8S", "--bandwidthLimiter", "K8SANNOTATION", "--wondershaperImage",
        "theiacloud/theia-cloud-wondershaper:1.3.0-next", "--serviceUrl",
        "https://service.theia-cloud.local", "--sessionsPerUser", "1", "--serviceAuthToken",
        "asdfghjkl", "--instancesHost", HOST, "--storageClassName", "default",
        "--requestedStorage", "250Mi", "--enableMonitor", "--enableActivityTracker",
        "--monitorInterval", "1", "--leaderLeaseDuration", "10", "--leaderRenewDeadline", "5",
        "--leaderRetryPeriod", "2", "--maxWatchIdleTime", "3600000", "--oAuth2ProxyVersion",
        "v7.12.0", "--ingressPathSuffix", "(/|$)(.*)"]


def install(kube: Kube) -> None:
    create_namespace(kube, NS)
    # oauth2-configmap-oauth2proxy-keycloak.yaml, rendered (with test secrets).
    template = (Path(__file__).with_name("oauth2-proxy.cfg")).read_text()
    kube.create({"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "oauth2-proxy-config", "namespace": NS},
                 "data": {"oauth2-proxy.cfg": template}})
    kube.create({"apiVersion": "v1", "kind": "ConfigMap",
                 "metadata": {"name": "oauth2-templates", "namespace": NS}, "data": {}})
    # instances-ingress.yaml without usePaths: one rule for the host, no paths yet.
    kube.create({"apiVersion": ING, "kind": "Ingress",
                 "metadata": {"name": INGRESS, "namespace": NS, "annotations": {
                     "nginx.ingress.kubernetes.io/rewrite-target": "/$2"}},
                 "spec": {"ingressClassName": "nginx", "rules": [{"host": HOST}]}})
    labels = {"app": "operator"}
    kube.create({"apiVersion": "apps/v1", "kind": "Deployment",
                 "metadata": {"name": "operator-deployment", "namespace": NS, "labels": labels},
                 "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                          "template": {"metadata": {"labels": labels}, "spec": {"containers": [
                              {"name": "operator-container",
                               "image": "theiacloud/theia-cloud-operator:1.3.0-next",
                               "args": ARGS}]}}}})
    # theia-appdefinition-spec.yaml (demoApplication's defaults), minInstances raised to 3.
    appdef = kube.create({
        "apiVersion": "theia.cloud/v1beta10", "kind": "AppDefinition",
        "metadata": {"name": "theia-cloud-demo", "namespace": NS},
        "spec": {"name": "theia-cloud-demo", "image": "theiacloud/theia-cloud-demo:1.3.0-next",
                 "imagePullPolicy": "Always", "pullSecret": "", "uid": 101, "port": 3000,
                 "ingressname": INGRESS, "ingressHostnamePrefixes": ["*.webview."],
                 "minInstances": 3, "maxInstances": 10, "timeout": 30,
                 "requestsMemory": "1000M", "limitsMemory": "1200M", "requestsCpu": "100m",
                 "limitsCpu": "2", "downlinkLimit": 30000, "uplinkLimit": 30000,
                 "mountPath": "/home/project/persisted",
                 "monitor": {"port": 3000, "activityTracker": {"timeoutAfter": 30,
                                                               "notifyAfter": 25}}}})
    line = JavaLine(appdef_api_version="theia.cloud/v1beta10",
                    session_api_version="theia.cloud/v1beta8",
                    generation_label=False, annotates_sessions=False)
    pool = JavaPool(kube, appdef, host=HOST, line=line)
    # TheiaCloudIngressUtil: the AppDefinition's owner reference on the shared Ingress.
    kube.merge_patch(ING, "Ingress", NS, INGRESS,
                     {"metadata": {"ownerReferences": [pool.appdef_ref()]}})
    for k in (1, 2, 3):
        pool.instance(k)
    for k, name in ((1, "alice"), (2, "bob")):
        session = kube.create({
            "apiVersion": "theia.cloud/v1beta8", "kind": "Session",
            "metadata": {"name": f"{name}-session", "namespace": NS},
            "spec": {"name": f"{name}-session", "appDefinition": "theia-cloud-demo",
                     "user": f"{name}@example.com"}})
        pool.claim(k, session, route=False)
        # EagerSessionHandler.addIngressRule: the instance's rule, appended.
        ingress = kube.get(ING, "Ingress", NS, INGRESS)
        assert ingress is not None
        rules = [*ingress["spec"]["rules"], {"host": HOST, "http": {"paths": [{
            "path": f"{pool.path(k)}(/|$)(.*)", "pathType": "ImplementationSpecific",
            "backend": {"service": {"name": pool.name(k), "port": {"number": 3000}}}}]}}]
        kube.merge_patch(ING, "Ingress", NS, INGRESS, {"spec": {"rules": rules}})


if __name__ == "__main__":
    install(Kube(connect(os.environ["KUBECONFIG"])))

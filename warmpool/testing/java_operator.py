"""A pool and live Sessions exactly as Theia Cloud's Java operator leaves them, written to a
real API server: the starting point of a migration to warmpool (docs/operating.md).

Each write below is the one the Java operator makes, with the names, labels, annotations,
owner references and allow-lists it gives them; the comments cite the source, the EduIDE fork
of Theia Cloud at 375ef32 (the line warmpool's CRDs serve, AppDefinition v1beta11), written
`EC:` + a path under `java/operator/org.eclipse.theia.cloud.operator/src/main/`, and upstream
eclipse-theia/theia-cloud at 3a8dbd5 (`UP:`) where the two agree. The controller's own
builders are deliberately not used (as in `warmpool.testing.world`): a migration test built
with them could pass because both sides share a bug. Only the object names come from
`warmpool.pool.naming`, the port of Java's `NamingUtil` that tests/unit/test_naming.py pins
to Java's outputs.

The API versions Java writes into owner references are parameters (`JavaLine`): the EC line
(AppDefinition v1beta11, Session v1beta8) by default; upstream's is v1beta10 and v1beta8.

Also the Java operator's known broken states (pool-spec §3):

- `double_claim`: a second Session added to an instance a first one holds, as its stale-list
  reservation does (`reserveInstance` lists the Services, then edits one without a
  resourceVersion, so two reservations on one read both succeed): both Sessions annotated with
  the instance, both owner references on the Services and the Deployment, the session labels
  and the allow-list the second writer's.
- `scale_below`: minInstances lowered below a claimed id, as `PrewarmedResourcePool.reconcile`
  then leaves it: the claimed instance's two ConfigMaps deleted (owned by the AppDefinition
  alone), the AppDefinition's reference stripped from its Services and Deployment, the free
  instances above the new minInstances deleted.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from warmpool.kube.api import Kube
from warmpool.pool import naming
from warmpool.pool import vocabulary as v
from warmpool.pool.meta import labels_of, meta_of, name_of, owner_refs, uid_of
from warmpool.testing.waiting import wait_for
from warmpool.testing.world import HOST

__all__ = ["OAUTH2_PROXY_TEMPLATE", "UPSTREAM", "JavaLine", "JavaPool", "create_proxy_template"]

# The namespace's oauth2-proxy template as Theia Cloud's chart renders it
# (theia-cloud-helm: charts/theia-cloud/templates/oauth2-configmap-oauth2proxy-keycloak.yaml),
# with a test realm and secrets. Java copies it into each instance's proxy ConfigMap.
OAUTH2_PROXY_TEMPLATE = """\
# Provider config
provider="keycloak-oidc"
redirect_url="https://placeholder/oauth2/callback"
oidc_issuer_url="https://keycloak.theia-cloud.local/realms/TheiaCloud"
ssl_insecure_skip_verify=true
# Client config
client_id="theia-cloud"
client_secret="test-client-secret"
cookie_secret="0123456789abcdef0123456789abcdef"
cookie_secure="false"
# Upstream config
http_address="0.0.0.0:5000"
upstreams="http://127.0.0.1:placeholder-port/"
skip_provider_button="true"
reverse_proxy="true"
cookie_domains=["instances.theia-cloud.local"]
whitelist_domains=["instances.theia-cloud.local:*","keycloak.theia-cloud.local:*"]
custom_templates_dir="/templates"
"""


def create_proxy_template(kube: Kube, ns: str) -> dict[str, Any]:
    """The chart's `oauth2-proxy-config` ConfigMap, which Java reads for every proxy ConfigMap
    (EC: java/.../handler/AddedHandlerUtil.java `updateProxyConfigMap`)."""
    return kube.create({"apiVersion": "v1", "kind": "ConfigMap",
                        "metadata": {"name": v.NAMESPACE_PROXY_TEMPLATE, "namespace": ns},
                        "data": {v.PROXY_CONFIG_KEY: OAUTH2_PROXY_TEMPLATE}})


@dataclass(frozen=True, slots=True)
class JavaLine:
    """What differs between Theia Cloud's lines in what the operator leaves: the API versions
    it writes into owner references (Java's `AppDefinition.API` and `Session.API`, EC:
    common/.../appdefinition/AppDefinition.java:40, session/Session.java:40), and whether it
    labels pool objects with the AppDefinition's generation and annotates claimed Sessions
    (EC does both; upstream does neither: UP's EagerStartAppDefinitionAddedHandler creates the
    objects with no added labels and UP's EagerSessionHandler writes no annotation). The owner
    references are written at the versions the cluster serves (`Kube.served_api_version`):
    upstream's own, v1beta10 / v1beta8, on upstream's CRDs."""

    appdef_api_version: str = v.APPDEF_API_VERSION
    session_api_version: str = v.SESSION_API_VERSION
    generation_label: bool = True
    annotates_sessions: bool = True


UPSTREAM = JavaLine(generation_label=False, annotates_sessions=False)


def _owner(api_version: str, kind: str, obj: Mapping[str, Any]) -> dict[str, str]:
    """Java's owner reference: apiVersion, kind, name, uid; no controller, no
    blockOwnerDeletion (EC: util/TheiaCloudHandlerUtil.java `createOwnerReference`,
    ResourceEdit.updateOwnerReference)."""
    return {"apiVersion": api_version, "kind": kind, "name": name_of(obj), "uid": uid_of(obj)}


def _truncate(value: str) -> str:
    """LabelsUtil.truncateLabelValue: at most 63 characters."""
    return value[:63]


class JavaPool:
    """One AppDefinition's pool, written as the Java operator writes it.

    `appdef` is the AppDefinition as read from the server (its uid and generation name the
    objects). Methods return what they wrote, so a test can compare what warmpool keeps.
    """

    def __init__(self, kube: Kube, appdef: Mapping[str, Any], *, host: str = HOST,
                 line: JavaLine = JavaLine()) -> None:
        self.kube = kube
        self.appdef = dict(appdef)
        self.ns = str(meta_of(appdef).get("namespace"))
        self.host = host
        self.line = line

    # --- names and small shapes -----------------------------------------------------------

    @property
    def spec(self) -> Mapping[str, Any]:
        spec: Mapping[str, Any] = self.appdef["spec"]
        return spec

    @property
    def generation(self) -> str:
        """The generation label value (EC: util/K8sResourceFactory.java `addGenerationLabel`
        with pool/PrewarmedResourcePool.java:19 APPDEFINITION_GENERATION_LABEL)."""
        return str(meta_of(self.appdef).get("generation"))

    def name(self, k: int, ident: str | None = None) -> str:
        """NamingUtil.createName (Deployment, external Service, ConfigMaps)."""
        return naming.create_name(self.spec["name"], uid_of(self.appdef), k, ident)

    def internal_name(self, k: int) -> str:
        """The internal Service's name: NamingUtil.createNameWithSuffix(A, k, "int"), which
        Java tells from the external one by its `-int` ending
        (EC: pool/PrewarmedResourcePool.java:745)."""
        return naming.create_name_with_suffix(self.spec["name"], uid_of(self.appdef), k, "int")

    def selector(self, k: int) -> str:
        """TheiaCloudHandlerUtil.getAppSelector: asValidName(spec.name + "-" + k)."""
        return naming.app_selector(self.spec["name"], k)

    def path(self, k: int) -> str:
        """IngressPathProviderImpl.getPath without --usePaths: "/" + raw spec.name + "-" + k."""
        return f"/{self.spec['name']}-{k}"

    def appdef_ref(self) -> dict[str, str]:
        # At the version the cluster serves: each line's Java writes its own CRDs' version
        # (upstream's v1beta10 on upstream's CRDs, not the fork's v1beta11).
        return _owner(self.kube.served_api_version(self.line.appdef_api_version, v.APPDEF_KIND),
                      v.APPDEF_KIND, self.appdef)

    def session_ref(self, session: Mapping[str, Any]) -> dict[str, str]:
        return _owner(self.kube.served_api_version(self.line.session_api_version,
                                                   v.SESSION_KIND), v.SESSION_KIND, session)

    def session_labels(self, session: Mapping[str, Any]) -> dict[str, str]:
        """LabelsUtil.createSessionLabels (EC and UP: common/.../util/LabelsUtil.java:53-66)."""
        user = session["spec"]["user"]
        sanitized = "".join(c if c.isascii() and c.isalnum() else "_"
                            for c in user.replace("@", "_at_"))
        return {v.LABEL_COMPONENT: "session", v.LABEL_PART_OF: "theia-cloud",
                v.LABEL_USER: _truncate(sanitized),
                v.LABEL_APP_DEFINITION: _truncate(self.spec["name"]),
                v.LABEL_SESSION: _truncate(session["spec"]["name"]),
                v.LABEL_SESSION_UUID: _truncate(uid_of(session))}

    # --- a free instance ------------------------------------------------------------------

    def instance(self, k: int) -> dict[str, dict[str, Any]]:
        """Instance k's five objects as `PrewarmedResourcePool.ensureCapacity` creates them
        with --keycloak (EC: pool/PrewarmedResourcePool.java:109-250, through
        util/K8sResourceFactory.java `create*ForEagerInstance` and the templates in
        resources/template{Service,InternalService,ConfigmapEmails,Configmap,Deployment}.yaml):
        owned by the AppDefinition alone, each with the generation label, the allow-list empty.
        """
        gen = {v.LABEL_GENERATION: self.generation} if self.line.generation_label else {}
        meta = {"namespace": self.ns, "ownerReferences": [self.appdef_ref()]}
        port = int(self.spec["port"])
        selector = self.selector(k)
        bodies: dict[str, dict[str, Any]] = {
            "external": {
                "apiVersion": "v1", "kind": "Service",
                "metadata": {**meta, "name": self.name(k),
                             "labels": {v.LABEL_APP: selector, **gen}},
                "spec": {"ports": [{"name": "http", "port": port, "protocol": "TCP",
                                    "targetPort": "web"}],
                         "selector": {v.LABEL_APP: selector}, "type": "ClusterIP"}},
            "internal": {
                "apiVersion": "v1", "kind": "Service",
                "metadata": {**meta, "name": self.internal_name(k),
                             "labels": {v.LABEL_APP: selector,
                                        v.LABEL_SERVICE_TYPE: v.SERVICE_TYPE_INTERNAL, **gen}},
                "spec": {"ports": [{"name": "http-internal", "port": v.INTERNAL_PORT,
                                    "protocol": "TCP", "targetPort": port}],
                         "selector": {v.LABEL_APP: selector}, "type": "ClusterIP"}},
            "proxy": {
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {**meta, "name": self.name(k, "proxy"),
                             "labels": {v.LABEL_TEMPLATE_PURPOSE: v.PURPOSE_PROXY, **gen}},
                # AddedHandlerUtil.updateProxyConfigMap: the template's data, placeholders
                # replaced ("https://" + instancesHost + path, and the port).
                "data": {v.PROXY_CONFIG_KEY: OAUTH2_PROXY_TEMPLATE
                         .replace("https://placeholder", f"https://{self.host}{self.path(k)}")
                         .replace("placeholder-port", str(port))}},
            "email": {
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {**meta, "name": self.name(k, "email"),
                             "labels": {v.LABEL_TEMPLATE_PURPOSE: v.PURPOSE_EMAILS, **gen}},
                # `authenticated-emails-list:` with no value: a null, which the API server
                # stores as no key at all.
                "data": {}},
            "deployment": {
                "apiVersion": "apps/v1", "kind": "Deployment",
                "metadata": {**meta, "name": self.name(k), "labels": dict(gen)},
                "spec": self._deployment_spec(k, selector, port)},
        }
        return {part: self.kube.create(body) for part, body in bodies.items()}

    def _deployment_spec(self, k: int, selector: str, port: int) -> dict[str, Any]:
        """resources/templateDeployment.yaml as DefaultDeploymentTemplateReplacements fills
        it for an eager instance (no Session yet: the session env values empty); the
        generation label also on the pod template (util/K8sUtil.java:171-177)."""
        uid = int(self.spec.get("uid") or 0)
        env = {"THEIACLOUD_SESSION_UID": "", "THEIACLOUD_SESSION_NAME": "",
               "THEIACLOUD_SESSION_USER": "",
               "THEIACLOUD_SESSION_URL": f"{self.host}{self.path(k)}/", "THEIA": "1"}
        resources = {"limits": {"cpu": self.spec.get("limitsCpu"),
                                "memory": self.spec.get("limitsMemory")},
                     "requests": {"cpu": self.spec.get("requestsCpu"),
                                  "memory": self.spec.get("requestsMemory")}}
        return {
            "replicas": 1,
            "selector": {"matchLabels": {v.LABEL_APP: selector}},
            "template": {
                "metadata": {"labels": {v.LABEL_APP: selector, **(
                    {v.LABEL_GENERATION: self.generation} if self.line.generation_label
                    else {})}},
                "spec": {
                    "automountServiceAccountToken": False, "enableServiceLinks": False,
                    "containers": [
                        {"name": "oauth2-proxy",
                         "image": "quay.io/oauth2-proxy/oauth2-proxy:latest",
                         "imagePullPolicy": "IfNotPresent",
                         "args": ["--config=/etc/oauth2-proxy.cfg",
                                  "--authenticated-emails-file=/emails/"
                                  "authenticated-emails-list",
                                  "--gcp-healthchecks", "--reverse-proxy",
                                  "--skip-auth-route=/monitor/*"],
                         "ports": [{"containerPort": v.OAUTH2_PROXY_PORT, "name": "web"}],
                         "volumeMounts": [
                             {"name": "oauth2-proxy-config",
                              "mountPath": "/etc/oauth2-proxy.cfg",
                              "subPath": v.PROXY_CONFIG_KEY},
                             {"name": "oauth2-templates", "mountPath": "/templates"},
                             {"name": "oauth2-emails", "mountPath": "/emails"}]},
                        {"name": self.spec["name"], "image": self.spec["image"],
                         "imagePullPolicy": self.spec.get("imagePullPolicy") or "IfNotPresent",
                         "ports": [{"containerPort": port, "name": "application"}],
                         "resources": resources,
                         "env": [{"name": n, "value": val} for n, val in env.items()],
                         "securityContext": {"runAsUser": uid, "runAsGroup": uid}}],
                    "securityContext": {"fsGroup": uid},
                    "volumes": [
                        {"name": "oauth2-proxy-config",
                         "configMap": {"name": self.name(k, "proxy")}},
                        {"name": "oauth2-templates", "configMap": {"name": "oauth2-templates"}},
                        {"name": "oauth2-emails", "configMap": {"name": self.name(k, "email")}},
                    ]}}}

    # --- a claim ---------------------------------------------------------------------------

    def claim(self, k: int, session: Mapping[str, Any], *, route: bool = True
              ) -> dict[str, Any]:
        """Session `session` gets instance k as `EagerSessionHandler.trySessionAdded` gives it
        (EC: handler/session/EagerSessionHandler.java:97-265), returning the Session as left:

        1. `reserveInstance` adds the Session's reference to both Services
           (pool/PrewarmedResourcePool.java:826-850, `addOwnerReferenceToItem`);
        2. `annotateSession`: `session-start-strategy: eager`, `instance-id: k` (:340-351);
        3. `completeSessionSetup` (pool/PrewarmedResourcePool.java:868-939): the session
           labels on both Services, the reference on the Deployment, the allow-list set to
           the user (the ConfigMaps keep the AppDefinition as their only owner: the defect),
           the refresh annotation on the instance's pods;
        4. the Session's HTTPRoute (ingress/IngressManager.java:168-304), unless `route`
           is False (UP adds a rule to the shared Ingress instead: not made here);
        5. `markHandled` and the URL probe's write: HANDLED, lastActivity, url
           (handler/session/SessionStatusUtil.java:81-95, handler/AddedHandlerUtil.java).
        """
        ref = self.session_ref(session)
        for name in (self.name(k), self.internal_name(k)):
            self._append_ref("v1", "Service", name, ref)
        if self.line.annotates_sessions:
            session = self.kube.merge_patch(
                self.line.session_api_version, v.SESSION_KIND, self.ns, name_of(session),
                {"metadata": {"annotations": {
                    v.ANNOTATION_START_STRATEGY: v.START_STRATEGY_EAGER,
                    v.ANNOTATION_INSTANCE_ID: str(k)}}})
        labels = self.session_labels(session)
        for name in (self.name(k), self.internal_name(k)):
            self.kube.merge_patch("v1", "Service", self.ns, name, {"metadata": {"labels": labels}})
        self._append_ref("apps/v1", "Deployment", self.name(k), ref)
        self.kube.merge_patch("v1", "ConfigMap", self.ns, self.name(k, "email"),
                              {"data": {v.EMAILS_KEY: session["spec"]["user"]}})
        self.refresh_pods(k)
        if route:
            self.session_route(k, session)
        now_ms = int(time.time() * 1000)
        return self.kube.merge_patch(
            self.line.session_api_version, v.SESSION_KIND, self.ns, name_of(session),
            {"status": {"operatorStatus": v.STATUS_HANDLED, "lastActivity": now_ms,
                        "url": f"{self.host}{self.path(k)}/"}}, status=True)

    def _append_ref(self, api_version: str, kind: str, name: str, ref: dict[str, str]) -> None:
        """`item.getMetadata().getOwnerReferences().add(ref)`: appended, not de-duplicated."""
        obj = self.kube.get(api_version, kind, self.ns, name)
        assert obj is not None, f"{kind} {name} is missing"
        refs = [dict(r) for r in owner_refs(obj)] + [ref]
        self.kube.merge_patch(api_version, kind, self.ns, name,
                              {"metadata": {"ownerReferences": refs}})

    def pods(self, k: int) -> list[dict[str, Any]]:
        """The pods of instance k's Deployment (by its selector)."""
        items, _ = self.kube.list("v1", "Pod", self.ns,
                                  label_selector=f"{v.LABEL_APP}={self.selector(k)}")
        return [p for p in items if not meta_of(p).get("deletionTimestamp")]

    def refresh_pods(self, k: int) -> None:
        """`refreshPods`: the `eager-start-refresh` annotation on the Deployment's pods
        (EC: pool/PrewarmedResourcePool.java:1169-1208); waits for the pod to exist first,
        as a running pool's pod does."""
        pods = wait_for(lambda: self.pods(k), timeout=60,
                        message=f"a pod of instance {k}")
        for pod in pods:
            self.kube.merge_patch("v1", "Pod", self.ns, name_of(pod), {"metadata": {
                "annotations": {v.ANNOTATION_REFRESH: time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                     time.gmtime())}}})

    def session_route(self, k: int, session: Mapping[str, Any]) -> dict[str, Any]:
        """The Session's HTTPRoute `<uid>-route` (session-lifecycle §1; EC:
        ingress/IngressManager.java:168-304): the session labels, the Session as owner, the
        shared route's parentRefs and hostnames, Java's redirect rule and prefix rule to the
        external Service."""
        shared = self.kube.get(v.ROUTE_API_VERSION, v.ROUTE_KIND, self.ns,
                               self.spec["ingressname"])
        assert shared is not None, "the shared route must exist before a claim"
        path = self.path(k)
        return self.kube.create({
            "apiVersion": v.ROUTE_API_VERSION, "kind": v.ROUTE_KIND,
            "metadata": {"name": uid_of(session) + v.ROUTE_SUFFIX, "namespace": self.ns,
                         "labels": self.session_labels(session),
                         "ownerReferences": [self.session_ref(session)]},
            "spec": {
                "parentRefs": shared["spec"]["parentRefs"],
                "hostnames": shared["spec"].get("hostnames") or [self.host],
                "rules": [
                    {"matches": [{"path": {"type": "Exact", "value": path}}],
                     "filters": [{"type": "RequestRedirect", "requestRedirect": {
                         "statusCode": 302,
                         "path": {"type": "ReplaceFullPath", "replaceFullPath": f"{path}/"}}}]},
                    {"matches": [{"path": {"type": "PathPrefix", "value": f"{path}/"}}],
                     "filters": [
                         {"type": "RequestHeaderModifier", "requestHeaderModifier": {
                             "set": [{"name": "X-Forwarded-Uri", "value": "%REQ(:PATH)%"}]}},
                         {"type": "URLRewrite", "urlRewrite": {"path": {
                             "type": "ReplacePrefixMatch", "replacePrefixMatch": "/"}}}],
                     "backendRefs": [{"name": self.name(k), "port": int(self.spec["port"])}]},
                ]}})

    def own_shared_route(self) -> None:
        """TheiaCloudIngressUtil.checkForExistingIngressAndAddOwnerReferencesIfMissing
        (EC: util/TheiaCloudIngressUtil.java:36-73): the AppDefinition's reference appended
        to the shared route."""
        self._append_ref(v.ROUTE_API_VERSION, v.ROUTE_KIND, self.spec["ingressname"],
                         self.appdef_ref())

    def lazy_fallback(self, session: Mapping[str, Any]) -> dict[str, Any]:
        """A Session the Java operator started lazily because no instance was free
        (EC: handler/session/EagerWithLazyFallbackSessionHandler.java:67-92): its own
        Deployment owned by the Session (util/K8sResourceFactory.java
        `createDeploymentForLazySession`; the name shaped like NamingUtil.createName(Session),
        "session-..." with the Session's uid: no `instance-<k>-` prefix, so no pool's), the
        annotation `session-start-strategy: lazy-fallback`, HANDLED at its own path
        (IngressPathProviderImpl.getPath(A, Session): the base and the Session's uid). Only the
        Deployment of its objects is made: it carries the pod whose uid a test compares."""
        uid = uid_of(session)
        name = naming.as_valid_name(f"session-{session['spec']['user']}-{uid[-12:]}")
        labels = {v.LABEL_APP: name}
        self.kube.create({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": self.ns, "labels": dict(labels),
                         "ownerReferences": [self.session_ref(session)]},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels},
                     "template": {"metadata": {"labels": labels}, "spec": {
                         "automountServiceAccountToken": False,
                         "containers": [{"name": self.spec["name"],
                                         "image": self.spec["image"]}]}}}})
        self.kube.merge_patch(
            self.line.session_api_version, v.SESSION_KIND, self.ns, name_of(session),
            {"metadata": {"annotations": {
                v.ANNOTATION_START_STRATEGY: v.START_STRATEGY_LAZY_FALLBACK}}})
        return self.kube.merge_patch(
            self.line.session_api_version, v.SESSION_KIND, self.ns, name_of(session),
            {"status": {"operatorStatus": v.STATUS_HANDLED,
                        "lastActivity": int(time.time() * 1000),
                        "url": f"{self.host}/{uid}/"}}, status=True)

    # --- after a release -------------------------------------------------------------------

    def released(self, k: int, session: Mapping[str, Any]) -> None:
        """What `releaseInstance` leaves of a claim (EC: pool/PrewarmedResourcePool.java:
        945-1048): the Session's references removed, but only the session-specific labels
        (`LabelsUtil.getSessionSpecificLabelKeys`: session, session-uuid, user), so
        `component`, `part-of` and `app-definition` stay on the free Services; the
        allow-list set to null; the pod deleted."""
        uid = uid_of(session)
        for api_version, kind, name in (("v1", "Service", self.name(k)),
                                        ("v1", "Service", self.internal_name(k)),
                                        ("apps/v1", "Deployment", self.name(k))):
            obj = self.kube.get(api_version, kind, self.ns, name)
            assert obj is not None
            refs = [dict(r) for r in owner_refs(obj) if r.get("uid") != uid]
            patch: dict[str, Any] = {"metadata": {"ownerReferences": refs}}
            if kind == "Service":
                patch["metadata"]["labels"] = {key: None for key in (
                    v.LABEL_SESSION, v.LABEL_SESSION_UUID, v.LABEL_USER)}
            self.kube.merge_patch(api_version, kind, self.ns, name, patch)
        self.kube.merge_patch("v1", "ConfigMap", self.ns, self.name(k, "email"),
                              {"data": {v.EMAILS_KEY: None}})
        for pod in self.pods(k):
            self.kube.delete("v1", "Pod", self.ns, name_of(pod))

    # --- the known broken states -------------------------------------------------------------

    def double_claim(self, k: int, second: Mapping[str, Any]) -> dict[str, Any]:
        """A second Session on instance k, held already: the same steps as `claim`, on a
        reservation made from a list read before the first one's reference (the Services are
        edited without a resourceVersion), so both references stay; the labels and the
        allow-list are the second writer's."""
        return self.claim(k, second)

    def scale_below(self, min_instances: int, claimed: Mapping[int, Mapping[str, Any]]
                    ) -> dict[str, Any]:
        """Lower minInstances as the admin API does, then what `PrewarmedResourcePool.
        reconcile` does about it (EC: pool/PrewarmedResourcePool.java:256-477 through
        util/ResourceLifecycleManager.java:205-330): every object of an id above the target
        owned solely by the AppDefinition is deleted (so a claimed instance's two ConfigMaps
        go), the AppDefinition's reference is removed from those with other owners (a claimed
        instance's Services and Deployment), and free instances at or below the target at an
        older generation are recreated (delete, create). `claimed`: id -> holder."""
        ad = self.kube.merge_patch(v.APPDEF_API_VERSION, v.APPDEF_KIND, self.ns,
                                   name_of(self.appdef), {"spec": {"minInstances": min_instances}})
        self.appdef = dict(ad)
        mine = self.appdef_ref()
        for api_version, kind in (("v1", "Service"), ("apps/v1", "Deployment"),
                                  ("v1", "ConfigMap")):
            items, _ = self.kube.list(api_version, kind, self.ns)
            for obj in items:
                k = naming.instance_id_from_name(name_of(obj))
                refs = [dict(r) for r in owner_refs(obj)]
                if k is None or not any(r.get("uid") == mine["uid"] for r in refs):
                    continue
                if k > min_instances:
                    others = [r for r in refs if r.get("uid") != mine["uid"]]
                    if not others:
                        self.kube.delete(api_version, kind, self.ns, name_of(obj))
                    else:
                        self.kube.merge_patch(api_version, kind, self.ns, name_of(obj),
                                              {"metadata": {"ownerReferences": others}})
        for k in range(1, min_instances + 1):
            if k in claimed:
                continue  # ResourceLifecycleManager skips objects with more than one owner
            current = self.kube.get("v1", "Service", self.ns, self.name(k))
            if current is not None and labels_of(current).get(v.LABEL_GENERATION) \
                    != self.generation:
                self._delete_instance(k)
                self.instance(k)
        return self.appdef

    def _delete_instance(self, k: int) -> None:
        for api_version, kind, name in (("v1", "Service", self.name(k)),
                                        ("v1", "Service", self.internal_name(k)),
                                        ("apps/v1", "Deployment", self.name(k)),
                                        ("v1", "ConfigMap", self.name(k, "proxy")),
                                        ("v1", "ConfigMap", self.name(k, "email"))):
            self.kube.delete(api_version, kind, self.ns, name)
        wait_for(lambda: self.kube.get("v1", "Service", self.ns, self.name(k)) is None,
                 timeout=30, message=f"instance {k}'s Service to go")

"""Build the five objects of instance k as plain Kubernetes dicts.

Pure functions of the AppDefinition, the id and the holder: no API access, so the desired shape
of every object is unit-testable and the executor only ever sends what these return.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Self

from warmpool.pool import naming, proxy
from warmpool.pool import vocabulary as v
from warmpool.pool.availability import ProbeSettings, session_url
from warmpool.pool.meta import labels_of
from warmpool.pool.model import CEILING_SETTING, MAX_INSTANCES_CEILING, AppDefinition, Session
from warmpool.pool.parts import Part

# The proxy's image and configuration: warmpool.pool.proxy (the advisories behind its default).
OAUTH2_PROXY_IMAGE = proxy.DEFAULT_IMAGE


SESSIONS_PER_USER_SETTING = "WARMPOOL_SESSIONS_PER_USER"
ROUTES_SETTING = "WARMPOOL_ROUTES"
#: How a claimed Session is routed: its own HTTPRoute (session-lifecycle §1, the default), a
#: rule on the shared Ingress (§4, upstream Theia Cloud), or not at all (a cluster without
#: either: `url` is still written, nothing routes to it).
ROUTE_MODES = ("httproute", "ingress", "none")
SERVICE_URL_SETTING = "WARMPOOL_SERVICE_URL"
SERVICE_AUTH_TOKEN_SETTING = "WARMPOOL_SERVICE_AUTH_TOKEN"
KEYCLOAK_URL_SETTING = "WARMPOOL_KEYCLOAK_URL"
KEYCLOAK_REALM_SETTING = "WARMPOOL_KEYCLOAK_REALM"
KEYCLOAK_CLIENT_ID_SETTING = "WARMPOOL_KEYCLOAK_CLIENT_ID"
#: The longest value each of those may have: a URL, a token, a realm or client id.
_TEXT_LIMITS = {SERVICE_URL_SETTING: 2048, SERVICE_AUTH_TOKEN_SETTING: 1024,
                KEYCLOAK_URL_SETTING: 2048, KEYCLOAK_REALM_SETTING: 255,
                KEYCLOAK_CLIENT_ID_SETTING: 255}


@dataclass(frozen=True, slots=True)
class PoolSettings:
    """Deployment-wide settings the object shapes depend on (not per AppDefinition)."""

    instances_host: str = "instances.theia-cloud.local"
    # WARMPOOL_OAUTH2_PROXY_IMAGE (upstream's --oAuth2ProxyVersion, as a whole reference).
    oauth2_proxy_image: str = OAUTH2_PROXY_IMAGE
    # WARMPOOL_TRUSTED_PROXY_IPS: the gateway's pod ranges, written as every proxy's
    # trusted_proxy_ip; without them, skip routes are refused (warmpool.pool.proxy).
    trusted_proxy_ips: tuple[str, ...] = ()
    # WARMPOOL_PROXY_SECRET: a Secret the proxies read client_secret and cookie_secret from,
    # which then stay out of the per-instance ConfigMaps. Empty: copied as Theia Cloud does.
    proxy_secret: str = ""
    # The most instances an AppDefinition may ask for; above it, it is Invalid and left as it
    # is (parse_appdefinition's max_instances_ceiling).
    max_instances_ceiling: int = MAX_INSTANCES_CEILING
    # Theia Cloud's sessionsPerUser: None (or negative) no limit (session-lifecycle §6).
    sessions_per_user: int | None = None
    # "httproute": each holder gets its route, and a claim waits for the shared route;
    # "ingress": each claimed instance gets its rule on the shared Ingress, and a claim waits
    # for the Ingress; "none": no routes are read or written.
    routes: str = "httproute"
    # Upstream's --ingressPathSuffix: nginx's default; empty for HAProxy.
    ingress_path_suffix: str = "(/|$)(.*)"
    # Java's --usePaths and --instancesPath: the base of every session path.
    use_paths: bool = False
    instances_path: str = ""
    # Write status.url only once the instance answers (session-lifecycle §2); off: with
    # HANDLED. The probe's own settings: warmpool.pool.availability.ProbeSettings.
    url_probe: bool = True
    # With no free instance, a claim makes one above minInstances, up to maxInstances
    # (session-lifecycle §6, "Burst"); off: strict minInstances, a Session waits.
    burst: bool = True
    # Java's --serviceUrl, --serviceAuthToken and --keycloakURL/Realm/ClientId: written, as
    # Java writes them, into the IDE container's THEIACLOUD_* environment (instance_env).
    # The token is a credential: kept out of the repr, so that no log line shows it.
    service_url: str = ""
    service_auth_token: str = field(default="", repr=False)
    keycloak_url: str = ""
    keycloak_realm: str = ""
    keycloak_client_id: str = ""

    @property
    def proxy_policy(self) -> proxy.ProxyPolicy:
        return proxy.ProxyPolicy(self.trusted_proxy_ips, self.proxy_secret)

    @property
    def routing(self) -> bool:
        """Session routes (HTTPRoutes) in use."""
        return self.routes == "httproute"

    @property
    def ingress(self) -> bool:
        """Rules on the shared Ingress in use."""
        return self.routes == "ingress"

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> Self:
        """The settings from the WARMPOOL_* variables below (unset or empty: the default); a
        bad value raises ValueError naming the variable. Every value that reaches an object
        or a proxy's configuration is held to a bounded grammar here (warmpool.pool.proxy's
        parsers), so a quote or a newline in one is a configuration error, not a new line."""
        # In this order: with two bad values, the first of them is the one named.
        values: dict[str, Any] = {**_proxy_values(environ), **_limit_values(environ),
                                  **_route_values(environ)}
        values["url_probe"] = ProbeSettings.from_env(environ).enabled
        if raw := environ.get("WARMPOOL_BURST", "").strip():
            values["burst"] = _either(raw, "WARMPOOL_BURST", "on", "off")
        for attr, name in (("service_url", SERVICE_URL_SETTING),
                           ("service_auth_token", SERVICE_AUTH_TOKEN_SETTING),
                           ("keycloak_url", KEYCLOAK_URL_SETTING),
                           ("keycloak_realm", KEYCLOAK_REALM_SETTING),
                           ("keycloak_client_id", KEYCLOAK_CLIENT_ID_SETTING)):
            if raw := environ.get(name, "").strip():
                values[attr] = _env_value(raw, name)
        return cls(**values)

    def session_path(self, appdef: AppDefinition, instance: int) -> str:
        """Java's IngressPathProviderImpl: the base, then the *raw* spec.name (case and `_`
        kept), a dash and the id: ``/java-17-latest-1``, or ``/instances/java-17-latest-1``."""
        base = (f"/{self.instances_path.strip()}/"
                if self.use_paths and self.instances_path.strip() else "/")
        return f"{base}{appdef.spec_name}-{instance}"

    def session_url(self, appdef: AppDefinition, instance: int) -> str:
        """`status.url`: host and path with a trailing slash and **no scheme** (clients open
        ``https://${url}``; a stored scheme breaks them)."""
        return session_url(self.instances_host, self.session_path(appdef, instance))


def _proxy_values(environ: Mapping[str, str]) -> dict[str, Any]:
    """`PoolSettings.from_env`'s instances host and oauth2-proxy settings that are set."""
    values: dict[str, Any] = {}
    if host := environ.get("WARMPOOL_INSTANCES_HOST", "").strip():
        values["instances_host"] = proxy.parse_host(host, "WARMPOOL_INSTANCES_HOST")
    if raw := environ.get(proxy.IMAGE_SETTING, "").strip():
        values["oauth2_proxy_image"] = proxy.parse_image(raw)
    if raw := environ.get(proxy.TRUSTED_PROXIES_SETTING, "").strip():
        values["trusted_proxy_ips"] = proxy.parse_trusted_proxies(raw)
    if raw := environ.get(proxy.SECRET_SETTING, "").strip():
        values["proxy_secret"] = proxy.parse_secret_name(raw)
    return values


def _limit_values(environ: Mapping[str, str]) -> dict[str, Any]:
    """`PoolSettings.from_env`'s ceiling of instances and sessions per user, where set."""
    values: dict[str, Any] = {}
    if raw := environ.get(CEILING_SETTING, "").strip():
        if not (raw.isascii() and raw.isdigit()) or int(raw) < 1:
            raise ValueError(f"{CEILING_SETTING} must be a positive integer, got {raw!r}")
        values["max_instances_ceiling"] = int(raw)
    if raw := environ.get(SESSIONS_PER_USER_SETTING, "").strip():
        try:
            values["sessions_per_user"] = int(raw)
        except ValueError:
            raise ValueError(f"{SESSIONS_PER_USER_SETTING} must be an integer (negative: "
                             f"no limit), got {raw!r}") from None
    return values


def _route_values(environ: Mapping[str, str]) -> dict[str, Any]:
    """`PoolSettings.from_env`'s routing and session path settings, where set."""
    values: dict[str, Any] = {}
    if raw := environ.get(ROUTES_SETTING, "").strip():
        if raw not in ROUTE_MODES:
            raise ValueError(f"{ROUTES_SETTING} must be one of {', '.join(ROUTE_MODES)}, "
                             f"got {raw!r}")
        values["routes"] = raw
    if raw := environ.get("WARMPOOL_USE_PATHS", "").strip():
        values["use_paths"] = _either(raw, "WARMPOOL_USE_PATHS", "true", "false")
    if raw := environ.get("WARMPOOL_INSTANCES_PATH", "").strip():
        values["instances_path"] = proxy.parse_path(raw, "WARMPOOL_INSTANCES_PATH")
    if "WARMPOOL_INGRESS_PATH_SUFFIX" in environ:  # set and empty: HAProxy's
        suffix = environ["WARMPOOL_INGRESS_PATH_SUFFIX"].strip()
        # A regex for the ingress controller, written into Ingress paths only: printable
        # ASCII without spaces, at most 64 characters.
        if len(suffix) > 64 or not all("!" <= c <= "~" for c in suffix):
            raise ValueError("WARMPOOL_INGRESS_PATH_SUFFIX must be at most 64 printable "
                             f"ASCII characters without spaces, got {suffix[:80]!r}")
        values["ingress_path_suffix"] = suffix
    return values


def _either(raw: str, name: str, yes: str, no: str) -> bool:
    """A two-valued setting: True for `yes`, False for `no`, anything else a ValueError."""
    if raw not in (yes, no):
        raise ValueError(f"{name} must be {yes} or {no}, got {raw!r}")
    return raw == yes


def _env_value(raw: str, name: str) -> str:
    """A setting copied verbatim into every instance's environment: printable ASCII without
    spaces, bounded in length, so that a stray newline or a pasted paragraph is a
    configuration error at start rather than in every IDE. The value is never shown (one of
    them is a token)."""
    limit = _TEXT_LIMITS[name]
    if len(raw) > limit or not all("!" <= c <= "~" for c in raw):
        raise ValueError(f"{name} must be at most {limit} printable ASCII characters without "
                         f"spaces (got {len(raw)} characters; the value is not shown)")
    return raw


#: The THEIACLOUD_* variables of Java's Deployment template (templateDeployment.yaml, both
#: lines), in its order. The Session ones are empty on a prewarmed instance: Java fills them
#: only for a lazy Session's own Deployment, and never patches a claimed instance.
THEIACLOUD_ENV = (
    "THEIACLOUD_SERVICE_AUTH_TOKEN", "THEIACLOUD_APP_ID", "THEIACLOUD_SERVICE_URL",
    "THEIACLOUD_SESSION_UID", "THEIACLOUD_SESSION_NAME", "THEIACLOUD_SESSION_USER",
    "THEIACLOUD_SESSION_URL", "THEIACLOUD_SESSION_SECRET",
    "THEIACLOUD_MONITOR_ENABLE_ACTIVITY_TRACKER", "THEIACLOUD_MONITOR_PORT",
    "THEIACLOUD_KEYCLOAK_URL", "THEIACLOUD_KEYCLOAK_REALM", "THEIACLOUD_KEYCLOAK_CLIENT_ID",
)


def instance_env(appdef: AppDefinition, instance: int,
                 settings: PoolSettings) -> list[dict[str, str]]:
    """The IDE container's environment, as Java's DefaultDeploymentTemplateReplacements fills
    it for eager instance k (getReplacements(namespace, appDefinition, instance)).

    Set once, at creation: everything here is the instance's, not a Session's, so a claim
    changes nothing in the pod template (a change there would restart the pod under the
    user). Departures from Java: the activity tracker flag is "true" when the AppDefinition
    declares spec.monitor.activityTracker (Java: its --enableActivityTracker, with
    --enableMonitor), and THEIACLOUD_MONITOR_PORT is "" without spec.monitor.port (Java leaves
    its template's placeholder text there).
    """
    values = {
        # Java sets both: THEIACLOUD_APP_ID is the deprecated name of the same token.
        "THEIACLOUD_SERVICE_AUTH_TOKEN": settings.service_auth_token,
        "THEIACLOUD_APP_ID": settings.service_auth_token,
        "THEIACLOUD_SERVICE_URL": settings.service_url,
        "THEIACLOUD_SESSION_UID": "",
        "THEIACLOUD_SESSION_NAME": "",
        "THEIACLOUD_SESSION_USER": "",
        # TheiaCloudDeploymentUtil.getSessionURL: "https://" + host + path + "/".
        "THEIACLOUD_SESSION_URL": f"https://{settings.session_url(appdef, instance)}",
        "THEIACLOUD_SESSION_SECRET": "",
        "THEIACLOUD_MONITOR_ENABLE_ACTIVITY_TRACKER": (
            "true" if appdef.activity_tracker and appdef.monitor_port is not None else "false"),
        "THEIACLOUD_MONITOR_PORT": "" if appdef.monitor_port is None else str(appdef.monitor_port),
        "THEIACLOUD_KEYCLOAK_URL": settings.keycloak_url,
        "THEIACLOUD_KEYCLOAK_REALM": settings.keycloak_realm,
        "THEIACLOUD_KEYCLOAK_CLIENT_ID": settings.keycloak_client_id,
    }
    return [{"name": name, "value": values[name]} for name in THEIACLOUD_ENV]


def separate_monitor_port(appdef: AppDefinition) -> int | None:
    """spec.monitor.port when it is a port of its own. Java declares it (container port
    "monitor", Service port "monitor-express") only then: equal to spec.port it would be a
    duplicate the API server refuses, and the monitor is reached on the application port."""
    port = appdef.monitor_port
    return port if port is not None and port != appdef.port else None


def object_name(appdef: AppDefinition, part: Part, instance: int) -> str:
    return part.object_name(appdef.spec_name, appdef.uid, instance)


def session_labels(appdef: AppDefinition, session: Session) -> dict[str, str]:
    """Labels both Services carry while `session` holds the instance."""
    return {
        v.LABEL_SESSION: naming.label_value(session.name),
        v.LABEL_SESSION_UUID: session.uid,
        v.LABEL_USER: naming.user_label(session.user),
        v.LABEL_APP_DEFINITION: naming.label_value(appdef.spec_name),
        v.LABEL_COMPONENT: "session",
        v.LABEL_PART_OF: "theia-cloud",
    }


def base_labels(appdef: AppDefinition, part: Part, instance: int) -> dict[str, str]:
    """Labels an object carries whether it is free or claimed."""
    gen = {v.LABEL_GENERATION: str(appdef.generation)}
    selector = naming.app_selector(appdef.spec_name, instance)
    match part:
        case Part.EXTERNAL_SERVICE:
            return {v.LABEL_APP: selector, **gen}
        case Part.INTERNAL_SERVICE:
            return {v.LABEL_APP: selector, v.LABEL_SERVICE_TYPE: v.SERVICE_TYPE_INTERNAL, **gen}
        case Part.PROXY_CONFIGMAP:
            return {v.LABEL_TEMPLATE_PURPOSE: v.PURPOSE_PROXY, **gen}
        case Part.EMAIL_CONFIGMAP:
            return {v.LABEL_TEMPLATE_PURPOSE: v.PURPOSE_EMAILS, **gen}
        case Part.DEPLOYMENT:
            return gen
        case Part.ROUTE | Part.INGRESS:
            raise ValueError(f"{part.kind} is not one of the five: warmpool.pool.routes and "
                             "warmpool.pool.ingress build what is written to it")


def proxy_config(
    appdef: AppDefinition, instance: int, template: str | None, settings: PoolSettings
) -> str:
    """The namespace's oauth2-proxy template, rewritten (warmpool.pool.proxy), with this
    instance's URL, port and path filled in."""
    path = settings.session_path(appdef, instance)
    url = f"https://{settings.instances_host}{path}"
    return proxy.prepare(template, settings.proxy_policy).render(url, appdef.port, path)


def build(
    part: Part,
    appdef: AppDefinition,
    instance: int,
    *,
    holder: Session | None,
    proxy_template: str | None,
    settings: PoolSettings,
) -> dict[str, Any]:
    """The full desired object; `holder` is the claiming Session, or None for a free instance."""
    owners = [appdef.owner_reference()]
    labels = base_labels(appdef, part, instance)
    if holder is not None:
        owners.append(holder.owner_reference())
        if part.is_service:
            labels.update(session_labels(appdef, holder))
    metadata: dict[str, Any] = {
        "name": object_name(appdef, part, instance),
        "namespace": appdef.namespace,
        "labels": labels,
        "ownerReferences": owners,
    }
    body: dict[str, Any] = {"apiVersion": part.api_version, "kind": part.kind, "metadata": metadata}
    selector = naming.app_selector(appdef.spec_name, instance)
    match part:
        case Part.EXTERNAL_SERVICE:
            ports: list[dict[str, Any]] = [
                {"name": "http", "port": appdef.port, "targetPort": "web"}]
            if (monitor := separate_monitor_port(appdef)) is not None:
                # Java's TheiaCloudServiceUtil: straight to the IDE's monitor, past the proxy.
                # The activity tracker asks the instance's monitor here (clusterIP:port).
                ports.append({"name": "monitor-express", "port": monitor,
                              "targetPort": monitor, "protocol": "TCP"})
            body["spec"] = {"selector": {v.LABEL_APP: selector}, "ports": ports}
        case Part.INTERNAL_SERVICE:
            body["spec"] = {
                "selector": {v.LABEL_APP: selector},
                "ports": [{"name": "http-internal", "port": v.INTERNAL_PORT,
                           "targetPort": appdef.port}],
            }
        case Part.PROXY_CONFIGMAP:
            body["data"] = {v.PROXY_CONFIG_KEY: proxy_config(appdef, instance, proxy_template,
                                                             settings)}
        case Part.EMAIL_CONFIGMAP:
            body["data"] = {v.EMAILS_KEY: holder.user if holder is not None else ""}
        case Part.DEPLOYMENT:
            body["spec"] = _deployment_spec(appdef, instance, selector, settings)
    metadata["annotations"] = {v.ANNOTATION_SHAPE: shape_hash(body)}
    if holder is not None and part is Part.EXTERNAL_SERVICE:
        metadata["annotations"][v.ANNOTATION_CLAIMED_FOR] = naming.claimed_for(holder.uid,
                                                                               holder.user)
    return body


def shape_hash(body: Mapping[str, Any]) -> str:
    """What an object looks like when free, whatever its generation, holder or owners.

    Every spec change bumps the AppDefinition's generation, minInstances included; comparing
    shapes tells a change that needs new objects (image, port, resources, proxy template) from
    one that only needs the generation label moved, so scaling a pool does not restart its
    prewarmed pods.
    """
    shape = copy.deepcopy(dict(body))
    meta = shape.setdefault("metadata", {})
    for key in ("ownerReferences", "annotations", "resourceVersion", "uid"):
        meta.pop(key, None)
    meta["labels"] = {k: val for k, val in labels_of(shape).items()
                      if k != v.LABEL_GENERATION and k not in v.SESSION_LABEL_KEYS}
    if v.EMAILS_KEY in (shape.get("data") or {}):
        shape["data"] = {**shape["data"], v.EMAILS_KEY: ""}
    template = (shape.get("spec") or {}).get("template")
    if template is not None:
        template["metadata"]["labels"] = {k: val for k, val in labels_of(template).items()
                                          if k != v.LABEL_GENERATION}
    raw = json.dumps(shape, sort_keys=True, separators=(",", ":"))
    return hashlib.blake2b(raw.encode(), digest_size=8).hexdigest()


def _resources(appdef: AppDefinition) -> dict[str, dict[str, str]]:
    requests = {k: q for k, q in (("cpu", appdef.requests_cpu),
                                  ("memory", appdef.requests_memory)) if q}
    limits = {k: q for k, q in (("cpu", appdef.limits_cpu), ("memory", appdef.limits_memory)) if q}
    out: dict[str, dict[str, str]] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _deployment_spec(
    appdef: AppDefinition, instance: int, selector: str, settings: PoolSettings
) -> dict[str, Any]:
    proxy_cm = object_name(appdef, Part.PROXY_CONFIGMAP, instance)
    email_cm = object_name(appdef, Part.EMAIL_CONFIGMAP, instance)
    app: dict[str, Any] = {
        "name": naming.as_valid_name(appdef.spec_name),
        "image": appdef.image,
        "imagePullPolicy": appdef.image_pull_policy,
        "ports": [{"containerPort": appdef.port}],
        "resources": _resources(appdef),
        "env": instance_env(appdef, instance, settings),
    }
    if (monitor := separate_monitor_port(appdef)) is not None:
        app["ports"].append({"containerPort": monitor, "name": "monitor"})
    # Hardening that keeps Theia Cloud's images working (docs/security.md, each a departure
    # from the Java operator): no privilege escalation (no setuid sudo in the IDE), and
    # runAsNonRoot where the AppDefinition names a uid other than 0 (one that names none, or
    # 0, runs as its image says, as before).
    app_security: dict[str, Any] = {"allowPrivilegeEscalation": False}
    if appdef.run_as_user is not None:
        app_security["runAsUser"] = appdef.run_as_user
        if appdef.run_as_user != 0:
            app_security["runAsNonRoot"] = True
    app["securityContext"] = app_security
    proxy_container: dict[str, Any] = {
        "name": "oauth2-proxy",
        "image": settings.oauth2_proxy_image,
        "args": [
            "--config=/etc/oauth2-proxy.cfg",
            f"--authenticated-emails-file=/emails/{v.EMAILS_KEY}",
        ],
        "ports": [{"name": "web", "containerPort": v.OAUTH2_PROXY_PORT}],
        "volumeMounts": [
            {"name": "oauth2-proxy-config", "mountPath": "/etc/oauth2-proxy.cfg",
             "subPath": v.PROXY_CONFIG_KEY},
            {"name": "oauth2-emails", "mountPath": "/emails"},
        ],
        "resources": copy.deepcopy(proxy.PROXY_RESOURCES),
        "securityContext": {
            "runAsNonRoot": True, "runAsUser": proxy.PROXY_UID, "runAsGroup": proxy.PROXY_UID,
            "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    if settings.proxy_secret:
        # client_secret and cookie_secret come from the Secret (oauth2-proxy's environment
        # wins over its file), so the per-instance ConfigMap does not carry them. Not optional:
        # a missing Secret or key keeps the pod from starting, with the Secret's name.
        proxy_container["env"] = [
            {"name": env, "valueFrom": {"secretKeyRef": {"name": settings.proxy_secret,
                                                          "key": key}}}
            for key, env in proxy.SECRET_KEYS.values()]
    pod_spec: dict[str, Any] = {
        "automountServiceAccountToken": False,
        # The container runtime's default seccomp profile for both containers.
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [app, proxy_container],
        "volumes": [
            # Neither is optional: a pod whose allow-list is missing must not start
            # (it would answer 403 to everyone, or worse, serve without the proxy).
            {"name": "oauth2-proxy-config", "configMap": {"name": proxy_cm}},
            {"name": "oauth2-emails", "configMap": {"name": email_cm}},
        ],
    }
    if appdef.pull_secret:
        # Java's AddedHandlerUtil.addImagePullSecret; the name's grammar is checked at parse.
        pod_spec["imagePullSecrets"] = [{"name": appdef.pull_secret}]
    return {
        "replicas": 1,
        "selector": {"matchLabels": {v.LABEL_APP: selector}},
        "template": {
            "metadata": {
                "labels": {v.LABEL_APP: selector, v.LABEL_GENERATION: str(appdef.generation)},
            },
            "spec": pod_spec,
        },
    }

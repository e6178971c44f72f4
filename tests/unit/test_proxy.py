"""The proxy in front of every instance (issue #27, points 2, 6 and 7): its image setting, the
rewrite of the namespace's template, the escaping of every value, the hardened pod."""

from __future__ import annotations

import re
import tomllib

import pytest

from tests.unit.pool_fixtures import SETTINGS, appdef, instance, session
from warmpool.pool import builders, proxy
from warmpool.pool.actions import Create, Report
from warmpool.pool.builders import PoolSettings
from warmpool.pool.decide import decide_instance
from warmpool.pool.parts import PARTS, Part

#: Theia Cloud's chart's template (charts/theia-cloud/templates/oauth2-configmap-...), as the
#: namespace holds it: the secrets inline, reverse_proxy on, the unanchored skip route.
STOCK = """\
# Provider config
provider="keycloak-oidc"
redirect_url="https://placeholder/oauth2/callback"
oidc_issuer_url="https://keycloak.example.com/realms/TheiaCloud"
ssl_insecure_skip_verify=true
client_id="theia-cloud"
client_secret="client-s3cret"
cookie_secret="0123456789abcdef0123456789abcdef"
cookie_secure="false"
http_address="0.0.0.0:5000"
upstreams="http://127.0.0.1:placeholder-port/"
skip_auth_routes=["/health.*"]
skip_provider_button="true"
reverse_proxy="true"
cookie_domains=["ws.example.com"]
custom_templates_dir="/templates"
"""

GATEWAY = PoolSettings(routes="none", url_probe=False, trusted_proxy_ips=("10.244.0.0/16",))


def config(template: str | None, settings: PoolSettings = SETTINGS, k: int = 1) -> dict:
    body = builders.build(Part.PROXY_CONFIGMAP, appdef(), k, holder=None,
                          proxy_template=template, settings=settings)
    return tomllib.loads(body["data"]["oauth2-proxy.cfg"])


def findings(template: str | None, settings: PoolSettings = SETTINGS) -> list[proxy.Finding]:
    return list(proxy.prepare(template, settings.proxy_policy).findings)


def go_match(route: str, path: str) -> bool:
    """oauth2-proxy's skip route check: METHOD=regex, the regex searched in the path (the
    rendered regexes use only syntax Python's `re` reads the same as Go's RE2)."""
    method, _, regex = route.partition("=")
    return method == "GET" and re.search(regex, path) is not None


# --- point 2: the bypass ---------------------------------------------------------------------


def test_the_default_image_is_the_newest_established_release_not_7_5_1() -> None:
    assert PoolSettings().oauth2_proxy_image == "quay.io/oauth2-proxy/oauth2-proxy:v7.15.5"
    dep = builders.build(Part.DEPLOYMENT, appdef(), 1, holder=None, proxy_template=None,
                         settings=SETTINGS)
    (proxy_c,) = [c for c in dep["spec"]["template"]["spec"]["containers"]
                  if c["name"] == "oauth2-proxy"]
    assert proxy_c["image"].endswith(":v7.15.5")


@pytest.mark.parametrize("image", [
    "quay.io/oauth2-proxy/oauth2-proxy:v7.15.5",
    "registry.example.com:5000/mirror/oauth2-proxy:v7.15.5-alpine",
    "oauth2-proxy/oauth2-proxy@sha256:" + "0" * 64,
])
def test_the_image_is_a_setting(image: str) -> None:
    settings = PoolSettings.from_env({"WARMPOOL_OAUTH2_PROXY_IMAGE": image})
    assert settings.oauth2_proxy_image == image


@pytest.mark.parametrize("image", [
    "quay.io/oauth2-proxy/oauth2-proxy",  # floats to latest
    "quay.io/oauth2-proxy/oauth2 proxy:v7",
    'x:1"\nfoo',
    "quay.io/UPPER/case:v1",
    "a:" + "v" * 200,
    "x" * 300 + ":v1",
])
def test_a_bad_image_setting_names_the_variable(image: str) -> None:
    with pytest.raises(ValueError, match="WARMPOOL_OAUTH2_PROXY_IMAGE"):
        PoolSettings.from_env({"WARMPOOL_OAUTH2_PROXY_IMAGE": image})


def test_stock_template_without_trusted_proxies_loses_its_skip_routes_with_a_finding() -> None:
    """reverse_proxy on, no trusted_proxy_ip: oauth2-proxy trusts every client's
    X-Forwarded-Uri (issue #3506), so `/health.*` would open everything. Refused."""
    cfg = config(STOCK)
    assert "skip_auth_routes" not in cfg and "trusted_proxy_ip" not in cfg
    assert cfg["reverse_proxy"] == "true"
    (f,) = findings(STOCK)
    assert f.reason == "ProxyTemplateRefused"
    assert f.field == "data[oauth2-proxy.cfg].skip_auth_routes"
    assert "oauth2-proxy-config" in f.message and "WARMPOOL_TRUSTED_PROXY_IPS" in f.message


def test_with_trusted_proxies_the_skip_route_is_anchored_to_the_literal_path() -> None:
    cfg = config(STOCK, GATEWAY, k=2)
    assert cfg["trusted_proxy_ip"] == ["10.244.0.0/16"]
    (route,) = cfg["skip_auth_routes"]
    assert route == "GET=^(?:/java-17-2)?/health$"
    # The rewritten path and the forwarded one (the session's prefix) match ...
    assert go_match(route, "/health") and go_match(route, "/java-17-2/health")
    # ... nothing else: not a longer path, not another instance's, not a query smuggled in.
    for path in ("/healthz", "/health/../secret", "/x/health", "/secret?/health",
                 "/java-17-3/health", "/java-17-2/secret/health"):
        assert not go_match(route, path), path
    assert findings(STOCK, GATEWAY) == []


@pytest.mark.parametrize(("entry", "kept"), [
    ("/health.*", "GET=^(?:/java-17-1)?/health$"),
    ("^/health$", "GET=^(?:/java-17-1)?/health$"),
    ("HEAD=/ready", "HEAD=^(?:/java-17-1)?/ready$"),
    (r"/static/app\.js", r"GET=^(?:/java-17-1)?/static/app\.js$"),
    ("/a.b", r"GET=^(?:/java-17-1)?/a\.b$"),  # an unescaped dot: a dot, nothing wider
    ("/api/(public|docs)/.*", None),
    ("/.*", "GET=^(?:/java-17-1)?/$"),
    ("health", None),  # not a path
    ("FETCH=/health", None),
    ("/h[e]alth", None),
])
def test_skip_route_grammar(entry: str, kept: str | None) -> None:
    escaped = entry.replace("\\", "\\\\")  # as a TOML basic string
    template = f'reverse_proxy = true\nskip_auth_routes = ["{escaped}"]\n'
    cfg = config(template, GATEWAY)
    assert cfg.get("skip_auth_routes", []) == ([kept] if kept else [])
    refused = [f for f in findings(template, GATEWAY) if f.field.endswith("skip_auth_routes")]
    assert bool(refused) == (kept is None)


def test_skip_auth_regex_joins_the_anchored_routes_and_is_not_written() -> None:
    cfg = config('skip_auth_regex = ["^/metrics$"]\n', SETTINGS)  # reverse_proxy off
    assert "skip_auth_regex" not in cfg
    assert cfg["skip_auth_routes"] == ["GET=^(?:/java-17-1)?/metrics$"]


def test_allow_list_wideners_are_refused() -> None:
    template = ('reverse_proxy = "true"\ntrusted_ips = ["0.0.0.0/0"]\nemail_domains = ["*"]\n'
                "skip_auth_preflight = true\n")
    cfg = config(template, GATEWAY)
    assert not {"trusted_ips", "email_domains", "skip_auth_preflight"} & set(cfg)
    assert {f.field.rsplit(".", 1)[1] for f in findings(template, GATEWAY)} == {
        "trusted_ips", "email_domains", "skip_auth_preflight"}
    assert config("skip_auth_preflight = false\n")["skip_auth_preflight"] is False


def test_the_templates_own_trusted_proxy_ip_counts_only_if_it_is_narrow() -> None:
    own = 'reverse_proxy = true\ntrusted_proxy_ip = ["10.1.0.0/16"]\nskip_auth_routes = ["/h"]\n'
    assert config(own)["trusted_proxy_ip"] == ["10.1.0.0/16"]
    assert config(own)["skip_auth_routes"] == ["GET=^(?:/java-17-1)?/h$"]
    wide = own.replace("10.1.0.0/16", "0.0.0.0/0")
    cfg = config(wide)
    assert "trusted_proxy_ip" not in cfg and "skip_auth_routes" not in cfg
    assert {f.field.rsplit(".", 1)[1] for f in findings(wide)} == {
        "trusted_proxy_ip", "skip_auth_routes"}
    # The setting wins over the template's.
    assert config(own, GATEWAY)["trusted_proxy_ip"] == ["10.244.0.0/16"]


@pytest.mark.parametrize("raw", ["0.0.0.0/0", "::/0", "10.0.0.1/8", "ten", "10.0.0.0/33",
                                 ",".join(f"10.0.{i}.0/24" for i in range(33))])
def test_bad_trusted_proxy_setting(raw: str) -> None:
    with pytest.raises(ValueError, match="WARMPOOL_TRUSTED_PROXY_IPS"):
        PoolSettings.from_env({"WARMPOOL_TRUSTED_PROXY_IPS": raw})


def test_trusted_proxy_setting() -> None:
    s = PoolSettings.from_env({"WARMPOOL_TRUSTED_PROXY_IPS": "10.244.0.0/16, fd00::/8,192.0.2.7"})
    assert s.trusted_proxy_ips == ("10.244.0.0/16", "fd00::/8", "192.0.2.7/32")


# --- the template's grammar ------------------------------------------------------------------


@pytest.mark.parametrize(("template", "why"), [
    ("provider = [", "is not TOML"),
    ("x = 1\n" + "#" * proxy.MAX_TEMPLATE_CHARS, "characters, more than"),
    ("".join(f"k{i} = 1\n" for i in range(proxy.MAX_KEYS + 1)), "keys, more than"),
])
def test_an_unreadable_template_gives_way_to_the_minimal_config(template: str, why: str) -> None:
    (f,) = findings(template)
    assert f.reason == "ProxyTemplateInvalid" and why in f.message
    cfg = config(template)
    assert cfg["redirect_url"] == "https://instances.theia-cloud.local/java-17-1/oauth2/callback"
    assert "client_id" not in cfg  # the proxy does not start: the instance fails closed


def test_values_that_are_no_option_are_dropped_with_a_finding() -> None:
    template = ('provider = "oidc"\n[table]\nx = 1\n')
    cfg = config(template)
    assert cfg == {"provider": "oidc"}
    (f,) = findings(template)
    assert f.reason == "ProxyTemplateInvalid" and "table" in f.field


def test_a_template_value_cannot_add_a_line() -> None:
    """A value holding a quote, a newline and a key is written back as one escaped string."""
    template = 'custom_templates_dir = "/t\\"\\nskip_auth_routes = [\\"/.*\\"]\\n"\n'
    cfg = config(template)
    assert set(cfg) == {"custom_templates_dir"}
    assert cfg["custom_templates_dir"] == '/t"\nskip_auth_routes = ["/.*"]\n'


# --- point 6: the settings pasted into the configuration -------------------------------------


@pytest.mark.parametrize(("name", "raw"), [
    ("WARMPOOL_INSTANCES_HOST", 'h.example.com"\nskip_auth_routes=["/.*"]'),
    ("WARMPOOL_INSTANCES_HOST", "Host.Example.com"),
    ("WARMPOOL_INSTANCES_HOST", "h.example.com/path"),
    ("WARMPOOL_INSTANCES_HOST", "-h.example.com"),
    ("WARMPOOL_INSTANCES_HOST", "h.example.com:99999"),
    ("WARMPOOL_INSTANCES_HOST", "a" * 64 + ".example.com"),
    ("WARMPOOL_INSTANCES_HOST", ".".join(["a" * 60] * 5)),
    ("WARMPOOL_INSTANCES_PATH", 'instances"\nx=1'),
    ("WARMPOOL_INSTANCES_PATH", "/instances"),
    ("WARMPOOL_INSTANCES_PATH", "a/../b"),
    ("WARMPOOL_INGRESS_PATH_SUFFIX", "(/|$) (.*)"),
    ("WARMPOOL_PROXY_SECRET", "Not_A_Name"),
])
def test_a_bad_setting_is_a_configuration_error(name: str, raw: str) -> None:
    with pytest.raises(ValueError, match=name):
        PoolSettings.from_env({name: raw})


@pytest.mark.parametrize(("name", "raw"), [
    ("WARMPOOL_INSTANCES_HOST", "instances.theia-cloud.local"),
    ("WARMPOOL_INSTANCES_HOST", "localhost:8443"),
    ("WARMPOOL_INSTANCES_PATH", "instances"),
    ("WARMPOOL_INSTANCES_PATH", "a/b-c_d.e"),
    ("WARMPOOL_INGRESS_PATH_SUFFIX", "(/|$)(.*)"),
])
def test_good_settings_are_taken(name: str, raw: str) -> None:
    PoolSettings.from_env({name: raw})


def test_the_rendered_config_is_escaped_toml_whatever_the_settings() -> None:
    """Settings built without from_env (tests, the harness) are escaped all the same."""
    settings = PoolSettings(instances_host='h"\nx = 1', routes="none", url_probe=False)
    cfg = config(STOCK, settings)
    assert cfg["redirect_url"] == 'https://h"\nx = 1/java-17-1/oauth2/callback'
    assert "x" not in cfg


# --- point 7: secrets and the pod ------------------------------------------------------------


def test_secrets_stay_out_of_the_instance_configmap_with_a_secret_setting() -> None:
    settings = PoolSettings.from_env({"WARMPOOL_PROXY_SECRET": "oauth2-proxy-secrets"})
    body = builders.build(Part.PROXY_CONFIGMAP, appdef(), 1, holder=None, proxy_template=STOCK,
                          settings=settings)
    text = body["data"]["oauth2-proxy.cfg"]
    assert "client-s3cret" not in text and "0123456789abcdef" not in text
    dep = builders.build(Part.DEPLOYMENT, appdef(), 1, holder=None, proxy_template=STOCK,
                         settings=settings)
    (proxy_c,) = [c for c in dep["spec"]["template"]["spec"]["containers"]
                  if c["name"] == "oauth2-proxy"]
    assert proxy_c["env"] == [
        {"name": "OAUTH2_PROXY_CLIENT_SECRET", "valueFrom": {"secretKeyRef": {
            "name": "oauth2-proxy-secrets", "key": "client-secret"}}},
        {"name": "OAUTH2_PROXY_COOKIE_SECRET", "valueFrom": {"secretKeyRef": {
            "name": "oauth2-proxy-secrets", "key": "cookie-secret"}}}]
    # Without the setting: copied, as the Java operator does (Theia Cloud has no such Secret).
    assert config(STOCK)["client_secret"] == "client-s3cret"


def _pod(uid: int | None) -> dict:
    a = appdef()
    if uid is not None or a.run_as_user is not None:
        from dataclasses import replace
        a = replace(a, run_as_user=uid)
    dep = builders.build(Part.DEPLOYMENT, a, 1, holder=None, proxy_template=None,
                         settings=SETTINGS)
    return dep["spec"]["template"]["spec"]


@pytest.mark.parametrize("uid", [101, 0, None])
def test_instance_pods_are_hardened_where_the_image_allows(uid: int | None) -> None:
    pod = _pod(uid)
    assert pod["securityContext"] == {"seccompProfile": {"type": "RuntimeDefault"}}
    app, proxy_c = pod["containers"]
    assert app["securityContext"]["allowPrivilegeEscalation"] is False
    assert app["securityContext"].get("runAsUser") == uid
    # non-root where the AppDefinition names a uid other than 0; its image decides otherwise
    assert app["securityContext"].get("runAsNonRoot", False) is (uid not in (0, None))
    assert proxy_c["securityContext"] == {
        "runAsNonRoot": True, "runAsUser": 65532, "runAsGroup": 65532,
        "allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]}}
    assert set(proxy_c["resources"]) == {"requests", "limits"}
    assert "env" not in proxy_c


# --- the Warning event ----------------------------------------------------------------------


def test_the_decision_reports_the_refusal_on_the_template_once_per_configmap_built() -> None:
    a = appdef(min_instances=1)
    fresh = decide_instance(instance(a, 1, missing=tuple(PARTS)), "java", a, [],
                            proxy_template=STOCK, settings=SETTINGS)
    assert any(isinstance(x, Create) and x.part is Part.PROXY_CONFIGMAP for x in fresh.actions)
    (report,) = [x for x in fresh.actions if isinstance(x, Report)]
    assert report.reason == "ProxyTemplateRefused"
    assert report.regarding == {"apiVersion": "v1", "kind": "ConfigMap",
                                "name": "oauth2-proxy-config"}
    assert "skip_auth_routes" in report.message
    # An instance whose ConfigMap exists is not reported again on every reconcile.
    s = session("s1", instance=1, status="HANDLED")
    held = decide_instance(instance(a, 1, holder=s), "java", a, [s], proxy_template=STOCK,
                           settings=SETTINGS)
    assert not [x for x in held.actions if isinstance(x, Report)]


@pytest.mark.parametrize(("value", "refused"), [
    ("true", True), ('"true"', True), ('"1"', True), ("1", True), ('"yes"', True),
    ("false", False), ('"false"', False), ('"0"', False), (None, False)])
def test_reverse_proxy_counts_as_on_unless_it_is_plainly_off(value: str | None,
                                                             refused: bool) -> None:
    line = f"reverse_proxy = {value}\n" if value is not None else ""
    template = line + 'skip_auth_routes = ["/health"]\n'
    assert ("skip_auth_routes" not in config(template)) is refused


def test_a_template_is_read_once_and_its_reading_is_shared_read_only() -> None:
    """Every proxy ConfigMap built from one template shares one reading (memoized: the TOML
    was parsed again for each instance); nothing a caller does to it reaches the next."""
    policy = GATEWAY.proxy_policy
    first = proxy.prepare(STOCK, policy)
    assert proxy.prepare(STOCK, policy) is first
    assert proxy.prepare(STOCK + "\n", policy) is not first  # another text, another reading
    with pytest.raises(TypeError):
        first.values["upstreams"] = "http://elsewhere/"  # type: ignore[index]
    # The bounds come before the memo: a value that is no text (unhashable, too) is refused.
    (finding,) = proxy.prepare(["a = 1"], policy).findings  # type: ignore[arg-type]
    assert "is a list, not text" in finding.message
    # Two instances rendered from the shared reading, each with its own URL and port.
    one, two = config(STOCK, GATEWAY, k=1), config(STOCK, GATEWAY, k=2)
    assert one["redirect_url"] != two["redirect_url"]
    assert config(STOCK, GATEWAY, k=1) == one

"""`warmpool status` and `warmpool scale`, run as a person runs them, on the real cluster.

Each command is a subprocess (`python -m warmpool.cli ...`) configured only by its
environment (KUBECONFIG, WARMPOOL_NAMESPACE) or flags. The pool is driven to a converged state
by real worker processes; the test plays the scheduler by adding the keys a change needs.
Configuration failures (no kubeconfig, an API server that does not answer) need no cluster.
"""

from __future__ import annotations

import functools
import http.server
import json
import re
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
import yaml

from tests.cli_run import assert_one_line_error, clean_env, run, run_json
from tests.pool_world import converge, held_instance, session
from tests.redis_server import isolated
from tests.waiting import wait_for
from warmpool.keys import PoolKey, SessionKey
from warmpool.pool import vocabulary as v
from warmpool.queue.keyed import KeyedQueue
from warmpool.queue.redis_conn import connect
from warmpool.queue.settings import QueueSettings
from warmpool.testing.world import USERS, create_appdef, create_session, patch_appdef_spec
from workers.process import WorkerPool

BAD_USER = "ann@example.com,eve@example.org"  # two addresses: refused, never printed


def cli_env(kubeconfig: str | None = None, **extra: str) -> dict[str, str]:
    return clean_env(**({"KUBECONFIG": kubeconfig} if kubeconfig else {}), **extra)


def assert_no_email(text: str) -> None:
    for address in [*USERS[:10], *BAD_USER.split(",")]:
        assert address not in text, address
    assert not re.search(r"[\w.+-]+@[\w-]+\.[\w.]+", text), text


@pytest.fixture
def settings(redis_url: str, redis_client: redis.Redis) -> Iterator[QueueSettings]:
    with isolated(redis_url, redis_client, drain_timeout=5) as s:
        yield s


@pytest.fixture
def workers(settings: QueueSettings, cluster) -> Iterator[WorkerPool]:
    pool = WorkerPool(settings, processes=2, threads=4, modules=("workers.handlers",),
                      env={"KUBECONFIG": str(cluster.kubeconfig)})
    pool.start()
    yield pool
    pool.stop(timeout=15)


@pytest.fixture
def queue(settings: QueueSettings) -> KeyedQueue:
    assert settings.redis_url
    return KeyedQueue(connect(settings.redis_url), settings)


def test_status_of_converged_pools_with_holders_waiting_outdated_and_errors(
    kube, namespace, cluster, workers, queue
) -> None:
    ns = namespace
    # maxInstances 3: with all three claimed a fourth Session waits (a burst has no room)
    create_appdef(kube, ns, "java", min_instances=3, max_instances=3)
    create_appdef(kube, ns, "broken", min_instances=5, max_instances=2)
    queue.add_many([str(PoolKey(ns, "java")), str(PoolKey(ns, "broken"))])
    # The pool first: this test plays the scheduler only by adding keys, so nothing would
    # re-offer capacity to a claim that ran before its instances existed (the scheduler does,
    # on the instances' own events).
    converge(kube, ns)
    users = [*USERS[:4], BAD_USER]
    for i, user in enumerate(users):  # s0..s2 claim, s3 waits, s4 is refused
        create_session(kube, ns, f"s{i}", user)
        queue.add(str(SessionKey(ns, f"s{i}")))
        wait_for(lambda i=i: session(kube, ns, f"s{i}").get("status"), timeout=60)
    create_session(kube, ns, "stray", USERS[9], appdef="nowhere")
    queue.add(str(SessionKey(ns, "stray")))
    converge(kube, ns)
    held = {f"s{i}": held_instance(kube, ns, f"s{i}") for i in range(3)}
    assert sorted(held.values()) == [1, 2, 3]
    env = cli_env(str(cluster.kubeconfig), WARMPOOL_NAMESPACE=ns)

    raw = run(env, "status", "--json").stdout
    assert_no_email(raw)
    doc = json.loads(raw)
    assert doc["namespace"] == ns
    pools = {p["name"]: p for p in doc["appdefinitions"]}
    assert set(pools) == {"java", "broken"}
    java = pools["java"]
    assert java["valid"] and (java["minInstances"], java["maxInstances"]) == (3, 3)
    assert java["counts"] == {"claimed": 3, "free": 0, "free_warm": 0, "free_starting": 0,
                              "free_failing": 0, "outdated": 0, "starting": 0,
                              "releasing": 0, "removing": 0, "waiting": 1}
    assert {i["id"]: i["session"] for i in java["instances"]} == {
        k: name for name, k in held.items()}
    assert all(i["objects"] == 5 and i["state"] == "claimed" for i in java["instances"])
    assert java["waiting"] == ["s3"]
    reasons = {(e["source"], e["reason"], e["object"]) for e in java["errors"]}
    assert {("session", "SessionError", "Session/s4"),
            ("event", "InvalidSession", "Session/s4")} <= reasons
    broken = pools["broken"]
    assert not broken["valid"] and "must not exceed" in broken["problem"]
    assert ("event", "InvalidAppDefinition", "AppDefinition/broken") in {
        (e["source"], e["reason"], e["object"]) for e in broken["errors"]}
    stray = {(e["reason"], e["object"]) for e in doc["errors"]}
    assert ("SessionError", "Session/stray") in stray
    assert all("nowhere" in e["message"] for e in doc["errors"])

    # -o yaml is the same document; -o wide adds each instance's URL
    assert yaml.safe_load(run(env, "status", "-o", "yaml").stdout) == doc
    wide = run(env, "status", "java", "-o", "wide").stdout
    assert re.search(r"^ID +STATE +POD +OBJECTS +SESSION +ALSO-CLAIMED-BY +ROUTE +URL$", wide, re.M)
    assert "URL" not in run(env, "status", "java").stdout

    # The table: names, counts, holders; no e-mail address.
    text = run(env, "status").stdout
    assert_no_email(text)
    for fragment in ("java", "broken", "claimed 3", "waiting 1", "s3", "InvalidSession",
                     "InvalidAppDefinition", "stray", "invalid, left as it is"):
        assert fragment in text, fragment

    # One AppDefinition by name, the namespace by flag (beats $WARMPOOL_NAMESPACE).
    only = run_json(cli_env(str(cluster.kubeconfig), WARMPOOL_NAMESPACE="elsewhere"),
                    "status", "java", "-n", ns)
    assert [p["name"] for p in only["appdefinitions"]] == ["java"] and only["errors"] == []

    # A spec change with every instance claimed: claimed instances are outdated, kept.
    patch_appdef_spec(kube, ns, "java", image="theiacloud/theia-cloud-demo:1.1")
    queue.add(str(PoolKey(ns, "java")))
    converge(kube, ns)
    java = run_json(env, "status", "java")["appdefinitions"][0]
    assert java["generation"] == 2
    assert (java["counts"]["claimed"], java["counts"]["outdated"]) == (3, 3)
    assert all(i["outdated"] and i["state"] == "claimed" for i in java["instances"])
    assert "claimed (old generation)" in run(env, "status", "java").stdout


def test_scale_validates_then_patches_min_and_max(kube, namespace, cluster) -> None:
    ns = namespace
    create_appdef(kube, ns, "java", min_instances=2, max_instances=4)
    env = cli_env(str(cluster.kubeconfig), WARMPOOL_NAMESPACE=ns)

    def spec() -> tuple[int, int]:
        s = kube.get(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, "java")["spec"]
        return s["minInstances"], s["maxInstances"]

    out = run(env, "scale", "java", "--min", "3").stdout
    assert " ".join(out.split()) == (
        f"{ns}/java: minInstances 2 -> 3, maxInstances 4 (unchanged)")  # folded at 80
    assert spec() == (3, 4)

    # Above the current max, below zero, above --max: exit 2, one line, nothing written.
    assert_one_line_error(run(env, "scale", "java", "--min", "5", code=2),
                          "maxInstances 4", "--max 5")
    assert_one_line_error(run(env, "scale", "java", "--min", "-1", code=2), "--min")
    assert_one_line_error(run(env, "scale", "java", "--min", "3", "--max", "2", code=2),
                          "--min 3 exceeds --max 2")
    assert_one_line_error(run(env, "scale", "java", "--min", "x", code=2), "--min")
    assert spec() == (3, 4)

    doc = run_json(env, "scale", "java", "--min", "6", "--max", "8")
    assert doc == {"namespace": ns, "appdefinition": "java", "changed": True, "dryRun": False,
                   "old": {"minInstances": 3, "maxInstances": 4},
                   "new": {"minInstances": 6, "maxInstances": 8}, "generation": 3}
    assert spec() == (6, 8)
    assert run_json(env, "scale", "java", "--min", "6")["changed"] is False
    assert "(unchanged)" in run(env, "scale", "java", "--min", "0").stdout
    assert spec() == (0, 8)


def test_scale_refuses_what_the_controller_would_refuse_and_dry_runs_on_the_server(
    kube, namespace, cluster
) -> None:
    """Issue #27: `--min 5001 --max 5001` was written, the controller found the AppDefinition
    invalid and left the pool as it was (releases included). The command now judges the
    AppDefinition as it would be with the controller's own validation, and `--dry-run` asks
    the API server (dryRun=All) without storing anything."""
    ns = namespace
    create_appdef(kube, ns, "java", min_instances=2, max_instances=4)
    env = cli_env(str(cluster.kubeconfig), WARMPOOL_NAMESPACE=ns)

    def stored() -> tuple[int, int, str, int]:
        obj = kube.get(v.APPDEF_API_VERSION, v.APPDEF_KIND, ns, "java")
        return (obj["spec"]["minInstances"], obj["spec"]["maxInstances"],
                obj["metadata"]["resourceVersion"], obj["metadata"]["generation"])

    before = stored()
    for args in (("--min", "5001", "--max", "5001"), ("--min", "2", "--max", "5001")):
        for dry in ((), ("--dry-run",)):
            proc = run(env, "scale", "java", *args, *dry, code=2)
            assert_one_line_error(proc, "refused, nothing written", "would be invalid",
                                  "above the ceiling of 5000 instances",
                                  "WARMPOOL_INSTANCES_CEILING")
            assert proc.stdout == ""
    assert stored() == before

    # The rest of the spec counts too: an AppDefinition invalid for another reason is not
    # scaled into a pool the controller would still refuse.
    patch_appdef_spec(kube, ns, "java", requestsCpu="1 Gi")
    assert_one_line_error(run(env, "scale", "java", "--min", "3", code=2),
                          "spec.requestsCpu must be a Kubernetes quantity")
    patch_appdef_spec(kube, ns, "java", requestsCpu="100m")
    before = stored()

    # --dry-run: the server answers as if it wrote; nothing is stored.
    out = run(env, "scale", "java", "--min", "3", "--max", "6", "--dry-run").stdout
    assert " ".join(out.split()) == (
        f"{ns}/java: minInstances 2 -> 3, maxInstances 4 -> 6 (dry run: the API server "
        "accepted it, nothing was written)")
    doc = run_json(env, "scale", "java", "--min", "3", "--dry-run")
    assert doc["dryRun"] is True and doc["changed"] is True
    assert doc["new"] == {"minInstances": 3, "maxInstances": 4}
    assert stored() == before
    # The controller's ceiling is a setting; the command takes the same one.
    proc = run(cli_env(str(cluster.kubeconfig), WARMPOOL_NAMESPACE=ns,
                       WARMPOOL_INSTANCES_CEILING="3"), "scale", "java", "--min", "4", code=2)
    assert_one_line_error(proc, "above the ceiling of 3 instances")
    assert stored() == before
    # Without --dry-run it is written; a dry run of what is already there sends nothing.
    run(env, "scale", "java", "--min", "3")
    assert stored()[:2] == (3, 4)
    written = stored()
    assert "nothing to change, nothing sent" in " ".join(
        run(env, "scale", "java", "--min", "3", "--dry-run").stdout.split())
    assert stored() == written


def test_unknown_appdefinition_exits_3(kube, namespace, cluster) -> None:
    env = cli_env(str(cluster.kubeconfig))
    for args in (("scale", "nope", "--min", "1"), ("status", "nope")):
        proc = run(env, *args, "-n", namespace, code=3)
        assert_one_line_error(proc, "'nope' not found", namespace)
        assert proc.stdout == ""


def test_empty_namespace_and_the_kubeconfig_flag(namespace, cluster) -> None:
    env = cli_env(None)
    doc = run_json(env, "status", "--kubeconfig", str(cluster.kubeconfig), "-n", namespace)
    assert doc == {"namespace": namespace, "appdefinitions": [], "errors": [],
                   "errors_total": 0}
    assert "no AppDefinitions" in run(env, "status", "--kubeconfig", str(cluster.kubeconfig),
                                      "-n", namespace).stdout


def test_missing_kubeconfig_is_one_line_and_exit_4(tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    for args in (("status",), ("scale", "java", "--min", "1")):
        proc = run(cli_env(str(missing)), *args, code=4)
        assert_one_line_error(proc, str(missing), "KUBECONFIG")
        # No KUBECONFIG, no ~/.kube/config, not in a pod.
        proc = run(cli_env(None, HOME=str(tmp_path)), *args, code=4)
        assert_one_line_error(proc, "no Kubernetes configuration", "--kubeconfig")
    proc = run(cli_env(None), "status", "--kubeconfig", str(missing), code=4)
    assert_one_line_error(proc, "from --kubeconfig")


def _kubeconfig(path: Path, server: str, namespace: str | None = None) -> Path:
    context = {"cluster": "c", "user": "u", **({"namespace": namespace} if namespace else {})}
    path.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "c", "cluster": {"server": server,
                                                "insecure-skip-tls-verify": True}}],
        "contexts": [{"name": "x", "context": context}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    return path


def test_unreachable_api_server_is_one_line_and_exit_4_and_debug_shows_why(
    tmp_path: Path
) -> None:
    kc = _kubeconfig(tmp_path / "kc.yaml", "https://127.0.0.1:1")
    proc = run(cli_env(str(kc)), "status", code=4)
    assert_one_line_error(proc, "cannot reach the Kubernetes API server at https://127.0.0.1:1",
                          "$KUBECONFIG")
    debug = run(cli_env(str(kc)), "--debug", "status", code=4)
    assert "Traceback (most recent call last)" in debug.stderr
    assert debug.stderr.strip().splitlines()[-1].startswith("error: cannot reach")
    garbage = tmp_path / "garbage.yaml"
    garbage.write_text("this: [is not a kubeconfig")
    assert_one_line_error(run(cli_env(str(garbage)), "status", code=4), "garbage.yaml")


def test_namespace_comes_from_the_kubeconfig_context_and_is_checked(
    namespace, cluster, tmp_path: Path
) -> None:
    # The test cluster's kubeconfig with its current context's namespace set.
    config = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    (current,) = [c for c in config["contexts"] if c["name"] == config["current-context"]]
    current["context"]["namespace"] = namespace
    kc = tmp_path / "ns.yaml"
    kc.write_text(yaml.safe_dump(config))
    assert run_json(cli_env(str(kc)), "status")["namespace"] == namespace
    assert run_json(cli_env(str(kc), WARMPOOL_NAMESPACE="other"), "status")["namespace"] == (
        "other")
    assert_one_line_error(run(cli_env(str(kc)), "status", "-n", "Not_A_Name", code=2),
                          "Not_A_Name")


def test_help_names_each_option_and_its_environment_variable() -> None:
    for args in (("status",), ("scale",)):
        text = run(cli_env(None), *args, "--help").stdout
        for fragment in ("--kubeconfig", "KUBECONFIG", "--namespace", "WARMPOOL_NAMESPACE",
                         "--context", "-o, --output [json|yaml|wide]", "-o json | -o yaml:",
                         "--json", "Same as -o json"):
            assert fragment in text, (args, fragment)
    assert "-A, --all-namespaces" in run(cli_env(None), "status", "--help").stdout
    top = " ".join(run(cli_env(None), "--help").stdout.split())
    for fragment in ("Exit codes", "4 unreachable", "5 credentials refused",
                     "6 not a Kubernetes API server"):
        assert fragment in top, fragment
    assert re.fullmatch(r"warmpool \d+\.\d+\S*\n", run(cli_env(None), "--version").stdout)


class _HtmlEverywhere(http.server.BaseHTTPRequestHandler):
    """A web server that answers every path 200 with a page: its status alone looks fine."""

    def do_GET(self) -> None:
        body = b"<!DOCTYPE html><html><body>welcome</body></html>"
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture(params=["404", "200"])
def web_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A real HTTP server on a free port that is not a Kubernetes API server: Python's file
    server (a 404 page on /apis), or one answering every path 200 with HTML."""
    handler: Callable[..., http.server.BaseHTTPRequestHandler] = (
        _HtmlEverywhere if request.param == "200" else
        functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(tmp_path)))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_that_is_not_kubernetes_is_one_line_and_exit_6(
    web_server: str, tmp_path: Path
) -> None:
    """A kubeconfig pointing at a web server printed 'unexpected NotFoundError' with the page
    in it. Each command says, in one line, that the address is not an API server."""
    kc = _kubeconfig(tmp_path / "web.yaml", web_server)
    for args in (("status",), ("status", "-A", "-o", "yaml"), ("scale", "java", "--min", "1")):
        proc = run(cli_env(str(kc)), *args, code=6)
        assert_one_line_error(proc, f"the server at {web_server}", "is not a Kubernetes API "
                              "server", "cluster.server")
        assert "<html" not in proc.stderr.lower() and proc.stdout == ""


def test_refused_credentials_are_one_line_and_exit_5(cluster, tmp_path: Path) -> None:
    config = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    for user in config["users"]:
        user["user"] = {"token": "not-a-token-of-this-cluster"}
    kc = tmp_path / "refused.yaml"
    kc.write_text(yaml.safe_dump(config))
    for args in (("status",), ("scale", "java", "--min", "1")):
        proc = run(cli_env(str(kc)), *args, code=5)
        assert_one_line_error(proc, "refused the credentials", "401")
        assert "not-a-token" not in proc.stderr


def test_context_flag_and_all_namespaces(kube, namespace, cluster, tmp_path: Path) -> None:
    """--context picks a context other than the current one, with its namespace; -A shows
    every namespace that has AppDefinitions."""
    config = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    (current,) = [c for c in config["contexts"] if c["name"] == config["current-context"]]
    config["clusters"].append({"name": "nowhere", "cluster": {"server": "https://127.0.0.1:1"}})
    config["contexts"] = [
        {"name": "down", "context": {**current["context"], "cluster": "nowhere"}},
        {"name": "test", "context": {**current["context"], "namespace": namespace}}]
    config["current-context"] = "down"
    kc = tmp_path / "contexts.yaml"
    kc.write_text(yaml.safe_dump(config))
    env = cli_env(str(kc))
    run(env, "status", code=4)  # the current context's server does not answer
    create_appdef(kube, namespace, "java", min_instances=0, max_instances=2)
    doc = run_json(env, "status", "--context", "test")
    assert doc["namespace"] == namespace
    assert [p["name"] for p in doc["appdefinitions"]] == ["java"]
    assert_one_line_error(run(env, "status", "--context", "prod", code=2),
                          "--context prod: no such context", "down, test")

    every = run_json(env, "status", "--context", "test", "-A")["namespaces"]
    mine = [d for d in every if d["namespace"] == namespace]
    assert [[p["name"] for p in d["appdefinitions"]] for d in mine] == [["java"]]
    assert all(d["appdefinitions"] for d in every)  # only namespaces with AppDefinitions
    only = run_json(env, "status", "java", "--context", "test", "-A")["namespaces"]
    assert namespace in {d["namespace"] for d in only}
    assert all([p["name"] for p in d["appdefinitions"]] == ["java"] for d in only)
    text = run(env, "status", "--context", "test", "-A").stdout
    assert f"(namespace {namespace})" in text
    assert_one_line_error(run(env, "status", "-A", "-n", namespace, code=2),
                          "not both")
    assert_one_line_error(run(env, "status", "nope", "--context", "test", "-A", code=3),
                          "'nope' not found in any namespace")


def test_a_kind_the_api_server_does_not_serve_stops_the_roles_with_one_line(cluster) -> None:
    """`warmpool worker` and `warmpool scheduler` check the kinds their settings need: a watch
    of a kind the server does not serve would never sync, and the controller would stall
    without a word."""
    from warmpool.config import check_servers
    from warmpool.errors import EXIT_UNREACHABLE, Unreachable
    from warmpool.kube import kinds
    from warmpool.pool.builders import PoolSettings

    kc = str(cluster.kubeconfig)
    check_servers(None, kube=True, kubeconfig=kc, kinds=kinds.required(PoolSettings()))
    with pytest.raises(Unreachable) as refused:
        check_servers(None, kube=True, kubeconfig=kc,
                      kinds=[("example.com/v1", "Nothing", "install example.com's CRD")])
    assert refused.value.exit_code == EXIT_UNREACHABLE
    assert "serves no Nothing (example.com/v1): install example.com's CRD" in str(
        refused.value.message)

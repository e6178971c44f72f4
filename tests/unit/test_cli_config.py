"""Where every command's configuration comes from: flags, then environment, then defaults."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from warmpool import config
from warmpool.errors import EXIT_UNREACHABLE, EXIT_USAGE, BadValue, Unreachable


def kubeconfig(path: Path, namespace: str | None = None) -> Path:
    context = {"cluster": "c", "user": "u", **({"namespace": namespace} if namespace else {})}
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "x",
        "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
        "contexts": [{"name": "x", "context": context}],
        "users": [{"name": "u", "user": {"token": "t"}}]}))
    return path


@pytest.fixture
def sa_dir(tmp_path: Path) -> Path:
    d = tmp_path / "sa"
    d.mkdir()
    return d


def test_flag_beats_kubeconfig_env_which_beats_in_cluster_and_home(tmp_path, sa_dir) -> None:
    flag = kubeconfig(tmp_path / "flag.yaml")
    env_file = kubeconfig(tmp_path / "env.yaml")
    (sa_dir / "token").write_text("t")
    home = tmp_path / "home"
    (home / ".kube").mkdir(parents=True)
    kubeconfig(home / ".kube" / "config")
    env = {"KUBECONFIG": str(env_file), "KUBERNETES_SERVICE_HOST": "10.0.0.1"}

    t = config.resolve_kube_target(str(flag), env, home, sa_dir)
    assert (t.in_cluster, t.path, t.source) == (False, str(flag), "--kubeconfig")
    t = config.resolve_kube_target(None, env, home, sa_dir)
    assert (t.path, t.source) == (str(env_file), "$KUBECONFIG")
    t = config.resolve_kube_target(None, {"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, home, sa_dir)
    assert (t.in_cluster, t.source) == (True, "in-cluster")
    t = config.resolve_kube_target(None, {"KUBECONFIG": ""}, home, sa_dir)
    assert (t.path, t.source) == (str(home / ".kube" / "config"), "~/.kube/config")


def test_kubeconfig_lists_like_kubectl(tmp_path, sa_dir) -> None:
    real = kubeconfig(tmp_path / "real.yaml")
    joined = f"{tmp_path / 'absent.yaml'}:{real}"
    t = config.resolve_kube_target(None, {"KUBECONFIG": joined}, tmp_path, sa_dir)
    assert t.path == joined


def test_missing_kubeconfig_says_which_setting_to_fix(tmp_path, sa_dir) -> None:
    with pytest.raises(Unreachable) as exc:
        config.resolve_kube_target(None, {"KUBECONFIG": str(tmp_path / "x")}, tmp_path, sa_dir)
    assert exc.value.exit_code == EXIT_UNREACHABLE
    assert "from $KUBECONFIG" in exc.value.message and "does not exist" in exc.value.message
    with pytest.raises(Unreachable, match="from --kubeconfig"):
        config.resolve_kube_target(str(tmp_path / "x"), {}, tmp_path, sa_dir)
    # A token file without the service env is not "in a pod"; nothing else: say so.
    (sa_dir / "token").write_text("t")
    with pytest.raises(Unreachable, match="no Kubernetes configuration"):
        config.resolve_kube_target(None, {}, tmp_path, sa_dir)


def test_namespace_flag_env_context_default(tmp_path, sa_dir) -> None:
    with_ns = config.KubeTarget(False, str(kubeconfig(tmp_path / "a.yaml", "team")), "x")
    without = config.KubeTarget(False, str(kubeconfig(tmp_path / "b.yaml")), "x")
    env = {"WARMPOOL_NAMESPACE": "from-env"}
    assert config.resolve_namespace("from-flag", with_ns, env) == "from-flag"
    assert config.resolve_namespace(None, with_ns, env) == "from-env"
    assert config.resolve_namespace(None, with_ns, {}) == "team"
    assert config.resolve_namespace(None, without, {}) == "default"
    assert config.resolve_namespace(None, None, {"WARMPOOL_NAMESPACE": " "}) == "default"
    with pytest.raises(BadValue, match="from \\$WARMPOOL_NAMESPACE") as exc:
        config.resolve_namespace(None, with_ns, {"WARMPOOL_NAMESPACE": "Bad_Name"})
    assert exc.value.exit_code == EXIT_USAGE


def test_context_flag_chooses_the_kubeconfig_context_and_its_namespace(tmp_path, sa_dir) -> None:
    path = kubeconfig(tmp_path / "two.yaml", "team")
    doc = yaml.safe_load(path.read_text())
    doc["contexts"].append({"name": "staging", "context": {"cluster": "c", "user": "u",
                                                            "namespace": "stage"}})
    path.write_text(yaml.safe_dump(doc))
    target = config.KubeTarget(False, str(path), "$KUBECONFIG")
    assert config.resolve_namespace(None, target, {}) == "team"  # the current context's
    assert config.resolve_namespace(None, target, {}, context="staging") == "stage"
    assert config.resolve_namespace("mine", target, {}, context="staging") == "mine"
    with pytest.raises(BadValue) as exc:
        config.resolve_namespace(None, target, {}, context="prod")
    assert exc.value.exit_code == EXIT_USAGE
    assert "--context prod: no such context" in exc.value.message
    assert "its contexts: x, staging" in exc.value.message
    with pytest.raises(BadValue, match="pass --kubeconfig"):
        config.context_namespace(config.KubeTarget(True, None, "in-cluster"), sa_dir,
                                 context="staging")


def test_in_cluster_namespace_is_the_service_accounts(sa_dir) -> None:
    (sa_dir / "namespace").write_text("theia-cloud\n")
    target = config.KubeTarget(True, None, "in-cluster")
    assert config.context_namespace(target, sa_dir) == "theia-cloud"
    assert config.context_namespace(target, sa_dir / "missing") is None


def test_a_broken_kubeconfig_is_a_configuration_error(tmp_path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("this: [is not")
    target = config.KubeTarget(False, str(bad), "$KUBECONFIG")
    assert config.context_namespace(target) is None
    with pytest.raises(Unreachable, match=r"cannot use the kubeconfig .*bad\.yaml"):
        config.connect_kube(target)


def test_unreachable_api_server_names_the_server_and_the_source(tmp_path) -> None:
    target = config.KubeTarget(False, str(kubeconfig(tmp_path / "k.yaml")), "$KUBECONFIG")
    with pytest.raises(Unreachable) as exc:
        config.connect_kube(target)
    assert "https://127.0.0.1:1" in exc.value.message and "$KUBECONFIG" in exc.value.message


def test_redis_url_flag_env_default_and_never_a_server() -> None:
    env = {"WARMPOOL_REDIS_URL": "redis://env:6379/1"}
    assert config.resolve_redis_url("redis://flag/0", env) == ("redis://flag/0", "--redis-url")
    assert config.resolve_redis_url(None, env) == ("redis://env:6379/1", "$WARMPOOL_REDIS_URL")
    assert config.resolve_redis_url(None, {}) == (config.DEFAULT_REDIS_URL, "the default")
    assert config.resolve_redis_url(None, {"WARMPOOL_REDIS_URL": ""})[1] == "the default"


def test_passwords_never_show() -> None:
    assert config.redact_url("redis://:pw@h:1/0") == "redis://:***@h:1/0"
    assert config.redact_url("rediss://user:pw@h/0") == "rediss://user:***@h/0"
    assert config.redact_url("redis://h:6379/0") == "redis://h:6379/0"
    assert config.redact_url("unix:///tmp/r.sock") == "unix:///tmp/r.sock"


@pytest.mark.parametrize("url, shown", [
    # issue #27, point 6: each of these showed (part of) its password before
    ("REDIS://:s3cret@h:1/0", "REDIS://:***@h:1/0"),
    ("Rediss://u:s3cret@h/0", "Rediss://u:***@h/0"),
    ("redis://:s3@cret@h:1/0", "redis://:***@h:1/0"),
    ("redis://:s3/cret@h:1/0", "redis://:***@h:1/0"),
    ("redis://u:a/b@c:d@h/0?password=s3cret", "redis://u:***@h/0?password=***"),
    ("redis://:s3?cret@h/0", "redis://:***@h/0"),
    ("redis://s3cret@h/0", "redis://***@h/0"),
    ("redis://:s3cret@[::1]:6379/0", "redis://:***@[::1]:6379/0"),
    ("redis://h/0?PASSWORD=s3cret&db=1", "redis://h/0?PASSWORD=***&db=1"),
    ("redis://h/0?password=s3@cret&db=1", "redis://h/0?password=***&db=1"),
    ("REDIS+SENTINEL://:s3cret@s1:26379,s2/svc?Sentinel_Password=s3cret",
     "REDIS+SENTINEL://:***@s1:26379,s2/svc?Sentinel_Password=***"),
])
def test_passwords_never_show_whatever_they_contain(url: str, shown: str) -> None:
    assert config.redact_url(url) == shown
    assert "cret" not in config.redact_url(url)


def test_a_password_with_an_at_in_the_query_too_leaks_nothing() -> None:
    """Ambiguous (an `@` on both sides of a `?`): more is hidden than needed, never less."""
    assert "s3" not in config.redact_url("redis://:s3@x@h/0?password=s3@y")


def test_queue_layout_comes_from_the_workers_environment() -> None:
    s = config.queue_settings("redis://h/0", {"WARMPOOL_QUEUE_PREFIX": "t1:warmpool:",
                                              "WARMPOOL_QUEUE_NAMESPACE": "t1:dramatiq"})
    assert (s.redis_url, s.prefix, s.namespace) == ("redis://h/0", "t1:warmpool:",
                                                    "t1:dramatiq")
    with pytest.raises(BadValue, match="WARMPOOL_QUEUE_"):
        config.queue_settings("redis://h/0", {"WARMPOOL_QUEUE_LEASE_TTL": "soon"})


def test_nothing_answering_is_unreachable_and_a_bad_url_is_a_bad_value() -> None:
    shown = re.escape("nothing answers at redis://:***@127.0.0.1:1")  # no password
    with pytest.raises(Unreachable, match=shown):
        config.connect_redis("redis://:pw@127.0.0.1:1/0", "--redis-url")
    with pytest.raises(BadValue, match="bad Redis URL"):
        config.connect_redis("http://x", "--redis-url")

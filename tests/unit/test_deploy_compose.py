"""docker-compose.yml, validated against the Compose specification's own JSON schema (the copy
check-jsonschema ships as `vendor.compose-spec`), then read to check that the stack is wired
together: services, shared kubeconfig, Redis password, scrape targets, dashboard provisioning.

The checks read the file as Compose would load it: YAML merge keys resolved, `${VAR:-default}`
interpolated from a given environment, `$$` unescaped, short volume syntax split. No Docker
engine (and no Compose binary) is needed.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_FILE = ROOT / "docker-compose.yml"
# Files other parts of the project provide (metrics/): referenced here, checked when present.
PROVIDED_ELSEWHERE = {ROOT / "metrics" / "alerts.yml",
                      ROOT / "metrics" / "grafana" / "warmpool-dashboard.json"}

_VAR = re.compile(r"\$\{(\w+)(?::?-([^}]*))?\}")


def validate(file: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema",
                           "vendor.compose-spec", str(file)], capture_output=True, text=True,
                          timeout=60)


def _interpolate(value: Any, env: dict[str, str]) -> Any:
    if isinstance(value, str):
        text = _VAR.sub(lambda m: env.get(m.group(1)) or (m.group(2) or ""), value)
        return text.replace("$$", "$")
    if isinstance(value, list):
        return [_interpolate(x, env) for x in value]
    if isinstance(value, dict):
        return {k: _interpolate(x, env) for k, x in value.items()}
    return value


def _volume(spec: str | dict[str, Any]) -> dict[str, Any]:
    if isinstance(spec, dict):
        return spec
    source, target, *_ = spec.split(":")
    if source.startswith((".", "/")):
        return {"type": "bind", "source": str((ROOT / source).resolve()), "target": target}
    return {"type": "volume", "source": source, "target": target}


def load(env: dict[str, str] | None = None) -> dict[str, Any]:
    model = _interpolate(yaml.safe_load(COMPOSE_FILE.read_text()), env or {})
    for service in model["services"].values():
        service["volumes"] = [_volume(v) for v in service.get("volumes") or []]
        if "build" in service:
            service["build"]["context"] = str((ROOT / service["build"]["context"]).resolve())
    return model


@pytest.fixture(scope="module")
def model() -> dict[str, Any]:
    return load()


def test_the_compose_specification_schema_accepts_the_file() -> None:
    out = validate(COMPOSE_FILE)
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_schema_rejects_a_broken_file(tmp_path: Path) -> None:
    broken = yaml.safe_load(COMPOSE_FILE.read_text())
    broken["services"]["redis"]["healthcheck"]["retries"] = "many"
    broken["services"]["worker"]["not_a_compose_key"] = True
    path = tmp_path / "docker-compose.yml"
    path.write_text(yaml.safe_dump(broken))
    out = validate(path)
    assert out.returncode != 0
    assert "not_a_compose_key" in out.stdout + out.stderr


def test_services_of_the_stack(model: dict[str, Any]) -> None:
    services = model["services"]
    assert set(services) == {"redis", "k3s", "crds", "scheduler", "worker", "prometheus",
                             "grafana"}
    assert services["k3s"]["image"].startswith("rancher/k3s:")
    assert services["k3s"]["privileged"] is True
    assert services["worker"]["deploy"]["replicas"] >= 2
    assert services["scheduler"]["deploy"]["replicas"] == 2
    # The k3s server's kubeconfig lands on the shared volume the warmpool services mount.
    k3s_env = services["k3s"]["environment"]
    assert k3s_env["K3S_KUBECONFIG_OUTPUT"].startswith("/output/")
    for name in ("scheduler", "worker"):
        s = services[name]
        assert s["image"] == "warmpool:dev" and s["build"]["context"] == str(ROOT)
        assert s["depends_on"]["crds"]["condition"] == "service_completed_successfully"
        assert s["depends_on"]["redis"]["condition"] == "service_healthy"
        assert s["read_only"] is True and s["cap_drop"] == ["ALL"]
        multiproc = s["environment"]["PROMETHEUS_MULTIPROC_DIR"]
        if name == "worker":
            assert any(t.split(":")[0] == multiproc for t in s["tmpfs"])
        else:
            assert multiproc == ""  # one process: prometheus-client's single-process mode
        (kube,) = [v for v in s["volumes"] if v["source"] == "kube"]
        assert s["environment"]["KUBECONFIG"].startswith(kube["target"] + "/")
    crds = services["crds"]
    assert crds["depends_on"]["k3s"]["condition"] == "service_healthy"
    script = crds["command"][0]
    assert "https://k3s:6443" in script and "kubectl apply -f /crds/" in script
    assert k3s_env["K3S_KUBECONFIG_OUTPUT"] in script  # reads what k3s wrote
    assert f"--kubeconfig={k3s_env['K3S_KUBECONFIG_OUTPUT']}" in services["k3s"]["healthcheck"][
        "test"]
    out_name = Path(services["scheduler"]["environment"]["KUBECONFIG"]).name
    assert f"/output/{out_name}" in script
    assert "--tls-san=k3s" in services["k3s"]["command"]


def test_warmpool_commands_are_accepted_by_the_real_cli(model: dict[str, Any]) -> None:
    from tests.unit.test_deploy_manifests import parse_cli

    name, params = parse_cli(model["services"]["scheduler"]["command"])
    assert name == "scheduler" and params["health_host"] == "0.0.0.0"
    assert str(params["health_port"]) in " ".join(
        model["services"]["scheduler"]["healthcheck"]["test"])
    name, params = parse_cli(model["services"]["worker"]["command"])
    assert name == "worker" and params["processes"] >= 1


def test_redis_password_is_one_value_everywhere() -> None:
    services = load({"REDIS_PASSWORD": "s3cret"})["services"]
    command = services["redis"]["command"]
    assert command[command.index("--requirepass") + 1] == "s3cret"
    assert command[command.index("--save") + 1] == ""
    for name in ("scheduler", "worker"):
        assert services[name]["environment"]["WARMPOOL_REDIS_URL"] == (
            "redis://:s3cret@redis:6379/0")


def bind_mounts(model: dict[str, Any]) -> list[tuple[str, Path, str]]:
    return [(name, Path(v["source"]), v["target"])
            for name, s in model["services"].items()
            for v in s.get("volumes") or [] if v["type"] == "bind"]


def test_bind_mounted_files_exist(model: dict[str, Any]) -> None:
    for service, source, _ in bind_mounts(model):
        assert source.is_relative_to(ROOT), (service, source)
        if source in PROVIDED_ELSEWHERE and not source.exists():
            continue  # metrics/ provides it; Compose would otherwise mount an empty dir
        assert source.exists(), (service, source)
        if source in PROVIDED_ELSEWHERE:
            assert source.is_file(), source


def test_prometheus_scrapes_every_replica_and_loads_the_alert_rules(
    model: dict[str, Any],
) -> None:
    mounts = {target: source for service, source, target in bind_mounts(model)
              if service == "prometheus"}
    config_path = mounts["/etc/prometheus/prometheus.yml"]
    assert config_path == ROOT / "deploy" / "compose" / "prometheus.yml"
    config = yaml.safe_load(config_path.read_text())
    (rules,) = config["rule_files"]
    alerts_target = next(t for t, s in mounts.items() if s == ROOT / "metrics" / "alerts.yml")
    assert Path(alerts_target).match(rules)
    jobs = {j["job_name"]: j for j in config["scrape_configs"]}
    expected = {"warmpool-scheduler": ("scheduler", 9090), "warmpool-worker": ("worker", 9091)}
    for job, (service, port) in expected.items():
        (sd,) = jobs[job]["dns_sd_configs"]
        assert sd["names"] == [service] and sd["port"] == port and sd["type"] == "A"
    # The same ports the Kubernetes manifests name `metrics`.
    text = (ROOT / "deploy" / "base" / "scheduler.yaml").read_text()
    assert "name: metrics\n              containerPort: 9090" in text
    text = (ROOT / "deploy" / "base" / "worker.yaml").read_text()
    assert "name: metrics\n              containerPort: 9091" in text


def test_grafana_provisions_the_datasource_and_the_dashboard(model: dict[str, Any]) -> None:
    mounts = {target: source for service, source, target in bind_mounts(model)
              if service == "grafana"}
    datasources = mounts["/etc/grafana/provisioning/datasources"]
    (ds,) = yaml.safe_load((datasources / "prometheus.yaml").read_text())["datasources"]
    assert ds["type"] == "prometheus" and ds["url"] == "http://prometheus:9090"
    dashboards = mounts["/etc/grafana/provisioning/dashboards"]
    (provider,) = yaml.safe_load((dashboards / "warmpool.yaml").read_text())["providers"]
    dashboard_target = next(t for t, s in mounts.items()
                            if s == ROOT / "metrics" / "grafana" / "warmpool-dashboard.json")
    assert Path(dashboard_target).parent == Path(provider["options"]["path"])

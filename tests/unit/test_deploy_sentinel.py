"""deploy/components/redis-sentinel: the base with a Sentinel URL in the Secret. The
component must change only the workers' readiness probe (the base's calls redis-py's own URL
parser, which has no Sentinel form), and the new probe must fail fast when no Sentinel
answers. That it passes against real Sentinels is checked in
tests/integration/test_queue_sentinel.py."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

from tests.unit.test_deploy_manifests import DEPLOY, ROOT, _rel, by_kind, container, kustomize


def _with_component() -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "kustomization.yaml").write_text(yaml.safe_dump({
            "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
            "resources": [_rel(DEPLOY / "base", Path(tmp))],
            "components": [_rel(DEPLOY / "components" / "redis-sentinel", Path(tmp))],
        }))
        return kustomize(Path(tmp))


def test_only_the_worker_readiness_probe_changes() -> None:
    base = kustomize(DEPLOY / "base")
    with_sentinel = _with_component()
    before, after = container(base, "warmpool-worker"), container(with_sentinel, "warmpool-worker")
    assert before["readinessProbe"] != after["readinessProbe"]
    assert {k: v for k, v in before.items() if k != "readinessProbe"} == {
        k: v for k, v in after.items() if k != "readinessProbe"}
    rest = [o for o in with_sentinel
            if (o["kind"], o["metadata"]["name"]) != ("Deployment", "warmpool-worker")]
    assert rest == [o for o in base
                    if (o["kind"], o["metadata"]["name"]) != ("Deployment", "warmpool-worker")]
    assert by_kind(with_sentinel, "Deployment")["warmpool-worker"]["spec"]["replicas"] == (
        by_kind(base, "Deployment")["warmpool-worker"]["spec"]["replicas"])


def test_the_probe_fails_within_its_timeout_when_no_sentinel_answers() -> None:
    probe = container(_with_component(), "warmpool-worker")["readinessProbe"]
    command = probe["exec"]["command"]
    assert command[:2] == ["python3", "-c"]
    env = {**os.environ, "WARMPOOL_REDIS_URL": "redis+sentinel://127.0.0.1:1,127.0.0.1:2/svc/0"}
    # the kubelet kills a probe after timeoutSeconds and counts that as a failure too; the
    # probe must say "not ready" by itself, well before
    proc = subprocess.run([sys.executable, "-c", command[2]], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=probe["timeoutSeconds"])
    assert proc.returncode != 0
    assert "MasterNotFoundError" in proc.stderr
